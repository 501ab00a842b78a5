//! The fuzz body for the tokenizer: arbitrary bytes as a `tokenizer.json`, as
//! text to encode, or as token ids to decode (all at once and streamed). Used
//! by the `tokenizer` cargo-fuzz target (`fuzz/`) and by a plain test.
//!
//! Invariants: nothing panics; every id `encode` returns is inside the
//! vocabulary; decoding ids `encode` made gives valid UTF-8 text (it is a
//! `String`), and streaming decode yields the same text as decoding at once.

use alloc::string::String;
use alloc::vec::Vec;

use crate::{StreamDecoder, Tokenizer};

/// Runs one case against `tok` (a real tokenizer the caller loaded once).
/// The first byte selects: 0 parses the rest as `tokenizer.json`, 1 decodes
/// the rest as little-endian `u32` ids, anything else encodes the rest as
/// text (invalid UTF-8 replaced).
pub fn run(tok: &Tokenizer, data: &[u8]) {
    let Some((&mode, rest)) = data.split_first() else { return };
    match mode {
        0 => {
            let _ = Tokenizer::from_json(rest);
        }
        1 => {
            let ids: Vec<u32> = rest
                .chunks_exact(4)
                .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect();
            let _ = tok.decode(&ids);
            let _ = streamed(tok, &ids);
        }
        _ => {
            let text = String::from_utf8_lossy(rest);
            let ids = tok.encode(&text);
            let vocab = tok.vocab_size() as u32;
            assert!(
                ids.iter().all(|&id| id < vocab),
                "encode produced an id outside the vocabulary"
            );
            assert_eq!(streamed(tok, &ids), tok.decode(&ids), "streamed decode differs");
            let _ = tok.encode_ordinary(&text);
        }
    }
}

fn streamed(tok: &Tokenizer, ids: &[u32]) -> String {
    let mut dec = StreamDecoder::new(tok);
    let mut out = String::new();
    for &id in ids {
        out.extend(dec.push(id));
    }
    out.extend(dec.finish());
    out
}
