//! The fuzz body for checkpoint files ([`super::file`]): used by the
//! `checkpoint_file` cargo-fuzz target (`fuzz/`) and by a plain test.
//!
//! Invariants: nothing panics and nothing is allocated for sizes the input
//! does not hold; a file [`decode`] accepts re-encodes to the very same
//! bytes, and [`peek_tokens`] agrees with it.

use alloc::vec::Vec;

use super::file::{decode, encode_to_vec, peek_tokens, Identity};
use super::{Fixed, KvSpan, Shape};
use crate::state::KvPrecision;

/// The small shape the fuzz cases use (2 layers: one DeltaNet, one attention).
pub const SHAPE: Shape = Shape { layers: 2, attention_layers: 1, kv_row: 4, fixed_floats: 6 };

/// Runs one case. The first byte selects: 0 decodes the rest as a file
/// (f32 KV), 1 as a file with f16 KV, anything else builds a valid file
/// from the rest (tokens and floats), damages it as the first bytes say,
/// and decodes that.
pub fn run(data: &[u8]) {
    let Some((&mode, rest)) = data.split_first() else { return };
    let kv = if mode == 1 { KvPrecision::F16 } else { KvPrecision::F32 };
    let id = Identity { pack: [0x5a; 32], shape: SHAPE, kv };
    if mode <= 1 {
        return check(rest, &id);
    }
    let Some((&n, body)) = rest.split_first() else { return };
    let n = usize::from(n % 16);
    let word = |i: usize| body.get(i % body.len().max(1)).copied().unwrap_or(0);
    let tokens: Vec<u32> = (0..n).map(|i| u32::from(word(i))).collect();
    let floats = |len: usize, salt: usize| -> Vec<f32> {
        (0..len).map(|i| f32::from(word(i + salt)) - 128.0).collect()
    };
    let fixed = Fixed::from_parts(n, floats(SHAPE.fixed_floats, 7));
    let rows = n * SHAPE.kv_row;
    let layer = (crate::state::Kv::F32(floats(rows, 3)), crate::state::Kv::F32(floats(rows, 5)));
    let span = KvSpan::from_parts(0, n, alloc::vec![layer]);
    let mut bytes = encode_to_vec(&id, &tokens, &[&span], &fixed);
    assert!(decode(&bytes, &id).is_ok(), "a freshly encoded file is refused");
    let (flip, cut) = (usize::from(word(1)) * 7, usize::from(word(2)));
    if mode & 2 != 0 && !bytes.is_empty() {
        let at = flip % bytes.len();
        bytes[at] ^= 1 << (mode % 8);
    }
    if mode & 4 != 0 {
        bytes.truncate(bytes.len().saturating_sub(cut));
    }
    check(&bytes, &id);
}

fn check(bytes: &[u8], id: &Identity) {
    let peeked = peek_tokens(bytes, id);
    let Ok(d) = decode(bytes, id) else { return };
    assert_eq!(peeked.as_ref(), Ok(&d.tokens), "peek disagrees with decode");
    let again = encode_to_vec(id, &d.tokens, &[&d.kv], &d.fixed);
    assert_eq!(again, bytes, "an accepted file does not re-encode to itself");
}

#[cfg(test)]
mod tests {
    #[test]
    fn fuzz_body_runs_on_simple_cases() {
        for mode in 0..8u8 {
            for n in [0u8, 1, 3, 15] {
                super::run(&[mode, n, 1, 2, 3, 200, 9, 9, 9]);
            }
        }
        super::run(b"\x00KORECKPT\x01\x00\x00\x00");
    }
}
