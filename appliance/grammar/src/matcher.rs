//! [`Matcher`]: one sequence's constraint state over a [`Vocab`]: which tokens
//! may come next (a bitmask), advancing by the sampled token, and whether the
//! output may end.
//!
//! The mask is the union over the matcher's threads. A thread in a bulk
//! lexical state (inside a string, raw text or free text) takes the
//! precomputed tokens that stay inside, walks the tokens whose first byte is
//! an exit with its own state, and walks the small trie of tokens that exit
//! later with the state every one of them has at its exit. Raw or free text
//! in the middle of a `</parameter>` / `<tool_call>` match is the bulk state
//! with the tokens that continue the match walked separately. Any other
//! state walks the vocabulary trie, cut wherever a byte is refused.

use alloc::sync::Arc;
use alloc::vec::Vec;
use core::fmt;

use crate::frame::{accepting, s, step, tag, text, Special, Sym, Thread};
use crate::grammar::Grammar;
use crate::vocab::{Bulk, Lexer, TokTrie, Vocab};
use crate::GrammarError;

/// The sampled token was not allowed (a caller bug: sample from the mask).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rejected(pub u32);

impl fmt::Display for Rejected {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "token {} is not allowed by the constraint here", self.0)
    }
}

/// One sequence's constraint state.
#[derive(Clone)]
pub struct Matcher {
    g: Arc<Grammar>,
    v: Arc<Vocab>,
    ends: Vec<u32>,
    threads: Vec<Thread>,
    /// Thread buffers per trie depth, kept between masks.
    levels: Vec<Vec<Thread>>,
}

impl fmt::Debug for Matcher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Matcher").field("threads", &self.threads.len()).finish_non_exhaustive()
    }
}

fn set(mask: &mut [u32], id: u32) {
    if let Some(w) = mask.get_mut(id as usize / 32) {
        *w |= 1 << (id % 32);
    }
}

fn clear(mask: &mut [u32], id: u32) {
    if let Some(w) = mask.get_mut(id as usize / 32) {
        *w &= !(1 << (id % 32));
    }
}

/// Whether bit `id` of `mask` is set.
pub fn mask_allows(mask: &[u32], id: u32) -> bool {
    mask.get(id as usize / 32).is_some_and(|w| w >> (id % 32) & 1 == 1)
}

impl Matcher {
    /// A matcher at the start of `g`'s output; `ends` are the end-of-output
    /// tokens (allowed exactly where the output is complete).
    pub fn new(g: Arc<Grammar>, v: Arc<Vocab>, ends: &[u32]) -> Result<Matcher, GrammarError> {
        if g.tool_set().is_some() {
            for (k, name) in
                [(Special::ToolOpen, "<tool_call>"), (Special::ToolClose, "</tool_call>")]
            {
                if v.special_id(k).is_none() {
                    return Err(GrammarError::Vocabulary(alloc::format!(
                        "no {name} added token (tool calls need Qwen3.5's vocabulary)"
                    )));
                }
            }
        }
        if g.options().think && v.special_id(Special::ThinkEnd).is_none() {
            return Err(GrammarError::Vocabulary(alloc::string::String::from(
                "no </think> added token (thinking needs Qwen3.5's vocabulary)",
            )));
        }
        let threads = alloc::vec![Thread::initial(&g)];
        Ok(Matcher { g, v, ends: ends.to_vec(), threads, levels: Vec::new() })
    }

    /// The vocabulary.
    pub fn vocab(&self) -> &Vocab {
        &self.v
    }

    /// Whether the output may end here (the end tokens are allowed).
    pub fn is_complete(&self) -> bool {
        self.threads.iter().any(|t| accepting(&self.g, t))
    }

    fn sym(&self, token: u32) -> Option<Sym> {
        if let Some(k) = self.v.special(token) {
            return Some(Sym::Special(k));
        }
        None
    }

    /// Advances `threads` by the bytes of `token`; empty when refused.
    fn advance(&self, threads: &[Thread], token: u32) -> Vec<Thread> {
        let mut cur: Vec<Thread> = threads.to_vec();
        let mut next = Vec::new();
        let syms: Vec<Sym> = match self.sym(token) {
            Some(sym) => alloc::vec![sym],
            None => self.v.token_bytes(token).iter().map(|&b| Sym::Byte(b)).collect(),
        };
        if syms.is_empty() {
            return Vec::new();
        }
        for sym in syms {
            next.clear();
            for t in &cur {
                step(&self.g, t, sym, &mut next);
            }
            dedup(&mut next);
            core::mem::swap(&mut cur, &mut next);
            if cur.is_empty() {
                break;
            }
        }
        cur
    }

    /// Whether `token` may come next (the fast path: check the sampled or
    /// best token before computing a whole mask).
    pub fn allows(&self, token: u32) -> bool {
        if self.ends.contains(&token) {
            return self.is_complete();
        }
        !self.advance(&self.threads, token).is_empty()
    }

    /// Takes `token` (an end token is taken where the output is complete).
    pub fn accept(&mut self, token: u32) -> Result<(), Rejected> {
        if self.ends.contains(&token) {
            return if self.is_complete() { Ok(()) } else { Err(Rejected(token)) };
        }
        let next = self.advance(&self.threads, token);
        if next.is_empty() {
            return Err(Rejected(token));
        }
        self.threads = next;
        Ok(())
    }

