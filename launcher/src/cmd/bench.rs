//! `kore-launch bench`: the machine's read bandwidth, then prefill and decode
//! speed of a model, as CONTRACT.md specifies. The measuring is
//! `kore_engine::bench` (the same code runs in the guest); this file picks
//! the threads, supplies the clock and the bandwidth buffer, and formats.

use std::io::Write;
use std::time::Instant;

use kore_engine::bench::{self, BenchOptions, BenchReport};
use kore_engine::pool::{Parallel, ThreadPool};
use serde_json::json;

use crate::cli::BenchArgs;
use crate::error::{LaunchError, Result};
use crate::model;

/// Bytes of the read-bandwidth buffer: far larger than any cache here.
const BANDWIDTH_BYTES: usize = 1 << 30;

/// Runs `bench`.
pub fn run(args: BenchArgs) -> Result<()> {
    if !args.native {
        return crate::appliance::bench::run_for(
            args.model.as_deref(),
            args.mtp,
            args.threads,
            args.json.json,
        );
    }
    let threads = match args.threads {
        Some(0) => return Err(LaunchError::Usage("--threads must be at least 1".into())),
        Some(n) => n,
        None => std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
    };
    let mut opts = BenchOptions { mtp: args.mtp.unwrap_or(0), ..BenchOptions::default() };
    if let Some(n) = env_count("KORE_BENCH_PROMPT_TOKENS")? {
        opts.prompt_tokens = n;
    }
    if let Some(n) = env_count("KORE_BENCH_DECODE_TOKENS")? {
        opts.decode_tokens = n;
    }
    if opts.mtp > 0 {
        tracing::warn!(
            "bench --mtp is not wired to speculative decoding yet; measuring one token a step"
        );
    }
    let pool = ThreadPool::new(threads);
    let start = Instant::now();
    let clock = move || start.elapsed().as_nanos() as u64;

    eprintln!("read bandwidth: {} MiB, {threads} threads", BANDWIDTH_BYTES >> 20);
    let mut buf = vec![0u64; BANDWIDTH_BYTES / 8];
    let gbps = bench::read_bandwidth(&pool, &mut buf, &clock, opts.bandwidth_passes);
    drop(buf);
    eprintln!("read bandwidth: {gbps:.2} GB/s");

    let files = model::open(args.model.as_deref())?;
    let mut model = files.model()?;
    model.set_pool(&pool);
    eprintln!(
        "model {}: {:.2} GB of weights per decode step, {} kernels",
        files.path.display(),
        model.weight_bytes_per_token() as f64 / 1e9,
        kore_engine::simd::active().name()
    );
    let report = bench::run(&model, gbps, &clock, &opts, &mut |line| eprintln!("{line}"))
        .map_err(|e| LaunchError::Other(format!("bench forward failed: {e}")))?;
    print(&report, args.json.json, pool.workers())
}

/// A positive count from the environment (quick runs: `KORE_BENCH_PROMPT_TOKENS`,
/// `KORE_BENCH_DECODE_TOKENS`; the contract's figures use the defaults 512 and 128).
fn env_count(name: &str) -> Result<Option<usize>> {
    match std::env::var(name) {
        Err(_) => Ok(None),
        Ok(v) => match v.trim().parse::<usize>() {
            Ok(n) if n > 0 => Ok(Some(n)),
            _ => Err(LaunchError::Usage(format!("{name} must be a positive integer, got {v:?}"))),
        },
    }
}

fn print(r: &BenchReport, as_json: bool, threads: usize) -> Result<()> {
    let mut out = std::io::stdout().lock();
    let io = |source| LaunchError::Io { path: "stdout".into(), source };
    if as_json {
        let obj = json!({
            "measured_read_gbps": r.measured_read_gbps,
            "prefill_tok_per_s": r.prefill_tok_per_s,
            "decode_tok_per_s": r.decode_tok_per_s,
            "step_ms": r.step_ms,
            "weight_bytes_per_step": r.weight_bytes_per_step,
            "achieved_gbps": r.achieved_gbps,
            "bandwidth_fraction": r.bandwidth_fraction,
            "tokens_per_step": r.tokens_per_step,
            "threads": threads,
            "kernels": r.kernels,
        });
        writeln!(out, "{obj}").map_err(io)?;
    } else {
        writeln!(
            out,
            "read {:.2} GB/s | prefill {:.1} tok/s | decode {:.2} tok/s ({:.1} ms/step, {:.2} GB/step) | \
             achieved {:.2} GB/s = {:.0}% of read bandwidth | {} threads, {} kernels",
            r.measured_read_gbps,
            r.prefill_tok_per_s,
            r.decode_tok_per_s,
            r.step_ms,
            r.weight_bytes_per_step as f64 / 1e9,
            r.achieved_gbps,
            r.bandwidth_fraction * 100.0,
            threads,
            r.kernels
        )
        .map_err(io)?;
    }
    Ok(())
}
