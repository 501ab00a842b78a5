//! The id <-> token tables: every token's string form (as written in
//! `tokenizer.json`) and its bytes, stored in two arenas for a fast load.

use alloc::string::String;
use alloc::vec::Vec;
use hashbrown::HashTable;

use crate::bytelevel::char_to_byte;
use crate::hash::hash_bytes;
use crate::TokenizerError;

/// Ids at or above this are refused (they would make the tables absurdly large).
const MAX_ID: u32 = 1 << 24;

/// What an id stands for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// No token has this id.
    Absent,
    /// A token of the BPE model.
    Model,
    /// An added token that is not special.
    Added,
    /// An added token flagged `special`.
    Special,
}

/// Token tables indexed by id.
pub(crate) struct Vocab {
    text: String,
    text_end: Vec<u32>,
    bytes: Vec<u8>,
    bytes_end: Vec<u32>,
    kind: Vec<Kind>,
    index: HashTable<u32>,
}

/// The bytes a token stands for: the byte-level decoding of its string form, or
/// the string's own UTF-8 when a character is outside the byte-level alphabet
/// (what the reference ByteLevel decoder does).
pub(crate) fn token_bytes(token: &str, out: &mut Vec<u8>) {
    let start = out.len();
    for c in token.chars() {
        match char_to_byte(c) {
            Some(b) => out.push(b),
            None => {
                out.truncate(start);
                out.extend_from_slice(token.as_bytes());
                return;
            }
        }
    }
}

impl Vocab {
    /// Builds the tables from `(id, token, kind)` entries in any order.
    pub(crate) fn build(mut entries: Vec<(u32, &str, Kind)>) -> Result<Vocab, TokenizerError> {
        entries.sort_unstable_by_key(|e| e.0);
        let size = match entries.last() {
            Some(&(id, _, _)) if id >= MAX_ID => {
                return Err(TokenizerError::Invalid(alloc::format!("token id {id} is too large")))
            }
            Some(&(id, _, _)) => id as usize + 1,
            None => 0,
        };
        let text_len: usize = entries.iter().map(|e| e.1.len()).sum();
        let mut v = Vocab {
            text: String::with_capacity(text_len),
            text_end: Vec::with_capacity(size),
            bytes: Vec::with_capacity(text_len),
            bytes_end: Vec::with_capacity(size),
            kind: Vec::with_capacity(size),
            index: HashTable::with_capacity(entries.len()),
        };
        let mut prev: Option<u32> = None;
        for (id, token, kind) in entries {
            if prev == Some(id) {
                return Err(TokenizerError::Invalid(alloc::format!("two tokens have id {id}")));
            }
            prev = Some(id);
            while v.kind.len() < id as usize {
                v.push_absent();
            }
            v.push(id, token, kind)?;
        }
        Ok(v)
    }

    fn push_absent(&mut self) {
        self.text_end.push(self.text.len() as u32);
        self.bytes_end.push(self.bytes.len() as u32);
        self.kind.push(Kind::Absent);
    }

    fn push(&mut self, id: u32, token: &str, kind: Kind) -> Result<(), TokenizerError> {
        let hash = hash_bytes(token.as_bytes());
        let Vocab { text, text_end, index, .. } = self;
        let found = index.find(hash, |&other| slice(text, text_end, other) == token.as_bytes());
        if let Some(&other) = found {
            return Err(TokenizerError::Invalid(alloc::format!(
                "token {token:?} has two ids ({other} and {id})"
            )));
        }
        self.text.push_str(token);
        self.text_end.push(self.text.len() as u32);
        token_bytes(token, &mut self.bytes);
        self.bytes_end.push(self.bytes.len() as u32);
        self.kind.push(kind);
        let Vocab { text, text_end, index, .. } = self;
        index.insert_unique(hash, id, |&other| hash_bytes(slice(text, text_end, other)));
        Ok(())
    }

    /// Number of ids (one more than the highest id).
    pub(crate) fn len(&self) -> usize {
        self.kind.len()
    }

    /// The id of a token given in its string form.
    pub(crate) fn id(&self, token: &str) -> Option<u32> {
        let hash = hash_bytes(token.as_bytes());
        self.index
            .find(hash, |&id| slice(&self.text, &self.text_end, id) == token.as_bytes())
            .copied()
    }

    /// The string form of token `id`.
    pub(crate) fn token(&self, id: u32) -> Option<&str> {
        if self.kind(id) == Kind::Absent {
            return None;
        }
        let (s, e) = bounds(&self.text_end, id);
        self.text.get(s..e)
    }

    /// The bytes token `id` stands for.
    pub(crate) fn bytes(&self, id: u32) -> Option<&[u8]> {
        if self.kind(id) == Kind::Absent {
            return None;
        }
        let (s, e) = bounds(&self.bytes_end, id);
        self.bytes.get(s..e)
    }

    /// What `id` stands for.
    pub(crate) fn kind(&self, id: u32) -> Kind {
        self.kind.get(id as usize).copied().unwrap_or(Kind::Absent)
    }
}

fn bounds(ends: &[u32], id: u32) -> (usize, usize) {
    let i = id as usize;
    let start = if i == 0 { 0 } else { ends[i - 1] as usize };
    (start, ends[i] as usize)
}

fn slice<'a>(text: &'a str, ends: &[u32], id: u32) -> &'a [u8] {
    let (s, e) = bounds(ends, id);
    &text.as_bytes()[s..e]
}
