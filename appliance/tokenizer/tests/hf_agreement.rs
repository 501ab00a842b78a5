//! Exact agreement with Hugging Face `tokenizers` on the committed corpus
//! (fixtures made by scripts/tokenizer/gen_fixtures.py), round trips and streaming,
//! for the small committed tokenizers (the real Qwen3.5 one: tests/qwen35.rs).

mod common;

use common::{check_corpus, check_round_trip_and_stream, load};
use kore_tokenizer::StreamDecoder;

#[test]
fn small_tokenizer_matches_hf() {
    check_corpus(&load("small_tokenizer.json"), "expected_small.json");
}

#[test]
fn small_tokenizer_with_ignore_merges_matches_hf() {
    check_corpus(&load("small_ignore_merges_tokenizer.json"), "expected_small_ignore_merges.json");
}

#[test]
fn round_trips_and_streams() {
    check_round_trip_and_stream(&load("small_tokenizer.json"), Some("café"));
}

/// The small fixture's added token `café` is not byte-level; its `é` is also the
/// byte-level character for byte 0xE9, so the reference ByteLevel decoder (and
/// this one) turn it into that lone byte: U+FFFD. HF gives 'Decomposed caf\u{fffd} vs'.
#[test]
fn small_tokenizer_decodes_latin1_added_tokens_like_hf() {
    let tok = load("small_tokenizer.json");
    let ids = tok.encode("Decomposed cafe\u{301} vs");
    assert_eq!(tok.decode(&ids), "Decomposed caf\u{fffd} vs");
}

#[test]
fn stream_decoder_holds_back_split_characters() {
    let tok = load("small_tokenizer.json");
    // A rare CJK character is not in the small vocabulary: three byte tokens.
    let ids = tok.encode("\u{4e2d}");
    assert_eq!(ids.len(), 3, "{ids:?}");
    let mut s = StreamDecoder::new(&tok);
    assert_eq!(s.push(ids[0]), None);
    assert_eq!(s.push(ids[1]), None);
    assert_eq!(s.pending().len(), 2);
    assert_eq!(s.push(ids[2]).as_deref(), Some("\u{4e2d}"));
    // A cut character at the end comes out as one replacement character, like decode.
    let mut s = StreamDecoder::new(&tok);
    let emoji = tok.encode("a😀");
    for &id in &emoji[..emoji.len() - 1] {
        s.push(id);
    }
    assert_eq!(s.finish().as_deref(), Some("\u{fffd}"));
    assert_eq!(tok.decode(&emoji[..emoji.len() - 1]), "a\u{fffd}");
    // An invalid byte in the middle does not stall the stream.
    let lone = tok.encode("😀")[0];
    let mut s = StreamDecoder::new(&tok);
    assert_eq!(s.push(lone), None);
    assert_eq!(s.push(tok.encode("x")[0]).as_deref(), Some("\u{fffd}x"));
}

#[test]
fn normalized_added_token_matches_after_nfc() {
    let tok = load("small_tokenizer.json");
    let cafe = tok.token_to_id("café").expect("fixture has café");
    assert_eq!(tok.encode("cafe\u{301}"), [cafe]);
    assert!(!tok.encode_ordinary("café").contains(&cafe));
}
