//! What kore-launch carries with it, so that an installed binary works from any directory
//! with no source tree: the VMM process binary `kore-vmm`, the guest images (`guest/`) and
//! the default pack (`packs/tiny/`), embedded at build time by launcher/build.rs. On first use a file is written under
//! `$XDG_DATA_HOME/kore/<version>-<id>/` (else `~/.local/share/kore/...`; `<id>` names the
//! embedded set, so two builds never share a directory), and at every use it is checked
//! against the sha256 digest recorded at build time and written again when it differs or is
//! missing. Writes go to a temporary name first and are renamed into place, so two
//! processes extracting at once both end with the same complete file.
//!
//! A build of the source tree normally finds the same files where the build put them
//! (`target/vmm-process/...`, `target/guest/...`, `model-packs/tiny` above the working
//! directory) and extracts nothing; callers look there first.

use std::fs;
use std::io::{Read, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

/// One embedded file.
#[derive(Debug)]
pub(crate) struct Embedded {
    /// Its path under the bundle's directory.
    pub rel: &'static str,
    /// Unix permission bits.
    pub mode: u32,
    /// sha256 of `bytes`, lowercase hex.
    pub sha256: &'static str,
    /// The contents.
    pub bytes: &'static [u8],
}

mod generated {
    use super::Embedded;
    include!(concat!(env!("OUT_DIR"), "/bundle.rs"));
}

/// Why a bundled file is not available.
#[derive(Debug, thiserror::Error)]
pub enum BundleError {
    /// This binary carries no such file (a fuzzing build carries none).
    #[error("this kore-launch carries no {0} (it was built without its bundle); build it with `cargo build --release -p kore-launch`")]
    Missing(String),
    /// Neither `XDG_DATA_HOME` nor `HOME` names a directory.
    #[error("kore-launch keeps its VMM, guest images and default pack under $XDG_DATA_HOME/kore or ~/.local/share/kore: set XDG_DATA_HOME or HOME to an absolute path")]
    NoDataDir,
    /// A file could not be read, written or renamed.
    #[error("cannot write {path} (kore-launch's own files): {source}; free space there, or point XDG_DATA_HOME at a writable directory")]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
}

/// The bundle's directory: `<data home>/kore/<version>-<id>`.
pub fn dir() -> Result<PathBuf, BundleError> {
    let abs = crate::env::base_dir;
    let base = match (abs("XDG_DATA_HOME"), abs("HOME")) {
        (Some(data), _) => data,
        (None, Some(home)) => home.join(".local/share"),
        (None, None) => return Err(BundleError::NoDataDir),
    };
    Ok(base.join("kore").join(format!("{}-{}", env!("CARGO_PKG_VERSION"), generated::ID)))
}

/// The embedded file `rel`, written under [`dir`] when missing or different.
pub fn file(rel: &str) -> Result<PathBuf, BundleError> {
    let item = generated::FILES
        .iter()
        .find(|e| e.rel == rel)
        .ok_or_else(|| BundleError::Missing(rel.to_string()))?;
    ensure(&dir()?, item)
}

/// The embedded directory `rel` (every file under it written, as [`file`] does).
pub fn tree(rel: &str) -> Result<PathBuf, BundleError> {
    let prefix = format!("{rel}/");
    let root = dir()?;
    let mut any = false;
    for item in generated::FILES.iter().filter(|e| e.rel.starts_with(&prefix)) {
        ensure(&root, item)?;
        any = true;
    }
    match any {
        true => Ok(root.join(rel)),
        false => Err(BundleError::Missing(rel.to_string())),
    }
}

/// `item` under `root`, checked by digest; written (atomically) when missing or different.
fn ensure(root: &Path, item: &Embedded) -> Result<PathBuf, BundleError> {
    let path = root.join(item.rel);
    if sha256_of(&path).as_deref() == Some(item.sha256) {
        return Ok(path);
    }
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| BundleError::Io { path, source }
    };
    let parent = path.parent().expect("a bundle path has a parent");
    fs::create_dir_all(parent).map_err(io(parent))?;
    let tmp = parent.join(format!(".{}.{}", std::process::id(), file_name(&path)));
    let written = fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(item.mode)
        .open(&tmp)
        .and_then(|mut f| f.write_all(item.bytes).and_then(|()| f.sync_all()))
        .and_then(|()| fs::set_permissions(&tmp, fs::Permissions::from_mode(item.mode)))
        .and_then(|()| fs::rename(&tmp, &path));
    if let Err(e) = written {
        let _ = fs::remove_file(&tmp);
        return Err(io(&path)(e));
    }
    tracing::info!(path = %path.display(), "extracted a bundled file");
    Ok(path)
}

