//! A Hugging Face model directory for the guest: the appliance boots packs,
//! so `--model HF_DIR` without `--native` is imported on the fly (no
//! quantization and no conversion: every tensor keeps the checkpoint's dtype,
//! as `kore-launch pack import --quant none`, so the guest computes what
//! `--native` computes on the directory) into a cache in the runtime
//! directory, once per version of the directory.

use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};

use kore_pack::import::{import, ImportOptions, QuantMode};

use crate::error::{LaunchError, Result};

/// Whether `path` is a Hugging Face model directory rather than a pack.
pub fn is_hf_dir(path: &Path) -> bool {
    !path.join("pack.toml").is_file() && path.join("config.json").is_file()
}

/// The pack for the Hugging Face directory `hf` under `runtime_dir/packs/`,
/// imported now unless an import of this version of the directory exists.
pub fn pack_for(hf: &Path, runtime_dir: &Path) -> Result<PathBuf> {
    let name = hf
        .canonicalize()
        .ok()
        .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
        .unwrap_or_else(|| "model".into());
    let dir = runtime_dir.join("packs").join(format!("{name}-{:016x}", version(hf)));
    if dir.join("pack.toml").is_file() {
        tracing::info!("using the pack imported earlier from {}: {}", hf.display(), dir.display());
        return Ok(dir);
    }
    let tmp = dir.with_extension(format!("partial-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    eprintln!(
        "kore-launch: importing {} as a pack for the guest (once, dtypes kept): {}",
        hf.display(),
        dir.display()
    );
    let opts = ImportOptions { quant: QuantMode::Keep, ..ImportOptions::default() };
    import(hf, &tmp, &opts, &kore_pack::progress::NoProgress).map_err(|e| {
        let _ = std::fs::remove_dir_all(&tmp);
        LaunchError::Model(format!("{}: cannot import it as a pack: {e}", hf.display()))
    })?;
    std::fs::rename(&tmp, &dir)
        .map_err(|source| LaunchError::Io { path: dir.display().to_string(), source })?;
    Ok(dir)
}

/// A hash of the directory's canonical path and its files' names, sizes and
/// modification times: changes when the model does.
fn version(hf: &Path) -> u64 {
    let mut h = DefaultHasher::new();
    // The import's own format: a change of what the import writes invalidates old caches.
    "kore-import dtypes-kept 1".hash(&mut h);
    hf.canonicalize().unwrap_or_else(|_| hf.to_path_buf()).hash(&mut h);
    let mut files: Vec<_> =
        std::fs::read_dir(hf).map(|d| d.flatten().collect()).unwrap_or_default();
    files.sort_by_key(|e| e.file_name());
    for e in files {
        e.file_name().hash(&mut h);
        if let Ok(m) = e.metadata() {
            m.len().hash(&mut h);
            m.modified().ok().hash(&mut h);
        }
    }
    h.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_version_changes_with_the_files() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("config.json"), "{}").unwrap();
        assert!(is_hf_dir(dir.path()));
        let v1 = version(dir.path());
        assert_eq!(v1, version(dir.path()));
        std::fs::write(dir.path().join("model.safetensors"), "12345").unwrap();
        assert_ne!(v1, version(dir.path()));
        std::fs::write(dir.path().join("pack.toml"), "").unwrap();
        assert!(!is_hf_dir(dir.path()));
    }
}
