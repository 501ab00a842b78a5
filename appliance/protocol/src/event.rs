//! Event lines: everything the service sends, one JSON object followed by
//! `\n`. The service serializes them borrowing its own data
//! (`Cow::Borrowed`); every client (the launcher, its HTTP server, tests)
//! reads a line with [`parse_event`] into the same types, owned.

use alloc::borrow::Cow;
use alloc::string::String;
use alloc::vec::Vec;
use serde::{Deserialize, Serialize};

use crate::bench::BenchReport;
use crate::error::ErrorCode;
use crate::request::Id;
use crate::tools::{CallDelta, CallOut, TokenLogprob};

/// Which part of the model's output a delta belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    /// Reasoning between `<think>` and `</think>`.
    Thinking,
    /// The answer (everything for raw prompts).
    Answer,
}

/// Why a request ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Finish {
    /// A stop token or stop string was generated.
    Stop,
    /// `max_tokens` or the context limit was reached.
    Length,
    /// Cancelled by `{"cancel": id}`.
    Cancelled,
}

impl Finish {
    /// The wire name (`stop`, `length`, `cancelled`).
    pub fn as_str(self) -> &'static str {
        match self {
            Finish::Stop => "stop",
            Finish::Length => "length",
            Finish::Cancelled => "cancelled",
        }
    }
}

/// Per-request measurements in the `done` event (a reader takes 0 for a
/// field an older service did not send).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct Stats {
    /// Prompt length in tokens.
    pub prompt_tokens: u32,
    /// Prompt tokens served from the prefix cache (0 when none).
    pub cached_tokens: u32,
    /// Which tier of the prefix cache served them: `memory` or `disk`
    /// (absent when none were).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cache_tier: Option<String>,
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
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DeltaEvent<'a> {
    /// Request id.
    pub id: Cow<'a, Id>,
    /// New text.
    pub delta: Cow<'a, str>,
    /// Its phase.
    pub phase: Phase,
    /// A piece of a tool call (`delta` is then empty; requests with
    /// `tools` only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call: Option<CallDelta<'a>>,
    /// The log-probabilities of the tokens generated since the last delta
    /// that carried some (requests with `logprobs`): the deltas' lists,
    /// joined, are a prefix of `done.logprobs`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logprobs: Option<Cow<'a, [TokenLogprob]>>,
}

/// The final event of a successful (or cancelled) request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DoneEvent<'a> {
    /// Request id.
    pub id: Cow<'a, Id>,
    /// Always true.
    pub done: bool,
    /// Why it ended.
    pub finish: Finish,
    /// Generated token ids (including a final stop token).
    pub token_ids: Cow<'a, [u32]>,
    /// Answer text (the concatenated answer deltas).
    pub text: Cow<'a, str>,
    /// Thinking text (chat requests only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub thinking: Option<Cow<'a, str>>,
    /// Measurements.
    pub stats: Cow<'a, Stats>,
    /// The model's tool calls (requests with `tools`; `finish` is then
    /// `stop` and `text` holds what came before the calls).
    #[serde(default, skip_serializing_if = "<[CallOut]>::is_empty")]
    pub tool_calls: Cow<'a, [CallOut]>,
    /// Each generated token's log-probabilities (requests with `logprobs`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logprobs: Option<Cow<'a, [TokenLogprob]>>,
    /// The stop string that ended the answer (`finish` is then `stop`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop_sequence: Option<Cow<'a, str>>,
}

/// `{"code", "message"}` inside an error event.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ErrorBody<'a> {
    /// Stable code.
    pub code: ErrorCode,
    /// Explanation.
    pub message: Cow<'a, str>,
}

/// `{"id", "error": {...}}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ErrorEvent<'a> {
    /// Request id (`null` if unreadable).
    pub id: Cow<'a, Id>,
    /// The error.
    pub error: ErrorBody<'a>,
}

/// Body of the `info` reply (a reader takes defaults for fields an older
/// service did not send).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct InfoBody {
    /// Model name.
    pub model: String,
    /// Context limit in tokens.
    pub context_limit: u32,
    /// Vocabulary size.
    pub vocab_size: u32,
    /// kore-service version.
    pub version: Cow<'static, str>,
    /// Protocol revision (this document: 1).
    pub protocol: u32,
    /// Scheduling policy: `"batched"` (up to `max_active` requests decode
    /// together, the rest wait in order) or `"fifo"` (an engine that runs one
    /// request at a time).
    pub scheduling: Cow<'static, str>,
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
    /// The prefix cache's counters (absent from engines without one).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cache: Option<CacheInfo>,
}

/// The prefix cache's counters in the `info` reply (docs/protocol.md,
/// "Prefix cache"): the memory tier's and, where the engine has one, the
/// disk tier's (on the host for a guest).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct CacheInfo {
    /// Requests that started from a checkpoint in memory.
    pub hits_memory: u64,
    /// Requests that started from a checkpoint loaded from disk.
    pub hits_disk: u64,
    /// Requests that could use the cache and found nothing.
    pub misses: u64,
    /// Prompt tokens served from memory.
    pub tokens_memory: u64,
    /// Prompt tokens served from disk.
    pub tokens_disk: u64,
    /// Bytes the memory tier holds.
    pub bytes_memory: u64,
    /// The memory tier's budget in bytes.
    pub budget_memory: u64,
    /// Checkpoints held in memory.
    pub checkpoints: u64,
    /// Checkpoints the memory tier dropped for its budget.
    pub evictions_memory: u64,
    /// Bytes of checkpoint files kept on disk.
    pub bytes_disk: u64,
    /// The disk tier's budget in bytes (0: no disk tier).
    pub budget_disk: u64,
    /// Checkpoint files kept on disk.
    pub files: u64,
    /// Files the disk tier deleted for its budget.
    pub evictions_disk: u64,
    /// Files written.
    pub written: u64,
    /// Files found bad (truncated, corrupt, foreign) and ignored.
    pub rejected: u64,
}

