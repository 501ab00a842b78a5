//! `kore-launch status [--json]`: whether a background appliance is up, and
//! what it runs (its `info` answer: model, context, queue, connections).

use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::{json, Value};

use super::daemon::{Probe, Runtime};
use crate::appliance::vm::connect_service;
use crate::cli::StatusArgs;
use crate::client::{Client, Connection};
use crate::error::{ApplianceError, LaunchError, Result};

/// Runs `status`. Exits 0 whether or not the appliance is up.
pub fn run(args: StatusArgs) -> Result<()> {
    let rt = Runtime::from_settings(args.runtime_dir)?;
    let (report, info) = match rt.probe() {
        Probe::Running(pid) => running(&rt, pid).map(|(r, i)| (r, Some(i)))?,
        Probe::Absent => (json!({"running": false, "runtime_dir": rt.dir}), None),
        Probe::Stale(what) => {
            (json!({"running": false, "runtime_dir": rt.dir, "stale": what}), None)
        }
    };
    if args.json {
        println!("{report}");
        return Ok(());
    }
    let Some(info) = info else {
        println!("no appliance is up (runtime directory {})", rt.dir.display());
        if let Some(stale) = report["stale"].as_str() {
            println!("stale files: {stale} (`kore-launch down` or `up` cleans them)");
        }
        return Ok(());
    };
    println!("appliance up: pid {}, {}", report["pid"], report["engine"].as_str().unwrap_or("?"));
    println!(
        "  model {}, context {} tokens, protocol {}",
        info.model, info.context_limit, info.protocol
    );
    println!(
        "  {} connections, {} of {} running, {} queued; up {} s",
        info.connections, info.active, info.max_active, info.queued, report["uptime_s"]
    );
    println!("  socket {}", report["socket"].as_str().unwrap_or("?"));
    if let Some(v) = report["vmm"].as_object() {
        let on = |k: &str| if v.get(k) == Some(&Value::Bool(true)) { "on" } else { "off" };
        println!(
            "  VMM process {}: uid {}, seccomp {}, own network and mount namespaces {}, empty root {}",
            v["pid"],
            v["uid"],
            on("seccomp"),
            on("namespaces"),
            on("empty_root")
        );
    }
    match report["vf"].as_str() {
        Some(vf) => println!("  PCI passthrough: VF {vf} (VFIO)"),
        None => println!("  PCI passthrough: none"),
    }
    Ok(())
}

fn running(rt: &Runtime, pid: u32) -> Result<(Value, kore_protocol::InfoBody)> {
    let stream = connect_service(&rt.socket()).map_err(|e| ApplianceError::NotAnswering {
        pid,
        socket: rt.socket().display().to_string(),
        source: Box::new(e),
    })?;
    let reader = stream
        .try_clone()
        .map_err(|source| LaunchError::Io { path: rt.socket().display().to_string(), source })?;
    let info =
        Client::new(Connection { reader: Box::new(reader), writer: Box::new(stream) }).info()?;
    let state = rt.state().unwrap_or(Value::Null);
    let now = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let uptime =
        state["started_unix"].as_u64().map_or(Value::Null, |t| now.saturating_sub(t).into());
    let report = json!({
        "running": true,
        "pid": pid,
        "runtime_dir": rt.dir,
        "socket": rt.socket(),
        "engine": state["engine"],
        "native": state["native"],
        "vmm": state["vmm"],
        "vf": state["vf"],
        "uptime_s": uptime,
        "info": info,
    });
    Ok((report, info))
}
