//! Finding added tokens (`<|im_start|>`, `<think>`, ...) in text: leftmost match,
//! longest token at that position, like the reference's Aho-Corasick search.

use alloc::string::String;
use alloc::vec::Vec;

/// A set of literal tokens to find in text.
pub(crate) struct Matcher {
    /// Tokens grouped by first byte, longest first within a group.
    tokens: Vec<(String, u32)>,
    /// For each first byte, the range of `tokens` starting with it.
    groups: [(u32, u32); 256],
}

impl Matcher {
    /// Builds a matcher over `(content, id)` pairs (contents must be non-empty).
    pub(crate) fn new(mut tokens: Vec<(String, u32)>) -> Matcher {
        tokens.retain(|t| !t.0.is_empty());
        tokens.sort_by(|a, b| {
            a.0.as_bytes()[0]
                .cmp(&b.0.as_bytes()[0])
                .then(b.0.len().cmp(&a.0.len()))
                .then(a.1.cmp(&b.1))
        });
        let mut groups = [(0u32, 0u32); 256];
        let mut i = 0;
        while i < tokens.len() {
            let first = tokens[i].0.as_bytes()[0];
            let start = i;
            while i < tokens.len() && tokens[i].0.as_bytes()[0] == first {
                i += 1;
            }
            groups[first as usize] = (start as u32, i as u32);
        }
        Matcher { tokens, groups }
    }

    /// Whether there is nothing to find.
    pub(crate) fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }

    /// The first match at or after byte `from`: `(start, end, id)`.
    pub(crate) fn find(&self, text: &str, from: usize) -> Option<(usize, usize, u32)> {
        let b = text.as_bytes();
        for i in from..b.len() {
            let (s, e) = self.groups[b[i] as usize];
            if s == e {
                continue;
            }
            for (tok, id) in &self.tokens[s as usize..e as usize] {
                if b[i..].starts_with(tok.as_bytes()) {
                    return Some((i, i + tok.len(), *id));
                }
            }
        }
        None
    }

    /// Splits `text` into plain text and token matches, calling `f` for each
    /// non-empty plain stretch and each match, in order.
    pub(crate) fn split<'t>(&self, text: &'t str, mut f: impl FnMut(Seg<'t>)) {
        let mut pos = 0;
        if !self.is_empty() {
            while let Some((s, e, id)) = self.find(text, pos) {
                if s > pos {
                    f(Seg::Text(&text[pos..s]));
                }
                f(Seg::Token(id));
                pos = e;
            }
        }
        if pos < text.len() {
            f(Seg::Text(&text[pos..]));
        }
    }
}

/// A piece of text split on added tokens.
pub(crate) enum Seg<'t> {
    /// Plain text.
    Text(&'t str),
    /// An added token's id.
    Token(u32),
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::string::ToString;
    use alloc::vec;

    #[test]
    fn finds_leftmost_longest() {
        let m = Matcher::new(vec![
            ("<a>".to_string(), 1),
            ("<a>>".to_string(), 2),
            ("b".to_string(), 3),
        ]);
        let mut out = Vec::new();
        m.split("x<a>>yb<a>", |seg| match seg {
            Seg::Text(t) => out.push(t.to_string()),
            Seg::Token(id) => out.push(alloc::format!("#{id}")),
        });
        assert_eq!(out, ["x", "#2", "y", "#3", "#1"]);
    }
}
