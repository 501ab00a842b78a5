//! The pack benchmark, `no_std`: the same code measures the host
//! (`kore-launch bench --native`) and the Kore guest (kore-service's
//! `Engine::bench`). The caller brings a clock, the read-bandwidth buffer and
//! the pool; this module only measures.
//!
//! ```text
//! 1. read bandwidth: every worker sums its share of `buf` (>> caches), with the
//!    weight kernels' software prefetch; best pass
//! 2. prefill: a `prompt_tokens` prompt in forwards of `prefill_chunk` tokens
//!    (the appliance's chunk; logits of the last token),
//!    with each part's share of its time (`crate::profile`); with `depth = D >
//!    0` after D positions of context (synthetic keys and values in every
//!    attention layer, `State::push_synthetic_context`: what llama-bench's
//!    `-d D` measures, without prefilling D tokens first)
//! 3. decode:  `decode_tokens` greedy single-token steps from the prefilled state
//!    (so at depth D + prompt_tokens)
//!    (with `concurrency = C > 1`: C copies of it decode together, one
//!    `Model::forward_batch` a step, each copy starting from its own first
//!    token so that an MoE model routes them apart; tok/s per sequence and all
//!    together)
//! 4. with `mtp = N > 0` (and an MTP head): `rounds` rounds, each one plain
//!    decode (as 3) and one speculative decode of `decode_tokens` greedy tokens
//!    (N drafts every step, untimed fresh prefill first), in ABBA order so drift
//!    in the machine's load hits both alike; `mtp_speedup` = MTP tok/s over
//!    plain tok/s summed over the rounds of this run; then the cost of a verify
//!    step over 1..=8 tokens from the prefilled state, which with the measured
//!    draft cost gives the projected speedups (`Projection`)
//! achieved_gbps = weight_bytes_per_step / step time; fraction = achieved / measured
//! (an MoE model's weight_bytes_per_step counts the routed experts the steps
//! actually read, `Model::expert_reads`, instead of top_k per token)
//! ```

use alloc::format;
use alloc::string::String;
use alloc::vec::Vec;
use core::sync::atomic::{AtomicU64, Ordering};

use crate::model::{Logits, Model, SeqInput};
use crate::pool::{split, Parallel};
use crate::sampling::{argmax, Sampler, SamplingParams};
use crate::spec::{SpecOptions, SpecStats, Speculator, MAX_DRAFTS};
use crate::state::State;

/// What to run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BenchOptions {
    /// Prompt length of the prefill measurement.
    pub prompt_tokens: usize,
    /// Decode steps timed.
    pub decode_tokens: usize,
    /// Passes over the bandwidth buffer (the best one counts).
    pub bandwidth_passes: usize,
    /// Draft tokens per step with the MTP head (0: plain decoding only).
    pub mtp: usize,
    /// With `mtp > 0`: rounds of (plain, speculative) decoding compared.
    pub rounds: usize,
    /// Draft vocabulary with `mtp > 0` (lm_head rows the drafts score; 0:
    /// [`crate::spec::draft_vocab`] of the model's vocabulary).
    pub draft_vocab: usize,
    /// Sequences decoding together (plain decoding only): each step is one
    /// [`Model::forward_batch`] over all of them.
    pub concurrency: usize,
    /// Positions of context before the prompt (0: an empty context).
    pub depth: usize,
    /// Prompt tokens per forward of the prefill (0: the whole prompt in
    /// one). Default [`crate::PREFILL_CHUNK`], the appliance's: a long
    /// prompt in one forward keeps activations of every token, far past the
    /// caches, and is not what a request runs.
    pub prefill_chunk: usize,
}

impl Default for BenchOptions {
    fn default() -> Self {
        BenchOptions {
            prompt_tokens: 512,
            decode_tokens: 128,
            bandwidth_passes: 3,
            mtp: 0,
            rounds: 2,
            draft_vocab: 0,
            concurrency: 1,
            depth: 0,
            prefill_chunk: crate::PREFILL_CHUNK,
        }
    }
}