/// `{"id", "info": {...}}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct InfoEvent<'a> {
    /// Request id.
    pub id: Cow<'a, Id>,
    /// The description.
    pub info: Cow<'a, InfoBody>,
}

/// `{"id", "bench": {...}}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BenchEvent<'a> {
    /// Request id.
    pub id: Cow<'a, Id>,
    /// Results.
    pub bench: Cow<'a, BenchReport>,
}

/// Any event, as a client reads it: each kind is told apart by its key
/// (`delta`, `done`, `error`, `info`, `bench`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Event<'a> {
    /// Streamed text.
    Delta(DeltaEvent<'a>),
    /// A request ended.
    Done(DoneEvent<'a>),
    /// A request (or an unreadable line) failed.
    Error(ErrorEvent<'a>),
    /// The `info` reply.
    Info(InfoEvent<'a>),
    /// The `bench` reply.
    Bench(BenchEvent<'a>),
}

impl Event<'_> {
    /// Whether this ends its request (everything but a delta).
    pub fn is_terminal(&self) -> bool {
        !matches!(self, Event::Delta(_))
    }

    /// The request id the event answers.
    pub fn id(&self) -> &Id {
        match self {
            Event::Delta(e) => &e.id,
            Event::Done(e) => &e.id,
            Event::Error(e) => &e.id,
            Event::Info(e) => &e.id,
            Event::Bench(e) => &e.id,
        }
    }
}

/// Reads one event line (without its newline) into owned wire types; the
/// error says why a line is not an event of this protocol.
pub fn parse_event(line: &str) -> Result<Event<'static>, serde_json::Error> {
    serde_json::from_str(line)
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

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn round_trip(event: &Event<'_>) -> Event<'static> {
        let mut line = Vec::new();
        write_line(&mut line, event);
        assert_eq!(line.pop(), Some(b'\n'));
        parse_event(core::str::from_utf8(&line).unwrap()).unwrap()
    }

    #[test]
    fn every_event_reads_back_as_written() {
        let id = Id(json!("r1"));
        let stats = Stats {
            prompt_tokens: 3,
            cached_tokens: 1,
            cache_tier: Some("disk".into()),
            ..Stats::default()
        };
        let info = InfoBody {
            model: "tiny".into(),
            context_limit: 4096,
            vocab_size: 8,
            version: Cow::Borrowed("0.1.0"),
            protocol: 1,
            scheduling: Cow::Borrowed("batched"),
            max_active: 8,
            active: 0,
            max_line_bytes: 1 << 20,
            queue_limit: 64,
            queued: 0,
            busy: false,
            connections: 1,
            cache: Some(CacheInfo { hits_memory: 2, bytes_disk: 9, ..CacheInfo::default() }),
        };
        let report = BenchReport { threads: 2, kernels: "avx2".into(), ..BenchReport::default() };
        let events = [
            Event::Delta(DeltaEvent {
                id: Cow::Borrowed(&id),
                delta: Cow::Borrowed("hi"),
                phase: Phase::Thinking,
                tool_call: None,
                logprobs: Some(Cow::Owned(alloc::vec![TokenLogprob {
                    id: 7,
                    token: "hi".into(),
                    bytes: b"hi".to_vec(),
                    logprob: -0.5,
                    top: Vec::new(),
                }])),
            }),
            Event::Done(DoneEvent {
                id: Cow::Borrowed(&id),
                done: true,
                finish: Finish::Length,
                token_ids: Cow::Borrowed(&[1, 2, 3]),
                text: Cow::Borrowed("abc"),
                thinking: None,
                stats: Cow::Borrowed(&stats),
                tool_calls: Cow::Borrowed(&[]),
                logprobs: None,
                stop_sequence: Some(Cow::Borrowed("\n\n")),
            }),
            Event::Error(ErrorEvent {
                id: Cow::Borrowed(&Id::NULL),
                error: ErrorBody { code: ErrorCode::LineTooLong, message: "long".into() },
            }),
            Event::Info(InfoEvent { id: Cow::Borrowed(&id), info: Cow::Borrowed(&info) }),
            Event::Bench(BenchEvent { id: Cow::Borrowed(&id), bench: Cow::Borrowed(&report) }),
        ];
        for e in &events {
            assert_eq!(&round_trip(e), e);
        }
    }

    #[test]
    fn lines_that_are_no_event_are_errors() {
        for line in ["", "{}", "[1]", r#"{"id":1,"delta":5,"phase":"answer"}"#, r#"{"id":1}"#] {
            assert!(parse_event(line).is_err(), "{line}");
        }
        let e = parse_event(r#"{"id":7,"delta":"x","phase":"answer","extra":true}"#).unwrap();
        assert_eq!(e.id(), &Id(json!(7)), "unknown fields are ignored (newer services)");
    }
}
