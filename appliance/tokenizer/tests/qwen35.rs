//! The real Qwen3.5 tokenizer against Hugging Face `tokenizers` (corpus ids,
//! round trips, special ids). Its tokenizer.json is generated, not committed
//! (scripts/tokenizer/make_qwen_tokenizer.sh, Python), so this suite needs the
//! `qwen35-reference` feature: scripts/test.sh runs it; plain `cargo test` does not build it.

mod common;

use common::{check_corpus, check_round_trip_and_stream, load_qwen35};

#[test]
fn qwen35_matches_hf() {
    check_corpus(&load_qwen35(), "expected_qwen35.json");
}

#[test]
fn qwen35_round_trips_and_streams() {
    check_round_trip_and_stream(&load_qwen35(), None);
}

#[test]
fn qwen35_special_ids() {
    let tok = load_qwen35();
    for (t, id) in [
        ("<|endoftext|>", 248044),
        ("<|im_start|>", 248045),
        ("<|im_end|>", 248046),
        ("<think>", 248068),
        ("</think>", 248069),
        ("<|audio_pad|>", 248076),
    ] {
        assert_eq!(tok.token_to_id(t), Some(id), "{t}");
        assert_eq!(tok.id_to_token(id), Some(t));
    }
    assert!(tok.is_special(248046));
    assert!(!tok.is_special(248068), "<think> is an added, non-special token in Qwen's files");
    assert_eq!(tok.vocab_size(), 248077);
    assert_eq!(tok.encode("<|im_end|>"), [248046]);
    assert_ne!(tok.encode_ordinary("<|im_end|>"), [248046]);
    assert!(!tok.encode_ordinary("<|im_end|><think>").iter().any(|&id| id >= 248044));
    assert_eq!(tok.decode_with(&tok.encode("a<|im_end|>b"), true), "ab");
    assert!(tok.try_decode(&[248077]).is_err());
    assert_eq!(tok.decode(&[248077, 64]), tok.decode(&[64]));
}
