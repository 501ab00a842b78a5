//! Noticing an appliance that hangs in the middle of an answer. A request may legitimately go
//! without events for a long time (queued behind others, a long prefill chunk), so silence
//! alone proves nothing: after [`Watchdog::idle`] without an event the client asks the
//! appliance for `info` on a new connection. The service answers `info` between engine
//! steps, so a live appliance answers within one step; one that does not within
//! `KORE_HANG_TIMEOUT_S` seconds (default [`DEFAULT_LIMIT`]) is declared hung and the request
//! fails with an error that says so, instead of waiting forever. [`WatchedReader`] does this
//! inside `read`, so every reader of a VM's connection (the protocol client, chat and batch,
//! the `up` daemon's pump) gets it.

use std::io::{BufRead, BufReader, ErrorKind, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use kore_vmm::vsock::ConnectError;

use super::vm::SERVICE_PORT;
use crate::error::{ApplianceError, LaunchError, Result};

/// How long a probe may go unanswered before the appliance counts as hung.
pub const DEFAULT_LIMIT: Duration = Duration::from_secs(300);
/// Silence on a request before the first probe.
const IDLE_MAX: Duration = Duration::from_secs(30);

/// Probes the appliance behind a vsock socket.
#[derive(Debug, Clone)]
pub struct Watchdog {
    socket: PathBuf,
    limit: Duration,
}

impl Watchdog {
    /// A watchdog for the appliance on `socket`, with `KORE_HANG_TIMEOUT_S` as its limit.
    pub fn for_socket(socket: &Path) -> Self {
        let limit = crate::env::seconds("KORE_HANG_TIMEOUT_S", DEFAULT_LIMIT);
        Self::with_limit(socket, limit)
    }

    /// A watchdog for the appliance on `socket` that waits `limit` for a probe's answer.
    pub fn with_limit(socket: &Path, limit: Duration) -> Self {
        Self { socket: socket.to_path_buf(), limit }
    }

    /// Silence on a request before [`Watchdog::check`] is due.
    pub fn idle(&self) -> Duration {
        self.limit.min(IDLE_MAX)
    }

    /// Ok if the appliance answers `info` within the limit; the hang error if not.
    pub fn check(&self, silent_for: Duration) -> Result<()> {
        let deadline = Instant::now() + self.limit;
        let s = self.connect_for(silent_for)?;
        match info_within(s, deadline) {
            true => Ok(()),
            false => Err(self.hung(silent_for, "`info` on a new connection got no answer")),
        }
    }

    /// A new connection to the service. The guest accepts connections
    /// between engine steps, so a busy one (a long prefill chunk) answers the
    /// handshake late: it may take up to the limit, after which the appliance
    /// counts as hung.
    pub fn connect(&self) -> Result<UnixStream> {
        self.connect_for(Duration::ZERO)
    }

    fn connect_for(&self, silent_for: Duration) -> Result<UnixStream> {
        match kore_vmm::vsock::connect_within(&self.socket, SERVICE_PORT, self.limit) {
            Ok(s) => Ok(s),
            Err(ConnectError::Io(e))
                if matches!(e.kind(), ErrorKind::TimedOut | ErrorKind::WouldBlock) =>
            {
                Err(self.hung(silent_for, "a new connection was not accepted"))
            }
            Err(e) => Err(ApplianceError::WentAway(e).into()),
        }
    }

    fn hung(&self, silent_for: Duration, why: &'static str) -> LaunchError {
        let (silent_s, limit_s) = (silent_for.as_secs(), self.limit.as_secs());
        LaunchError::from(ApplianceError::Hung { silent_s, why, limit_s })
    }
}

/// The reading half of a connection to the appliance, watched: its reads wait at most
/// [`Watchdog::idle`] at a time, and a silence that long is checked with [`Watchdog::check`].
#[derive(Debug)]
pub struct WatchedReader {
    stream: UnixStream,
    watchdog: Watchdog,
    heard: Instant,
}

impl WatchedReader {
    /// Watches `stream` (sets its read timeout).
    pub fn new(stream: UnixStream, watchdog: Watchdog) -> std::io::Result<Self> {
        stream.set_read_timeout(Some(watchdog.idle()))?;
        Ok(Self { stream, watchdog, heard: Instant::now() })
    }
}

impl Read for WatchedReader {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        loop {
            match self.stream.read(buf) {
                Ok(n) => {
                    self.heard = Instant::now();
                    return Ok(n);
                }
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                    let silent = self.heard.elapsed();
                    if silent >= self.watchdog.idle() {
                        self.watchdog
                            .check(silent)
                            .map_err(|e| std::io::Error::new(ErrorKind::TimedOut, e.to_string()))?;
                        self.heard = Instant::now();
                    }
                }
                Err(e) => return Err(e),
            }
        }
    }
}

/// Sends `info` on `s` and waits for a line until `deadline`.
fn info_within(mut s: UnixStream, deadline: Instant) -> bool {
    let left = deadline.saturating_duration_since(Instant::now()).max(Duration::from_millis(1));
    if s.set_read_timeout(Some(left)).is_err()
        || s.write_all(b"{\"op\":\"info\",\"id\":\"kore-watchdog\"}\n").is_err()
    {
        return false;
    }
    let mut line = Vec::new();
    matches!(BufReader::new(s).read_until(b'\n', &mut line), Ok(n) if n > 0 && line.ends_with(b"\n"))
}