    /// Writes the allowed tokens into `mask` (bit `id % 32` of word `id / 32`;
    /// at least [`Vocab::mask_words`] words; other bits are cleared).
    pub fn fill_mask(&mut self, mask: &mut [u32]) {
        mask.iter_mut().for_each(|w| *w = 0);
        let threads = core::mem::take(&mut self.threads);
        for t in &threads {
            self.thread_mask(t, mask);
        }
        if threads.iter().any(|t| accepting(&self.g, t)) {
            self.ends.iter().for_each(|&e| set(mask, e));
        }
        self.threads = threads;
    }

    fn thread_mask(&mut self, t: &Thread, mask: &mut [u32]) {
        for k in [Special::ToolOpen, Special::ToolClose, Special::ThinkEnd] {
            if let Some(id) = self.v.special_id(k) {
                let mut out = Vec::new();
                step(&self.g, t, Sym::Special(k), &mut out);
                if !out.is_empty() {
                    set(mask, id);
                }
            }
        }
        let v = self.v.clone();
        match bulk_state(t) {
            Some((lx, u, 0)) => self.bulk_mask(&v, t, lx, u, mask),
            Some((lx, _, k)) => {
                // Mid-pattern: tokens not continuing it act as from the reset state.
                let pattern: &[u8] =
                    if lx == Lexer::Raw { b"</parameter>" } else { b"<tool_call>" };
                let reset = t.normalized();
                self.bulk_mask(&v, &reset, lx, 0, mask);
                if let Some(n) = v.trie.child(0, pattern[k as usize]) {
                    v.trie.for_each_token(n, &mut |id| clear(mask, id));
                    self.walk_one(&v.trie, n, pattern[k as usize], t, mask);
                }
            }
            None => self.walk(&v.trie, 0, core::slice::from_ref(t), mask),
        }
    }

    fn bulk_mask(&mut self, v: &Vocab, t: &Thread, lx: Lexer, u: u8, mask: &mut [u32]) {
        let table: &Bulk = &v.bulk[lx as usize][u as usize];
        for (w, m) in mask.iter_mut().zip(&table.inside) {
            *w |= m;
        }
        if u == 0 {
            for &e in lx.exit_bytes() {
                if let Some(n) = v.trie.child(0, e) {
                    self.walk_one(&v.trie, n, e, t, mask);
                }
            }
        }
        let norm = t.normalized();
        self.walk(&table.exits, 0, core::slice::from_ref(&norm), mask);
    }

    /// Walks the subtree of `node` (reached by byte `b` from the root) from `t`.
    fn walk_one(&mut self, trie: &TokTrie, node: u32, b: u8, t: &Thread, mask: &mut [u32]) {
        let mut next = Vec::new();
        step(&self.g, t, Sym::Byte(b), &mut next);
        if next.is_empty() {
            return;
        }
        trie.tokens(node).iter().for_each(|&id| set(mask, id));
        self.walk(trie, node, &next, mask);
    }

    /// Marks every token below `node` that `threads` accept.
    fn walk(&mut self, trie: &TokTrie, node: u32, threads: &[Thread], mask: &mut [u32]) {
        if self.levels.is_empty() {
            self.levels.push(Vec::new());
        }
        self.levels[0].clear();
        self.levels[0].extend_from_slice(threads);
        walk_rec(&self.g, trie, node, &mut self.levels, 0, mask);
    }
}

fn walk_rec(
    g: &Grammar,
    trie: &TokTrie,
    node: u32,
    levels: &mut Vec<Vec<Thread>>,
    d: usize,
    mask: &mut [u32],
) {
    if levels.len() <= d + 1 {
        levels.push(Vec::new());
    }
    let (bytes, nodes) = trie.children(node);
    for (&b, &child) in bytes.iter().zip(nodes) {
        let (lo, hi) = levels.split_at_mut(d + 1);
        let next = &mut hi[0];
        next.clear();
        for t in &lo[d] {
            step(g, t, Sym::Byte(b), next);
        }
        if next.is_empty() {
            continue;
        }
        trie.tokens(child).iter().for_each(|&id| set(mask, id));
        walk_rec(g, trie, child, levels, d + 1, mask);
    }
}

/// The bulk lexer, its UTF-8 state (0: between characters) and pattern
/// progress of a thread's top frame, if it is in one.
fn bulk_state(t: &Thread) -> Option<(Lexer, u8, u8)> {
    let f = t.top();
    let in_utf8 = (s::C..=s::F4).contains(&f.st);
    match f.tag {
        tag::STR if in_utf8 => Some((Lexer::Str, f.st - s::C, 0)),
        tag::KEY if in_utf8 && f.b == u32::MAX && f.x == 1 => Some((Lexer::Str, f.st - s::C, 0)),
        tag::TEXT => match f.x {
            text::THINK => Some((Lexer::Think, 0, 0)),
            text::FREE => Some((Lexer::Free, 0, f.ws)),
            _ if in_utf8 => Some((Lexer::Raw, f.st - s::C, f.ws)),
            _ => None,
        },
        _ => None,
    }
}

fn dedup(v: &mut Vec<Thread>) {
    if v.len() < 2 {
        return;
    }
    let mut i = 1;
    while i < v.len() {
        if v[..i].contains(&v[i]) {
            v.swap_remove(i);
        } else {
            i += 1;
        }
    }
}