/// The figures of one run (CONTRACT.md `bench --json` fields, plus the kernels).
#[derive(Clone, Debug, PartialEq)]
pub struct BenchReport {
    /// Read bandwidth of this machine measured in this run (GB/s, 1e9 bytes).
    pub measured_read_gbps: f64,
    /// Prompt tokens per second.
    pub prefill_tok_per_s: f64,
    /// Generated tokens per second of one sequence.
    pub decode_tok_per_s: f64,
    /// Sequences decoding together.
    pub concurrency: usize,
    /// Generated tokens per second of all sequences together.
    pub aggregate_decode_tok_per_s: f64,
    /// Milliseconds per decode step.
    pub step_ms: f64,
    /// Weight bytes one decode step streams.
    pub weight_bytes_per_step: u64,
    /// Positions of context before the prompt ([`BenchOptions::depth`]).
    pub depth: usize,
    /// KV cache bytes one decode step reads at its start (every attention
    /// layer's keys and values: depth + prompt positions, in the model's KV
    /// precision); not in `weight_bytes_per_step` or `achieved_gbps`.
    pub kv_bytes_per_step: u64,
    /// `weight_bytes_per_step / step time` (GB/s).
    pub achieved_gbps: f64,
    /// `achieved_gbps / measured_read_gbps`.
    pub bandwidth_fraction: f64,
    /// Tokens accepted per decode step (1.0 without MTP).
    pub tokens_per_step: f64,
    /// Workers.
    pub threads: usize,
    /// Kernel path (`generic`, `avx2`, `avx512`).
    pub kernels: &'static str,
    /// Share of the prefill's time per part of the forward
    /// ([`crate::profile::Part`] names: `trunk_matmuls`, `deltanet`,
    /// `attention`, `head`, `rest`; they sum to 1), empty where the tally
    /// has no clock (not x86_64).
    pub prefill_share: Vec<(&'static str, f64)>,
    /// The same shares over plain decoding's steps (every sequence of
    /// `concurrency` together); empty with MTP or without a clock.
    pub decode_share: Vec<(&'static str, f64)>,
    /// With MTP: drafts asked per step, plain decode tok/s of the same run,
    /// speedup and acceptance per draft position.
    pub mtp: Option<MtpReport>,
}

/// The MTP part of a [`BenchReport`].
#[derive(Clone, Debug, PartialEq)]
pub struct MtpReport {
    /// Drafts per step asked for (`--mtp N`).
    pub drafts: usize,
    /// Mean drafts actually made per step (the adaptive length may use fewer).
    pub drafts_per_step: f64,
    /// Plain (one token a step) decode tok/s measured in the same run.
    pub plain_decode_tok_per_s: f64,
    /// MTP decode tok/s over plain decode tok/s.
    pub speedup: f64,
    /// Fraction of steps whose drafts 1..=k were all accepted, per k (length `drafts`).
    pub acceptance: Vec<f64>,
    /// Draft vocabulary (lm_head rows the drafts score).
    pub draft_vocab: usize,
    /// Milliseconds a speculative step spent per phase (mean over steps),
    /// [`crate::spec::StepProfile::phases`] order, then `other`.
    pub profile_ms: Vec<(&'static str, f64)>,
    /// Projected, not measured: the speedup at the reference acceptance
    /// ([`REFERENCE_TOKENS_PER_STEP`] tokens a step with [`REFERENCE_DRAFTS`]
    /// drafts) from this run's step costs ([`Projection`]).
    pub projected_speedup: f64,
    /// Projected, not measured: the speedup at this run's own acceptance
    /// (its tokens a step with `drafts` drafts), from the same costs.
    pub projected_speedup_measured: f64,
    /// Milliseconds of a verify step (checkpointed trunk forward plus the
    /// full lm_head) over `n` tokens, `n = 1..=8` (index `n - 1`).
    pub verify_ms: Vec<f64>,
    /// Milliseconds of a plain step (forward + lm_head over one token),
    /// measured as `verify_ms` is (the projections' baseline).
    pub plain_step_ms: f64,
    /// Milliseconds of one draft (MTP layer + draft head), measured.
    pub draft_ms: f64,
    /// The draft length (0..=`drafts`) that the measured acceptance by
    /// position and these costs say gives the most tokens a second (0:
    /// drafting does not pay; the adaptive length may choose it).
    pub best_drafts: usize,
}

/// The step costs a projected speedup is derived from (milliseconds).
#[derive(Clone, Debug, PartialEq)]
pub struct Projection {
    /// A plain single-token decode step (forward + lm_head over one token),
    /// timed the same way as `verify_ms`.
    pub plain_ms: f64,
    /// A verify step over `n` tokens, `n = 1..` (index `n - 1`).
    pub verify_ms: Vec<f64>,
    /// One draft.
    pub draft_ms: f64,
    /// What else a speculative step costs (rewind, MTP refill, sampling),
    /// as measured per step.
    pub other_ms: f64,
}

impl Projection {
    /// Milliseconds of a step with `drafts` drafts: the drafts, a verify of
    /// `drafts + 1` tokens and the rest ([`None`] past the verify table).
    pub fn step_ms(&self, drafts: usize) -> Option<f64> {
        let verify = self.verify_ms.get(drafts)?;
        Some(verify + drafts as f64 * self.draft_ms + self.other_ms)
    }

    /// Speedup over plain decoding of steps with `drafts` drafts that yield
    /// `tokens_per_step` tokens.
    pub fn speedup(&self, drafts: usize, tokens_per_step: f64) -> Option<f64> {
        Some(tokens_per_step * self.plain_ms / self.step_ms(drafts)?.max(1e-9))
    }

    /// The draft length in `0..=max` with the best projected speedup for
    /// the acceptance `acceptance[j]` (fraction of steps whose drafts
    /// `1..=j+1` were all accepted); 0 is plain decoding (speedup 1).
    pub fn best_drafts(&self, acceptance: &[f64], max: usize) -> usize {
        let (mut best, mut best_speedup) = (0, 1.0);
        let mut tokens = 1.0;
        for k in 1..=max.min(acceptance.len()) {
            tokens += acceptance[k - 1];
            match self.speedup(k, tokens) {
                Some(s) if s > best_speedup => (best, best_speedup) = (k, s),
                _ => {}
            }
        }
        best
    }
}

/// Tokens a step the reference MTP acceptance gives (Qwen3.5 with 7 drafts).
pub const REFERENCE_TOKENS_PER_STEP: f64 = 3.9;
/// Drafts a step of the reference acceptance.
pub const REFERENCE_DRAFTS: usize = 7;

/// The speedup over plain decoding that `tokens_per_step` accepted tokens
/// with `drafts` drafts a step would give, from measured costs: a plain step
/// of `plain_step_ms`, a speculative step of `step_ms` that made
/// `drafts_made` drafts in `draft_ms` (MTP layer + draft head). The
/// projected step is the measured one minus its drafts plus `drafts` drafts
/// at the measured cost each; its verify part is the one measured (for
/// `drafts_made + 1` tokens: exact when the run drafted `drafts` a step).
pub fn projected_speedup(
    plain_step_ms: f64,
    step_ms: f64,
    draft_ms: f64,
    drafts_made: f64,
    drafts: usize,
    tokens_per_step: f64,
) -> f64 {
    let per_draft = if drafts_made > 0.0 { draft_ms / drafts_made } else { 0.0 };
    let step = (step_ms - draft_ms).max(0.0) + drafts as f64 * per_draft;
    tokens_per_step * plain_step_ms / step.max(1e-9)
}

/// A nanosecond clock (monotonic).
pub type Clock<'c> = &'c dyn Fn() -> u64;

/// STREAM-like read bandwidth over `buf` with every worker of `pool`
/// (GB/s, best of `passes`). `buf` should be far larger than the caches;
/// its pages are touched first.
pub fn read_bandwidth(
    pool: &dyn Parallel,
    buf: &mut [u64],
    clock: Clock<'_>,
    passes: usize,
) -> f64 {
    let n = buf.len();
    for (i, v) in buf.iter_mut().enumerate() {
        *v = i as u64;
    }
    let buf: &[u64] = buf;
    let sink = AtomicU64::new(0);
    let path = crate::simd::best();
    let mut best = 0.0f64;
    for _ in 0..passes.max(1) {
        let t0 = clock();
        pool.run(&|w, workers| {
            let part = &buf[split(n, w, workers, 8)];
            sink.fetch_add(crate::kernels::read_sum(path, part), Ordering::Relaxed);
        });
        let dt = clock().saturating_sub(t0).max(1);
        best = best.max((n * 8) as f64 / dt as f64);
    }
    core::hint::black_box(sink.load(Ordering::Relaxed));
    best
}

/// The deterministic benchmark prompt: spread-out ids below the vocabulary.
pub fn prompt(len: usize, vocab: usize) -> Vec<u32> {
    (0..len as u64).map(|i| ((i * 7919 + 13) % vocab as u64) as u32).collect()
}

/// Runs prefill and decode on `model` (which should already use `pool`),
/// reporting progress lines through `progress`. `read_gbps` comes from
/// [`read_bandwidth`] in the same run. The prompt is [`prompt`].
pub fn run(
    model: &Model<'_>,
    read_gbps: f64,
    clock: Clock<'_>,
    opts: &BenchOptions,
    progress: &mut dyn FnMut(String),
) -> Result<BenchReport, BenchError> {
    run_with_prompt(model, read_gbps, clock, opts, None, progress)
}

/// A benchmark forward failed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BenchError {
    /// The trunk forward.
    Forward(crate::ForwardError),
    /// The MTP speculator (e.g. `mtp > 0` on a model without an MTP head).
    Mtp(crate::MtpError),
    /// `mtp > 0` with `concurrency > 1`: drafting decodes one sequence at a time.
    MtpConcurrency,
    /// `mtp > 0` with `depth > 0`: the speculative rounds prefill from an empty context.
    MtpDepth,
}

impl core::fmt::Display for BenchError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            BenchError::Forward(e) => e.fmt(f),
            BenchError::Mtp(e) => e.fmt(f),
            BenchError::MtpConcurrency => write!(
                f,
                "MTP drafting decodes one sequence at a time: use concurrency 1 with mtp > 0"
            ),
            BenchError::MtpDepth => {
                write!(f, "MTP rounds are measured from an empty context: use depth 0 with mtp > 0")
            }
        }
    }
}