#[cfg(test)]
mod tests {
    use std::io::{BufRead, BufReader, Write};
    use std::os::unix::net::UnixListener;
    use std::time::{Duration, Instant};

    use super::Watchdog;

    /// A fake VMM socket: accepts the `CONNECT` handshake, then answers `info` after
    /// `delay` (or never, with `None`).
    fn fake_appliance(dir: &std::path::Path, delay: Option<Duration>) -> std::path::PathBuf {
        fake_busy_appliance(dir, Duration::ZERO, delay)
    }

    /// [`fake_appliance`] whose guest answers the handshake after `busy`.
    fn fake_busy_appliance(
        dir: &std::path::Path,
        busy: Duration,
        delay: Option<Duration>,
    ) -> std::path::PathBuf {
        let path = dir.join("v.sock");
        let listener = UnixListener::bind(&path).unwrap();
        std::thread::spawn(move || {
            for s in listener.incoming() {
                let mut s = s.unwrap();
                let mut r = BufReader::new(s.try_clone().unwrap());
                let mut line = String::new();
                r.read_line(&mut line).unwrap();
                assert_eq!(line, "CONNECT 1025\n");
                std::thread::sleep(busy);
                if s.write_all(b"OK 1025\n").is_err() {
                    continue;
                }
                line.clear();
                if r.read_line(&mut line).unwrap_or(0) == 0 {
                    continue; // a connection that asks nothing
                }
                assert!(line.contains("\"info\""), "{line}");
                match delay {
                    Some(d) => {
                        std::thread::sleep(d);
                        s.write_all(b"{\"id\":\"kore-watchdog\",\"info\":{}}\n").unwrap();
                    }
                    None => std::thread::sleep(Duration::from_secs(30)),
                }
            }
        });
        path
    }

    #[test]
    fn a_busy_appliance_that_answers_within_the_limit_is_alive() {
        let dir = tempfile::tempdir().unwrap();
        let socket = fake_appliance(dir.path(), Some(Duration::from_millis(700)));
        let w = Watchdog::with_limit(&socket, Duration::from_secs(5));
        w.check(Duration::from_secs(30)).expect("alive");
    }

    #[test]
    fn a_busy_guest_that_accepts_late_gets_the_connection() {
        // The guest accepts between engine steps: a handshake answered after
        // 1.5 s is a connection when the limit allows it, and a hang when not.
        let dir = tempfile::tempdir().unwrap();
        let busy = Duration::from_millis(1500);
        let socket = fake_busy_appliance(dir.path(), busy, Some(Duration::ZERO));
        let t = Instant::now();
        Watchdog::with_limit(&socket, Duration::from_secs(5)).connect().expect("late but alive");
        assert!(t.elapsed() >= busy, "{:?}", t.elapsed());
        let short = Watchdog::with_limit(&socket, Duration::from_millis(300));
        let err = short.connect().unwrap_err().to_string();
        assert!(err.contains("stopped answering") && err.contains("not accepted"), "{err}");
    }

    #[test]
    fn an_appliance_that_never_answers_is_hung_after_the_limit() {
        let dir = tempfile::tempdir().unwrap();
        let socket = fake_appliance(dir.path(), None);
        let w = Watchdog::with_limit(&socket, Duration::from_secs(1));
        let t = Instant::now();
        let err = w.check(Duration::from_secs(30)).unwrap_err().to_string();
        assert!(err.contains("stopped answering") && err.contains("no answer"), "{err}");
        assert!(t.elapsed() < Duration::from_secs(5), "took {:?}", t.elapsed());
    }

    #[test]
    fn an_appliance_whose_socket_is_gone_went_away() {
        let dir = tempfile::tempdir().unwrap();
        let w = Watchdog::with_limit(&dir.path().join("gone.sock"), Duration::from_secs(1));
        let err = w.check(Duration::from_secs(30)).unwrap_err().to_string();
        assert!(err.contains("went away"), "{err}");
    }

    /// A reader over a silent stream probes once per idle time and reads on while the
    /// appliance answers; bytes arriving later are read normally.
    #[test]
    fn a_watched_read_waits_through_silence_while_the_appliance_answers() {
        use std::io::Read;
        let dir = tempfile::tempdir().unwrap();
        let socket = fake_appliance(dir.path(), Some(Duration::from_millis(10)));
        let (a, mut b) = std::os::unix::net::UnixStream::pair().unwrap();
        let mut w = Watchdog::with_limit(&socket, Duration::from_secs(5));
        w.limit = Duration::from_millis(300); // idle = limit: probe every 0.3 s
        let mut r = super::WatchedReader::new(a, w).unwrap();
        let late = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(1200));
            b.write_all(b"late\n").unwrap();
        });
        let mut buf = [0u8; 5];
        r.read_exact(&mut buf).expect("read through the silence");
        assert_eq!(&buf, b"late\n");
        late.join().unwrap();
    }
}
