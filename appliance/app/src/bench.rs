//! `{"op":"bench"}` for [`crate::ModelEngine`]: kore-engine's benchmark
//! (`kore_engine::bench`, the very code `kore-launch bench --native` runs on
//! the host), so guest and host figures are comparable:
//!
//! ```text
//! 1. read bandwidth over a buffer of `buffer_bytes` (1 GiB like the host; halved while the
//!    allocation fails), every worker of the model's pool, best of 3 passes
//! 2. prefill of `prompt_tokens` (default 512), 3. `decode_tokens` greedy steps (default 128)
//! 4. with `mtp` N > 0: rounds of plain and speculative decoding alternated
//!    (`kore_engine::bench`); the MTP figures go into `BenchReport::mtp`. The
//!    guest has no tokenizer here, so its prompt is `kore_engine::bench::prompt`
//!    (its prompt is [`BENCH_TEXT`] as the served tokenizer encodes it, cycled
//!    to `prompt_tokens`: the speculative decode's acceptance depends on it)
//! ```
//!
//! The guest and `kore-launch bench --native` both run this through the
//! service, so their figures come from the same code and the same prompt.

use alloc::format;
use alloc::string::String;
use alloc::vec::Vec;

use kore_engine::bench::{self, BenchOptions};
use kore_engine::Model;
use kore_service::{BenchReport, BenchRequest, EngineError, MtpBench};

/// A monotonic nanosecond clock (the guest's TSC clock, `Instant` on the host).
pub type NsClock = fn() -> u64;

/// Allocates the read-bandwidth buffer of `bytes` (zeroed), or `None` when
/// the memory is not there (the launcher's advises 2 MiB pages for it, as the
/// weights are read from 2 MiB pages too).
pub type BufferAlloc = fn(usize) -> Option<Vec<u64>>;

/// The benchmark prompt's text (public-domain Shakespeare, Richard III I.i and
/// Henry V III.i, like the default pack's training data), cycled to the prompt
/// length.
pub const BENCH_TEXT: &str = "GLOUCESTER:\nNow is the winter of our discontent\n\
Made glorious summer by this sun of York;\nAnd all the clouds that lour'd upon our house\n\
In the deep bosom of the ocean buried.\nNow are our brows bound with victorious wreaths;\n\
Our bruised arms hung up for monuments;\nOur stern alarums changed to merry meetings,\n\
Our dreadful marches to delightful measures.\n\nKING HENRY V:\n\
Once more unto the breach, dear friends, once more;\nOr close the wall up with our English dead.\n\
In peace there's nothing so becomes a man\nAs modest stillness and humility:\n\
But when the blast of war blows in our ears,\nThen imitate the action of the tiger;\n\
Stiffen the sinews, summon up the blood,\nDisguise fair nature with hard-favour'd rage;\n\n";

/// How `{"op":"bench"}` measures (set when the engine is assembled).
#[derive(Debug, Clone)]
pub struct Setup {
    /// The clock (none: bench answers `unsupported`).
    pub clock: Option<NsClock>,
    /// Bytes of the read-bandwidth buffer.
    pub buffer_bytes: usize,
    /// How the buffer is allocated.
    pub alloc: BufferAlloc,
    /// The prompt's ids before cycling (empty: `kore_engine::bench::prompt`).
    pub prompt: Vec<u32>,
}

impl Default for Setup {
    fn default() -> Self {
        Setup {
            clock: default_clock(),
            buffer_bytes: DEFAULT_BUFFER_BYTES,
            alloc: heap_buffer,
            prompt: Vec::new(),
        }
    }
}

/// A zeroed buffer from the heap, `None` when it has not the room.
pub fn heap_buffer(bytes: usize) -> Option<Vec<u64>> {
    let mut v: Vec<u64> = Vec::new();
    v.try_reserve_exact(bytes / 8).ok()?;
    v.resize(bytes / 8, 0);
    Some(v)
}

/// Bytes of the read-bandwidth buffer: `kore-launch bench --native`'s size.
pub const DEFAULT_BUFFER_BYTES: usize = 1 << 30;

/// Smallest buffer worth measuring with (still far larger than the caches).
const MIN_BUFFER_BYTES: usize = 64 << 20;

/// The default clock: `std::time::Instant` with feature `std`, none without.
pub fn default_clock() -> Option<NsClock> {
    #[cfg(feature = "std")]
    {
        fn now() -> u64 {
            static T0: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
            T0.get_or_init(std::time::Instant::now).elapsed().as_nanos() as u64
        }
        Some(now)
    }
    #[cfg(not(feature = "std"))]
    {
        None
    }
}

