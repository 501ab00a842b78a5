//! Response lines: every event the service sends, as serializable structs
//! that encode to one JSON object followed by `\n`.

use alloc::string::String;
use alloc::vec::Vec;
use serde::Serialize;

use crate::engine::BenchReport;
use crate::request::{ErrorCode, Id};

/// Which part of the model's output a delta belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    /// Reasoning between `<think>` and `</think>`.
    Thinking,
    /// The answer (everything for raw prompts).
    Answer,
}

/// Why a request ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Finish {
    /// A stop token or stop string was generated.
    Stop,
    /// `max_tokens` or the context limit was reached.
    Length,
    /// Cancelled by `{"cancel": id}`.
    Cancelled,
}

/// Per-request measurements in the `done` event.
#[derive(Debug, Clone, PartialEq, Default, Serialize)]
pub struct Stats {
    /// Prompt length in tokens.
    pub prompt_tokens: u32,
    /// Prompt tokens served from the request's session state (0 when none).
    pub cached_tokens: u32,
    /// Tokens in `token_ids`.
    pub generated_tokens: u32,
    /// Time from starting the request until its first token, ms.
    pub prefill_ms: f64,
    /// `prompt_tokens / prefill time`.
    pub prefill_tok_per_s: f64,
    /// Tokens after the first, divided by the time from first to last token.
    pub decode_tok_per_s: f64,
    /// Tokens after the first per engine step that produced them.
    pub tokens_per_step: f64,
    /// `prompt_tokens + generated_tokens`.
    pub context_used: u32,
    /// The model's context limit.
    pub context_limit: u32,
}

/// `{"id", "delta", "phase"}`.
#[derive(Debug, Serialize)]
pub struct DeltaEvent<'a> {
    /// Request id.
    pub id: &'a Id,
    /// New text.
    pub delta: &'a str,
    /// Its phase.
    pub phase: Phase,
}

/// The final event of a successful (or cancelled) request.
#[derive(Debug, Serialize)]
pub struct DoneEvent<'a> {
    /// Request id.
    pub id: &'a Id,
    /// Always true.
    pub done: bool,
    /// Why it ended.
    pub finish: Finish,
    /// Generated token ids (including a final stop token).
    pub token_ids: &'a [u32],
    /// Answer text (the concatenated answer deltas).
    pub text: &'a str,
    /// Thinking text (chat requests only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub thinking: Option<&'a str>,
    /// Measurements.
    pub stats: &'a Stats,
}

/// `{"code", "message"}` inside an error event.
#[derive(Debug, Serialize)]
pub struct ErrorBody<'a> {
    /// Stable code.
    pub code: ErrorCode,
    /// Explanation.
    pub message: &'a str,
}

/// `{"id", "error": {...}}`.
#[derive(Debug, Serialize)]
pub struct ErrorEvent<'a> {
    /// Request id (`null` if unreadable).
    pub id: &'a Id,
    /// The error.
    pub error: ErrorBody<'a>,
}

/// Body of the `info` reply.
#[derive(Debug, Clone, Serialize)]
pub struct InfoBody {
    /// Model name.
    pub model: String,
    /// Context limit in tokens.
    pub context_limit: u32,
    /// Vocabulary size.
    pub vocab_size: u32,
    /// kore-service version.
    pub version: &'static str,
    /// Protocol revision (this document: 1).
    pub protocol: u32,
    /// Scheduling policy: `"batched"` (up to `max_active` requests decode
    /// together, the rest wait in order) or `"fifo"` (an engine that runs one
    /// request at a time).
    pub scheduling: &'static str,
    /// Requests the engine runs together at most.
    pub max_active: usize,
    /// Requests running now.
    pub active: usize,
    /// Longest accepted request line in bytes.
    pub max_line_bytes: usize,
    /// Queue capacity (requests waiting, not counting the running one).
    pub queue_limit: usize,
    /// Requests waiting now.
    pub queued: usize,
    /// Whether any request is running now.
    pub busy: bool,
    /// Open connections.
    pub connections: usize,
}

/// `{"id", "info": {...}}`.
#[derive(Debug, Serialize)]
pub struct InfoEvent<'a> {
    /// Request id.
    pub id: &'a Id,
    /// The description.
    pub info: &'a InfoBody,
}

/// `{"id", "bench": {...}}`.
#[derive(Debug, Serialize)]
pub struct BenchEvent<'a> {
    /// Request id.
    pub id: &'a Id,
    /// Results.
    pub bench: &'a BenchReport,
}

/// Appends `event` as one JSON line to `out`.
pub fn write_line<T: Serialize>(out: &mut Vec<u8>, event: &T) {
    match serde_json::to_vec(event) {
        Ok(bytes) => out.extend_from_slice(&bytes),
        // Our events contain only strings, numbers and maps with string keys,
        // which always serialize; keep the stream well-formed regardless.
        Err(_) => out.extend_from_slice(
            br#"{"id":null,"error":{"code":"internal","message":"response encoding failed"}}"#,
        ),
    }
    out.push(b'\n');
}