#[cfg(feature = "std")]
impl std::error::Error for BenchError {}

impl From<crate::ForwardError> for BenchError {
    fn from(e: crate::ForwardError) -> Self {
        BenchError::Forward(e)
    }
}

impl From<crate::MtpError> for BenchError {
    fn from(e: crate::MtpError) -> Self {
        BenchError::Mtp(e)
    }
}

/// [`run`] with the prompt's ids given (for MTP: text like the model's
/// training data, cycled to `prompt_tokens`); `None` uses [`prompt`].
pub fn run_with_prompt(
    model: &Model<'_>,
    read_gbps: f64,
    clock: Clock<'_>,
    opts: &BenchOptions,
    ids: Option<&[u32]>,
    progress: &mut dyn FnMut(String),
) -> Result<BenchReport, BenchError> {
    let vocab = model.config.vocab_size;
    let len = opts.prompt_tokens.max(1);
    let p: Vec<u32> = match ids {
        Some(ids) if !ids.is_empty() => ids.iter().copied().cycle().take(len).collect(),
        _ => prompt(len, vocab),
    };
    if opts.mtp > 0 && !model.has_mtp() {
        return Err(crate::MtpError::NoMtpHead.into());
    }
    if opts.mtp > 0 && opts.concurrency > 1 {
        return Err(BenchError::MtpConcurrency);
    }
    if opts.mtp > 0 && opts.depth > 0 {
        return Err(BenchError::MtpDepth);
    }
    let seqs = opts.concurrency.max(1);
    let needed = opts.depth + p.len() + steps_needed(opts);
    if needed > model.config.max_position_embeddings {
        let max = model.config.max_position_embeddings;
        return Err(crate::ForwardError::ContextFull { needed, max }.into());
    }
    let mut prefilled = model.new_state();
    if opts.depth > 0 {
        progress(format!("context: {} synthetic positions", opts.depth));
        prefilled.push_synthetic_context(&model.config, opts.depth, DEPTH_SEED);
    }
    progress(format!("prefill: {} tokens", p.len()));
    let t0 = clock();
    crate::profile::start();
    let logits = prefill(model, &mut prefilled, &p, opts.prefill_chunk);
    let prefill_share = crate::profile::shares(&crate::profile::stop());
    let logits = logits?;
    let prefill_s = secs(clock().saturating_sub(t0));
    let prefill_tok_per_s = p.len() as f64 / prefill_s;
    progress(format!(
        "prefill: {prefill_tok_per_s:.1} tok/s; decode: {} tokens",
        opts.decode_tokens
    ));
    let first = argmax(&logits);
    let steps = opts.decode_tokens.max(1);
    let mut decode_share = Vec::new();
    let (decode, mtp) = if opts.mtp == 0 {
        crate::profile::start();
        let d = decode_plain(model, &prefilled, (first, seqs), steps, clock, progress);
        decode_share = crate::profile::shares(&crate::profile::stop());
        (d?, None)
    } else {
        let mut plain = Decode::default();
        let mut spec = SpecRun::default();
        for r in 0..opts.rounds.max(1) {
            // ABBA: plain first in even rounds, speculative first in odd ones.
            for part in [r % 2, 1 - r % 2] {
                if part == 0 {
                    let d = decode_plain(model, &prefilled, (first, 1), steps, clock, progress)?;
                    plain.add(d);
                } else {
                    spec.add(decode_mtp(model, &p, steps, opts, clock, progress)?);
                }
            }
        }
        let costs = verify_costs(model, &prefilled, &p, clock, progress)?;
        let m = spec.report(&spec_options(model, opts), plain.tok_per_s(), &costs);
        (spec.decode, Some(m))
    };
    let step_s = decode.seconds / decode.steps as f64;
    let achieved_gbps = decode.bytes as f64 / step_s / 1e9;
    let kv_bytes_per_step = prefilled.kv_bytes() as u64;
    Ok(BenchReport {
        measured_read_gbps: read_gbps,
        prefill_tok_per_s,
        decode_tok_per_s: decode.tok_per_s(),
        concurrency: seqs,
        aggregate_decode_tok_per_s: decode.tok_per_s() * seqs as f64,
        step_ms: step_s * 1e3,
        weight_bytes_per_step: decode.bytes,
        depth: opts.depth,
        kv_bytes_per_step,
        achieved_gbps,
        bandwidth_fraction: achieved_gbps / read_gbps,
        tokens_per_step: decode.tokens as f64 / decode.steps as f64,
        threads: model.pool().workers(),
        kernels: model.kernels().name(),
        prefill_share,
        decode_share,
        mtp,
    })
}

