//! `kore-launch bench` without `--native`: the benchmark runs in the
//! appliance (`{"op":"bench"}` over the protocol, docs/protocol.md) on the
//! same pack, with the vCPUs the native run would use as threads. The JSON
//! has the CONTRACT.md bench fields from the guest plus, when this command
//! booted the VM, `boot_to_ready_ms`, `preload_gbps` and `preload_bytes`.

use std::io::Write;
use std::path::Path;

use serde_json::{json, Value};

use super::Appliance;
use crate::error::{LaunchError, Result};

/// Runs the benchmark through the appliance and prints it (`json`: one JSON
/// object on the last stdout line; else a short table).
pub fn run(
    appliance: &Appliance,
    mtp: Option<usize>,
    threads: Option<usize>,
    concurrency: u32,
    json: bool,
) -> Result<()> {
    let mut params = json!({});
    if concurrency > 1 {
        params["concurrency"] = json!(concurrency);
    }
    if let Some(m) = mtp {
        params["mtp"] = json!(m);
    }
    if let Some(t) = threads {
        params["threads"] = json!(t);
    }
    let mut report = appliance.client()?.bench(params)?;
    if let Some(boot) = appliance.boot_report() {
        report["boot_to_ready_ms"] = json!(round3(boot.boot_to_ready.as_secs_f64() * 1e3));
        report["preload_gbps"] = json!(round3(boot.preload_gbps()));
        report["preload_bytes"] = json!(boot.preload_bytes);
    }
    report["placement"] = json!(appliance.placement());
    print(&report, json)
}

/// Opens the appliance for `model` ([`Appliance::open_with`]) and runs [`run`];
/// what `cmd/bench.rs` calls without `--native`.
pub fn run_for(
    model: Option<&Path>,
    mtp: Option<usize>,
    threads: Option<usize>,
    concurrency: u32,
    json: bool,
) -> Result<()> {
    if threads == Some(0) {
        return Err(LaunchError::Usage("--threads must be at least 1".into()));
    }
    // A VM booted for the bench gets one vCPU per thread (default: all CPUs, as
    // `bench --native`); an attached appliance measures on the vCPUs it has.
    let overrides = crate::config::Overrides {
        model: model.map(Path::to_path_buf),
        vcpus: threads.and_then(|t| u32::try_from(t).ok()),
        ..Default::default()
    };
    let (appliance, _) = Appliance::open_with(&overrides, false, true)?;
    let result = run(&appliance, mtp, threads, concurrency, json);
    appliance.shutdown();
    result
}

fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

fn print(report: &Value, json: bool) -> Result<()> {
    let mut out = std::io::stdout().lock();
    let io = |source| LaunchError::Io { path: "stdout".into(), source };
    if json {
        return writeln!(out, "{report}").map_err(io);
    }
    if let Some(map) = report.as_object() {
        for (k, v) in map {
            writeln!(out, "{k:>22}  {v}").map_err(io)?;
        }
    }
    Ok(())
}
