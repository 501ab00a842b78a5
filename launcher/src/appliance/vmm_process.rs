//! The VMM runs in its own process: `kore-launch` starts itself again as the
//! hidden `vmm-process` command, writes a [`VmmSpec`] (one JSON object) to its
//! stdin and reads [`VmmEvent`]s (JSON lines) from its stdout. The child boots
//! the VM and then confines itself (`crate::cmd::vmm_process`), so whatever
//! the guest does to the VMM, it does to an unprivileged, seccomp-filtered
//! process without network, not to `kore-launch` and its user's files.
//!
//! The child dies with its parent (`PR_SET_PDEATHSIG`), stops the VM on
//! SIGTERM, and reports how the guest ended as its last event.

use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::error::{LaunchError, Result};

/// Name of the hidden command the child runs.
pub const COMMAND: &str = "vmm-process";
/// How long a stopped VMM may take to exit before it is killed.
const STOP_GRACE: Duration = Duration::from_secs(5);

/// Everything the child needs to boot the VM.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct VmmSpec {
    /// The Kore kernel ELF.
    pub kernel: PathBuf,
    /// The ring-3 appliance image ELF.
    pub image: PathBuf,
    /// vCPUs.
    pub vcpus: u32,
    /// Guest RAM besides the pack, MiB.
    pub memory_mib: u64,
    /// `2M`, `1G` or `off`.
    pub hugepages: String,
    /// The guest CPU level (`host`, `x86-64-v3`, `x86-64-v2`).
    pub guest_cpu: String,
    /// The vsock device's host socket.
    pub socket: PathBuf,
    /// Guest command line.
    pub cmdline: String,
    /// Files preloaded into guest RAM (the pack).
    pub preload: Vec<PathBuf>,
    /// A host PCI function to pass through with VFIO.
    pub vf: Option<String>,
    /// Confine the VMM after boot (seccomp, namespaces, no root).
    pub confine: bool,
}

/// What the child confined (reported once the VM runs).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Confinement {
    /// The child's pid.
    pub pid: u32,
    /// uid and gid it runs as.
    pub uid: u32,
    /// See `uid`.
    pub gid: u32,
    /// Every VMM thread runs under its seccomp filter.
    pub seccomp: bool,
    /// It has its own network and mount namespaces.
    pub namespaces: bool,
    /// Its root is an empty, read-only tmpfs (no host file is reachable by path).
    #[serde(default)]
    pub empty_root: bool,
}

/// One line from the child.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum VmmEvent {
    /// Preload progress, bytes.
    Progress {
        /// Bytes loaded.
        done: u64,
        /// Bytes to load.
        total: u64,
    },
    /// A confinement step the host did not allow, or a fallback.
    Warning {
        /// One line for the user.
        message: String,
    },
    /// The vCPUs run and the VMM is confined.
    Started(Confinement),
    /// The last event: the guest exited (`status`), or the VM failed or was
    /// stopped (`error`); with the console's last lines.
    Exit {
        /// The guest's exit status.
        status: Option<u32>,
        /// Why the VM ended otherwise.
        error: Option<String>,
        /// The console's last lines.
        console: Vec<String>,
    },
}

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
        let exe = std::env::current_exe()
            .map_err(|e| LaunchError::Other(format!("cannot find kore-launch itself: {e}")))?;
        let mut child = Command::new(exe)
            .arg(COMMAND)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|e| LaunchError::Other(format!("cannot start the VMM process: {e}")))?;
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
                    return Err(LaunchError::Other(format!(
                        "the VMM process ended before the VM started ({how})"
                    )));
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

    /// Blocks until the VMM ends.
    pub fn wait(&mut self) -> Ended {
        loop {
            if let Some(e) = self.wait_timeout(Duration::from_secs(3600)) {
                return e.clone();
            }
        }
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
