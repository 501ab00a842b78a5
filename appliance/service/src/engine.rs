//! What the service needs from an inference engine and a clock: small traits
//! so that the same scheduler drives the real engine in the guest, the real
//! engine in-process on the host (`--native`), and fakes in tests.

use alloc::string::String;
use alloc::sync::Arc;
use alloc::vec::Vec;
use serde::Serialize;

pub use kore_protocol::{BenchReport, BenchRequest, CacheInfo};

/// Sampling and drafting parameters of one request, already validated.
#[derive(Debug, Clone, PartialEq)]
pub struct GenParams {
    /// Upper bound on generated tokens (the service also enforces it).
    pub max_tokens: u32,
    /// Softmax temperature; `0.0` means greedy (argmax).
    pub temperature: f32,
    /// Nucleus sampling mass in `(0, 1]`; `1.0` disables it.
    pub top_p: f32,
    /// Keep only the `top_k` most likely tokens; `0` disables it.
    pub top_k: u32,
    /// Drop tokens below `min_p` times the top probability; `0.0` disables it.
    pub min_p: f32,
    /// Seed of the request's random stream.
    pub seed: u64,
    /// Draft tokens per step for multi-token prediction; `None` = engine default,
    /// `Some(0)` = drafting off.
    pub mtp: Option<u32>,
    /// Session name: the engine may continue the state it kept for it and
    /// keeps this request's state for it afterwards.
    pub session: Option<String>,
    /// With a session: a prompt position to keep a checkpoint at besides the
    /// prompt's end (the service gives the start of a chat prompt's
    /// generation-prompt thinking block, which later turns render differently).
    pub checkpoint_at: Option<u32>,
    /// With a session: the end of a prefix other sessions may share (a chat
    /// prompt's system turn), kept once for all of them.
    pub shared_at: Option<u32>,
    /// Prompt positions where a message ends and the next begins (from
    /// [`crate::Codec::boundaries`]): the engine's prefix cache keeps a
    /// checkpoint at each (docs/protocol.md, "Prefix cache").
    pub boundaries: Vec<u32>,
    /// Constrained decoding: only tokens this grammar allows are sampled and
    /// the stop tokens only where its output is complete (a JSON Schema, any
    /// JSON object, or tool calls: `kore_grammar::Grammar`). Drafting is off
    /// for such a request.
    pub constraint: Option<Arc<kore_grammar::Grammar>>,
    /// `Some(n)`: report each generated token's log-probability and the `n`
    /// (at most 20) most likely tokens' ([`Engine::take_logprobs`]).
    pub logprobs: Option<u8>,
}

/// One generated token's log-probabilities (the model's log-softmax, before
/// temperature, filters and constraints).
#[derive(Debug, Clone, PartialEq)]
pub struct TokenLogprobs {
    /// The token.
    pub token: u32,
    /// Its log-probability.
    pub logprob: f32,
    /// The most likely tokens and theirs, most likely first.
    pub top: Vec<(u32, f32)>,
}

impl Default for GenParams {
    fn default() -> Self {
        Self {
            max_tokens: u32::MAX,
            temperature: 0.0,
            top_p: 1.0,
            top_k: 0,
            min_p: 0.0,
            seed: 0,
            mtp: None,
            session: None,
            checkpoint_at: None,
            shared_at: None,
            boundaries: Vec::new(),
            constraint: None,
            logprobs: None,
        }
    }
}

/// Static facts about the loaded model, reported by `{"op":"info"}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct EngineInfo {
    /// Model name (e.g. the pack name).
    pub model: String,
    /// Maximum tokens (prompt + generated) one request may use.
    pub context_limit: u32,
    /// Vocabulary size; `prompt_ids` must be below it.
    pub vocab_size: u32,
}

/// Why the engine refused or failed a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EngineError {
    /// A parameter the engine cannot honour (sent to the client as `bad_request`).
    BadParams(String),
    /// The prompt does not fit (sent as `prompt_too_long`).
    PromptTooLong(String),
    /// The operation is not available in this build (sent as `unsupported`).
    Unsupported(String),
    /// Anything else (sent as `internal`); the service keeps running.
    Internal(String),
}

