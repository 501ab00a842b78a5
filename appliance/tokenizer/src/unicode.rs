//! Character classes used by the pre-tokenizer, from generated tables that match
//! the reference regex engine (see `scripts/tokenizer/gen_unicode_tables.py`).

use crate::unicode_tables::{LATIN1, RANGES};

/// The class of one character for the pre-tokenizer regex.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CharClass {
    /// None of the classes below (punctuation, symbols, controls, unassigned).
    Other,
    /// `\p{L}`.
    Letter,
    /// `\p{M}`.
    Mark,
    /// `\p{N}`.
    Number,
    /// `\s`.
    Space,
}

const fn from_code(code: u8) -> CharClass {
    match code {
        1 => CharClass::Letter,
        2 => CharClass::Mark,
        3 => CharClass::Number,
        4 => CharClass::Space,
        _ => CharClass::Other,
    }
}

/// Classifies `c`.
#[inline]
pub(crate) fn class_of(c: char) -> CharClass {
    let cp = c as u32;
    if cp < 256 {
        return from_code(LATIN1[cp as usize]);
    }
    // Binary search the last range starting at or before `cp`.
    let idx = RANGES.partition_point(|&(first, _, _)| first <= cp);
    if idx == 0 {
        return CharClass::Other;
    }
    let (_, last, code) = RANGES[idx - 1];
    if cp <= last {
        from_code(code)
    } else {
        CharClass::Other
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes_of_known_characters() {
        assert_eq!(class_of('a'), CharClass::Letter);
        assert_eq!(class_of('中'), CharClass::Letter);
        assert_eq!(class_of('\u{301}'), CharClass::Mark);
        assert_eq!(class_of('٣'), CharClass::Number);
        assert_eq!(class_of('\u{3000}'), CharClass::Space);
        assert_eq!(class_of('\u{a0}'), CharClass::Space);
        assert_eq!(class_of('😀'), CharClass::Other);
        assert_eq!(class_of('\u{200d}'), CharClass::Other);
        assert_eq!(class_of('!'), CharClass::Other);
    }
}