fn file_name(path: &Path) -> String {
    path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default()
}

/// sha256 of a file, lowercase hex; `None` when it cannot be read.
fn sha256_of(path: &Path) -> Option<String> {
    let mut f = fs::File::open(path).ok()?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        match f.read(&mut buf).ok()? {
            0 => break,
            n => h.update(&buf[..n]),
        }
    }
    Some(h.finalize().iter().map(|b| format!("{b:02x}")).collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    fn item(bytes: &'static [u8]) -> Embedded {
        let sha256: String = Sha256::digest(bytes).iter().map(|b| format!("{b:02x}")).collect();
        Embedded { rel: "bin/tool", mode: 0o755, sha256: String::leak(sha256), bytes }
    }

    #[test]
    fn a_file_is_written_once_then_reused_and_repaired_when_changed() {
        let root = tempfile::tempdir().unwrap();
        let it = item(b"\x7fELF the tool");
        let path = ensure(root.path(), &it).unwrap();
        assert_eq!(fs::read(&path).unwrap(), it.bytes);
        assert_eq!(fs::metadata(&path).unwrap().mode() & 0o777, 0o755);
        let ino = fs::metadata(&path).unwrap().ino();
        // Present and intact: left alone.
        ensure(root.path(), &it).unwrap();
        assert_eq!(fs::metadata(&path).unwrap().ino(), ino);
        // Changed on disk: written again, byte for byte.
        fs::write(&path, b"\x7fELF tampered").unwrap();
        ensure(root.path(), &it).unwrap();
        assert_eq!(fs::read(&path).unwrap(), it.bytes);
        // No temporary file left behind.
        let names: Vec<_> = fs::read_dir(path.parent().unwrap()).unwrap().flatten().collect();
        assert_eq!(names.len(), 1, "{names:?}");
    }

    #[test]
    fn an_unwritable_place_is_an_error_naming_it() {
        let root = tempfile::tempdir().unwrap();
        let blocker = root.path().join("bin");
        fs::write(&blocker, b"a file where the directory should be").unwrap();
        let err = ensure(root.path(), &item(b"x")).unwrap_err();
        assert!(err.to_string().contains(&blocker.display().to_string()), "{err}");
    }

    #[test]
    fn this_build_carries_the_vmm_the_guest_and_the_default_pack_with_their_digests() {
        let find = |rel: &str| generated::FILES.iter().find(|e| e.rel == rel).expect(rel);
        for elf in ["kore-vmm", "guest/kore-kernel", "guest/kore-appliance"] {
            assert!(find(elf).bytes.starts_with(b"\x7fELF"), "{elf}");
        }
        assert_eq!(find("kore-vmm").mode, 0o755);
        let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../model-packs/tiny");
        for f in ["pack.toml", "tokenizer.json", "weights.safetensors"] {
            let embedded = find(&format!("packs/tiny/{f}"));
            assert!(
                embedded.bytes == fs::read(repo.join(f)).unwrap(),
                "{f} differs from the repo's"
            );
        }
        for e in generated::FILES {
            let sha: String = Sha256::digest(e.bytes).iter().map(|b| format!("{b:02x}")).collect();
            assert_eq!(sha, e.sha256, "{}", e.rel);
        }
        assert_eq!(generated::ID.len(), 16);
    }
}