/// Runs `prompt` through `state` `chunk` tokens a forward (0: all in one)
/// and returns the logits of its last token.
fn prefill(
    model: &Model<'_>,
    state: &mut State,
    prompt: &[u32],
    chunk: usize,
) -> Result<Vec<f32>, crate::ForwardError> {
    let chunk = if chunk == 0 { prompt.len() } else { chunk };
    let (rest, last) = prompt.split_at(chunk * ((prompt.len() - 1) / chunk));
    for part in rest.chunks(chunk) {
        model.forward_hidden(state, part)?;
    }
    model.forward(state, last, Logits::Last)
}

/// Seed of the synthetic context of [`BenchOptions::depth`].
const DEPTH_SEED: u64 = 0x5EED_DE97;

/// Positions the decode part may add after the prompt (decode steps, and
/// with MTP the drafts a verify step runs ahead).
fn steps_needed(opts: &BenchOptions) -> usize {
    opts.decode_tokens.max(1) + 1 + opts.mtp
}

/// Timed decoding: `tokens` produced in `steps` trunk steps reading
/// `bytes` of weights a step (mean).
#[derive(Clone, Copy, Default)]
struct Decode {
    seconds: f64,
    tokens: usize,
    steps: usize,
    bytes: u64,
}

impl Decode {
    fn tok_per_s(&self) -> f64 {
        self.tokens as f64 / self.seconds.max(1e-9)
    }

