//! Literal tries: sets of byte strings with an outcome at each end (enum
//! values, object keys, tool names, parameter headers, fixed text).

use alloc::vec::Vec;

/// No outcome at this node.
pub const NO_END: u32 = u32::MAX;

/// One trie node: children by byte, the outcome of a string ending here, and
/// the outcomes (as bits 0..64) of every string below it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TrieNode {
    /// `(byte, child index)`, sorted by byte.
    pub children: Vec<(u8, u32)>,
    /// The outcome of the string ending here, or [`NO_END`].
    pub end: u32,
    /// Bit `i` (i < 64) set when a string with outcome `i` ends in this subtree.
    pub below: u64,
}

/// A trie; node 0 is the root.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Trie {
    /// The nodes.
    pub nodes: Vec<TrieNode>,
}

impl Trie {
    /// A trie of `(string, outcome)`; a repeated string keeps its first outcome.
    pub fn new<'a>(entries: impl IntoIterator<Item = (&'a [u8], u32)>) -> Trie {
        let mut nodes = alloc::vec![TrieNode { end: NO_END, ..TrieNode::default() }];
        for (s, outcome) in entries {
            let mut at = 0usize;
            let bit = if outcome < 64 { 1u64 << outcome } else { 0 };
            nodes[0].below |= bit;
            for &b in s {
                at = match nodes[at].children.binary_search_by_key(&b, |c| c.0) {
                    Ok(k) => nodes[at].children[k].1 as usize,
                    Err(k) => {
                        let id = nodes.len() as u32;
                        nodes.push(TrieNode { end: NO_END, ..TrieNode::default() });
                        nodes[at].children.insert(k, (b, id));
                        id as usize
                    }
                };
                nodes[at].below |= bit;
            }
            if nodes[at].end == NO_END {
                nodes[at].end = outcome;
            }
        }
        Trie { nodes }
    }

    /// A trie of one string with outcome 0.
    pub fn literal(s: &[u8]) -> Trie {
        Trie::new([(s, 0)])
    }

    /// The child of `node` by `b`.
    #[inline]
    pub fn child(&self, node: u32, b: u8) -> Option<u32> {
        let n = &self.nodes[node as usize];
        if n.children.len() <= 4 {
            return n.children.iter().find(|c| c.0 == b).map(|c| c.1);
        }
        n.children.binary_search_by_key(&b, |c| c.0).ok().map(|k| n.children[k].1)
    }
}
