//! The tokenizer: loading, encoding and decoding.

use alloc::borrow::Cow;
use alloc::format;
use alloc::string::{String, ToString};
use alloc::vec::Vec;
use unicode_normalization::{is_nfc_quick, IsNormalized, UnicodeNormalization};

use crate::added::{Matcher, Seg};
use crate::bpe::{Merge, Merges};
use crate::bytelevel::BYTE_TO_CHAR;
use crate::load::{parse, Parsed};
use crate::pretok::pieces;
use crate::vocab::{Kind, Vocab};
use crate::TokenizerError;

/// A byte-level BPE tokenizer loaded from a Hugging Face `tokenizer.json`.
///
/// `encode` gives the same ids as Hugging Face `tokenizers`' `encode(text).ids`
/// for the files this crate accepts (see [`Tokenizer::from_json`]).
pub struct Tokenizer {
    vocab: Vocab,
    /// Whether each id belongs to the BPE model's own vocabulary.
    in_model: Vec<bool>,
    merges: Merges,
    /// Token id of each byte's alphabet character (`u32::MAX` if absent).
    byte_ids: [u32; 256],
    unk: Option<u32>,
    ignore_merges: bool,
    nfc: bool,
    /// Added tokens matched on the raw text (`normalized: false`).
    raw_added: Matcher,
    /// Added tokens matched on the normalized text (`normalized: true`).
    norm_added: Matcher,
}

impl core::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("vocab_size", &self.vocab.len())
            .field("merges", &self.merges.len())
            .finish_non_exhaustive()
    }
}

/// NFC of `s`, borrowing when it is already normalized.
pub(crate) fn nfc(s: &str) -> Cow<'_, str> {
    if s.is_ascii() || is_nfc_quick(s.chars()) == IsNormalized::Yes {
        Cow::Borrowed(s)
    } else {
        Cow::Owned(s.nfc().collect())
    }
}

impl Tokenizer {
    /// Loads a tokenizer from the bytes of a `tokenizer.json`.
    ///
    /// Accepted: a BPE model over the byte-level alphabet (merges as `"a b"` or
    /// `["a", "b"]`, `ignore_merges` either way), an NFC or absent normalizer, the
    /// Qwen3.5 `Split` regex followed by `ByteLevel(use_regex=false)`, a ByteLevel
    /// decoder, and added tokens without `lstrip`/`rstrip`/`single_word`. Anything
    /// else is an error, never a silently different tokenization.
    pub fn from_json(json: &[u8]) -> Result<Tokenizer, TokenizerError> {
        let parsed = parse(json)?;
        Tokenizer::build(parsed)
    }

