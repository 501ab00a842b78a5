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

/// The benchmark prompt when the model has a tokenizer (public-domain
/// Shakespeare, Richard III I.i and Henry V III.i), cycled to the prompt length.
const BENCH_TEXT: &str = "GLOUCESTER:\nNow is the winter of our discontent\n\
Made glorious summer by this sun of York;\nAnd all the clouds that lour'd upon our house\n\
In the deep bosom of the ocean buried.\nNow are our brows bound with victorious wreaths;\n\
Our bruised arms hung up for monuments;\nOur stern alarums changed to merry meetings,\n\
Our dreadful marches to delightful measures.\n\nKING HENRY V:\n\
Once more unto the breach, dear friends, once more;\nOr close the wall up with our English dead.\n\
In peace there's nothing so becomes a man\nAs modest stillness and humility:\n\
But when the blast of war blows in our ears,\nThen imitate the action of the tiger;\n\
Stiffen the sinews, summon up the blood,\nDisguise fair nature with hard-favour'd rage;\n\n";

/// Runs `bench`.
pub fn run(args: BenchArgs) -> Result<()> {
    if !args.native {
        return crate::appliance::bench::run_for(
            args.model.as_deref(),
            args.mtp,
            args.threads,
            args.concurrency,
            args.json.json,
        );
    }
    let threads = match args.threads {
        Some(0) => return Err(LaunchError::Usage("--threads must be at least 1".into())),
        Some(n) => n,
        None => std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
    };
    let mut opts = BenchOptions {
        mtp: args.mtp.unwrap_or(0),
        concurrency: args.concurrency as usize,
        ..BenchOptions::default()
    };
    if opts.mtp > 0 && opts.concurrency > 1 {
        return Err(LaunchError::Usage(format!(
            "--mtp {} with --concurrency {}: MTP drafting decodes one sequence at a time \
             (use --mtp 0 to measure batched decoding)",
            opts.mtp, opts.concurrency
        )));
    }
    if let Some(n) = env_count("KORE_BENCH_PROMPT_TOKENS")? {
        opts.prompt_tokens = n;
    }
    if let Some(n) = env_count("KORE_BENCH_DECODE_TOKENS")? {
        opts.decode_tokens = n;
    }
    if let Some(n) = env_count("KORE_BENCH_DEPTH")? {
        opts.depth = n;
    }
    if let Some(n) = env_count("KORE_BENCH_DRAFT_VOCAB")? {
        opts.draft_vocab = n;
    }
    if let Some(n) = env_count("KORE_BENCH_ROUNDS")? {
        opts.rounds = n;
    }
    if opts.mtp > kore_engine::spec::MAX_DRAFTS {
        return Err(LaunchError::Usage(format!(
            "--mtp {}: at most {} drafts per step",
            opts.mtp,
            kore_engine::spec::MAX_DRAFTS
        )));
    }
    let pool = ThreadPool::new(threads);
    let start = Instant::now();
    let clock = move || start.elapsed().as_nanos() as u64;

    eprintln!("read bandwidth: {} MiB, {threads} threads", BANDWIDTH_BYTES >> 20);
    let mut buf = bandwidth_buffer();
    let gbps = bench::read_bandwidth(&pool, &mut buf, &clock, opts.bandwidth_passes);
    // The page after the allocator's header: the advised range is its own mapping.
    let advised = (buf.as_ptr() as usize).next_multiple_of(4096);
    let huge = kore_pack::safetensors::anon_huge_bytes(advised).unwrap_or(0);
    drop(buf);
    eprintln!(
        "read bandwidth: {gbps:.2} GB/s ({:.2} of {:.2} GB on 2 MiB pages)",
        huge as f64 / 1e9,
        BANDWIDTH_BYTES as f64 / 1e9
    );

    let files = model::open(args.model.as_deref())?;
    let mut model = files.model()?;
    model.set_pool(&pool);
    eprintln!(
        "model {}: {:.2} GB of weights per decode step, {} kernels, weights {}",
        files.path.display(),
        model.weight_bytes_per_token() as f64 / 1e9,
        model.kernels().name(),
        files.residency()
    );
    if opts.mtp > 0 && !model.has_mtp() {
        return Err(LaunchError::Usage(format!(
            "--mtp {} needs a model with an MTP head; {} has none (use --mtp 0)",
            opts.mtp,
            files.path.display()
        )));
    }
    // Text like the default pack's training data (Shakespeare), cycled to
    // the prompt length; the speculative decode's acceptance depends on it.
    let ids = files.tokenizer.as_ref().map(|t| t.encode(BENCH_TEXT));
    let report = bench::run_with_prompt(&model, gbps, &clock, &opts, ids.as_deref(), &mut |line| {
        eprintln!("{line}")
    })
    .map_err(|e| LaunchError::Other(format!("bench forward failed: {e}")))?;
    print(&report, args.json.json, pool.workers())
}

/// The read-bandwidth buffer, advised for transparent 2 MiB pages before its
/// first touch: the weights are read from 2 MiB pages too (a resident copy
/// here, guest RAM in the VM), so the fraction compares like with like.
fn bandwidth_buffer() -> Vec<u64> {
    let mut buf = vec![0u64; BANDWIDTH_BYTES / 8];
    let base = buf.as_mut_ptr() as usize;
    let start = base.next_multiple_of(4096);
    let end = (base + BANDWIDTH_BYTES) & !4095;
    // SAFETY: [start, end) is page-aligned and lies inside `buf`'s allocation;
    // MADV_HUGEPAGE only changes how the kernel backs those pages, never their
    // contents, so `buf` stays valid whatever the call returns.
    let _ = unsafe { libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_HUGEPAGE) };
    buf
}