    /// Sums another run of the same kind into this one.
    fn add(&mut self, o: Decode) {
        let steps = (self.steps + o.steps).max(1) as u64;
        self.bytes = (self.bytes * self.steps as u64 + o.bytes * o.steps as u64) / steps;
        self.seconds += o.seconds;
        self.tokens += o.tokens;
        self.steps += o.steps;
    }
}

/// Greedy plain decoding of `steps` tokens (one a step) by each of `seqs`
/// copies of `prefilled` together, starting with `first`; `tokens` counts
/// one sequence's.
fn decode_plain(
    model: &Model<'_>,
    prefilled: &State,
    (first, seqs): (u32, usize),
    steps: usize,
    clock: Clock<'_>,
    progress: &mut dyn FnMut(String),
) -> Result<Decode, BenchError> {
    let mut states = alloc::vec![prefilled.clone(); seqs];
    // Copies beyond the first start from other tokens: identical sequences
    // would route every token of an MoE step to the same experts.
    let vocab = model.config.vocab_size as u32;
    let mut next: Vec<u32> = (0..seqs as u32).map(|i| (first + i * 7919) % vocab).collect();
    let (routed0, _) = model.expert_reads();
    let t0 = clock();
    for i in 0..steps {
        if seqs == 1 {
            next[0] = argmax(&model.forward(&mut states[0], &[next[0]], Logits::Last)?);
        } else {
            let mut inputs: Vec<SeqInput<'_>> = states
                .iter_mut()
                .zip(&next)
                .map(|(state, t)| SeqInput {
                    state,
                    tokens: core::slice::from_ref(t),
                    logits: true,
                })
                .collect();
            let logits = model.forward_batch(&mut inputs).map_err(|e| e.error)?;
            for (n, l) in next.iter_mut().zip(&logits) {
                *n = argmax(l);
            }
        }
        if (i + 1) % 32 == 0 {
            progress(format!("decode: {}/{steps}", i + 1));
        }
    }
    let seconds = secs(clock().saturating_sub(t0));
    let routed = (model.expert_reads().0 - routed0) / steps as u64;
    let bytes = (model.weight_bytes_per_token() - model.routed_bytes_per_token()) as u64 + routed;
    Ok(Decode { seconds, tokens: steps, steps, bytes })
}

