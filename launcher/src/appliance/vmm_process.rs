//! The VMM runs in its own process, the small binary `kore-vmm` (package
//! kore-vmm-process: the VMM and its sandbox, no HTTP server, runtime or engine):
//! `kore-launch` starts it, writes a [`VmmSpec`] (one JSON object) to its stdin
//! and reads [`VmmEvent`]s (JSON lines) from its stdout. The child boots the VM
//! and then confines itself, so whatever the guest does to the VMM, it does to
//! an unprivileged, seccomp-filtered process without network, not to
//! `kore-launch` and its user's files.
//!
//! The binary is `vmm-process/release/kore-vmm` under an ancestor of
//! kore-launch's own path (the source tree's `target/`, which launcher/build.rs
//! fills), else the copy kore-launch carries ([`crate::bundle`]).
//!
//! The child dies with its parent (`PR_SET_PDEATHSIG`), stops the VM on
//! SIGTERM, and reports how the guest ended as its last event.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

pub use kore_vmm_process::{Confinement, VmmEvent, VmmSpec};

use crate::error::{ApplianceError, LaunchError, Result};

/// Where a build of the source tree puts the binary, under its target directory.
const BUILT_REL: &str = "vmm-process/release/kore-vmm";
/// How long a stopped VMM may take to exit before it is killed.
const STOP_GRACE: Duration = Duration::from_secs(5);

/// How the VMM process ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ended {
    /// The guest's exit status, if it exited by itself.
    pub status: Option<u32>,
    /// Otherwise, why (including a VMM that died without saying).
    pub error: Option<String>,
    /// The console's last lines.
    pub console: Vec<String>,
}

/// The running VMM process.
#[derive(Debug)]
pub struct VmmProcess {
    child: Child,
    events: Receiver<VmmEvent>,
    confinement: Confinement,
    ended: Option<Ended>,
}

impl VmmProcess {
    /// Starts the child with `spec` and waits until the VM runs, passing
    /// preload progress to `progress`. Fails with the child's error.
    pub fn spawn(spec: &VmmSpec, progress: &mut dyn FnMut(u64, u64)) -> Result<VmmProcess> {
        let exe = vmm_binary()?;
        tracing::debug!(vmm = %exe.display(), "starting the VMM process");
        let mut child = Command::new(&exe)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|source| LaunchError::Start { what: "the VMM process (kore-vmm)", source })?;
        let spec_json = serde_json::to_vec(spec).expect("a spec serializes");
        let mut stdin = child.stdin.take().expect("piped stdin");
        // A child that died at once shows up below as an exit without events.
        let _ = stdin.write_all(&spec_json).and_then(|_| stdin.flush());
        drop(stdin);
        let events = read_events(child.stdout.take().expect("piped stdout"));
        let mut me = VmmProcess { child, events, confinement: Confinement::default(), ended: None };
        loop {
            match me.events.recv() {
                Ok(VmmEvent::Progress { done, total }) => progress(done, total),
                Ok(VmmEvent::Warning { message }) => eprintln!("kore-launch: warning: {message}"),
                Ok(VmmEvent::Started(c)) => {
                    tracing::info!(pid = c.pid, uid = c.uid, seccomp = c.seccomp, "VMM confined");
                    me.confinement = c;
                    return Ok(me);
                }
                Ok(VmmEvent::Exit { status, error, console }) => {
                    me.reap();
                    let mut why = error.unwrap_or_else(|| format!("guest exited with {status:?}"));
                    if !console.is_empty() {
                        why = format!("{why}; console:\n{}", console.join("\n"));
                    }
                    return Err(LaunchError::Host(format!("cannot boot the Kore VM: {why}")));
                }
                Err(_) => {
                    let how = me.reap();
                    return Err(ApplianceError::VmmEnded(how.to_string()).into());
                }
            }
        }
    }

    /// What the child confined.
    pub fn confinement(&self) -> &Confinement {
        &self.confinement
    }

    /// Waits at most `timeout` for the VMM to end; `Some` once it has.
    pub fn wait_timeout(&mut self, timeout: Duration) -> Option<&Ended> {
        let deadline = Instant::now() + timeout;
        while self.ended.is_none() {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.events.recv_timeout(left) {
                Ok(VmmEvent::Exit { status, error, console }) => {
                    self.reap();
                    self.ended = Some(Ended { status, error, console });
                }
                Ok(VmmEvent::Warning { message }) => tracing::warn!("VMM: {message}"),
                Ok(_) => {}
                Err(RecvTimeoutError::Timeout) => return None,
                Err(RecvTimeoutError::Disconnected) => {
                    let how = self.reap();
                    let error = Some(format!("the VMM process died ({how})"));
                    self.ended = Some(Ended { status: None, error, console: Vec::new() });
                }
            }
        }
        self.ended.as_ref()
    }

    /// Stops the VM (SIGTERM; SIGKILL after a grace period) and reaps the child.
    pub fn stop(&mut self) {
        if self.ended.is_some() {
            return;
        }
        // SAFETY: kill with a pid we spawned and have not reaped yet.
        unsafe { libc::kill(self.child.id() as libc::pid_t, libc::SIGTERM) };
        if self.wait_timeout(STOP_GRACE).is_none() {
            let _ = self.child.kill();
            self.wait_timeout(STOP_GRACE);
        }
    }

    /// Reaps the child; says how it ended.
    fn reap(&mut self) -> String {
        match self.child.wait() {
            Ok(s) => s.to_string(),
            Err(e) => format!("wait failed: {e}"),
        }
    }
}

impl Drop for VmmProcess {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The `kore-vmm` binary to start (see the module docs).
fn vmm_binary() -> Result<PathBuf> {
    let exe = std::env::current_exe()
        .map_err(|e| LaunchError::Host(format!("cannot find kore-launch's own path: {e}")))?;
    if let Some(built) = built_next_to(&exe) {
        return Ok(built);
    }
    crate::bundle::file(kore_vmm_process::BINARY).map_err(|e| LaunchError::Host(e.to_string()))
}

/// [`BUILT_REL`] under an ancestor of `exe`.
fn built_next_to(exe: &Path) -> Option<PathBuf> {
    exe.ancestors().skip(1).map(|d| d.join(BUILT_REL)).find(|p| p.is_file())
}

/// Reads the child's events on a thread; the channel closes at EOF. A line
/// that is not an event ends the stream (the child is ours: that is a bug).
fn read_events(stdout: std::process::ChildStdout) -> Receiver<VmmEvent> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            match serde_json::from_str::<VmmEvent>(&line) {
                Ok(ev) => {
                    if tx.send(ev).is_err() {
                        break;
                    }
                }
                Err(e) => {
                    tracing::error!("unreadable VMM event ({e}): {line}");
                    break;
                }
            }
        }
    });
    rx
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_source_trees_build_is_found_next_to_kore_launch() {
        let dir = tempfile::tempdir().unwrap();
        let exe = dir.path().join("target/release/kore-launch");
        assert_eq!(built_next_to(&exe), None);
        let built = dir.path().join("target").join(BUILT_REL);
        std::fs::create_dir_all(built.parent().unwrap()).unwrap();
        std::fs::write(&built, b"\x7fELF").unwrap();
        assert_eq!(built_next_to(&exe), Some(built));
    }
}
