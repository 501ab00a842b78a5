//! The background appliance: a detached `kore-launch daemon` process (started
//! by `up`) that owns the engine — the Kore VM booted for it, or with
//! `up --native` the in-process engine — and serves it on the Unix socket
//! `kore.sock` in the runtime directory with Firecracker's hybrid-vsock
//! handshake (`CONNECT 1025\n` -> `OK <port>\n`), so clients attach the same
//! way whatever holds the engine (`Appliance::attach`).
//!
//! Files in the runtime directory: `kore.pid` (the daemon's pid), `kore.sock`
//! (the socket), `kore.json` (what it runs, for `status`), `kore.log` (its
//! stderr). A pidfile whose process is gone, or a socket without a pidfile,
//! is stale: [`Runtime::probe`] reports it and [`Runtime::clean`] removes it.

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::{json, Value};
use signal_hook::consts::{SIGINT, SIGTERM};

use super::session::{self, Placement, Streams};
use crate::appliance::{self, vm::SERVICE_PORT};
use crate::cli::DaemonArgs;
use crate::error::{LaunchError, Result};

/// The runtime directory of a background appliance.
#[derive(Debug, Clone)]
pub struct Runtime {
    /// The directory.
    pub dir: PathBuf,
}

/// What the runtime directory says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Probe {
    /// Nothing there.
    Absent,
    /// A daemon is running with this pid.
    Running(u32),
    /// Leftovers of a daemon that is gone (what was found, for the message).
    Stale(String),
}

impl Runtime {
    /// The runtime directory of the effective settings (`--runtime-dir`,
    /// `KORE_RUNTIME_DIR`, config `runtime_dir`, default).
    pub fn from_settings(flag: Option<PathBuf>) -> Result<Self> {
        let s = crate::config::effective(&crate::config::Overrides {
            runtime_dir: flag,
            ..Default::default()
        })?;
        Ok(Self { dir: s.runtime_dir })
    }

    /// `kore.pid`.
    pub fn pid_file(&self) -> PathBuf {
        self.dir.join("kore.pid")
    }

    /// `kore.sock` ([`appliance::socket_path`]).
    pub fn socket(&self) -> PathBuf {
        appliance::socket_path(&self.dir)
    }

    /// `kore.json`.
    pub fn state_file(&self) -> PathBuf {
        self.dir.join("kore.json")
    }

    /// `kore.log`.
    pub fn log_file(&self) -> PathBuf {
        self.dir.join("kore.log")
    }

    /// Looks at the pidfile and the process it names.
    pub fn probe(&self) -> Probe {
        let pid_text = std::fs::read_to_string(self.pid_file()).ok();
        match pid_text.as_deref().map(str::trim).map(str::parse::<u32>) {
            Some(Ok(pid)) if is_our_daemon(pid) => Probe::Running(pid),
            Some(Ok(pid)) => Probe::Stale(format!("pidfile names pid {pid}, which is not running")),
            Some(Err(_)) => Probe::Stale("unreadable pidfile".into()),
            None if self.socket().exists() => Probe::Stale("socket without a pidfile".into()),
            None => Probe::Absent,
        }
    }

    /// Removes the pidfile, socket and state file.
    pub fn clean(&self) {
        for p in [self.pid_file(), self.socket(), self.state_file()] {
            let _ = std::fs::remove_file(p);
        }
    }

    /// The state file's contents, if readable.
    pub fn state(&self) -> Option<Value> {
        std::fs::read(self.state_file()).ok().and_then(|b| serde_json::from_slice(&b).ok())
    }
}

/// True when `pid` is alive and is a `kore-launch daemon` process.
fn is_our_daemon(pid: u32) -> bool {
    let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else { return false };
    let args: Vec<&[u8]> = cmdline.split(|&b| b == 0).collect();
    let is_launcher = args.first().is_some_and(|a| a.ends_with(b"kore-launch"));
    is_launcher && args.contains(&&b"daemon"[..])
}

