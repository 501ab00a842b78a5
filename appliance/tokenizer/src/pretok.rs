//! The Qwen3.5 pre-tokenizer: a hand-written scanner with exactly the semantics of
//! the regex (leftmost-first alternation, greedy quantifiers with backtracking)
//!
//! ```text
//! (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}
//! | ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
//! ```
//!
//! Every character is matched by one of the alternatives, so the pieces cover the
//! text without gaps.

use crate::unicode::{class_of, CharClass};

/// The regex this scanner implements, as it appears in a `tokenizer.json`.
pub const QWEN35_PATTERN: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// Splits `text` into pre-tokens.
pub(crate) fn pieces(text: &str) -> Pieces<'_> {
    Pieces { text, pos: 0 }
}

/// Iterator over the pre-tokens of a text.
pub(crate) struct Pieces<'a> {
    text: &'a str,
    pos: usize,
}

impl<'a> Iterator for Pieces<'a> {
    type Item = &'a str;

    fn next(&mut self) -> Option<&'a str> {
        if self.pos >= self.text.len() {
            return None;
        }
        let start = self.pos;
        let end = match_at(self.text, start);
        self.pos = end;
        Some(&self.text[start..end])
    }
}

/// The character starting at byte `i` (which must be a char boundary below the length),
/// its class and its length in bytes.
#[inline]
fn char_at(s: &str, i: usize) -> (char, CharClass, usize) {
    let b = s.as_bytes()[i];
    if b < 0x80 {
        let c = b as char;
        return (c, class_of(c), 1);
    }
    // The slice is non-empty and starts on a char boundary.
    let c = s[i..].chars().next().unwrap_or('\u{fffd}');
    (c, class_of(c), c.len_utf8())
}

#[inline]
fn is_letter_or_mark(class: CharClass) -> bool {
    matches!(class, CharClass::Letter | CharClass::Mark)
}

/// End of the longest run starting at `i` whose characters satisfy `pred`.
#[inline]
fn run(s: &str, mut i: usize, pred: impl Fn(CharClass) -> bool) -> usize {
    while i < s.len() {
        let (_, class, len) = char_at(s, i);
        if !pred(class) {
            break;
        }
        i += len;
    }
    i
}

/// Length of a contraction suffix (`s`, `t`, `re`, `ve`, `m`, `ll`, `d`, any case;
/// U+017F LONG S folds to `s`) starting at byte `i`, if any.
fn contraction(b: &[u8], i: usize) -> Option<usize> {
    let at = |k: usize| b.get(i + k).map(|c| c.to_ascii_lowercase());
    match at(0)? {
        b's' | b't' | b'm' | b'd' => Some(1),
        b'r' | b'v' if at(1) == Some(b'e') => Some(2),
        b'l' if at(1) == Some(b'l') => Some(2),
        0xC5 if b.get(i + 1) == Some(&0xBF) => Some(2),
        _ => None,
    }
}

/// End (exclusive, in bytes) of the regex match that starts at byte `i`.
fn match_at(s: &str, i: usize) -> usize {
    let b = s.as_bytes();
    let (c, class, len) = char_at(s, i);
    let next = i + len;
    // 1. (?i:'s|'t|'re|'ve|'m|'ll|'d)
    if c == '\'' {
        if let Some(n) = contraction(b, next) {
            return next + n;
        }
    }
    let next_class = if next < s.len() { Some(char_at(s, next).1) } else { None };
    // 2. [^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+
    let may_prefix =
        c != '\r' && c != '\n' && !matches!(class, CharClass::Letter | CharClass::Number);
    if may_prefix && next_class.is_some_and(is_letter_or_mark) {
        return run(s, next, is_letter_or_mark);
    }
    if is_letter_or_mark(class) {
        return run(s, next, is_letter_or_mark);
    }
    // 3. \p{N}
    if class == CharClass::Number {
        return next;
    }
    // 4. ' '?[^\s\p{L}\p{M}\p{N}]+[\r\n]*
    let other_start = if class == CharClass::Other {
        Some(i)
    } else if c == ' ' && next_class == Some(CharClass::Other) {
        Some(next)
    } else {
        None
    };
    if let Some(start) = other_start {
        let mut end = run(s, start, |k| k == CharClass::Other);
        while end < b.len() && (b[end] == b'\r' || b[end] == b'\n') {
            end += 1;
        }
        return end;
    }
    // Only white space is left.
    let ws_end = run(s, i, |k| k == CharClass::Space);
    // 5. \s*[\r\n]+ : up to and including the last \r or \n of the run.
    if let Some(k) = b[i..ws_end].iter().rposition(|&x| x == b'\r' || x == b'\n') {
        return i + k + 1;
    }
    // 6. \s+(?!\S) : the whole run at the end of the text, else all but its last char.
    if ws_end == s.len() {
        return ws_end;
    }
    let last_start = s[..ws_end].char_indices().next_back().map_or(i, |(k, _)| k);
    if last_start > i {
        return last_start;
    }
    // 7. \s+
    ws_end
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::vec::Vec;

    fn split(s: &str) -> Vec<&str> {
        pieces(s).collect()
    }

    #[test]
    fn splits_like_the_regex() {
        assert_eq!(split("Hello world"), ["Hello", " world"]);
        assert_eq!(split("I'M here"), ["I", "'M", " here"]);
        assert_eq!(split("don'tx"), ["don", "'t", "x"]);
        assert_eq!(split("a  b"), ["a", " ", " b"]);
        assert_eq!(split("a   \n\n  b  "), ["a", "   \n\n", " ", " b", "  "]);
        assert_eq!(split("x = 123;\r\n"), ["x", " =", " ", "1", "2", "3", ";\r\n"]);
        assert_eq!(split("(hello)"), ["(hello", ")"]);
        assert_eq!(split("e\u{301}t\u{e9}"), ["e\u{301}t\u{e9}"]);
        assert_eq!(split(" \u{301}a"), [" \u{301}a"]);
        assert_eq!(split("\u{a0}word"), ["\u{a0}word"]);
        assert_eq!(split("\t\tif"), ["\t", "\tif"]);
        assert_eq!(split("!!\n\nx"), ["!!\n\n", "x"]);
        assert_eq!(split(" !!"), [" !!"]);
        assert_eq!(split("\n"), ["\n"]);
        assert_eq!(split(" "), [" "]);
    }

    #[test]
    fn pieces_cover_the_text() {
        let s = "Mixed 中文 text, emoji 👍🏽 and\u{200d}joiners\r\n\ttabs 12.5%";
        let joined: alloc::string::String = pieces(s).collect();
        assert_eq!(joined, s);
    }
}
