//! `kore-launch bench`: the machine's read bandwidth, then prefill and decode
//! speed of a model (docs/contract.md). Both placements run the benchmark
//! in the appliance through the protocol (`{"op":"bench"}`): kore-engine's
//! benchmark behind kore-appliance, the same code in the guest and natively,
//! with as many threads (vCPUs natively, or the VM's) as `--threads` says.
//! This file builds the request, adds what the launcher knows (placement,
//! boot and preload figures) and prints the one report.

use std::io::Write;

use kore_protocol::{BenchReport, BenchRequest};
use serde::Serialize;

use crate::appliance::Appliance;
use crate::cli::BenchArgs;
use crate::error::{LaunchError, Result};

/// What `bench --json` prints: the appliance's report and the launcher's
/// additions.
#[derive(Debug, Serialize)]
struct Printed<'a> {
    #[serde(flatten)]
    report: &'a BenchReport,
    /// Drafts per step: 0 here when the report has no MTP part (which
    /// carries its own `mtp`).
    #[serde(skip_serializing_if = "Option::is_none")]
    mtp: Option<u32>,
    /// `native`, `vm` or `attached`.
    placement: &'static str,
    /// A VM this command booted: from starting the VMM to the guest service
    /// accepting, ms.
    #[serde(skip_serializing_if = "Option::is_none")]
    boot_to_ready_ms: Option<f64>,
    /// The pack's preload into guest memory, GB/s.
    #[serde(skip_serializing_if = "Option::is_none")]
    preload_gbps: Option<f64>,
    /// Bytes preloaded.
    #[serde(skip_serializing_if = "Option::is_none")]
    preload_bytes: Option<u64>,
}

/// Runs `bench`.
pub fn run(args: BenchArgs) -> Result<()> {
    if args.threads == Some(0) {
        return Err(LaunchError::Usage("--threads must be at least 1".into()));
    }
    let request = request(&args)?;
    // A VM booted for the bench gets one vCPU per thread and the in-process
    // engine a pool of that many threads (default: all CPUs); an attached
    // appliance measures on the vCPUs it has.
    let overrides = crate::config::Overrides {
        model: args.model.clone(),
        vcpus: args.threads.and_then(|t| u32::try_from(t).ok()),
        ..Default::default()
    };
    let (appliance, path) = Appliance::open_with(&overrides, args.native, true)?;
    eprintln!("bench: {} on {} (this takes a minute)", path.display(), appliance.placement());
    let report = appliance.client().and_then(|mut c| Ok(c.bench(request)?));
    let boot = appliance.boot_report();
    let placement = appliance.placement();
    appliance.shutdown();
    let report = report?;
    let printed = Printed {
        report: &report,
        mtp: report.mtp.is_none().then_some(0),
        placement,
        boot_to_ready_ms: boot.as_ref().map(|b| round3(b.boot_to_ready.as_secs_f64() * 1e3)),
        preload_gbps: boot.as_ref().map(|b| round3(b.preload_gbps())),
        preload_bytes: boot.as_ref().map(|b| b.preload_bytes),
    };
    print(&printed, args.json.json)
}

/// The protocol request: the flags, then the developer knobs of
/// docs/user-guide.md (`KORE_BENCH_PROMPT_TOKENS`, `KORE_BENCH_DECODE_TOKENS`,
/// `KORE_BENCH_DEPTH`, `KORE_BENCH_ROUNDS`, `KORE_BENCH_DRAFT_VOCAB`) where a
/// flag is absent.
fn request(args: &BenchArgs) -> Result<BenchRequest> {
    let small = |n: usize| u32::try_from(n).unwrap_or(u32::MAX);
    let r = BenchRequest {
        prompt_tokens: args.prompt_tokens.or(crate::env::count("KORE_BENCH_PROMPT_TOKENS")?),
        decode_tokens: args.decode_tokens.or(crate::env::count("KORE_BENCH_DECODE_TOKENS")?),
        mtp: args.mtp.map(small),
        threads: args.threads.map(small),
        concurrency: (args.concurrency > 1).then_some(args.concurrency),
        rounds: crate::env::count("KORE_BENCH_ROUNDS")?,
        draft_vocab: crate::env::count("KORE_BENCH_DRAFT_VOCAB")?,
        depth: args.depth.or(crate::env::count("KORE_BENCH_DEPTH")?),
    };
    if r.mtp.is_some_and(|m| m > 0) && args.concurrency > 1 {
        return Err(LaunchError::Usage(format!(
            "--mtp {} with --concurrency {}: MTP drafting decodes one sequence at a time \
             (use --mtp 0 to measure batched decoding)",
            args.mtp.unwrap_or(0),
            args.concurrency
        )));
    }
    r.validate().map_err(|e| LaunchError::Usage(format!("bench: {e}")))?;
    Ok(r)
}

fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

fn print(p: &Printed<'_>, as_json: bool) -> Result<()> {
    let mut out = std::io::stdout().lock();
    let io = |source| LaunchError::Io { path: "stdout".into(), source };
    if as_json {
        let line = serde_json::to_string(p)?;
        return writeln!(out, "{line}").map_err(io);
    }
    for line in text_lines(p) {
        writeln!(out, "{line}").map_err(io)?;
    }
    Ok(())
}

/// The report for people, one line per part.
fn text_lines(p: &Printed<'_>) -> Vec<String> {
    let r = p.report;
    let mut lines = vec![format!(
        "read {:.2} GB/s | prefill {:.1} tok/s | decode {:.2} tok/s x {} = {:.2} tok/s \
         ({:.1} ms/step, {:.2} GB/step) | achieved {:.2} GB/s = {:.0}% of read bandwidth | \
         {} threads, {} kernels, {}",
        r.measured_read_gbps,
        r.prefill_tok_per_s,
        r.decode_tok_per_s,
        r.concurrency.max(1),
        r.aggregate_decode_tok_per_s,
        r.step_ms,
        r.weight_bytes_per_step / 1e9,
        r.achieved_gbps,
        r.bandwidth_fraction * 100.0,
        r.threads,
        r.kernels,
        p.placement
    )];
    for (what, share) in [("prefill", &r.prefill_share), ("decode", &r.decode_share)] {
        if !share.is_empty() {
            let parts: Vec<String> = share
                .iter()
                .map(|(k, v)| format!("{} {:.1}%", k.replace('_', " "), v * 100.0))
                .collect();
            lines.push(format!("{what} time: {}", parts.join(" | ")));
        }
    }
    if r.depth > 0 {
        lines.push(format!(
            "at depth {}: {:.3} GB of KV read per decode step",
            r.depth,
            r.kv_bytes_per_step as f64 / 1e9
        ));
    }
    if let (Some(ms), Some(gbps)) = (p.boot_to_ready_ms, p.preload_gbps) {
        lines.push(format!("boot to ready {ms:.0} ms, preload {gbps:.2} GB/s"));
    }
    if let Some(m) = &r.mtp {
        let acc: Vec<String> = m.mtp_acceptance.iter().map(|a| format!("{a:.2}")).collect();
        lines.push(format!(
            "mtp {}: {:.2} tokens/step ({:.2} drafts/step, acceptance by position {}) | \
             decode {:.2} tok/s vs {:.2} tok/s plain in this run = {:.2}x",
            m.mtp,
            r.tokens_per_step,
            m.mtp_drafts_per_step,
            acc.join(" "),
            r.decode_tok_per_s,
            m.plain_decode_tok_per_s,
            m.mtp_speedup
        ));
        lines.push(format!(
            "mtp projected (not measured): {:.2}x at {} tokens a step with {} drafts, \
             {:.2}x at this run's {:.2} tokens a step with {}; from this run's step costs",
            m.mtp_projected_speedup,
            kore_engine::bench::REFERENCE_TOKENS_PER_STEP,
            kore_engine::bench::REFERENCE_DRAFTS,
            m.mtp_projected_speedup_measured,
            r.tokens_per_step,
            m.mtp
        ));
        let verify: Vec<String> = m.mtp_verify_ms.iter().map(|v| format!("{v:.1}")).collect();
        lines.push(format!(
            "mtp costs (ms): plain step {:.1} | verify of 1..{} tokens {} | one draft {:.2} \
             | best draft length at this acceptance {}",
            m.mtp_plain_step_ms,
            m.mtp_verify_ms.len(),
            verify.join(" "),
            m.mtp_draft_ms,
            m.mtp_best_drafts
        ));
        let phases: Vec<String> =
            m.mtp_step_profile_ms.iter().map(|(k, v)| format!("{k} {v:.2}")).collect();
        lines.push(format!(
            "mtp step profile (ms a step, draft vocabulary {}): {}",
            m.mtp_draft_vocab,
            phases.join(" | ")
        ));
    }
    lines
}
