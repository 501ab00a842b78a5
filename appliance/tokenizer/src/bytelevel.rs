//! The byte-level alphabet of GPT-2-style BPE: every byte has a printable
//! character that stands for it in the vocabulary.

/// Whether byte `b` stands for itself (printable Latin-1 other than space and soft hyphen).
const fn is_direct(b: u8) -> bool {
    matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF)
}

/// The character that stands for each byte.
pub(crate) static BYTE_TO_CHAR: [char; 256] = byte_to_char();

const fn byte_to_char() -> [char; 256] {
    let mut table = ['\0'; 256];
    let mut next = 256u32;
    let mut b = 0usize;
    while b < 256 {
        let cp = if is_direct(b as u8) {
            b as u32
        } else {
            let cp = next;
            next += 1;
            cp
        };
        table[b] = match char::from_u32(cp) {
            Some(c) => c,
            None => '\0',
        };
        b += 1;
    }
    table
}

/// Reverse of [`BYTE_TO_CHAR`] for code points below 324; 0xFFFF where unmapped.
static CHAR_TO_BYTE: [u16; 324] = char_to_byte_table();

const fn char_to_byte_table() -> [u16; 324] {
    let mut table = [0xFFFFu16; 324];
    let mut b = 0usize;
    while b < 256 {
        table[BYTE_TO_CHAR[b] as usize] = b as u16;
        b += 1;
    }
    table
}

/// The byte that character `c` stands for, if `c` is in the byte-level alphabet.
#[inline]
pub(crate) fn char_to_byte(c: char) -> Option<u8> {
    match CHAR_TO_BYTE.get(c as usize) {
        Some(&v) if v != 0xFFFF => Some(v as u8),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alphabet_round_trips() {
        assert_eq!(BYTE_TO_CHAR[b' ' as usize], 'Ġ');
        assert_eq!(BYTE_TO_CHAR[b'\n' as usize], 'Ċ');
        assert_eq!(BYTE_TO_CHAR[b'a' as usize], 'a');
        for b in 0..=255u8 {
            assert_eq!(char_to_byte(BYTE_TO_CHAR[b as usize]), Some(b));
        }
        assert_eq!(char_to_byte(' '), None);
    }
}
