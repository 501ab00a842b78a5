//! A pack's files against the sizes and digests its pack.toml records, and the
//! cache that lets a boot skip hashing files that did not change.

mod common;

use common::{temp_dir, tiny_config};
use kore_pack::integrity::{check_files, check_files_cached, CheckReport, VerifiedCache, RACY_NS};
use kore_pack::{manifest, NoProgress, PackError};
use std::path::{Path, PathBuf};

fn fresh_pack(tag: &str) -> PathBuf {
    let dir = temp_dir(tag);
    kore_pack::synth::synth_config("integrity", tiny_config(), &dir, 7, &NoProgress).unwrap();
    dir
}

/// Waits until the pack's files are older than the cache's racy window.
fn let_files_age() {
    std::thread::sleep(std::time::Duration::from_nanos(RACY_NS as u64 + 100_000_000));
}

fn check(dir: &Path, cache: &mut VerifiedCache) -> Result<CheckReport, PackError> {
    let m = manifest::load(dir).unwrap();
    check_files_cached(dir, &m, cache, &NoProgress)
}

/// Flips one byte of the weights' data (the size stays the same).
fn flip_last_byte(dir: &Path) {
    let p = dir.join("weights.safetensors");
    let mut bytes = std::fs::read(&p).unwrap();
    *bytes.last_mut().unwrap() ^= 0x40;
    std::fs::write(&p, bytes).unwrap();
}

#[test]
fn an_intact_pack_passes_and_every_file_is_hashed() {
    let dir = fresh_pack("ok");
    let m = manifest::load(&dir).unwrap();
    let r = check_files(&dir, &m, &NoProgress).unwrap();
    assert_eq!(r.hashed_files, m.files.len());
    assert_eq!(r.hashed_bytes, m.files.values().map(|f| f.bytes).sum::<u64>());
    assert_eq!(r.cached_files, 0);
}

#[test]
fn one_changed_byte_is_refused_with_both_digests() {
    let dir = fresh_pack("flip");
    flip_last_byte(&dir);
    let e = check(&dir, &mut VerifiedCache::disabled()).unwrap_err();
    match &e {
        PackError::Checksum { file, expected, actual } => {
            assert!(file.ends_with("weights.safetensors"));
            assert_ne!(expected, actual);
        }
        other => panic!("expected a checksum error, got {other}"),
    }
}

#[test]
fn a_size_mismatch_is_refused_before_hashing() {
    let dir = fresh_pack("size");
    let p = dir.join("tokenizer.json");
    let mut f = std::fs::OpenOptions::new().append(true).open(&p).unwrap();
    std::io::Write::write_all(&mut f, b" ").unwrap();
    let e = check(&dir, &mut VerifiedCache::disabled()).unwrap_err();
    assert!(e.to_string().contains("pack.toml records"), "{e}");
}

#[test]
fn the_cache_skips_unchanged_files_and_never_vouches_for_changed_ones() {
    let dir = fresh_pack("cache");
    let cache_file = dir.join("cache/verified.json");
    let files = manifest::load(&dir).unwrap().files.len();
    let_files_age();

    let mut cache = VerifiedCache::load(&cache_file);
    assert_eq!(check(&dir, &mut cache).unwrap().hashed_files, files);
    cache.save().unwrap();

    let mut cache = VerifiedCache::load(&cache_file);
    let again = check(&dir, &mut cache).unwrap();
    assert_eq!((again.hashed_files, again.cached_files), (0, files));

    // Same size, new content: the stamp no longer matches, so it is hashed and refused.
    flip_last_byte(&dir);
    let mut cache = VerifiedCache::load(&cache_file);
    assert!(matches!(check(&dir, &mut cache), Err(PackError::Checksum { .. })));
    // Restored, it is hashed again but not recorded: it changed too recently.
    flip_last_byte(&dir);
    let mut cache = VerifiedCache::load(&cache_file);
    assert_eq!(check(&dir, &mut cache).unwrap().hashed_files, 1);
    cache.save().unwrap();
    let mut cache = VerifiedCache::load(&cache_file);
    assert_eq!(check(&dir, &mut cache).unwrap().hashed_files, 1);
}

#[test]
fn a_corrupt_cache_file_counts_as_empty() {
    let dir = fresh_pack("corrupt");
    let_files_age();
    let cache_file = dir.join("verified.json");
    std::fs::write(&cache_file, b"{not json").unwrap();
    let mut cache = VerifiedCache::load(&cache_file);
    let r = check(&dir, &mut cache).unwrap();
    assert_eq!(r.cached_files, 0);
    cache.save().unwrap();
    let mut cache = VerifiedCache::load(&cache_file);
    assert_eq!(check(&dir, &mut cache).unwrap().hashed_files, 0);
}
