//! `kore-launch up`: starts the background appliance (a detached
//! `kore-launch daemon` process, see `daemon.rs`) and waits until it answers.

use std::fs::File;
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::time::Duration;

use super::daemon::{Probe, Runtime};
use crate::appliance::vm::connect_service;
use crate::cli::UpArgs;
use crate::error::{ApplianceError, LaunchError, Result};

/// Runs `up`.
pub fn run(args: UpArgs, verbose: u8) -> Result<()> {
    let rt = Runtime::from_settings(args.runtime_dir.clone())?;
    match rt.probe() {
        Probe::Running(pid) => {
            println!("the appliance is already up (pid {pid}, socket {})", rt.socket().display());
            return Ok(());
        }
        Probe::Stale(what) => {
            eprintln!("kore-launch: cleaning up after an appliance that is gone: {what}");
            rt.clean();
        }
        Probe::Absent => {}
    }
    let io_err = |path: &std::path::Path| {
        let path = path.display().to_string();
        move |source| LaunchError::Io { path, source }
    };
    std::fs::create_dir_all(&rt.dir).map_err(io_err(&rt.dir))?;
    let log = File::create(rt.log_file()).map_err(io_err(&rt.log_file()))?;
    let exe = std::env::current_exe().map_err(io_err(std::path::Path::new("/proc/self/exe")))?;
    let mut cmd = Command::new(exe);
    cmd.arg("daemon").arg("--runtime-dir").arg(&rt.dir);
    if args.native {
        cmd.arg("--native");
    }
    if let Some(model) = &args.model {
        cmd.arg("--model").arg(model);
    }
    if let Some(level) = crate::config::guest_cpu_flag() {
        cmd.arg("--guest-cpu").arg(level.name());
    }
    if let Some(vf) = crate::config::vf_flag() {
        cmd.arg("--vf").arg(vf);
    }
    let (cache, cache_disk) = crate::config::cache_flags();
    if let Some(b) = cache {
        cmd.arg("--cache").arg(b.to_string());
    }
    if let Some(b) = cache_disk {
        cmd.arg("--cache-disk").arg(b.to_string());
    }
    cmd.arg(format!("-{}", "v".repeat(usize::from(verbose.max(1)))));
    cmd.stdin(Stdio::null()).stdout(log.try_clone().map_err(io_err(&rt.log_file()))?).stderr(log);
    // SAFETY: setsid is async-signal-safe and touches no memory of the parent;
    // it detaches the daemon from our session so it outlives this terminal.
    unsafe {
        cmd.pre_exec(|| {
            libc::setsid();
            Ok(())
        });
    }
    let mut child = cmd
        .spawn()
        .map_err(|source| LaunchError::Start { what: "the appliance daemon", source })?;
    let started = std::time::Instant::now();
    loop {
        let limit = crate::appliance::vm::ready_timeout();
        if started.elapsed() > limit {
            let log = rt.log_file().display().to_string();
            return Err(ApplianceError::DaemonTimeout { limit, log }.into());
        }
        let waited = child.try_wait();
        let waited =
            waited.map_err(|source| LaunchError::Start { what: "the appliance daemon", source })?;
        if let Some(status) = waited {
            let log = std::fs::read_to_string(rt.log_file()).unwrap_or_default();
            let last = log.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or("no output");
            let (last, log) = (last.to_string(), rt.log_file().display().to_string());
            return Err(ApplianceError::DaemonExited { status, last, log }.into());
        }
        if matches!(rt.probe(), Probe::Running(_)) && connect_service(&rt.socket()).is_ok() {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let engine =
        rt.state().and_then(|s| s["engine"].as_str().map(str::to_owned)).unwrap_or_default();
    println!("appliance up: pid {}, {engine}, socket {}", child.id(), rt.socket().display());
    Ok(())
}
