//! Every defect of a pack fails `Pack::open` / `verify` with a typed error
//! naming the file (and tensor); nothing panics.

mod common;

use common::{temp_dir, tiny_config};
use kore_pack::pack::verify;
use kore_pack::{NoProgress, Pack, PackError};
use std::path::{Path, PathBuf};

fn fresh_pack(tag: &str) -> PathBuf {
    let dir = temp_dir(tag);
    kore_pack::synth::synth_config("bad-input", tiny_config(), &dir, 5, &NoProgress).unwrap();
    verify(&dir, &NoProgress).unwrap();
    dir
}

fn edit_manifest(dir: &Path, f: impl FnOnce(String) -> String) {
    let p = dir.join("pack.toml");
    let s = std::fs::read_to_string(&p).unwrap();
    std::fs::write(&p, f(s)).unwrap();
}

/// Rewrites the weights file's JSON header (same length, padded with spaces).
fn edit_header(dir: &Path, f: impl FnOnce(String) -> String) {
    let p = dir.join("weights.safetensors");
    let mut bytes = std::fs::read(&p).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header = String::from_utf8(bytes[8..8 + n].to_vec()).unwrap();
    let mut new = f(header.trim_end().to_string()).into_bytes();
    assert!(new.len() <= n, "edited header must not grow");
    new.resize(n, b' ');
    bytes[8..8 + n].copy_from_slice(&new);
    std::fs::write(&p, bytes).unwrap();
}

fn both(dir: &Path) -> (PackError, PackError) {
    (Pack::open(dir).unwrap_err(), verify(dir, &NoProgress).unwrap_err())
}

#[test]
fn truncated_weights() {
    let dir = fresh_pack("trunc");
    let p = dir.join("weights.safetensors");
    let len = std::fs::metadata(&p).unwrap().len();
    std::fs::OpenOptions::new().write(true).open(&p).unwrap().set_len(len - 100).unwrap();
    let (open, ver) = both(&dir);
    assert!(
        matches!(open, PackError::Truncated { ref what, .. } if what.contains("mtp.norm.weight")),
        "{open}"
    );
    assert!(matches!(ver, PackError::Truncated { .. }), "{ver}");
    assert!(ver.to_string().contains("weights.safetensors"));
}

#[test]
fn wrong_checksum() {
    let dir = fresh_pack("sha");
    let p = dir.join("weights.safetensors");
    let mut bytes = std::fs::read(&p).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0x55;
    std::fs::write(&p, bytes).unwrap();
    Pack::open(&dir).unwrap(); // structure is intact: only verify hashes
    let err = verify(&dir, &NoProgress).unwrap_err();
    assert!(
        matches!(err, PackError::Checksum { ref file, .. } if file.ends_with("weights.safetensors")),
        "{err}"
    );
    let tok = dir.join("tokenizer.json");
    let dir2 = fresh_pack("sha-tok");
    let mut t = std::fs::read(dir2.join("tokenizer.json")).unwrap();
    t[10] = b' ';
    std::fs::write(dir2.join("tokenizer.json"), t).unwrap();
    let err = verify(&dir2, &NoProgress).unwrap_err();
    assert!(
        matches!(err, PackError::Checksum { ref file, .. } if file.ends_with("tokenizer.json")),
        "{err}"
    );
    let _ = tok;
}

#[test]
fn newer_format_version() {
    let dir = fresh_pack("newer");
    edit_manifest(&dir, |s| s.replace("format_version = 1", "format_version = 2\n[future]\nx = 1"));
    let (open, ver) = both(&dir);
    assert!(matches!(open, PackError::NewerFormat { found: 2, supported: 1, .. }), "{open}");
    assert!(matches!(ver, PackError::NewerFormat { .. }));
    assert!(open.to_string().contains("pack.toml"));
}

#[test]
fn shape_disagrees_with_config() {
    let dir = fresh_pack("shape");
    // The config says intermediate 96; pretend it is 80 (tensors keep 96).
    edit_manifest(&dir, |s| s.replace("intermediate_size = 96", "intermediate_size = 80"));
    let (open, _) = both(&dir);
    assert!(
        matches!(open, PackError::ShapeMismatch { ref tensor, .. } if tensor == "model.layers.0.mlp.gate_proj.weight"),
        "{open}"
    );
}

