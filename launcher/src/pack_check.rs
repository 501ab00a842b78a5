//! Before a pack is booted or loaded, its files must match pack.toml: sizes
//! and SHA-256 digests ([`kore_pack::integrity`]). Files hashed once are
//! remembered in `$XDG_CACHE_HOME/kore/verified-packs.json` (else
//! `~/.cache/kore/…`; `KORE_CACHE_DIR` overrides), so later boots hash only
//! what changed. Without a usable cache directory every boot hashes in full.

use std::path::{Path, PathBuf};

use kore_pack::integrity::{check_files_cached, VerifiedCache};

use crate::error::{LaunchError, Result};

/// File name of the cache inside the cache directory.
const CACHE_FILE: &str = "verified-packs.json";

/// Refuses the pack in `dir` unless every file pack.toml lists has the recorded
/// size and digest.
pub fn ensure_intact(dir: &Path) -> Result<()> {
    let manifest = kore_pack::manifest::load(dir).map_err(|e| LaunchError::Model(e.to_string()))?;
    let mut cache = cache_file(&crate::env::get)
        .map(|f| VerifiedCache::load(&f))
        .unwrap_or_else(VerifiedCache::disabled);
    let bar = crate::term::progress::Bar::default();
    let report = check_files_cached(dir, &manifest, &mut cache, &bar).map_err(|e| {
        LaunchError::Model(format!(
            "{e}. The pack does not match its pack.toml: copy or import it again \
             (`kore-launch pack verify {}` checks it in full)",
            dir.display()
        ))
    })?;
    tracing::info!(
        pack = %dir.display(),
        hashed_files = report.hashed_files,
        hashed_bytes = report.hashed_bytes,
        cached_files = report.cached_files,
        "pack files match pack.toml"
    );
    if let Err(e) = cache.save() {
        tracing::info!(
            "cannot save the verified-pack cache ({e}); the next boot hashes the pack again"
        );
    }
    Ok(())
}

/// The cache file: `KORE_CACHE_DIR`, `$XDG_CACHE_HOME/kore` or `~/.cache/kore`.
fn cache_file(env: &dyn Fn(&str) -> Option<String>) -> Option<PathBuf> {
    let dir = env("KORE_CACHE_DIR")
        .map(PathBuf::from)
        .or_else(|| env("XDG_CACHE_HOME").map(|d| Path::new(&d).join("kore")))
        .or_else(|| env("HOME").map(|h| Path::new(&h).join(".cache/kore")))?;
    Some(dir.join(CACHE_FILE))
}

#[cfg(test)]
mod tests {
    use super::cache_file;
    use std::path::PathBuf;

    fn lookup(pairs: &[(&str, &str)], k: &str) -> Option<String> {
        pairs.iter().find(|(n, _)| *n == k).map(|(_, v)| v.to_string())
    }

    #[test]
    fn the_cache_lives_where_the_environment_says() {
        let all = [("KORE_CACHE_DIR", "/c"), ("XDG_CACHE_HOME", "/x"), ("HOME", "/h")];
        let at = |from: usize| cache_file(&|k| lookup(&all[from..], k));
        assert_eq!(at(0), Some(PathBuf::from("/c/verified-packs.json")));
        assert_eq!(at(1), Some(PathBuf::from("/x/kore/verified-packs.json")));
        assert_eq!(at(2), Some(PathBuf::from("/h/.cache/kore/verified-packs.json")));
        assert_eq!(at(3), None);
    }
}
