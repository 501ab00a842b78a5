//! Test vocabularies and helpers shared by the grammar tests.
#![allow(dead_code)]

use std::sync::Arc;

use kore_grammar::json::Value;
use kore_grammar::{Grammar, Matcher, Vocab};

/// Ids of the added tokens in the test vocabularies.
pub const TOOL_OPEN: u32 = 256;
pub const TOOL_CLOSE: u32 = 257;
pub const THINK_END: u32 = 258;
pub const END: u32 = 259;
pub const IM_START: u32 = 260;

/// Added tokens of the test vocabularies.
pub const ADDED: [(u32, &str); 5] = [
    (TOOL_OPEN, "<tool_call>"),
    (TOOL_CLOSE, "</tool_call>"),
    (THINK_END, "</think>"),
    (END, "<|im_end|>"),
    (IM_START, "<|im_start|>"),
];

/// Every single byte as a token (ids 0..256) plus the added tokens, then
/// `extra` multi-byte tokens from id 261 on.
pub fn vocab(extra: &[Vec<u8>]) -> Arc<Vocab> {
    let mut toks: Vec<(u32, Vec<u8>, bool)> =
        (0..256u32).map(|b| (b, vec![b as u8], false)).collect();
    toks.extend(ADDED.iter().map(|(id, t)| (*id, t.as_bytes().to_vec(), true)));
    let mut seen: std::collections::HashSet<Vec<u8>> = toks.iter().map(|t| t.1.clone()).collect();
    let mut id = 261;
    for e in extra {
        if e.len() > 1 && seen.insert(e.clone()) {
            toks.push((id, e.clone(), false));
            id += 1;
        }
    }
    let size = id as usize + 3; // a few ids no token has, as a model's padded vocabulary
    Arc::new(Vocab::new(size, toks.iter().map(|(i, b, a)| (*i, &b[..], *a))))
}

/// Splits text into tokens of `v` (added tokens by their text, else single
/// bytes) — the byte-level spelling.
pub fn byte_tokens(text: &str) -> Vec<u32> {
    let mut out = Vec::new();
    let mut rest = text;
    'outer: while !rest.is_empty() {
        for (id, t) in ADDED {
            if let Some(r) = rest.strip_prefix(t) {
                out.push(id);
                rest = r;
                continue 'outer;
            }
        }
        let c = rest.chars().next().unwrap();
        let mut buf = [0u8; 4];
        out.extend(c.encode_utf8(&mut buf).bytes().map(u32::from));
        rest = &rest[c.len_utf8()..];
    }
    out
}

/// Whether `g` accepts exactly `text` (spelled byte by byte, added tokens as
/// themselves) as a whole output.
pub fn accepts(g: &Arc<Grammar>, text: &str) -> bool {
    let v = vocab(&[]);
    let mut m = Matcher::new(g.clone(), v, &[END]).unwrap();
    for t in byte_tokens(text) {
        if m.accept(t).is_err() {
            return false;
        }
    }
    m.is_complete() && m.accept(END).is_ok()
}

/// A grammar for `schema` (JSON text) with default options.
pub fn schema(text: &str) -> Arc<Grammar> {
    let v = Value::parse(text).unwrap();
    Arc::new(Grammar::json_schema(&v, kore_grammar::Options::default()).unwrap())
}

/// xorshift64*.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    pub fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// The ids set in `mask`.
pub fn mask_ids(mask: &[u32]) -> Vec<u32> {
    let mut out = Vec::new();
    for (w, &bits) in mask.iter().enumerate() {
        for b in 0..32 {
            if bits >> b & 1 == 1 {
                out.push((w * 32 + b) as u32);
            }
        }
    }
    out
}

/// Generates one output by sampling uniformly among allowed tokens (an end
/// token with probability `p_end` when allowed), checking at every step that
/// the mask equals the token-by-token answer of `allows`. Returns the text
/// and whether it completed within `max` tokens.
pub fn random_walk(
    g: &Arc<Grammar>,
    v: &Arc<Vocab>,
    rng: &mut Rng,
    max: usize,
    check_mask: bool,
) -> (Vec<u8>, bool) {
    let mut m = Matcher::new(g.clone(), v.clone(), &[END]).unwrap();
    let mut mask = vec![0u32; v.mask_words()];
    let mut out = Vec::new();
    for _ in 0..max {
        m.fill_mask(&mut mask);
        let ids = mask_ids(&mask);
        if check_mask {
            for id in 0..v.size() as u32 {
                assert_eq!(
                    ids.binary_search(&id).is_ok(),
                    m.allows(id),
                    "token {id} after {:?}",
                    String::from_utf8_lossy(&out)
                );
            }
        }
        assert!(!ids.is_empty(), "dead end after {:?}", String::from_utf8_lossy(&out));
        let tok = if ids.contains(&END) && rng.below(100) < 30 {
            END
        } else {
            let others: Vec<u32> = ids.iter().copied().filter(|&i| i != END).collect();
            // Half the time prefer tokens that move the structure on.
            let structural: Vec<u32> = others
                .iter()
                .copied()
                .filter(|&i| {
                    i >= 256
                        || v.token_bytes(i)
                            .first()
                            .is_some_and(|b| b"\"{}[],:0123456789-tfn<\n".contains(b))
                })
                .collect();
            let specials: Vec<u32> =
                others.iter().copied().filter(|&i| (256..259).contains(&i)).collect();
            if others.is_empty() {
                END
            } else if !specials.is_empty() && rng.below(8) == 0 {
                specials[rng.below(specials.len())]
            } else if !structural.is_empty() && rng.below(2) == 0 {
                structural[rng.below(structural.len())]
            } else {
                others[rng.below(others.len())]
            }
        };
        m.accept(tok).unwrap();
        if tok == END {
            return (out, true);
        }
        match tok {
            TOOL_OPEN | TOOL_CLOSE | THINK_END => {
                out.extend(ADDED.iter().find(|a| a.0 == tok).unwrap().1.bytes())
            }
            _ => out.extend_from_slice(v.token_bytes(tok)),
        }
    }
    (out, false)
}
