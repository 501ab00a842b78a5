//! The vocabulary as the matcher sees it: every ordinary token's bytes in a
//! trie, the added tokens the grammars give meaning to (`<tool_call>`,
//! `</tool_call>`, `</think>`), and per-lexer tables that make the mask cheap
//! where almost everything is allowed (inside a string or free text).
//!
//! A bulk lexer (JSON string content, raw parameter text, free text) changes
//! nothing in a thread but its top frame's lexical state until an exit byte
//! (`"`/`\` in a string, `<`/newline in raw text, `<` in free text). For each
//! lexer and start state the table holds the tokens that stay inside (a
//! bitmask) and a trie of the tokens that exit after their first byte, keyed
//! by the bytes from the exit on: the thread at the exit is the same for all
//! of them, so one walk of that small trie decides them all.

use alloc::vec::Vec;

use crate::frame::{s, utf8, Special};

/// A byte trie over tokens, children flattened; several tokens may end at
/// one node (the exit tables key tokens by a suffix).
#[derive(Debug, Clone, Default)]
pub(crate) struct TokTrie {
    /// Per node: start of its children in `child_bytes`/`child_nodes`.
    child_start: Vec<u32>,
    child_bytes: Vec<u8>,
    child_nodes: Vec<u32>,
    /// Per node: start of the tokens ending there in `toks`.
    tok_start: Vec<u32>,
    toks: Vec<u32>,
}

impl TokTrie {
    /// A trie of `(bytes, token)`.
    fn build(mut entries: Vec<(&[u8], u32)>) -> TokTrie {
        entries.sort_unstable();
        let mut children: Vec<Vec<(u8, u32)>> = alloc::vec![Vec::new()];
        let mut ends: Vec<Vec<u32>> = alloc::vec![Vec::new()];
        for (bytes, id) in entries {
            let mut at = 0usize;
            for &b in bytes {
                // Sorted input: a shared prefix is always the last child.
                at = match children[at].last() {
                    Some(&(lb, n)) if lb == b => n as usize,
                    _ => {
                        let n = ends.len();
                        children.push(Vec::new());
                        ends.push(Vec::new());
                        children[at].push((b, n as u32));
                        n
                    }
                };
            }
            ends[at].push(id);
        }
        let mut t = TokTrie::default();
        for (c, e) in children.iter().zip(&ends) {
            t.child_start.push(t.child_bytes.len() as u32);
            t.child_bytes.extend(c.iter().map(|x| x.0));
            t.child_nodes.extend(c.iter().map(|x| x.1));
            t.tok_start.push(t.toks.len() as u32);
            t.toks.extend_from_slice(e);
        }
        t.child_start.push(t.child_bytes.len() as u32);
        t.tok_start.push(t.toks.len() as u32);
        t
    }

    /// The children of `node`: `(bytes, nodes)`.
    #[inline]
    pub(crate) fn children(&self, node: u32) -> (&[u8], &[u32]) {
        let a = self.child_start[node as usize] as usize;
        let b = self.child_start[node as usize + 1] as usize;
        (&self.child_bytes[a..b], &self.child_nodes[a..b])
    }

    /// The tokens ending at `node`.
    #[inline]
    pub(crate) fn tokens(&self, node: u32) -> &[u32] {
        let a = self.tok_start[node as usize] as usize;
        let b = self.tok_start[node as usize + 1] as usize;
        &self.toks[a..b]
    }

    /// The child of `node` by `c`.
    pub(crate) fn child(&self, node: u32, c: u8) -> Option<u32> {
        let (bs, ns) = self.children(node);
        bs.iter().position(|&x| x == c).map(|k| ns[k])
    }

    /// Calls `f` for every token in the subtree of `node`.
    pub(crate) fn for_each_token(&self, node: u32, f: &mut impl FnMut(u32)) {
        self.tokens(node).iter().for_each(|&t| f(t));
        let (_, nodes) = self.children(node);
        for &n in nodes {
            self.for_each_token(n, f);
        }
    }

    /// Nodes in the trie.
    pub(crate) fn len(&self) -> usize {
        self.tok_start.len() - 1
    }
}

/// The bulk lexers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Lexer {
    /// JSON string content: exits at `"` and `\`, no control bytes, UTF-8.
    Str = 0,
    /// Raw parameter text: exits at `<` and newline, UTF-8.
    Raw = 1,
    /// Free text before tool calls: exits at `<`.
    Free = 2,
    /// Reasoning: no exits.
    Think = 3,
}

impl Lexer {
    fn exits(self, c: u8) -> bool {
        match self {
            Lexer::Str => c == b'"' || c == b'\\',
            Lexer::Raw => c == b'<' || c == b'\n',
            Lexer::Free => c == b'<',
            Lexer::Think => false,
        }
    }

    /// UTF-8 states it has (1 for byte lexers).
    fn states(self) -> u8 {
        match self {
            Lexer::Str | Lexer::Raw => 8,
            _ => 1,
        }
    }

    /// The exit bytes.
    pub(crate) fn exit_bytes(self) -> &'static [u8] {
        match self {
            Lexer::Str => b"\"\\",
            Lexer::Raw => b"<\n",
            Lexer::Free => b"<",
            Lexer::Think => b"",
        }
    }
}