    fn build(p: Parsed<'_>) -> Result<Tokenizer, TokenizerError> {
        let mut entries: Vec<(u32, &str, Kind)> = Vec::with_capacity(p.vocab.len() + p.added.len());
        entries.extend(p.vocab.iter().map(|(t, id)| (*id, t.as_ref(), Kind::Model)));
        {
            let mut by_id: Vec<(u32, usize)> =
                entries.iter().enumerate().map(|(i, e)| (e.0, i)).collect();
            by_id.sort_unstable();
            for a in &p.added {
                let kind = if a.special { Kind::Special } else { Kind::Added };
                match by_id.binary_search_by_key(&a.id, |e| e.0) {
                    Ok(k) => {
                        let e = &mut entries[by_id[k].1];
                        if e.1 != a.content.as_ref() {
                            return Err(TokenizerError::Invalid(format!(
                                "added token {:?} has id {} which the vocabulary gives to {:?}",
                                a.content, a.id, e.1
                            )));
                        }
                        e.2 = kind;
                    }
                    Err(_) => entries.push((a.id, a.content.as_ref(), kind)),
                }
            }
        }
        if p.vocab.is_empty() {
            return Err(TokenizerError::Invalid("the model vocabulary is empty".to_string()));
        }
        let vocab = Vocab::build(entries)?;
        // A token only in `added_tokens` is not part of the BPE model.
        let mut in_model = alloc::vec![false; vocab.len()];
        for (_, id) in &p.vocab {
            in_model[*id as usize] = true;
        }
        let model_id = |tok: &str| vocab.id(tok).filter(|&id| in_model[id as usize]);
        let mut byte_ids = [u32::MAX; 256];
        let mut buf = [0u8; 4];
        for (b, slot) in byte_ids.iter_mut().enumerate() {
            if let Some(id) = model_id(BYTE_TO_CHAR[b].encode_utf8(&mut buf)) {
                *slot = id;
            }
        }
        let merges = build_merges(&p, model_id)?;
        let unk = match &p.unk_token {
            Some(t) => Some(vocab.id(t).ok_or_else(|| {
                TokenizerError::Invalid(format!("unk_token {t:?} is not in the vocabulary"))
            })?),
            None => None,
        };
        let (mut raw, mut norm) = (Vec::new(), Vec::new());
        for a in &p.added {
            if a.normalized {
                norm.push((nfc(&a.content).into_owned(), a.id));
            } else {
                raw.push((a.content.to_string(), a.id));
            }
        }
        Ok(Tokenizer {
            vocab,
            in_model,
            merges,
            byte_ids,
            unk,
            ignore_merges: p.ignore_merges,
            nfc: p.nfc,
            raw_added: Matcher::new(raw),
            norm_added: Matcher::new(norm),
        })
    }

    /// Loads a tokenizer from a `tokenizer.json` file.
    #[cfg(feature = "std")]
    pub fn from_file(path: impl AsRef<std::path::Path>) -> Result<Tokenizer, TokenizerError> {
        let path = path.as_ref();
        let bytes = std::fs::read(path)
            .map_err(|e| TokenizerError::Io(format!("{}: {e}", path.display())))?;
        Tokenizer::from_json(&bytes)
    }

    /// Encodes `text`; added and special tokens written in the text (`<|im_end|>`)
    /// become their ids. Equal to Hugging Face `tokenizers`' `encode(text).ids`.
    pub fn encode(&self, text: &str) -> Vec<u32> {
        let mut out = Vec::with_capacity(text.len() / 3 + 1);
        let mut syms = Vec::new();
        self.raw_added.split(text, |seg| match seg {
            Seg::Token(id) => out.push(id),
            Seg::Text(t) => {
                let t = self.normalize(t);
                self.norm_added.split(&t, |seg| match seg {
                    Seg::Token(id) => out.push(id),
                    Seg::Text(t) => self.encode_normalized(t, &mut out, &mut syms),
                });
            }
        });
        out
    }

    /// Encodes `text` as plain text: added and special tokens written in it are
    /// never recognised (a user typing `<|im_end|>` gets ordinary tokens).
    pub fn encode_ordinary(&self, text: &str) -> Vec<u32> {
        let mut out = Vec::with_capacity(text.len() / 3 + 1);
        let mut syms = Vec::new();
        let text = self.normalize(text);
        self.encode_normalized(&text, &mut out, &mut syms);
        out
    }

