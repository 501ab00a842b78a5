//! What the service needs from a tokenizer: encoding raw prompts, rendering
//! chat messages through the model's template, and streaming decode. The real
//! implementation wraps `kore-tokenizer`; tests use [`crate::fake::FakeCodec`].

use alloc::string::String;
use alloc::vec::Vec;

use kore_protocol::{Message, RawJson};

/// Why the codec cannot turn a request into tokens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CodecError {
    /// This model cannot serve such a request (no tokenizer, no chat
    /// template): answered `bad_request`, the message says what to send.
    Unsupported(String),
    /// The tokenizer failed on this input: answered `internal`.
    Failed(String),
}

/// Incremental detokenizer: text comes out as soon as it forms complete UTF-8.
pub trait StreamDecode {
    /// Adds one token and returns the text it completes (maybe empty).
    fn push(&mut self, id: u32) -> String;
    /// Returns whatever is still buffered (incomplete UTF-8 becomes U+FFFD).
    fn flush(&mut self) -> String;
}

/// Tokenizer and chat template of the served model.
pub trait Codec {
    /// The streaming decoder type.
    type Decoder: StreamDecode;

    /// Encodes a raw prompt as `tokenizers`' `encode(text)` would (special
    /// tokens written in the text are recognised).
    fn encode(&self, text: &str) -> Result<Vec<u32>, CodecError>;

    /// Renders `messages` (and `tools`, an OpenAI tools array, when given)
    /// with the chat template plus the assistant generation prompt, with
    /// thinking on or off; special tokens come only from the template, never
    /// from message text.
    fn render_chat(
        &self,
        messages: &[Message],
        tools: Option<&RawJson>,
        thinking: bool,
    ) -> Result<Vec<u32>, CodecError>;

    /// The bytes of token `id` (for log-probabilities; empty if unknown).
    fn token_bytes(&self, id: u32) -> Vec<u8> {
        let _ = id;
        Vec::new()
    }

    /// A fresh streaming decoder.
    fn decoder(&self) -> Self::Decoder;

    /// Tokens that end generation (e.g. `<|im_end|>`, `<|endoftext|>`).
    fn stop_ids(&self) -> &[u32];

    /// The `<think>` and `</think>` token ids, if the model has them.
    fn think_ids(&self) -> Option<(u32, u32)>;

    /// Positions in `prompt` (rendered chat or raw ids) where one message
    /// ends and the next begins, ascending: the engine keeps prefix-cache
    /// checkpoints there. None by default.
    fn boundaries(&self, prompt: &[u32]) -> Vec<u32> {
        let _ = prompt;
        Vec::new()
    }
}