/// Runs the benchmark on `model` (over the pool it already runs on).
pub fn run(
    model: &Model<'_>,
    setup: &Setup,
    req: &BenchRequest,
) -> Result<BenchReport, EngineError> {
    let clock = setup.clock.ok_or_else(|| {
        EngineError::Unsupported(String::from(
            "this engine has no clock to measure with (ModelEngine::with_clock)",
        ))
    })?;
    let workers = model.pool().workers();
    if let Some(t) = req.threads {
        if t as usize != workers {
            return Err(EngineError::BadParams(format!(
                "threads {t}: this engine runs on all its {workers} workers (vCPUs); start the \
                 appliance with {t} vCPUs to measure {t} threads"
            )));
        }
    }
    let defaults = BenchOptions::default();
    let opts = BenchOptions {
        prompt_tokens: req.prompt_tokens.map_or(defaults.prompt_tokens, |n| n as usize),
        decode_tokens: req.decode_tokens.map_or(defaults.decode_tokens, |n| n as usize),
        mtp: req.mtp.map_or(defaults.mtp, |n| n as usize),
        concurrency: req.concurrency.map_or(1, |n| n.max(1) as usize),
        rounds: req.rounds.map_or(defaults.rounds, |n| n.max(1) as usize),
        draft_vocab: req.draft_vocab.map_or(defaults.draft_vocab, |n| n as usize),
        depth: req.depth.map_or(0, |n| n as usize),
        ..defaults
    };
    if opts.mtp > 0 && opts.concurrency > 1 {
        return Err(EngineError::BadParams(format!(
            "mtp {} with concurrency {}: MTP drafting decodes one sequence at a time; send \
             \"mtp\": 0 to measure batched decoding",
            opts.mtp, opts.concurrency
        )));
    }
    if opts.mtp > kore_engine::spec::MAX_DRAFTS {
        return Err(EngineError::BadParams(format!(
            "mtp {}: at most {} drafts per step",
            opts.mtp,
            kore_engine::spec::MAX_DRAFTS
        )));
    }
    if opts.mtp > 0 && !model.has_mtp() {
        return Err(EngineError::BadParams(format!(
            "mtp {}: this model has no MTP head (no mtp.* weights); send \"mtp\": 0",
            opts.mtp
        )));
    }
    let context = model.config.max_position_embeddings;
    if opts.depth + opts.prompt_tokens + opts.decode_tokens + 1 > context {
        return Err(EngineError::BadParams(format!(
            "depth {} + prompt_tokens {} + decode_tokens {} do not fit the context of {context} \
             tokens",
            opts.depth, opts.prompt_tokens, opts.decode_tokens
        )));
    }
    let now = || clock();
    let gbps = {
        let mut buf = buffer(setup.alloc, setup.buffer_bytes)?;
        bench::read_bandwidth(model.pool(), &mut buf, &now, opts.bandwidth_passes)
    };
    let vocab = model.config.vocab_size;
    let prompt: Vec<u32> = setup.prompt.iter().copied().filter(|&t| (t as usize) < vocab).collect();
    let r = bench::run_with_prompt(model, gbps, &now, &opts, Some(&prompt), &mut |_line| {})
        .map_err(|e| EngineError::Internal(format!("bench forward failed: {e}")))?;
    Ok(BenchReport {
        measured_read_gbps: r.measured_read_gbps,
        prefill_tok_per_s: r.prefill_tok_per_s,
        decode_tok_per_s: r.decode_tok_per_s,
        concurrency: u32::try_from(r.concurrency).unwrap_or(u32::MAX),
        aggregate_decode_tok_per_s: r.aggregate_decode_tok_per_s,
        step_ms: r.step_ms,
        weight_bytes_per_step: r.weight_bytes_per_step as f64,
        achieved_gbps: r.achieved_gbps,
        bandwidth_fraction: r.bandwidth_fraction,
        tokens_per_step: r.tokens_per_step,
        threads: u32::try_from(r.threads).unwrap_or(u32::MAX),
        kernels: String::from(r.kernels),
        depth: u32::try_from(r.depth).unwrap_or(u32::MAX),
        kv_bytes_per_step: r.kv_bytes_per_step,
        prefill_share: r.prefill_share.iter().map(|&(k, v)| (String::from(k), v)).collect(),
        decode_share: r.decode_share.iter().map(|&(k, v)| (String::from(k), v)).collect(),
        mtp: r.mtp.map(|m| MtpBench {
            mtp: u32::try_from(m.drafts).unwrap_or(u32::MAX),
            mtp_acceptance: m.acceptance,
            mtp_drafts_per_step: m.drafts_per_step,
            plain_decode_tok_per_s: m.plain_decode_tok_per_s,
            mtp_speedup: m.speedup,
            mtp_projected_speedup: m.projected_speedup,
            mtp_projected_speedup_measured: m.projected_speedup_measured,
            mtp_plain_step_ms: m.plain_step_ms,
            mtp_verify_ms: m.verify_ms,
            mtp_draft_ms: m.draft_ms,
            mtp_best_drafts: u32::try_from(m.best_drafts).unwrap_or(u32::MAX),
            mtp_draft_vocab: u32::try_from(m.draft_vocab).unwrap_or(u32::MAX),
            mtp_step_profile_ms: m.profile_ms.iter().map(|&(k, v)| (String::from(k), v)).collect(),
        }),
    })
}

/// The bandwidth buffer: `bytes` if the heap has them, else the largest
/// halving of it down to [`MIN_BUFFER_BYTES`].
fn buffer(alloc: BufferAlloc, bytes: usize) -> Result<Vec<u64>, EngineError> {
    let mut size = bytes.max(MIN_BUFFER_BYTES);
    loop {
        if let Some(v) = alloc(size) {
            return Ok(v);
        }
        if size / 2 < MIN_BUFFER_BYTES {
            return Err(EngineError::Internal(format!(
                "bench: cannot allocate a {} MiB read-bandwidth buffer; give the appliance more memory",
                size >> 20
            )));
        }
        size /= 2;
    }
}