#[test]
fn header_offsets_that_overlap() {
    let dir = fresh_pack("overlap");
    // Make model.norm.weight claim the bytes of the tensor before it.
    edit_header(&dir, |h| {
        let key = "\"model.norm.weight\":{\"dtype\":\"F32\",\"shape\":[64],\"data_offsets\":[";
        let i = h.find(key).unwrap() + key.len();
        let j = h[i..].find(']').unwrap() + i;
        let nums: Vec<u64> = h[i..j].split(',').map(|x| x.parse().unwrap()).collect();
        format!("{}{},{}{}", &h[..i], nums[0] - 64, nums[1] - 64, &h[j..])
    });
    let (open, ver) = both(&dir);
    assert!(matches!(open, PackError::Overlap { .. } | PackError::BadTensor { .. }), "{open}");
    assert!(
        open.to_string().contains("model.norm.weight")
            || open.to_string().contains("weights.safetensors")
    );
    assert!(
        !matches!(ver, PackError::Checksum { .. }),
        "structure errors come before checksums: {ver}"
    );
}

#[test]
fn header_offsets_beyond_the_file() {
    let dir = fresh_pack("beyond");
    edit_header(&dir, |h| {
        let key = "\"mtp.norm.weight\":{\"dtype\":\"F32\",\"shape\":[64],\"data_offsets\":[";
        let i = h.find(key).unwrap() + key.len();
        let j = h[i..].find(']').unwrap() + i;
        format!("{}9999999000,9999999256{}", &h[..i], &h[j..])
    });
    let open = Pack::open(&dir).unwrap_err();
    assert!(
        matches!(open, PackError::Truncated { ref what, .. } if what.contains("mtp.norm.weight")),
        "{open}"
    );
}

#[test]
fn missing_and_unexpected_tensors() {
    let dir = fresh_pack("missing");
    edit_header(&dir, |h| h.replace("\"model.norm.weight\"", "\"model.norm.weighX\""));
    let err = Pack::open(&dir).unwrap_err();
    assert!(
        matches!(err, PackError::MissingTensor { ref tensor, .. } if tensor == "model.norm.weight"),
        "{err}"
    );
    let dir = fresh_pack("unexpected");
    edit_manifest(&dir, |s| {
        s.replace("mtp_num_hidden_layers = 1", "mtp_num_hidden_layers = 0")
            .replace("mtp = true", "mtp = false")
    });
    let err = Pack::open(&dir).unwrap_err();
    assert!(
        matches!(err, PackError::UnexpectedTensor { .. } | PackError::BadManifest { .. }),
        "{err}"
    );
}

#[test]
fn quantization_table_must_match_the_tensors() {
    let dir = fresh_pack("quant");
    edit_manifest(&dir, |s| s.replace("\"model.layers.0.mlp.up_proj\" = \"nvfp4\"\n", ""));
    let err = Pack::open(&dir).unwrap_err();
    assert!(err.to_string().contains("model.layers.0.mlp.up_proj"), "{err}");
}

#[test]
fn malformed_manifest_and_missing_files() {
    let dir = fresh_pack("manifest");
    edit_manifest(&dir, |s| s.replace("alignment = 64", "alignment = 48"));
    assert!(matches!(Pack::open(&dir).unwrap_err(), PackError::BadManifest { .. }));
    let dir = fresh_pack("garbage");
    std::fs::write(dir.join("pack.toml"), "this is = = not toml").unwrap();
    assert!(matches!(Pack::open(&dir).unwrap_err(), PackError::BadManifest { .. }));
    let dir = fresh_pack("nofile");
    std::fs::remove_file(dir.join("weights.safetensors")).unwrap();
    assert!(matches!(Pack::open(&dir).unwrap_err(), PackError::Io { .. }));
    assert!(matches!(verify(&dir, &NoProgress).unwrap_err(), PackError::Io { .. }));
}

#[test]
fn failed_import_leaves_an_existing_pack_intact() {
    let dir = fresh_pack("intact");
    let before = std::fs::read(dir.join("weights.safetensors")).unwrap();
    let hf = temp_dir("hf-broken");
    common::write_hf_dir(&hf, &tiny_config(), 8);
    // Break the checkpoint: the config now disagrees with the tensors.
    let cfg = std::fs::read_to_string(hf.join("config.json"))
        .unwrap()
        .replace("\"hidden_size\": 64", "\"hidden_size\": 80");
    std::fs::write(hf.join("config.json"), cfg).unwrap();
    let err = kore_pack::import::import(&hf, &dir, &Default::default(), &NoProgress).unwrap_err();
    assert!(matches!(err, PackError::ShapeMismatch { .. }), "{err}");
    assert_eq!(std::fs::read(dir.join("weights.safetensors")).unwrap(), before);
    verify(&dir, &NoProgress).unwrap();
}
