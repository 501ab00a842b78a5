//! The tokenizer's error type (a plain enum: the core is `no_std`).

use alloc::string::String;
use core::fmt;

/// Everything that can go wrong while loading a `tokenizer.json` or rendering a chat.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TokenizerError {
    /// The file is not valid JSON or lacks a required field.
    Json(String),
    /// The file is valid but describes something this tokenizer does not implement
    /// (another model type, normalizer, pre-tokenizer or decoder).
    Unsupported(String),
    /// The file is inconsistent: a merge names an unknown token, two tokens share an id, ...
    Invalid(String),
    /// Reading the file failed (only with the `std` feature).
    Io(String),
    /// A chat could not be rendered (system message not first, no user message, ...).
    Chat(String),
}

impl fmt::Display for TokenizerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TokenizerError::Json(m) => {
                write!(f, "malformed tokenizer.json: {m} (expected a Hugging Face tokenizer.json)")
            }
            TokenizerError::Unsupported(m) => write!(
                f,
                "unsupported tokenizer.json: {m} (only byte-level BPE with the Qwen3.5 pre-tokenizer is implemented)"
            ),
            TokenizerError::Invalid(m) => write!(f, "inconsistent tokenizer.json: {m}"),
            TokenizerError::Io(m) => write!(f, "cannot read tokenizer file: {m}"),
            TokenizerError::Chat(m) => write!(f, "cannot render chat: {m}"),
        }
    }
}

#[cfg(feature = "std")]
impl std::error::Error for TokenizerError {}