    fn normalize<'a>(&self, text: &'a str) -> Cow<'a, str> {
        if self.nfc {
            nfc(text)
        } else {
            Cow::Borrowed(text)
        }
    }

    /// Pre-tokenizes and BPE-encodes already normalized text.
    fn encode_normalized(&self, text: &str, out: &mut Vec<u32>, syms: &mut Vec<u32>) {
        for piece in pieces(text) {
            self.encode_piece(piece.as_bytes(), out, syms);
        }
    }

    fn encode_piece(&self, piece: &[u8], out: &mut Vec<u32>, syms: &mut Vec<u32>) {
        if self.ignore_merges {
            if let Some(id) = self.whole_piece(piece) {
                out.push(id);
                return;
            }
        }
        syms.clear();
        for &b in piece {
            match self.byte_ids[b as usize] {
                u32::MAX => syms.extend(self.unk),
                id => syms.push(id),
            }
        }
        self.merges.apply(syms);
        out.extend_from_slice(syms);
    }

    /// The model token equal to a whole piece (for `ignore_merges`).
    fn whole_piece(&self, piece: &[u8]) -> Option<u32> {
        let mut s = String::with_capacity(piece.len() * 2);
        s.extend(piece.iter().map(|&b| BYTE_TO_CHAR[b as usize]));
        self.vocab.id(&s).filter(|&id| self.in_model[id as usize])
    }

    /// Decodes ids to text, keeping added and special tokens as written. Unknown ids
    /// are skipped (as the reference does); invalid UTF-8 becomes U+FFFD.
    pub fn decode(&self, ids: &[u32]) -> String {
        self.decode_with(ids, false)
    }

    /// Like [`Tokenizer::decode`], optionally leaving out special tokens.
    pub fn decode_with(&self, ids: &[u32], skip_special: bool) -> String {
        let mut bytes = Vec::with_capacity(ids.len() * 4);
        for &id in ids {
            if skip_special && self.vocab.kind(id) == Kind::Special {
                continue;
            }
            bytes.extend_from_slice(self.vocab.bytes(id).unwrap_or(&[]));
        }
        String::from_utf8_lossy(&bytes).into_owned()
    }

    /// Like [`Tokenizer::decode`] but an id outside the vocabulary is an error.
    pub fn try_decode(&self, ids: &[u32]) -> Result<String, TokenizerError> {
        if let Some(&bad) = ids.iter().find(|&&id| self.vocab.kind(id) == Kind::Absent) {
            return Err(TokenizerError::Invalid(format!(
                "token id {bad} is not in the vocabulary (ids go up to {})",
                self.vocab.len().saturating_sub(1)
            )));
        }
        Ok(self.decode(ids))
    }

    /// The bytes token `id` stands for (`None` for an unknown id).
    pub fn token_bytes(&self, id: u32) -> Option<&[u8]> {
        self.vocab.bytes(id)
    }

    /// The id of a token written as in `tokenizer.json` (`"Ġthe"`, `"<|im_end|>"`).
    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.vocab.id(token)
    }

    /// The token with id `id`, written as in `tokenizer.json`.
    pub fn id_to_token(&self, id: u32) -> Option<&str> {
        self.vocab.token(id)
    }

    /// Whether `id` is an added token flagged `special` (`<|im_end|>`, ...).
    pub fn is_special(&self, id: u32) -> bool {
        self.vocab.kind(id) == Kind::Special
    }

    /// Whether `id` is an added token (special or not: `<tool_call>`, `<think>`,
    /// `<|im_end|>`), matched as a whole in text rather than built by merges.
    pub fn is_added(&self, id: u32) -> bool {
        matches!(self.vocab.kind(id), Kind::Special | Kind::Added)
    }

    /// Number of token ids: one more than the highest id (model and added tokens).
    pub fn vocab_size(&self) -> usize {
        self.vocab.len()
    }
}

/// Resolves the merge rules to token ids; rank = position in the list.
fn build_merges(
    p: &Parsed<'_>,
    model_id: impl Fn(&str) -> Option<u32>,
) -> Result<Merges, TokenizerError> {
    let mut merges = Merges::with_capacity(p.merges.len());
    let mut joined = String::new();
    for (rank, (a, b)) in p.merges.iter().enumerate() {
        let missing = |t: &str| {
            TokenizerError::Invalid(format!(
                "merge {a:?} {b:?}: token {t:?} is not in the vocabulary"
            ))
        };
        let left = model_id(a).ok_or_else(|| missing(a))?;
        let right = model_id(b).ok_or_else(|| missing(b))?;
        joined.clear();
        joined.push_str(a);
        joined.push_str(b);
        let id = model_id(&joined).ok_or_else(|| missing(&joined))?;
        merges.insert(left, right, Merge { rank: rank as u32, id });
    }
    Ok(merges)
}
