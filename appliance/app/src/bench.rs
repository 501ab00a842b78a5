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
//!    (spread-out ids), not the host's Shakespeare text: acceptance differs.
//! ```

use alloc::format;
use alloc::string::String;
use alloc::vec::Vec;

use kore_engine::bench::{self, BenchOptions};
use kore_engine::Model;
use kore_service::{BenchReport, BenchRequest, EngineError, MtpBench};

/// A monotonic nanosecond clock (the guest's TSC clock, `Instant` on the host).
pub type NsClock = fn() -> u64;

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
    clock: NsClock,
    buffer_bytes: usize,
    req: &BenchRequest,
) -> Result<BenchReport, EngineError> {
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
    if opts.prompt_tokens + opts.decode_tokens + 1 > context {
        return Err(EngineError::BadParams(format!(
            "prompt_tokens {} + decode_tokens {} do not fit the context of {context} tokens",
            opts.prompt_tokens, opts.decode_tokens
        )));
    }
    let now = || clock();
    let gbps = {
        let mut buf = buffer(buffer_bytes)?;
        bench::read_bandwidth(model.pool(), &mut buf, &now, opts.bandwidth_passes)
    };
    let r = bench::run(model, gbps, &now, &opts, &mut |_line: String| {})
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
        }),
    })
}

/// The bandwidth buffer: `bytes` if the heap has them, else the largest
/// halving of it down to [`MIN_BUFFER_BYTES`].
fn buffer(bytes: usize) -> Result<Vec<u64>, EngineError> {
    let mut size = bytes.max(MIN_BUFFER_BYTES);
    loop {
        let mut v: Vec<u64> = Vec::new();
        if v.try_reserve_exact(size / 8).is_ok() {
            v.resize(size / 8, 0);
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
