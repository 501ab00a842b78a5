//! The demo's vsock server, for the VMM's integration tests and throughput figures: it
//! listens on one port and serves `conns` connections at once, each in one [`Mode`]:
//!
//! * `echo` (default): sends back everything it reads until the peer shuts down sending;
//! * `sink`: reads and discards everything, then sends the byte count as decimal + `\n`;
//! * `source:BYTES`: sends BYTES bytes of [`pattern`] and closes, ignoring what it reads.
//!
//! It returns once every connection was served and closed, and the host acknowledged each
//! close (its RST), so nothing the host has not yet delivered is lost when the guest exits.

use alloc::vec::Vec;

use kore_rt::println;
use kore_rt::vsock::{self, ConnId, Error, Vsock};

/// What each connection does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Send back what was read.
    Echo,
    /// Count what was read; report the count at end of stream.
    Sink,
    /// Send this many bytes of [`pattern`].
    Source(usize),
}

impl Mode {
    /// Parses `echo`, `sink` or `source:BYTES`.
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "echo" => Some(Self::Echo),
            "sink" => Some(Self::Sink),
            _ => Some(Self::Source(s.strip_prefix("source:")?.parse().ok()?)),
        }
    }
}

/// Byte `i` of the `source` stream (the host test computes the same).
pub fn pattern(i: usize) -> u8 {
    ((i as u32).wrapping_mul(2_654_435_761) >> 24) as u8
}

/// Most bytes read ahead per connection before they are echoed (the peer's credit, not
/// our heap, is then the limit).
const PENDING_MAX: usize = 256 * 1024;

/// One served connection.
struct Conn {
    id: ConnId,
    /// Bytes to send (echo data, or the sink's count line).
    pending: Vec<u8>,
    /// Bytes read.
    read: usize,
    /// Bytes sent.
    sent: usize,
    done: bool,
}

/// Serves `conns` connections on `port` in `mode`.
pub fn run(port: u32, conns: usize, mode: Mode) -> Result<(), &'static str> {
    let mut dev = vsock::open().map_err(|_| "no usable virtio-vsock device")?;
    dev.sockets.listen(port).map_err(|_| "listen failed")?;
    println!("kore-test-image: vsock cid={} listening on port {port}", dev.sockets.cid());
    let mut open: Vec<Conn> = Vec::new();
    let mut buf = alloc::vec![0u8; 64 * 1024];
    let mut failed = false;
    vsock::run_until(&mut dev, |d| {
        while open.len() < conns {
            let Some(id) = d.sockets.accept() else { break };
            open.push(Conn { id, pending: Vec::new(), read: 0, sent: 0, done: false });
        }
        for c in open.iter_mut().filter(|c| !c.done) {
            failed |= !step(&mut d.sockets, c, mode, &mut buf);
        }
        open.len() == conns && open.iter().all(|c| c.done)
    })
    .map_err(|_| "device error while serving")?;
    // A closed connection lives until the host's RST, which the device sends once it has
    // written everything it buffered for the host client (or the client went away). Exiting
    // earlier would power off with that tail undelivered, so wait for every RST (with no
    // timer, unbounded: a client that neither reads nor closes keeps the guest here).
    vsock::run_until(&mut dev, |d| d.sockets.conn_count() == 0)
        .map_err(|_| "device error while closing")?;
    let read: usize = open.iter().map(|c| c.read).sum();
    let sent: usize = open.iter().map(|c| c.sent).sum();
    if mode == Mode::Echo {
        println!("kore-test-image: echoed {sent} bytes on {conns} connection(s)");
    } else {
        println!(
            "kore-test-image: {mode:?}: read {read}, sent {sent} bytes on {conns} connection(s)"
        );
    }
    if failed {
        return Err("a connection broke before it was served");
    }
    Ok(())
}

/// Moves one connection forward; closes it when served. False if it broke first.
fn step(s: &mut Vsock, c: &mut Conn, mode: Mode, buf: &mut [u8]) -> bool {
    while c.pending.len() < PENDING_MAX {
        match s.read(c.id, buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                c.read += n;
                if mode == Mode::Echo {
                    c.pending.extend_from_slice(&buf[..n]);
                }
            }
        }
    }
    let eof = s.at_eof(c.id) && s.readable(c.id) == 0;
    if mode == Mode::Sink && eof && c.sent == 0 && c.pending.is_empty() {
        c.pending = alloc::format!("{}\n", c.read).into_bytes();
    }
    if let Mode::Source(n) = mode {
        while c.sent < n {
            let k = buf.len().min(n - c.sent);
            for (j, b) in buf[..k].iter_mut().enumerate() {
                *b = pattern(c.sent + j);
            }
            match s.write(c.id, &buf[..k]) {
                Ok(w) => c.sent += w,
                Err(Error::WouldBlock) => return true,
                Err(_) => return close(s, c, false),
            }
        }
        return close(s, c, true);
    }
    while !c.pending.is_empty() {
        match s.write(c.id, &c.pending) {
            Ok(w) => {
                c.sent += w;
                c.pending.drain(..w);
            }
            Err(Error::WouldBlock) => return true,
            Err(_) => return close(s, c, false),
        }
    }
    let answered = mode == Mode::Echo || c.sent > 0;
    if eof && answered {
        return close(s, c, true);
    }
    true
}

fn close(s: &mut Vsock, c: &mut Conn, ok: bool) -> bool {
    c.done = true;
    s.close(c.id);
    ok
}
