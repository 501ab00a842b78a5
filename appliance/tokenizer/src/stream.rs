//! Incremental decoding for streaming: text comes out only in whole UTF-8
//! characters, however the tokens split them.

use alloc::string::String;
use alloc::vec::Vec;

use crate::Tokenizer;

/// Bytes in, whole UTF-8 characters out: the buffer under [`StreamDecoder`],
/// usable by decoders that hold their tokenizer some other way (an `Arc`).
///
/// ```
/// use kore_tokenizer::Utf8Stream;
/// let mut s = Utf8Stream::default();
/// assert_eq!(s.push(&[0xc3]), None); // half of 'é'
/// assert_eq!(s.push(&[0xa9, b'!']).as_deref(), Some("é!"));
/// assert_eq!(s.push(&[0xe2]), None);
/// assert_eq!(s.flush().as_deref(), Some("\u{fffd}")); // a cut character at the end
/// ```
#[derive(Debug, Default, Clone)]
pub struct Utf8Stream {
    pending: Vec<u8>,
}

impl Utf8Stream {
    /// Adds bytes; returns the text that became complete, if any. Bytes that
    /// can never form a character come out as U+FFFD; an incomplete character
    /// at the end is held back.
    pub fn push(&mut self, bytes: &[u8]) -> Option<String> {
        self.pending.extend_from_slice(bytes);
        self.drain(false)
    }

    /// Releases everything held back (U+FFFD for a cut character).
    pub fn flush(&mut self) -> Option<String> {
        self.drain(true)
    }

    /// Bytes held back because they may start a character.
    pub fn pending(&self) -> &[u8] {
        &self.pending
    }

    fn drain(&mut self, all: bool) -> Option<String> {
        let mut out = String::new();
        let mut start = 0;
        loop {
            match core::str::from_utf8(&self.pending[start..]) {
                Ok(s) => {
                    out.push_str(s);
                    start = self.pending.len();
                    break;
                }
                Err(e) => {
                    let valid = start + e.valid_up_to();
                    // The prefix is valid UTF-8 by the error's contract.
                    out.push_str(
                        core::str::from_utf8(&self.pending[start..valid]).unwrap_or_default(),
                    );
                    match e.error_len() {
                        Some(n) => {
                            out.push('\u{fffd}');
                            start = valid + n;
                        }
                        None if all => {
                            out.push('\u{fffd}');
                            start = self.pending.len();
                            break;
                        }
                        None => {
                            start = valid;
                            break;
                        }
                    }
                }
            }
        }
        self.pending.drain(..start);
        (!out.is_empty()).then_some(out)
    }
}

/// Turns a stream of token ids into text pieces.
///
/// The concatenation of everything [`StreamDecoder::push`] and
/// [`StreamDecoder::finish`] return equals [`Tokenizer::decode`] of all the ids.
#[derive(Debug)]
pub struct StreamDecoder<'t> {
    tokenizer: &'t Tokenizer,
    bytes: Utf8Stream,
    skip_special: bool,
}

impl<'t> StreamDecoder<'t> {
    /// A decoder that keeps special tokens in the text (like `decode`).
    pub fn new(tokenizer: &'t Tokenizer) -> StreamDecoder<'t> {
        StreamDecoder { tokenizer, bytes: Utf8Stream::default(), skip_special: false }
    }

    /// A decoder that leaves special tokens out (like `decode_with(ids, true)`).
    pub fn skipping_special(tokenizer: &'t Tokenizer) -> StreamDecoder<'t> {
        StreamDecoder { tokenizer, bytes: Utf8Stream::default(), skip_special: true }
    }

    /// Adds one token; returns the text that became complete, if any. Bytes that
    /// can never form a character come out as U+FFFD; an incomplete character at
    /// the end is held back until the next token completes it.
    pub fn push(&mut self, id: u32) -> Option<String> {
        if self.skip_special && self.tokenizer.is_special(id) {
            return None;
        }
        self.bytes.push(self.tokenizer.token_bytes(id)?)
    }

    /// Ends the stream: whatever is held back comes out (U+FFFD for a cut character).
    pub fn finish(mut self) -> Option<String> {
        self.bytes.flush()
    }

    /// Bytes held back because they may start a character.
    pub fn pending(&self) -> &[u8] {
        self.bytes.pending()
    }
}