/// A positive count from the environment (quick runs: `KORE_BENCH_PROMPT_TOKENS`,
/// `KORE_BENCH_DECODE_TOKENS`; the contract's figures use the defaults 512 and 128;
/// with `--mtp N`: `KORE_BENCH_ROUNDS` of plain + speculative decoding, default 2,
/// and `KORE_BENCH_DRAFT_VOCAB`, default `kore_engine::spec::draft_vocab`).
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
            "concurrency": r.concurrency,
            "aggregate_decode_tok_per_s": r.aggregate_decode_tok_per_s,
            "step_ms": r.step_ms,
            "weight_bytes_per_step": r.weight_bytes_per_step,
            "depth": r.depth,
            "kv_bytes_per_step": r.kv_bytes_per_step,
            "achieved_gbps": r.achieved_gbps,
            "bandwidth_fraction": r.bandwidth_fraction,
            "tokens_per_step": r.tokens_per_step,
            "threads": threads,
            "kernels": r.kernels,
            "mtp": r.mtp.as_ref().map_or(0, |m| m.drafts),
        });
        let mut obj = obj;
        for (key, share) in [("prefill_share", &r.prefill_share), ("decode_share", &r.decode_share)]
        {
            if !share.is_empty() {
                let share: serde_json::Map<String, serde_json::Value> =
                    share.iter().map(|(k, v)| ((*k).to_string(), json!(v))).collect();
                obj[key] = serde_json::Value::Object(share);
            }
        }
        if let Some(m) = &r.mtp {
            obj["mtp_acceptance"] = json!(m.acceptance);
            obj["mtp_drafts_per_step"] = json!(m.drafts_per_step);
            obj["plain_decode_tok_per_s"] = json!(m.plain_decode_tok_per_s);
            obj["mtp_speedup"] = json!(m.speedup);
            obj["mtp_projected_speedup"] = json!(m.projected_speedup);
            obj["mtp_projected_speedup_measured"] = json!(m.projected_speedup_measured);
            obj["mtp_verify_ms"] = json!(m.verify_ms);
            obj["mtp_plain_step_ms"] = json!(m.plain_step_ms);
            obj["mtp_draft_ms"] = json!(m.draft_ms);
            obj["mtp_best_drafts"] = json!(m.best_drafts);
            obj["mtp_draft_vocab"] = json!(m.draft_vocab);
            let profile: serde_json::Map<String, serde_json::Value> =
                m.profile_ms.iter().map(|(k, v)| ((*k).to_string(), json!(v))).collect();
            obj["mtp_step_profile_ms"] = serde_json::Value::Object(profile);
        }
        writeln!(out, "{obj}").map_err(io)?;
    } else {
        writeln!(
            out,
            "read {:.2} GB/s | prefill {:.1} tok/s | decode {:.2} tok/s x {} = {:.2} tok/s \
             ({:.1} ms/step, {:.2} GB/step) | achieved {:.2} GB/s = {:.0}% of read bandwidth | \
             {} threads, {} kernels",
            r.measured_read_gbps,
            r.prefill_tok_per_s,
            r.decode_tok_per_s,
            r.concurrency,
            r.aggregate_decode_tok_per_s,
            r.step_ms,
            r.weight_bytes_per_step as f64 / 1e9,
            r.achieved_gbps,
            r.bandwidth_fraction * 100.0,
            threads,
            r.kernels
        )
        .map_err(io)?;
        for (what, share) in [("prefill", &r.prefill_share), ("decode", &r.decode_share)] {
            if !share.is_empty() {
                let parts: Vec<String> = share
                    .iter()
                    .map(|(k, v)| format!("{} {:.1}%", k.replace('_', " "), v * 100.0))
                    .collect();
                writeln!(out, "{what} time: {}", parts.join(" | ")).map_err(io)?;
            }
        }
        if let Some(m) = &r.mtp {
            let acc: Vec<String> = m.acceptance.iter().map(|a| format!("{a:.2}")).collect();
            writeln!(
                out,
                "mtp {}: {:.2} tokens/step ({:.2} drafts/step, acceptance by position {}) | \
                 decode {:.2} tok/s vs {:.2} tok/s plain in this run = {:.2}x",
                m.drafts,
                r.tokens_per_step,
                m.drafts_per_step,
                acc.join(" "),
                r.decode_tok_per_s,
                m.plain_decode_tok_per_s,
                m.speedup
            )
            .map_err(io)?;
            writeln!(
                out,
                "mtp projected (not measured): {:.2}x at {} tokens a step with {} drafts, \
                 {:.2}x at this run's {:.2} tokens a step with {}; from this run's step costs",
                m.projected_speedup,
                kore_engine::bench::REFERENCE_TOKENS_PER_STEP,
                kore_engine::bench::REFERENCE_DRAFTS,
                m.projected_speedup_measured,
                r.tokens_per_step,
                m.drafts
            )
            .map_err(io)?;
            let verify: Vec<String> = m.verify_ms.iter().map(|v| format!("{v:.1}")).collect();
            writeln!(
                out,
                "mtp costs (ms): plain step {:.1} | verify of 1..{} tokens {} | one draft {:.2} \
                 | best draft length at this acceptance {}",
                m.plain_step_ms,
                m.verify_ms.len(),
                verify.join(" "),
                m.draft_ms,
                m.best_drafts
            )
            .map_err(io)?;
            let phases: Vec<String> =
                m.profile_ms.iter().map(|(k, v)| format!("{k} {v:.2}")).collect();
            writeln!(
                out,
                "mtp step profile (ms a step, draft vocabulary {}): {}",
                m.draft_vocab,
                phases.join(" | ")
            )
            .map_err(io)?;
        }
    }
    Ok(())
}
