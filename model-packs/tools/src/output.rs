//! Writing a pack directory safely: weights and tokenizer go to temporary
//! names first, pack.toml is written last, so a failed run never leaves a
//! half-written pack that looks complete (and never clobbers a good one early).

use crate::error::{PackError, Result};
use crate::manifest::{FileEntry, Manifest, MANIFEST_FILE, TOKENIZER_FILE, WEIGHTS_FILE};
use crate::pack::Pack;
use crate::progress::Progress;
use crate::safetensors::{SafetensorsWriter, TensorSpec};
use sha2::{Digest, Sha256};
use std::fs::File;
use std::io::BufWriter;
use std::path::{Path, PathBuf};

/// The stream a pack's weights are written to.
pub type WeightsWriter = SafetensorsWriter<BufWriter<File>>;

/// Writes `dir` as a pack: `fill` streams every tensor of `specs` (in order)
/// into the writer, `tokenizer` is the tokenizer.json content. `manifest`'s
/// `files` table is filled in here. The result is re-opened and checked.
pub fn write_pack(
    dir: &Path,
    mut manifest: Manifest,
    specs: &[TensorSpec],
    tokenizer: &[u8],
    progress: &dyn Progress,
    fill: impl FnOnce(&mut WeightsWriter) -> Result<()>,
) -> Result<Pack> {
    std::fs::create_dir_all(dir).map_err(|e| PackError::io(dir, e))?;
    let tmp_weights = dir.join(format!("{WEIGHTS_FILE}.partial"));
    let result = write_weights(&tmp_weights, &manifest, specs, progress, fill);
    let (digest, bytes) = match result {
        Ok(v) => v,
        Err(e) => {
            let _ = std::fs::remove_file(&tmp_weights);
            return Err(e);
        }
    };
    manifest.files.insert(WEIGHTS_FILE.to_string(), FileEntry { sha256: digest, bytes });
    let tok_digest = crate::safetensors::hex_digest(&Sha256::digest(tokenizer));
    manifest.tokenizer.file = TOKENIZER_FILE.to_string();
    manifest.files.insert(
        TOKENIZER_FILE.to_string(),
        FileEntry { sha256: tok_digest, bytes: tokenizer.len() as u64 },
    );
    let toml = crate::manifest::to_toml(&manifest)?;
    // Validate the manifest text before anything replaces an existing pack.
    crate::manifest::parse(&dir.join(MANIFEST_FILE), &toml)?;
    let tmp_tok = dir.join(format!("{TOKENIZER_FILE}.partial"));
    write_file(&tmp_tok, tokenizer)?;
    let tmp_manifest = dir.join(format!("{MANIFEST_FILE}.partial"));
    write_file(&tmp_manifest, toml.as_bytes())?;
    rename(&tmp_weights, &dir.join(WEIGHTS_FILE))?;
    rename(&tmp_tok, &dir.join(TOKENIZER_FILE))?;
    rename(&tmp_manifest, &dir.join(MANIFEST_FILE))?;
    Pack::open(dir)
}

fn write_weights(
    path: &Path,
    manifest: &Manifest,
    specs: &[TensorSpec],
    progress: &dyn Progress,
    fill: impl FnOnce(&mut WeightsWriter) -> Result<()>,
) -> Result<(String, u64)> {
    let file = File::create(path).map_err(|e| PackError::io(path, e))?;
    let meta = [("kore_pack".to_string(), manifest.name.clone())];
    let mut w = SafetensorsWriter::new(
        BufWriter::with_capacity(1 << 20, file),
        path,
        specs,
        manifest.alignment,
        &meta,
    )?;
    let total: u64 = specs.iter().filter_map(TensorSpec::nbytes).sum();
    progress.start("writing weights.safetensors", total);
    let r = fill(&mut w);
    progress.finish();
    r?;
    let (buf, digest, bytes) = w.finish()?;
    let file = buf.into_inner().map_err(|e| PackError::io(path, e.into_error()))?;
    file.sync_all().map_err(|e| PackError::io(path, e))?;
    Ok((digest, bytes))
}

fn write_file(path: &Path, bytes: &[u8]) -> Result<()> {
    std::fs::write(path, bytes).map_err(|e| PackError::io(path, e))
}

fn rename(from: &Path, to: &PathBuf) -> Result<()> {
    std::fs::rename(from, to).map_err(|e| PackError::io(to, e))
}
