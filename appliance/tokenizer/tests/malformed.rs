//! Bad tokenizer.json files give errors, never panics.

mod common;

use kore_tokenizer::{Tokenizer, TokenizerError};

fn small_json() -> Vec<u8> {
    std::fs::read(common::data_dir().join("small_tokenizer.json")).unwrap()
}

fn edit(f: impl FnOnce(&mut serde_json::Value)) -> Vec<u8> {
    let mut v: serde_json::Value = serde_json::from_slice(&small_json()).unwrap();
    f(&mut v);
    serde_json::to_vec(&v).unwrap()
}

#[test]
fn malformed_files_are_errors() {
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("empty", Vec::new()),
        ("not json", b"hello".to_vec()),
        ("not utf-8", vec![0xff, 0xfe, 0x00]),
        ("array", b"[]".to_vec()),
        ("no model", br#"{"added_tokens": []}"#.to_vec()),
        ("wordpiece", edit(|v| v["model"]["type"] = "WordPiece".into())),
        ("vocab not a map", edit(|v| v["model"]["vocab"] = serde_json::json!([1, 2]))),
        ("negative id", edit(|v| v["model"]["vocab"]["a"] = (-1).into())),
        ("huge id", edit(|v| v["model"]["vocab"]["a"] = 4_000_000_000u32.into())),
        ("duplicate id", edit(|v| v["model"]["vocab"]["b"] = v["model"]["vocab"]["a"].clone())),
        (
            "merge of unknown token",
            edit(|v| v["model"]["merges"][0] = serde_json::json!(["nope", "x"])),
        ),
        ("merge with three parts", edit(|v| v["model"]["merges"][0] = "a b c".into())),
        ("merge as number", edit(|v| v["model"]["merges"][0] = 5.into())),
        (
            "other regex",
            edit(|v| v["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "\\s+".into()),
        ),
        ("no pre-tokenizer", edit(|v| v["pre_tokenizer"] = serde_json::Value::Null)),
        ("other normalizer", edit(|v| v["normalizer"] = serde_json::json!({"type": "NFKC"}))),
        ("other decoder", edit(|v| v["decoder"] = serde_json::json!({"type": "WordPiece"}))),
        ("lstrip token", edit(|v| v["added_tokens"][0]["lstrip"] = true.into())),
        ("added id clash", edit(|v| v["added_tokens"][0]["id"] = v["model"]["vocab"]["a"].clone())),
        ("empty added", edit(|v| v["added_tokens"][0]["content"] = "".into())),
        ("empty vocab", edit(|v| v["model"]["vocab"] = serde_json::json!({}))),
    ];
    for (what, bytes) in cases {
        match Tokenizer::from_json(&bytes) {
            Ok(_) => panic!("{what}: accepted"),
            Err(e) => {
                let msg = e.to_string();
                assert!(!msg.is_empty() && !msg.contains('\n'), "{what}: {msg:?}");
            }
        }
    }
}

#[test]
fn truncated_and_corrupted_files_do_not_panic() {
    let good = small_json();
    assert!(Tokenizer::from_json(&good).is_ok());
    let step = good.len() / 300 + 1;
    for cut in (0..good.len()).step_by(step) {
        assert!(Tokenizer::from_json(&good[..cut]).is_err(), "truncated at {cut} accepted");
    }
    let mut seed = 7u64;
    for _ in 0..300 {
        let mut bad = good.clone();
        for _ in 0..3 {
            seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            let at = (seed >> 20) as usize % bad.len();
            bad[at] = (seed >> 12) as u8;
        }
        // Any outcome but a panic is fine; if it loads, it must tokenize.
        if let Ok(tok) = Tokenizer::from_json(&bad) {
            let ids = tok.encode("Hello <|im_end|> world 中文 👍");
            let _ = tok.decode(&ids);
        }
    }
}

#[test]
fn missing_file_is_an_io_error() {
    match Tokenizer::from_file("/nonexistent/tokenizer.json") {
        Err(TokenizerError::Io(m)) => assert!(m.contains("/nonexistent/tokenizer.json")),
        other => panic!("{other:?}"),
    }
}
