//! Byte-level BPE tokenizer (Hugging Face `tokenizer.json`) and the Qwen3.5
//! chat template, `no_std + alloc` so the guest appliance can use it.
//!
//! - [`Tokenizer`]: load with [`Tokenizer::from_json`] (or `from_file` with the
//!   `std` feature), then [`Tokenizer::encode`] (added/special tokens in the text
//!   are recognised, as Hugging Face `tokenizers` does), [`Tokenizer::encode_ordinary`]
//!   (they never are), [`Tokenizer::decode`].
//! - [`StreamDecoder`]: incremental decoding that never emits half a character
//!   (over [`Utf8Stream`], for decoders that own their tokenizer handle).
//! - [`chat`]: Qwen3.5's ChatML template rendered straight to token ids; message
//!   text is never parsed for special tokens.
//!
//! Exactness against the reference rests on: NFC normalisation, a hand-written
//! scanner with the semantics of Qwen3.5's split regex ([`pretok`]), character
//! classes generated from the reference's own regex engine, and the reference's
//! merge order (lowest rank first, leftmost on ties).
#![cfg_attr(not(feature = "std"), no_std)]
#![warn(missing_docs)]
extern crate alloc;

mod added;
mod bpe;
mod bytelevel;
pub mod chat;
mod chat_layout;
mod error;
#[doc(hidden)]
pub mod fuzz;
mod hash;
mod load;
pub mod pretok;
mod stream;
mod tokenizer;
mod unicode;
mod unicode_tables;
mod vocab;

pub use chat::{ChatMessage, ChatOptions, ChatTemplate, Role, ToolCall};
pub use error::TokenizerError;
pub use stream::{StreamDecoder, Utf8Stream};
pub use tokenizer::Tokenizer;
