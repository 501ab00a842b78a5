//! What the service needs from an inference engine and a clock: small traits
//! so that the same scheduler drives the real engine in the guest, the real
//! engine in-process on the host (`--native`), and fakes in tests.

use alloc::collections::BTreeMap;
use alloc::string::String;
use alloc::sync::Arc;
use alloc::vec::Vec;
use serde::{Deserialize, Serialize};

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

/// Parameters of `{"op":"bench"}`; every field is optional on the wire.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct BenchRequest {
    /// Prompt length for the prefill measurement (`None` = engine default).
    pub prompt_tokens: Option<u32>,
    /// Tokens to decode for the decode measurement (`None` = engine default).
    pub decode_tokens: Option<u32>,
    /// Draft tokens per step (`None` = engine default, `Some(0)` = off).
    pub mtp: Option<u32>,
    /// Worker threads (`None` = all vCPUs).
    pub threads: Option<u32>,
    /// Sequences decoding together (`None` = 1).
    pub concurrency: Option<u32>,
}

/// The [`BenchReport`] fields that are positive numbers in every report
/// (CONTRACT.md's `bench --json`): what clients and tests check first.
pub const BENCH_POSITIVE_FIELDS: [&str; 9] = [
    "measured_read_gbps",
    "prefill_tok_per_s",
    "decode_tok_per_s",
    "step_ms",
    "weight_bytes_per_step",
    "achieved_gbps",
    "bandwidth_fraction",
    "tokens_per_step",
    "threads",
];

/// Benchmark results, field for field the `kore-launch bench --json` object.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct BenchReport {
    /// Memory read bandwidth measured in the same run, GB/s.
    pub measured_read_gbps: f64,
    /// Prefill throughput, tokens/s.
    pub prefill_tok_per_s: f64,
    /// Decode throughput of one sequence, tokens/s.
    pub decode_tok_per_s: f64,
    /// Sequences decoding together.
    pub concurrency: u32,
    /// Decode throughput of all sequences together, tokens/s.
    pub aggregate_decode_tok_per_s: f64,
    /// Mean decode step time, ms.
    pub step_ms: f64,
    /// Weight bytes read per decode step.
    pub weight_bytes_per_step: f64,
    /// Weight bytes per step divided by step time, GB/s.
    pub achieved_gbps: f64,
    /// `achieved_gbps / measured_read_gbps`.
    pub bandwidth_fraction: f64,
    /// Mean tokens per decode step (1 without drafting).
    pub tokens_per_step: f64,
    /// Worker threads used.
    pub threads: u32,
    /// The kernel path the engine ran (`generic`, `avx2`, `avx512`, `avx512vnni`).
    pub kernels: String,
    /// Share of the prefill's time per part of the forward (`trunk_matmuls`,
    /// `deltanet`, `attention`, `head`, `rest`; `kore_engine::profile`),
    /// absent where nothing was counted.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub prefill_share: BTreeMap<String, f64>,
    /// The same shares over plain decoding's steps, absent with MTP or where
    /// nothing was counted.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub decode_share: BTreeMap<String, f64>,
    /// With MTP drafting (`mtp > 0`): the figures of [`MtpBench`], else absent.
    #[serde(flatten, default, skip_serializing_if = "Option::is_none")]
    pub mtp: Option<MtpBench>,
}

/// The MTP part of a bench report (`kore-launch bench --mtp N`), measured
/// against plain decoding in the same run.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct MtpBench {
    /// Drafts per step asked for.
    pub mtp: u32,
    /// Per draft position: fraction of steps whose drafts 1..=k were all accepted.
    pub mtp_acceptance: Vec<f64>,
    /// Mean drafts made per step.
    pub mtp_drafts_per_step: f64,
    /// Plain (one token a step) decode tok/s of the same run.
    pub plain_decode_tok_per_s: f64,
    /// Speculative decode tok/s over plain decode tok/s.
    pub mtp_speedup: f64,
    /// Projected (not measured) speedup at the reference acceptance, from
    /// this run's step costs (`kore_engine::bench::projected_speedup`).
    pub mtp_projected_speedup: f64,
    /// Projected (not measured) speedup at this run's own acceptance.
    #[serde(default)]
    pub mtp_projected_speedup_measured: f64,
    /// Milliseconds of a plain step, timed as the verify steps are.
    #[serde(default)]
    pub mtp_plain_step_ms: f64,
    /// Milliseconds of a verify step over 1..=8 tokens.
    #[serde(default)]
    pub mtp_verify_ms: Vec<f64>,
    /// Milliseconds of one draft.
    #[serde(default)]
    pub mtp_draft_ms: f64,
    /// Draft length with the best projected speedup at this run's acceptance.
    #[serde(default)]
    pub mtp_best_drafts: u32,
    /// Draft vocabulary (lm_head rows the drafts score).
    pub mtp_draft_vocab: u32,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mtp_figures_sit_beside_the_contract_fields_only_when_drafting() {
        let plain = serde_json::to_value(BenchReport { threads: 2, ..BenchReport::default() });
        let plain = plain.unwrap();
        assert_eq!(plain["threads"], 2);
        assert!(plain.get("mtp").is_none() && plain.get("mtp_acceptance").is_none(), "{plain}");
        let mtp = MtpBench {
            mtp: 3,
            mtp_acceptance: alloc::vec![0.5, 0.25, 0.125],
            mtp_speedup: 1.5,
            ..MtpBench::default()
        };
        let v = serde_json::to_value(BenchReport { mtp: Some(mtp), ..BenchReport::default() });
        let v = v.unwrap();
        assert_eq!(v["mtp"], 3);
        assert_eq!(v["mtp_acceptance"].as_array().map(|a| a.len()), Some(3));
        assert_eq!(v["mtp_speedup"], 1.5);
        assert!(v.get("tokens_per_step").is_some(), "{v}");
    }

    #[test]
    fn prefill_share_is_an_object_only_when_counted() {
        let plain = serde_json::to_value(BenchReport::default()).unwrap();
        assert!(plain.get("prefill_share").is_none(), "{plain}");
        let mut share = BTreeMap::new();
        share.insert(String::from("trunk_matmuls"), 0.75);
        share.insert(String::from("rest"), 0.25);
        let r = BenchReport { prefill_share: share, ..BenchReport::default() };
        let v = serde_json::to_value(&r).unwrap();
        assert_eq!(v["prefill_share"]["trunk_matmuls"], 0.75, "{v}");
        let back: BenchReport = serde_json::from_value(v).unwrap();
        assert_eq!(back, r);
    }
}