/// Speculative decoding summed over rounds.
#[derive(Default)]
struct SpecRun {
    decode: Decode,
    stats: SpecStats,
}

impl SpecRun {
    fn add(&mut self, (d, st): (Decode, SpecStats)) {
        self.decode.add(d);
        let s = &mut self.stats;
        s.steps += st.steps;
        s.step_tokens += st.step_tokens;
        for j in 0..s.drafted.len() {
            s.drafted[j] += st.drafted[j];
            s.accepted[j] += st.accepted[j];
        }
        let (p, q) = (&mut s.profile, st.profile);
        p.draft_mtp_ns += q.draft_mtp_ns;
        p.draft_head_ns += q.draft_head_ns;
        p.verify_trunk_ns += q.verify_trunk_ns;
        p.verify_head_ns += q.verify_head_ns;
        p.restore_ns += q.restore_ns;
        p.refill_ns += q.refill_ns;
    }

    /// The MTP part of the report, `plain_tok_per_s` from the same rounds.
    fn report(&self, opts: &SpecOptions, plain_tok_per_s: f64, costs: &Costs) -> MtpReport {
        let verify_ms = &costs.verify_ms;
        let (st, drafts) = (&self.stats, opts.max_drafts);
        let steps = st.steps.max(1) as f64;
        let drafted: u64 = st.drafted.iter().sum();
        let acceptance: Vec<f64> = (0..drafts.min(st.drafted.len()))
            .map(|j| st.accepted[j] as f64 / st.drafted[j].max(1) as f64)
            .collect();
        let step_ms = self.decode.seconds * 1e3 / steps;
        let mut profile_ms: Vec<(&'static str, f64)> =
            st.profile.phases().iter().map(|&(n, ns)| (n, ns as f64 / 1e6 / steps)).collect();
        let known: f64 = profile_ms.iter().map(|e| e.1).sum();
        profile_ms.push(("other", (step_ms - known).max(0.0)));
        let draft_ms: f64 =
            profile_ms.iter().filter(|e| e.0.starts_with("draft")).map(|e| e.1).sum();
        let drafts_made = drafted as f64 / steps;
        let per_draft = if drafts_made > 0.0 { draft_ms / drafts_made } else { 0.0 };
        let verify: f64 =
            profile_ms.iter().filter(|e| e.0.starts_with("verify")).map(|e| e.1).sum();
        let proj = Projection {
            plain_ms: costs.plain_ms,
            verify_ms: verify_ms.to_vec(),
            draft_ms: per_draft,
            other_ms: (step_ms - draft_ms - verify).max(0.0),
        };
        let tokens_per_step = st.tokens_per_step();
        let fallback = |k: usize, tps: f64| {
            let plain_ms = 1e3 / plain_tok_per_s.max(1e-9);
            projected_speedup(plain_ms, step_ms, draft_ms, drafts_made, k, tps)
        };
        let projected_speedup = proj
            .speedup(REFERENCE_DRAFTS, REFERENCE_TOKENS_PER_STEP)
            .unwrap_or_else(|| fallback(REFERENCE_DRAFTS, REFERENCE_TOKENS_PER_STEP));
        let projected_speedup_measured = proj
            .speedup(drafts, tokens_per_step)
            .unwrap_or_else(|| fallback(drafts, tokens_per_step));
        let best_drafts = proj.best_drafts(&acceptance, drafts);
        MtpReport {
            drafts,
            drafts_per_step: drafted as f64 / steps,
            plain_decode_tok_per_s: plain_tok_per_s,
            speedup: self.decode.tok_per_s() / plain_tok_per_s.max(1e-9),
            acceptance,
            draft_vocab: opts.draft_vocab,
            profile_ms,
            projected_speedup,
            projected_speedup_measured,
            verify_ms: verify_ms.to_vec(),
            plain_step_ms: costs.plain_ms,
            draft_ms: per_draft,
            best_drafts,
        }
    }
}

/// Most tokens a verify step's cost is measured for (1 pending + 7 drafts).
pub const VERIFY_TOKENS: usize = MAX_DRAFTS + 1;

/// Step costs measured from the prefilled state, best of 3 each.
struct Costs {
    /// A plain step: forward and lm_head over one token.
    plain_ms: f64,
    /// A verify step over `n = 1..=VERIFY_TOKENS` tokens (index `n - 1`).
    verify_ms: Vec<f64>,
}

/// [`Costs`] from `prefilled`: a plain step, and a verify step over `n =
/// 1..=VERIFY_TOKENS` tokens (a checkpointed trunk forward and the full
/// lm_head over every row, as `Speculator::step` verifies; shorter where the
/// context has no room), best of 3 each.
fn verify_costs(
    model: &Model<'_>,
    prefilled: &State,
    prompt: &[u32],
    clock: Clock<'_>,
    progress: &mut dyn FnMut(String),
) -> Result<Costs, BenchError> {
    let best_of_3 = |f: &mut dyn FnMut(&mut State) -> Result<(), BenchError>| {
        let mut best = f64::MAX;
        for _ in 0..3 {
            let mut state = prefilled.clone();
            let t0 = clock();
            f(&mut state)?;
            best = best.min(secs(clock().saturating_sub(t0)) * 1e3);
        }
        Ok::<f64, BenchError>(best)
    };
    let room = model.config.max_position_embeddings.saturating_sub(prefilled.pos);
    // No room: no costs (the projections then fall back to the measured step).
    let plain_ms = if room == 0 {
        f64::NAN
    } else {
        best_of_3(&mut |state| {
            core::hint::black_box(model.forward(state, &prompt[..1], Logits::Last)?);
            Ok(())
        })?
    };
    let mut ckpt = crate::state::Checkpoints::new();
    let mut verify_ms = Vec::with_capacity(VERIFY_TOKENS);
    for n in 1..=VERIFY_TOKENS.min(room) {
        let tokens: Vec<u32> = prompt.iter().copied().cycle().take(n).collect();
        verify_ms.push(best_of_3(&mut |state| {
            let hidden = model.forward_hidden_checkpointed(state, &tokens, &mut ckpt)?;
            core::hint::black_box(model.logits(&hidden));
            Ok(())
        })?);
    }
    progress(format!(
        "plain step {plain_ms:.1} ms; verify of 1..={VERIFY_TOKENS}: {verify_ms:.1?}"
    ));
    Ok(Costs { plain_ms, verify_ms })
}

/// The speculative decoding settings the bench measures: exactly
/// `opts.mtp` drafts a step (not adaptive, so every draft position is
/// measured) over `opts.draft_vocab` ids.
pub fn spec_options(model: &Model<'_>, opts: &BenchOptions) -> SpecOptions {
    let vocab = model.config.vocab_size;
    let dv = match opts.draft_vocab {
        0 => crate::spec::draft_vocab(vocab),
        n => n.min(vocab),
    };
    SpecOptions { adaptive: false, draft_vocab: dv, ..SpecOptions::new(opts.mtp) }
}

/// Greedy speculative decoding of `tokens` tokens after a fresh prefill of
/// `prompt` (untimed); weight bytes per step count the trunk plus, per draft
/// made, the MTP layer and the draft head.
fn decode_mtp(
    model: &Model<'_>,
    prompt: &[u32],
    tokens: usize,
    bench: &BenchOptions,
    clock: Clock<'_>,
    progress: &mut dyn FnMut(String),
) -> Result<(Decode, SpecStats), BenchError> {
    let drafts = bench.mtp;
    progress(format!("mtp {drafts}: prefill again, then {tokens} tokens"));
    let mut state = model.new_state();
    let sampler = Sampler::new(SamplingParams::greedy());
    let opts = spec_options(model, bench);
    let mut sp = Speculator::start(model, &mut state, prompt, sampler, opts)?;
    sp.set_clock(clock);
    let mut made = 1; // the pending token counts as the first one
    let t0 = clock();
    while made <= tokens {
        // Each step adds its accepted drafts plus one token: cap the drafts.
        made += sp.step(&mut state, tokens - made)?.len();
    }
    let seconds = secs(clock().saturating_sub(t0));
    let st = sp.stats.clone();
    let steps = st.steps.max(1);
    let drafted: u64 = st.drafted.iter().sum();
    let vocab = model.config.vocab_size.max(1);
    let head = model.lm_head.weight_bytes() * opts.draft_vocab.clamp(1, vocab) / vocab;
    let per_draft = (model.mtp_weight_bytes() + head) as f64;
    let bytes = model.weight_bytes_per_token() as u64
        + libm::round(drafted as f64 / steps as f64 * per_draft) as u64;
    progress(format!(
        "mtp {drafts}: {:.2} tokens/step, acceptance {:?}",
        st.tokens_per_step(),
        st.acceptance()
    ));
    Ok((Decode { seconds, tokens: st.step_tokens, steps, bytes }, st))
}

fn secs(ns: u64) -> f64 {
    ns.max(1) as f64 / 1e9
}

#[cfg(test)]
mod tests {
    use super::{projected_speedup, Projection};