/// Names one sequence (one running request) inside the engine; chosen by
/// the service, unique among the sequences started and not yet finished.
pub type SeqId = u64;

/// What one [`Engine::step`] did for one sequence.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StepOut {
    /// The sequence.
    pub seq: SeqId,
    /// Its new tokens (none while still prefilling; 1 + accepted drafts when
    /// decoding), or why it failed (the service then finishes it).
    pub result: Result<Vec<u32>, EngineError>,
}

/// The inference engine as the scheduler drives it: up to
/// [`Engine::max_sequences`] requests at once, every step advancing all of
/// them together (one forward over every sequence), so that the caller can
/// do I/O and notice cancellations between steps.
pub trait Engine {
    /// Model facts; called once when the service is created.
    fn info(&self) -> EngineInfo;

    /// Sequences the engine runs together at most (at least 1); the service
    /// queues requests beyond it.
    fn max_sequences(&self) -> usize {
        1
    }

    /// Whether a request of `prompt_tokens` that may generate `max_tokens`
    /// fits in the engine's memory beside the sequences running now; the
    /// service keeps it queued until it does. A request is always started
    /// when nothing runs (its context limit bounds it).
    fn has_room(&self, prompt_tokens: usize, max_tokens: u32) -> bool {
        let _ = (prompt_tokens, max_tokens);
        true
    }

    /// Begins sequence `seq` on `prompt` (never empty, and shorter than the
    /// context limit) and returns how many of its first tokens are served
    /// from a kept session state (`stats.cached_tokens`). The engine may
    /// prefill here or spread prefill over `step` calls.
    fn start(&mut self, seq: SeqId, prompt: &[u32], params: &GenParams)
        -> Result<u32, EngineError>;

    /// Prompt tokens of running sequence `seq` served from kept state so
    /// far, when that grew after [`Engine::start`] (an engine that let the
    /// sequence wait for another's checkpoint); `None` keeps what `start`
    /// returned. Asked once, when the request ends.
    fn cached_tokens(&self, seq: SeqId) -> Option<u32> {
        let _ = seq;
        None
    }

    /// Which tier of the engine's prefix cache served running sequence
    /// `seq`'s cached tokens (`"memory"`, `"disk"`), if any; asked with
    /// [`Engine::cached_tokens`].
    fn cache_tier(&self, seq: SeqId) -> Option<&'static str> {
        let _ = seq;
        None
    }

    /// The prefix cache's counters for `info` (`None`: no cache).
    fn cache_info(&self) -> Option<CacheInfo> {
        None
    }

    /// Advances every started sequence by one step and reports each in
    /// `out` (in no particular order). A step should take bounded time (one
    /// prefill chunk or one decode step per sequence) so cancellations are
    /// seen promptly.
    fn step(&mut self, out: &mut Vec<StepOut>);

    /// Ends sequence `seq` (finished, cancelled or failed) and frees its
    /// state. Called exactly once after every successful `start`.
    fn finish(&mut self, seq: SeqId);

    /// The log-probabilities of the tokens `seq` produced since the last call
    /// (requests with [`GenParams::logprobs`]; otherwise empty), in order.
    fn take_logprobs(&mut self, seq: SeqId) -> Vec<TokenLogprobs> {
        let _ = seq;
        Vec::new()
    }

    /// Runs the in-guest benchmark (`{"op":"bench"}`); blocks until done.
    fn bench(&mut self, request: &BenchRequest) -> Result<BenchReport, EngineError> {
        let _ = request;
        Err(EngineError::Unsupported(String::from("this engine does not implement the benchmark")))
    }
}

/// A monotonic clock in nanoseconds (TSC in the guest, `Instant` on the host).
pub trait Clock {
    /// Nanoseconds since an arbitrary fixed origin; never decreases.
    fn now_ns(&self) -> u64;
}
