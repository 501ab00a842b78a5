//! A pack's files against its manifest: every file `pack.toml` lists must have
//! the recorded size and SHA-256 digest.
//!
//! [`check_files`] hashes everything (`pack verify`). [`check_files_cached`] is
//! what the launcher runs before every boot: a file whose identity (device,
//! inode, size, modification and change times) and recorded digest match an
//! entry of a [`VerifiedCache`] is not hashed again, so a pack is read in full
//! once after each change, not on every boot. Any change to a file (even
//! `touch`) changes its ctime, which no unprivileged user can set back. As
//! in git's "racily clean" rule, a file changed less than [`RACY_NS`] before
//! it was hashed is not recorded: a write in the same timestamp tick as the
//! hash would otherwise go unnoticed.

use std::collections::BTreeMap;
use std::io::Read;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::error::{PackError, Result};
use crate::manifest::Manifest;
use crate::progress::Progress;

/// Files whose mtime or ctime is this close to the start of hashing are
/// hashed again next time (covers filesystems with 1-2 s timestamps).
pub const RACY_NS: i128 = 2_000_000_000;

/// What a check did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CheckReport {
    /// Files whose digest was computed now.
    pub hashed_files: usize,
    /// Bytes hashed now.
    pub hashed_bytes: u64,
    /// Files accepted from the cache without hashing.
    pub cached_files: usize,
}

/// Checks sizes, then hashes every file the manifest lists.
pub fn check_files(
    dir: &Path,
    manifest: &Manifest,
    progress: &dyn Progress,
) -> Result<CheckReport> {
    let mut none = VerifiedCache::disabled();
    check_files_cached(dir, manifest, &mut none, progress)
}

/// [`check_files`], skipping files the cache vouches for and recording the
/// ones it hashes. Sizes are always checked.
pub fn check_files_cached(
    dir: &Path,
    manifest: &Manifest,
    cache: &mut VerifiedCache,
    progress: &dyn Progress,
) -> Result<CheckReport> {
    let mut to_hash = Vec::new();
    let mut report = CheckReport::default();
    for (name, entry) in &manifest.files {
        let path = dir.join(name);
        let meta = std::fs::metadata(&path).map_err(|e| PackError::io(&path, e))?;
        check_size(&path, meta.len(), entry.bytes)?;
        let stamp = Stamp::of(&meta, &entry.sha256);
        match cache.vouches(&path, &stamp) {
            true => report.cached_files += 1,
            false => to_hash.push((path, stamp, entry)),
        }
    }
    let total = to_hash.iter().map(|(_, _, e)| e.bytes).sum();
    if to_hash.is_empty() {
        return Ok(report);
    }
    progress.start("checking pack checksums", total);
    let started = now_ns();
    for (path, stamp, entry) in to_hash {
        let actual = sha256_file(&path, progress);
        let actual = match actual {
            Ok(a) => a,
            Err(e) => {
                progress.finish();
                return Err(e);
            }
        };
        if actual != entry.sha256 {
            progress.finish();
            return Err(PackError::Checksum { file: path, expected: entry.sha256.clone(), actual });
        }
        if stamp.mtime_ns.max(stamp.ctime_ns) < started - RACY_NS {
            cache.record(&path, stamp);
        }
        report.hashed_files += 1;
        report.hashed_bytes += entry.bytes;
    }
    progress.finish();
    Ok(report)
}

/// Checks that every file the manifest lists exists with the recorded size.
pub fn check_sizes(dir: &Path, manifest: &Manifest) -> Result<()> {
    for (name, entry) in &manifest.files {
        let path = dir.join(name);
        let meta = std::fs::metadata(&path).map_err(|e| PackError::io(&path, e))?;
        check_size(&path, meta.len(), entry.bytes)?;
    }
    Ok(())
}

fn check_size(path: &Path, len: u64, recorded: u64) -> Result<()> {
    if len < recorded {
        return Err(PackError::Truncated {
            file: path.to_path_buf(),
            what: "the file recorded in pack.toml".into(),
            needed: recorded,
            actual: len,
        });
    }
    if len != recorded {
        return Err(PackError::manifest(
            path,
            format!("file is {len} bytes but pack.toml records {recorded}"),
        ));
    }
    Ok(())
}

fn now_ns() -> i128 {
    let d = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    d.as_nanos() as i128
}

/// Streams a file through SHA-256, reporting bytes to `progress`.
pub fn sha256_file(path: &Path, progress: &dyn Progress) -> Result<String> {
    let mut f = std::fs::File::open(path).map_err(|e| PackError::io(path, e))?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf).map_err(|e| PackError::io(path, e))?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
        progress.inc(n as u64);
    }
    Ok(crate::safetensors::hex_digest(&hasher.finalize()))
}

/// A file's identity when it was hashed, and the digest it matched.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Stamp {
    dev: u64,
    ino: u64,
    size: u64,
    mtime_ns: i128,
    ctime_ns: i128,
    sha256: String,
}

impl Stamp {
    fn of(meta: &std::fs::Metadata, sha256: &str) -> Stamp {
        let ns = |s: i64, n: i64| s as i128 * 1_000_000_000 + n as i128;
        Stamp {
            dev: meta.dev(),
            ino: meta.ino(),
            size: meta.len(),
            mtime_ns: ns(meta.mtime(), meta.mtime_nsec()),
            ctime_ns: ns(meta.ctime(), meta.ctime_nsec()),
            sha256: sha256.to_owned(),
        }
    }
}

/// Files already hashed, keyed by absolute path; kept in a small JSON file.
/// An unreadable or corrupt cache file counts as empty (everything is hashed
/// again); it is never trusted beyond an exact [`Stamp`] match.
#[derive(Debug, Default)]
pub struct VerifiedCache {
    file: Option<PathBuf>,
    entries: BTreeMap<String, Stamp>,
    dirty: bool,
}

impl VerifiedCache {
    /// A cache that vouches for nothing and saves nothing.
    pub fn disabled() -> VerifiedCache {
        VerifiedCache::default()
    }

    /// Loads the cache kept in `file` (missing or unreadable: empty).
    pub fn load(file: &Path) -> VerifiedCache {
        let entries = std::fs::read(file)
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
            .unwrap_or_default();
        VerifiedCache { file: Some(file.to_path_buf()), entries, dirty: false }
    }

    fn key(path: &Path) -> String {
        std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf()).display().to_string()
    }

    fn vouches(&self, path: &Path, stamp: &Stamp) -> bool {
        self.file.is_some() && self.entries.get(&Self::key(path)) == Some(stamp)
    }

    fn record(&mut self, path: &Path, stamp: Stamp) {
        if self.file.is_some() {
            self.entries.insert(Self::key(path), stamp);
            self.dirty = true;
        }
    }

    /// Writes the cache back if it changed (atomically: a temporary file,
    /// then a rename), dropping entries of files that no longer exist. A cache that cannot be written costs time, not
    /// correctness: the caller may just log the error.
    pub fn save(&mut self) -> std::io::Result<()> {
        let Some(file) = self.file.as_ref().filter(|_| self.dirty) else { return Ok(()) };
        if let Some(parent) = file.parent() {
            std::fs::create_dir_all(parent)?;
        }
        self.entries.retain(|path, _| Path::new(path).exists());
        let tmp = file.with_extension(format!("tmp.{}", std::process::id()));
        std::fs::write(&tmp, serde_json::to_vec_pretty(&self.entries)?)?;
        std::fs::rename(&tmp, file)?;
        self.dirty = false;
        Ok(())
    }
}