/// Where a token leaves a lexer started in a state.
enum Class {
    Inside,
    ExitAt(usize),
    Invalid,
}

fn classify(lx: Lexer, start: u8, bytes: &[u8]) -> Class {
    let mut st = start;
    for (i, &c) in bytes.iter().enumerate() {
        if st == s::C && lx.exits(c) {
            return Class::ExitAt(i);
        }
        let next = match lx {
            Lexer::Str if st == s::C && c < 0x20 => None,
            Lexer::Str | Lexer::Raw => utf8(st, c),
            _ => Some(s::C),
        };
        match next {
            Some(n) => st = n,
            None => return Class::Invalid,
        }
    }
    Class::Inside
}

/// One lexer in one start state.
#[derive(Debug, Clone, Default)]
pub(crate) struct Bulk {
    /// Tokens that stay inside, as bitmask words.
    pub inside: Vec<u32>,
    /// Tokens that exit after their first byte, keyed from the exit byte on.
    pub exits: TokTrie,
}

/// The vocabulary, built once per model and shared by every matcher.
#[derive(Debug, Clone)]
pub struct Vocab {
    size: usize,
    pub(crate) trie: TokTrie,
    tokens: Vec<(u32, u32)>,
    bytes: Vec<u8>,
    pub(crate) specials: [Option<u32>; 3],
    /// `bulk[lexer][utf8 state - 1]`.
    pub(crate) bulk: [Vec<Bulk>; 4],
}

impl Vocab {
    /// Builds the tables for a vocabulary of `size` ids from `(id, bytes,
    /// added)`: ordinary tokens (`added` false) by their bytes; added tokens
    /// count only when they are `<tool_call>`, `</tool_call>` or `</think>`
    /// (the rest are never allowed, bar the end tokens a matcher is given).
    pub fn new<'a>(size: usize, tokens: impl IntoIterator<Item = (u32, &'a [u8], bool)>) -> Vocab {
        let mut spans = alloc::vec![(0u32, 0u32); size];
        let mut bytes = Vec::new();
        let mut specials = [None; 3];
        for (id, b, added) in tokens {
            if id as usize >= size || b.is_empty() {
                continue;
            }
            if added {
                let k = match b {
                    b"<tool_call>" => Special::ToolOpen,
                    b"</tool_call>" => Special::ToolClose,
                    b"</think>" => Special::ThinkEnd,
                    _ => continue,
                };
                specials[k as usize] = Some(id);
                continue;
            }
            spans[id as usize] = (bytes.len() as u32, b.len() as u32);
            bytes.extend_from_slice(b);
        }
        let entries = |pred: &dyn Fn(&[u8]) -> bool| -> Vec<(&[u8], u32)> {
            spans
                .iter()
                .enumerate()
                .filter(|(_, sp)| sp.1 > 0)
                .map(|(id, sp)| (&bytes[sp.0 as usize..(sp.0 + sp.1) as usize], id as u32))
                .filter(|(b, _)| pred(b))
                .collect()
        };
        let trie = TokTrie::build(entries(&|_| true));
        let words = size.div_ceil(32);
        let mut bulk: [Vec<Bulk>; 4] = Default::default();
        for lx in [Lexer::Str, Lexer::Raw, Lexer::Free, Lexer::Think] {
            for u in 0..lx.states() {
                let mut inside = alloc::vec![0u32; words];
                let mut exits = Vec::new();
                for (b, id) in entries(&|_| true) {
                    match classify(lx, s::C + u, b) {
                        Class::Inside => inside[id as usize / 32] |= 1 << (id % 32),
                        Class::ExitAt(i) if i > 0 => exits.push((&b[i..], id)),
                        _ => {}
                    }
                }
                bulk[lx as usize].push(Bulk { inside, exits: TokTrie::build(exits) });
            }
        }
        Vocab { size, trie, tokens: spans, bytes, specials, bulk }
    }

    /// Ids the masks cover.
    pub fn size(&self) -> usize {
        self.size
    }

    /// Bitmask words a mask needs.
    pub fn mask_words(&self) -> usize {
        self.size.div_ceil(32)
    }

    /// The bytes of ordinary token `id` (empty for added or unknown ids).
    pub fn token_bytes(&self, id: u32) -> &[u8] {
        let Some(&(a, n)) = self.tokens.get(id as usize) else { return &[] };
        &self.bytes[a as usize..(a + n) as usize]
    }

    /// The meaning of token `id` if it is one of the grammar's added tokens.
    pub(crate) fn special(&self, id: u32) -> Option<Special> {
        [Special::ToolOpen, Special::ToolClose, Special::ThinkEnd]
            .into_iter()
            .find(|&k| self.specials[k as usize] == Some(id))
    }

    /// The id of an added token the grammar uses.
    pub fn special_id(&self, k: Special) -> Option<u32> {
        self.specials[k as usize]
    }

    /// Trie nodes (for reports).
    pub fn trie_nodes(&self) -> usize {
        self.trie.len()
    }
}