    #[test]
    fn projection_from_verify_costs_and_best_length() {
        // Verify cost grows 10% a token; a draft costs 5% of a plain step.
        let p = Projection {
            plain_ms: 100.0,
            verify_ms: (0..8).map(|n| 100.0 + 10.0 * n as f64).collect(),
            draft_ms: 5.0,
            other_ms: 5.0,
        };
        // 7 drafts: 170 + 35 + 5 = 210 ms for 3.9 tokens.
        let s = p.speedup(7, 3.9).unwrap();
        assert!((s - 3.9 * 100.0 / 210.0).abs() < 1e-12, "{s}");
        assert_eq!(p.speedup(8, 4.0), None, "no verify cost measured for 9 tokens");
        // Nothing accepted: plain steps are best; everything accepted: all drafts.
        assert_eq!(p.best_drafts(&[0.0; 7], 7), 0);
        assert_eq!(p.best_drafts(&[1.0; 7], 7), 7);
        assert_eq!(p.best_drafts(&[1.0; 7], 3), 3);
        // Acceptance 0.9, 0.45, 0.05: two drafts (2.35 tokens in 135 ms) beat
        // one (1.9 in 120) and three (2.4 in 150).
        assert_eq!(p.best_drafts(&[0.9, 0.45, 0.05, 0.0, 0.0, 0.0, 0.0], 7), 2);
    }

    #[test]
    fn projection_swaps_the_measured_drafts_for_the_reference_count() {
        // 7 drafts measured at 1 ms each, verify 13 ms: the step as measured.
        let s = projected_speedup(10.0, 20.0, 7.0, 7.0, 7, 3.9);
        assert!((s - 3.9 * 10.0 / 20.0).abs() < 1e-12, "{s}");
        // 3 drafts measured at 1 ms each: 4 more drafts are added.
        let s = projected_speedup(10.0, 16.0, 3.0, 3.0, 7, 3.9);
        assert!((s - 3.9 * 10.0 / 20.0).abs() < 1e-12, "{s}");
        // No drafts measured: the verify step alone.
        let s = projected_speedup(10.0, 12.0, 0.0, 0.0, 7, 3.9);
        assert!((s - 3.9 * 10.0 / 12.0).abs() < 1e-12, "{s}");
    }
}
