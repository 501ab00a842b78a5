//! The pack benchmark, `no_std`: the same code measures the host
//! (`kore-launch bench --native`) and the Kore guest (kore-service's
//! `Engine::bench`). The caller brings a clock, the read-bandwidth buffer and
//! the pool; this module only measures.
//!
//! ```text
//! 1. read bandwidth: every worker sums its share of `buf` (>> caches); best pass
//! 2. prefill: one forward over a `prompt_tokens` prompt (logits of the last)
//! 3. decode:  `decode_tokens` greedy single-token steps
//! achieved_gbps = weight_bytes_per_step / step time; fraction = achieved / measured
//! ```

use alloc::format;
use alloc::string::String;
use alloc::vec::Vec;
use core::sync::atomic::{AtomicU64, Ordering};

use crate::model::{Logits, Model};
use crate::pool::{split, Parallel};
use crate::sampling::argmax;
use crate::simd::{self, Path};

/// What to run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BenchOptions {
    /// Prompt length of the prefill measurement.
    pub prompt_tokens: usize,
    /// Decode steps timed.
    pub decode_tokens: usize,
    /// Passes over the bandwidth buffer (the best one counts).
    pub bandwidth_passes: usize,
    /// Draft tokens per step (MTP). Not used yet: decode is one token a step.
    /// The MTP drafter plugs in at `decode` below and sets `tokens_per_step`.
    pub mtp: usize,
}

impl Default for BenchOptions {
    fn default() -> Self {
        BenchOptions { prompt_tokens: 512, decode_tokens: 128, bandwidth_passes: 3, mtp: 0 }
    }
}

/// The figures of one run (CONTRACT.md `bench --json` fields, plus the kernels).
#[derive(Clone, Debug, PartialEq)]
pub struct BenchReport {
    /// Read bandwidth of this machine measured in this run (GB/s, 1e9 bytes).
    pub measured_read_gbps: f64,
    /// Prompt tokens per second.
    pub prefill_tok_per_s: f64,
    /// Generated tokens per second.
    pub decode_tok_per_s: f64,
    /// Milliseconds per decode step.
    pub step_ms: f64,
    /// Weight bytes one decode step streams.
    pub weight_bytes_per_step: u64,
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
    let path = simd::active();
    let mut best = 0.0f64;
    for _ in 0..passes.max(1) {
        let t0 = clock();
        pool.run(&|w, workers| {
            let part = &buf[split(n, w, workers, 8)];
            sink.fetch_add(read_sum(path, part), Ordering::Relaxed);
        });
        let dt = clock().saturating_sub(t0).max(1);
        best = best.max((n * 8) as f64 / dt as f64);
    }
    core::hint::black_box(sink.load(Ordering::Relaxed));
    best
}

fn read_sum(path: Path, part: &[u64]) -> u64 {
    #[cfg(target_arch = "x86_64")]
    if matches!(path, Path::Avx512 | Path::Avx512Vnni) {
        // SAFETY: `simd::active` only returns supported paths.
        return unsafe { simd::avx512::read_sum(part) };
    }
    let _ = path;
    crate::kernels::generic::read_sum(part)
}

/// The deterministic benchmark prompt: spread-out ids below the vocabulary.
pub fn prompt(len: usize, vocab: usize) -> Vec<u32> {
    (0..len as u64).map(|i| ((i * 7919 + 13) % vocab as u64) as u32).collect()
}

/// Runs prefill and decode on `model` (which should already use `pool`),
/// reporting progress lines through `progress`. `read_gbps` comes from
/// [`read_bandwidth`] in the same run.
pub fn run(
    model: &Model<'_>,
    read_gbps: f64,
    clock: Clock<'_>,
    opts: &BenchOptions,
    progress: &mut dyn FnMut(String),
) -> Result<BenchReport, crate::ForwardError> {
    let vocab = model.config.vocab_size;
    let p = prompt(opts.prompt_tokens.max(1), vocab);
    progress(format!("prefill: {} tokens", p.len()));
    let mut state = model.new_state();
    let t0 = clock();
    let logits = model.forward(&mut state, &p, Logits::Last)?;
    let prefill_s = secs(clock().saturating_sub(t0));
    let prefill_tok_per_s = p.len() as f64 / prefill_s;
    progress(format!(
        "prefill: {prefill_tok_per_s:.1} tok/s; decode: {} tokens",
        opts.decode_tokens
    ));

    // Decode: greedy, one token a step (MTP drafting plugs in here).
    let mut next = argmax(&logits) as u32;
    let steps = opts.decode_tokens.max(1);
    let t0 = clock();
    for i in 0..steps {
        let logits = model.forward(&mut state, &[next], Logits::Last)?;
        next = argmax(&logits) as u32;
        if (i + 1) % 32 == 0 {
            progress(format!("decode: {}/{steps}", i + 1));
        }
    }
    let decode_s = secs(clock().saturating_sub(t0));
    let tokens_per_step = 1.0;
    let step_s = decode_s / steps as f64;
    let bytes = model.weight_bytes_per_token() as u64;
    let achieved_gbps = bytes as f64 / step_s / 1e9;
    Ok(BenchReport {
        measured_read_gbps: read_gbps,
        prefill_tok_per_s,
        decode_tok_per_s: steps as f64 * tokens_per_step / decode_s,
        step_ms: step_s * 1e3,
        weight_bytes_per_step: bytes,
        achieved_gbps,
        bandwidth_fraction: achieved_gbps / read_gbps,
        tokens_per_step,
        threads: model.pool().workers(),
        kernels: simd::active().name(),
    })
}

fn secs(ns: u64) -> f64 {
    ns.max(1) as f64 / 1e9
}
