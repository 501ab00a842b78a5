//! Host side of the guest's vsock: connect to a guest port through the VM's
//! Unix socket (Firecracker's hybrid vsock).
//!
//! ```no_run
//! use std::io::{Read, Write};
//! let mut s = kore_vmm::vsock::connect("/run/kore/vsock.sock", 1025)?;
//! s.write_all(b"hello\n")?;
//! let mut buf = [0u8; 64];
//! let n = s.read(&mut buf)?;
//! # Ok::<(), kore_vmm::vsock::ConnectError>(())
//! ```

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Why [`connect`] failed.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    /// The VM's vsock socket is not there (VM not started, or another path).
    #[error("cannot connect to the VM's vsock socket {path}: {source} (is the VM running with this vsock_uds?)")]
    Socket {
        /// The socket path.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// The guest refused the connection (nothing listens on the port yet).
    #[error("the guest refused vsock port {port} (is the guest service listening yet?)")]
    Refused {
        /// The guest port.
        port: u32,
    },
    /// The VMM answered something other than `OK <port>`.
    #[error("unexpected vsock handshake reply {0:?}")]
    BadReply(String),
    /// Reading or writing the handshake failed.
    #[error("vsock handshake I/O: {0}")]
    Io(#[from] std::io::Error),
    /// [`connect_timeout`] gave up.
    #[error("guest vsock port {port} did not accept within {waited:?}")]
    Timeout {
        /// The guest port.
        port: u32,
        /// How long we tried.
        waited: Duration,
    },
}

/// How long [`connect`]'s handshake waits for the guest's answer.
pub const HANDSHAKE_WAIT: Duration = Duration::from_secs(10);

/// Connects to guest port `port` through the VM's vsock Unix socket `uds`:
/// writes `CONNECT <port>\n`, expects `OK <host port>\n`, and returns the
/// stream, which then carries the connection's bytes (shut down its write
/// side to send the guest end-of-stream). The handshake itself waits at most
/// [`HANDSHAKE_WAIT`] for the guest's answer.
pub fn connect(uds: impl AsRef<Path>, port: u32) -> Result<UnixStream, ConnectError> {
    connect_within(uds, port, HANDSHAKE_WAIT)
}

/// [`connect`] whose handshake waits at most `wait` for the guest's answer
/// (a guest that accepts connections between long units of work answers
/// late); past it the error is [`ConnectError::Io`] of kind `WouldBlock` or
/// `TimedOut`.
pub fn connect_within(
    uds: impl AsRef<Path>,
    port: u32,
    wait: Duration,
) -> Result<UnixStream, ConnectError> {
    let path = uds.as_ref();
    let mut s = UnixStream::connect(path)
        .map_err(|source| ConnectError::Socket { path: path.to_path_buf(), source })?;
    s.write_all(format!("CONNECT {port}\n").as_bytes())?;
    s.set_read_timeout(Some(wait.max(Duration::from_millis(1))))?;
    // Byte by byte: nothing after the line may be consumed here.
    let mut line = Vec::new();
    let mut b = [0u8; 1];
    loop {
        match s.read(&mut b) {
            Ok(0) => return Err(ConnectError::Refused { port }),
            Ok(_) if b[0] == b'\n' => break,
            Ok(_) if line.len() < 32 => line.push(b[0]),
            Ok(_) => return Err(ConnectError::BadReply(String::from_utf8_lossy(&line).into())),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {
                return Err(ConnectError::Refused { port })
            }
            Err(e) => return Err(e.into()),
        }
    }
    let text = String::from_utf8_lossy(&line);
    match text.strip_prefix("OK ").map(|p| p.trim().parse::<u32>()) {
        Some(Ok(_)) => {
            s.set_read_timeout(None)?;
            Ok(s)
        }
        _ => Err(ConnectError::BadReply(text.into())),
    }
}

/// Like [`connect`], retrying every 20 ms while the socket is missing or the
/// guest refuses, for at most `timeout` (e.g. while the guest boots).
pub fn connect_timeout(
    uds: impl AsRef<Path>,
    port: u32,
    timeout: Duration,
) -> Result<UnixStream, ConnectError> {
    let start = Instant::now();
    loop {
        match connect(uds.as_ref(), port) {
            Ok(s) => return Ok(s),
            Err(ConnectError::Socket { .. } | ConnectError::Refused { .. })
                if start.elapsed() < timeout =>
            {
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(ConnectError::Socket { .. } | ConnectError::Refused { .. }) => {
                return Err(ConnectError::Timeout { port, waited: start.elapsed() })
            }
            Err(e) => return Err(e),
        }
    }
}