/// Runs the daemon (hidden command `daemon`, started by `up`): serves until
/// SIGTERM/SIGINT, then shuts the engine down and removes its files.
pub fn run(args: DaemonArgs) -> Result<()> {
    let rt = Runtime { dir: args.runtime_dir.clone() };
    let io = |p: &Path| {
        let path = p.display().to_string();
        move |source| LaunchError::Io { path, source }
    };
    std::fs::create_dir_all(&rt.dir).map_err(io(&rt.dir))?;
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [SIGTERM, SIGINT] {
        signal_hook::flag::register(sig, stop.clone())
            .map_err(|source| LaunchError::Start { what: "a signal handler", source })?;
    }
    let placement = Placement { native: args.native, model: args.model.clone() };
    let backend = session::open_fresh(&placement)?;
    let _ = std::fs::remove_file(rt.socket());
    let listener = UnixListener::bind(rt.socket()).map_err(io(&rt.socket()))?;
    listener.set_nonblocking(true).map_err(io(&rt.socket()))?;
    let started = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let state = json!({
        "pid": std::process::id(),
        "engine": backend.describe(),
        "model": args.model.as_ref().map(|p| p.display().to_string()),
        "native": args.native,
        "vf": if args.native { None } else { crate::config::effective(&Default::default()).ok().and_then(|s| s.vf) },
        "started_unix": started,
        "vmm": backend.vmm(),
    });
    write_file(&rt.state_file(), &format!("{state}\n"))?;
    write_file(&rt.pid_file(), &format!("{}\n", std::process::id()))?;
    tracing::info!("serving {} on {}", backend.describe(), rt.socket().display());
    let mut next_port: u32 = 1 << 30;
    while !stop.load(Ordering::SeqCst) {
        match listener.accept() {
            Ok((stream, _)) => match backend.streams() {
                Ok(service) => {
                    let port = next_port;
                    next_port = next_port.wrapping_add(1).max(1 << 30);
                    thread::spawn(move || {
                        if let Err(e) = serve(stream, service, port) {
                            tracing::info!("client connection: {e}");
                        }
                    });
                }
                Err(e) => tracing::warn!("cannot open a connection to the engine: {e}"),
            },
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                thread::sleep(Duration::from_millis(20))
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => {
                tracing::warn!("accept: {e}");
                thread::sleep(Duration::from_millis(50));
            }
        }
    }
    tracing::info!("stopping");
    drop(listener);
    let _ = std::fs::remove_file(rt.socket());
    let result = backend.shutdown();
    rt.clean();
    result
}

fn write_file(path: &Path, text: &str) -> Result<()> {
    std::fs::write(path, text)
        .map_err(|source| LaunchError::Io { path: path.display().to_string(), source })
}

/// One client: the CONNECT handshake, then bytes both ways until either side ends.
fn serve(stream: UnixStream, service: Streams, port: u32) -> std::io::Result<()> {
    stream.set_nonblocking(false)?;
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    let mut reader = BufReader::new(stream.try_clone()?);
    let mut line = String::new();
    reader.by_ref().take(33).read_line(&mut line)?;
    let asked = line
        .trim_end()
        .split_once(' ')
        .filter(|(kw, _)| kw.eq_ignore_ascii_case("CONNECT"))
        .and_then(|(_, p)| p.parse::<u32>().ok());
    if asked != Some(SERVICE_PORT) {
        // Like the VMM when nothing listens on the port: close.
        return Err(std::io::Error::other(format!("bad handshake {line:?}: closing")));
    }
    stream.set_read_timeout(None)?;
    let (mut from_service, mut to_service) = service;
    let mut out = stream.try_clone()?;
    out.write_all(format!("OK {port}\n").as_bytes())?;
    let pump_out = thread::spawn(move || {
        let _ = std::io::copy(&mut from_service, &mut out);
        let _ = out.shutdown(std::net::Shutdown::Both);
    });
    // Bytes the handshake reader already buffered belong to the protocol.
    to_service.write_all(reader.buffer())?;
    let mut inbound = reader.into_inner();
    let _ = std::io::copy(&mut inbound, &mut to_service);
    drop(to_service); // EOF: requests already sent are answered, then the service closes
    let _ = pump_out.join();
    Ok(())
}
