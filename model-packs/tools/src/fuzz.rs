//! The fuzz body for pack loading: arbitrary bytes as a safetensors header, as a
//! `pack.toml`, or as a whole pack directory (`pack.toml` + `weights.safetensors` +
//! `tokenizer.json` cut from the input) that [`Pack::open`] and [`verify`] then read.
//! Used by the `pack_open`, `pack_toml` and `safetensors_header` cargo-fuzz targets (`fuzz/`) and by the plain test `tests/pack_fuzz.rs`,
//! which also feeds it truncated and mutated real packs.
//!
//! Whatever the input, loading must return (`Ok` or a typed error) without panicking.

use std::path::{Path, PathBuf};

use crate::pack::{verify, Pack};
use crate::progress::NoProgress;
use crate::safetensors::{parse_header, HeaderLimits};

/// Runs one case; the first byte picks the target.
pub fn run(data: &[u8]) {
    let Some((&sel, rest)) = data.split_first() else { return };
    match sel % 3 {
        0 => run_header(rest),
        1 => run_manifest(rest),
        _ => run_dir(rest),
    }
}

/// The bytes as a safetensors header (length prefix included).
pub fn run_header(data: &[u8]) {
    let _ = parse_header(data, HeaderLimits::default());
}

/// The bytes as `pack.toml` text (invalid UTF-8 replaced).
pub fn run_manifest(data: &[u8]) {
    let _ = crate::manifest::parse(Path::new("pack.toml"), &String::from_utf8_lossy(data));
}

/// The bytes as a whole pack: `pack.toml`, `weights.safetensors` and
/// `tokenizer.json`, separated by `0xff 0xfe`, written to a scratch directory.
pub fn run_dir(data: &[u8]) {
    let dir = case_dir();
    let files = split3(data);
    write_pack(&dir, files[0], files[1], files[2]);
    open_and_verify(&dir);
}

/// Opens and verifies the pack in `dir` (errors are the expected outcome).
pub fn open_and_verify(dir: &Path) {
    let _ = Pack::open(dir).map(|p| {
        // Touch every tensor's bytes through the typed accessors.
        for t in &p.weights().header().tensors {
            let _ = p.tensor(&t.name).map(|r| r.to_f32());
        }
        for m in p.manifest().quantization.modules.keys() {
            let _ = p.linear(m);
        }
    });
    let _ = verify(dir, &NoProgress);
}

/// Writes the three pack files into `dir`.
pub fn write_pack(dir: &Path, manifest: &[u8], weights: &[u8], tokenizer: &[u8]) {
    let _ = std::fs::create_dir_all(dir);
    for (name, bytes) in
        [("pack.toml", manifest), ("weights.safetensors", weights), ("tokenizer.json", tokenizer)]
    {
        std::fs::write(dir.join(name), bytes).expect("write a fuzz case file");
    }
}

/// Splits at the first two `0xff 0xfe` separators.
fn split3(b: &[u8]) -> [&[u8]; 3] {
    let mut parts = [&b[..0]; 3];
    let mut rest = b;
    for p in parts.iter_mut().take(2) {
        match rest.windows(2).position(|w| w == [0xff, 0xfe]) {
            Some(i) => {
                *p = &rest[..i];
                rest = &rest[i + 2..];
            }
            None => {
                *p = rest;
                rest = &rest[rest.len()..];
            }
        }
    }
    parts[2] = rest;
    parts
}

/// A per-process, per-thread scratch directory reused by every case.
fn case_dir() -> PathBuf {
    let t = format!("{:?}", std::thread::current().id());
    let t: String = t.chars().filter(char::is_ascii_digit).collect();
    std::env::temp_dir().join(format!("kore-pack-fuzz-{}-{t}", std::process::id()))
}
