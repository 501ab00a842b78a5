//! The host side of the vsock device: Firecracker's hybrid vsock over Unix
//! sockets.
//!
//! * Host to guest: a client connects to the listener at `uds`, writes
//!   `CONNECT <port>\n`; we send the guest a REQUEST from a fresh host port in
//!   `[2^30, 2^31)`; when the guest answers RESPONSE the client reads
//!   `OK <host port>\n` and bytes flow; an RST closes the client.
//! * Guest to host: a REQUEST to CID 2 port `P` connects to `<uds>_<P>`;
//!   RESPONSE if that works, RST if not.
//!
//! The muxer owns an epoll instance with the listener and every host stream
//! (level-triggered; interests follow each connection's flow-control state)
//! and decides which connection fills the guest's next receive buffer
//! (round-robin over connections with something to send).

use std::collections::{HashMap, HashSet, VecDeque};
use std::os::fd::AsRawFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};

use vmm_sys_util::epoll::{ControlOperation, Epoll, EpollEvent, EventSet};

use super::conn::{Conn, State, Verdict};
use super::packet::{op, Header, HOST_CID, TYPE_STREAM};

/// Most connections at once (Firecracker's cap); more are refused.
pub const MAX_CONNECTIONS: usize = 1023;
/// Most RSTs to unknown connections waiting for a receive buffer; more are dropped.
pub const MAX_LOOSE_RST: usize = 64;
/// Epoll token of the listener.
pub const TOKEN_LISTENER: u64 = 3;
/// First epoll token of a connection (smaller ones are the event loop's).
pub const FIRST_CONN_TOKEN: u64 = 16;
/// First host port handed out for host-initiated connections.
const LOCAL_PORT_BASE: u32 = 1 << 30;

/// The connection table and its host sockets.
pub struct Muxer {
    guest_cid: u64,
    uds: PathBuf,
    epoll: Epoll,
    listener: Option<UnixListener>,
    conns: HashMap<u64, Conn>,
    /// (host port, guest port) -> token, for established and connecting ones.
    by_key: HashMap<(u32, u32), u64>,
    /// Interest registered for each token.
    registered: HashMap<u64, EventSet>,
    local_ports: HashSet<u32>,
    ready: VecDeque<u64>,
    loose_rst: VecDeque<Header>,
    next_token: u64,
    next_port: u32,
}

impl Muxer {
    /// A muxer for guest `guest_cid` with host sockets under `uds`, polling
    /// `listener` (if any) through `epoll`.
    pub fn new(
        guest_cid: u64,
        uds: &Path,
        listener: Option<UnixListener>,
        epoll: Epoll,
    ) -> std::io::Result<Self> {
        if let Some(l) = &listener {
            l.set_nonblocking(true)?;
            epoll.ctl(
                ControlOperation::Add,
                l.as_raw_fd(),
                EpollEvent::new(EventSet::IN, TOKEN_LISTENER),
            )?;
        }
        Ok(Self {
            guest_cid,
            uds: uds.to_path_buf(),
            epoll,
            listener,
            conns: HashMap::new(),
            by_key: HashMap::new(),
            registered: HashMap::new(),
            local_ports: HashSet::new(),
            ready: VecDeque::new(),
            loose_rst: VecDeque::new(),
            next_token: FIRST_CONN_TOKEN,
            next_port: LOCAL_PORT_BASE,
        })
    }

    /// The epoll instance (the event loop adds its own fds with tokens below
    /// [`FIRST_CONN_TOKEN`]).
    pub fn epoll(&self) -> &Epoll {
        &self.epoll
    }

    /// Number of live connections.
    pub fn len(&self) -> usize {
        self.conns.len()
    }

    /// True without connections.
    pub fn is_empty(&self) -> bool {
        self.conns.is_empty()
    }

    /// The driver reset the device: drops every connection the old driver
    /// knew about (their host clients see the stream close) and everything
    /// queued for it. Host clients the guest has not accepted yet survive:
    /// a reset is noticed at the next event-loop pass, which may come after
    /// a client connected, and such a client was never the guest's.
    pub fn reset(&mut self) {
        self.ready.clear();
        self.loose_rst.clear();
        for t in self.conns.keys().copied().collect::<Vec<_>>() {
            let keep = self.conns.get_mut(&t).is_some_and(Conn::survive_reset);
            if keep {
                self.sync(t);
            } else {
                self.remove(t);
            }
        }
    }

    /// Drops every connection, host clients waiting for the guest included (a transport
    /// reset), and everything queued for the guest.
    pub fn drop_all(&mut self) {
        self.ready.clear();
        self.loose_rst.clear();
        for t in self.conns.keys().copied().collect::<Vec<_>>() {
            self.remove(t);
        }
    }

    /// Logs every connection's state (debug level).
    pub fn log_state(&self) {
        tracing::debug!("vsock muxer: ready {:?}, {} loose RSTs", self.ready, self.loose_rst.len());
        for (t, c) in &self.conns {
            tracing::debug!("vsock conn {t}: {c:?}");
        }
    }

    /// Accepts pending clients on the listener.
    pub fn accept(&mut self) {
        loop {
            let Some(l) = &self.listener else { return };
            match l.accept() {
                Ok((s, _)) => {
                    if self.conns.len() >= MAX_CONNECTIONS {
                        tracing::warn!(
                            "vsock: {MAX_CONNECTIONS} connections open, refusing a client"
                        );
                        continue;
                    }
                    if s.set_nonblocking(true).is_err() {
                        continue;
                    }
                    self.insert(Conn::from_host(s, self.guest_cid));
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => {
                    tracing::warn!("vsock: accept on {} failed: {e}", self.uds.display());
                    return;
                }
            }
        }
    }

    fn insert(&mut self, c: Conn) -> u64 {
        let t = self.next_token;
        self.next_token += 1;
        if c.state != State::AwaitConnect {
            self.by_key.insert((c.host_port, c.guest_port), t);
        }
        self.conns.insert(t, c);
        self.sync(t);
        t
    }

    fn remove(&mut self, t: u64) {
        if let Some(c) = self.conns.remove(&t) {
            if self.by_key.get(&(c.host_port, c.guest_port)) == Some(&t) {
                self.by_key.remove(&(c.host_port, c.guest_port));
            }
            self.local_ports.remove(&c.host_port);
            if self.registered.remove(&t).is_some() {
                let _ = self.epoll.ctl(
                    ControlOperation::Delete,
                    c.stream.as_raw_fd(),
                    EpollEvent::default(),
                );
            }
        }
    }

    /// Brings a connection's epoll registration and ready-queue membership in
    /// line with its state.
    fn sync(&mut self, t: u64) {
        let Some(c) = self.conns.get(&t) else { return };
        if c.wants_rx() && !self.ready.contains(&t) {
            self.ready.push_back(t);
        }
        let fd = c.stream.as_raw_fd();
        if c.host_gone() {
            if self.registered.remove(&t).is_some() {
                let _ = self.epoll.ctl(ControlOperation::Delete, fd, EpollEvent::default());
            }
            return;
        }
        let (r, w) = c.interest();
        let mut want = EventSet::empty();
        if r {
            want |= EventSet::IN;
        }
        if w {
            want |= EventSet::OUT;
        }
        let ev = EpollEvent::new(want, t);
        let res = match self.registered.get(&t) {
            None => self.epoll.ctl(ControlOperation::Add, fd, ev),
            Some(&old) if old != want => self.epoll.ctl(ControlOperation::Modify, fd, ev),
            Some(_) => Ok(()),
        };
        match res {
            Ok(()) => {
                self.registered.insert(t, want);
            }
            Err(e) => tracing::warn!("vsock: epoll_ctl failed: {e}"),
        }
    }

    /// An epoll event for connection token `t`.
    pub fn host_event(&mut self, t: u64, ev: EventSet) {
        let Some(c) = self.conns.get_mut(&t) else { return };
        let was_waiting = c.state == State::AwaitConnect;
        let readable = ev.contains(EventSet::IN);
        let writable = ev.contains(EventSet::OUT);
        let hangup = ev.intersects(EventSet::HANG_UP | EventSet::ERROR);
        if c.on_host_event(readable, writable, hangup) == Verdict::Drop {
            self.remove(t);
            return;
        }
        if was_waiting && c.state == State::LocalInit {
            let Some(port) = self.alloc_port() else {
                tracing::warn!("vsock: no free host port, dropping a client");
                self.remove(t);
                return;
            };
            let c = self.conns.get_mut(&t).expect("present");
            c.host_port = port;
            self.by_key.insert((port, c.guest_port), t);
        }
        self.sync(t);
    }

    fn alloc_port(&mut self) -> Option<u32> {
        for _ in 0..LOCAL_PORT_BASE {
            let p = self.next_port;
            self.next_port = if p == u32::MAX >> 1 { LOCAL_PORT_BASE } else { p + 1 };
            if self.local_ports.insert(p) {
                return Some(p);
            }
        }
        None
    }

    /// Handles one packet the guest sent (header already copied out of guest
    /// memory; `payload` holds `h.len` bytes for RW packets, else empty).
    pub fn on_guest_packet(&mut self, h: &Header, payload: &[u8]) {
        if h.src_cid != self.guest_cid || h.dst_cid != HOST_CID {
            tracing::debug!(
                "vsock: dropped packet {}:{} -> {}:{}",
                h.src_cid,
                h.src_port,
                h.dst_cid,
                h.dst_port
            );
            return;
        }
        if h.type_ != TYPE_STREAM {
            return self.loose_reset(h);
        }
        match self.by_key.get(&(h.dst_port, h.src_port)).copied() {
            Some(t) => {
                let c = self.conns.get_mut(&t).expect("indexed connection exists");
                if c.on_guest_packet(h, payload) == Verdict::Drop {
                    self.remove(t);
                } else {
                    self.sync(t);
                }
            }
            None if h.op == op::REQUEST => self.guest_connect(h),
            None if h.op == op::RST => {}
            None => self.loose_reset(h),
        }
    }

    /// The guest connects to host port `h.dst_port`: `<uds>_<port>`.
    fn guest_connect(&mut self, h: &Header) {
        if self.conns.len() >= MAX_CONNECTIONS {
            return self.loose_reset(h);
        }
        let mut path = self.uds.clone().into_os_string();
        path.push(format!("_{}", h.dst_port));
        match UnixStream::connect(&path) {
            Ok(s) if s.set_nonblocking(true).is_ok() => {
                self.insert(Conn::from_guest(s, h));
            }
            Ok(_) => self.loose_reset(h),
            Err(e) => {
                tracing::debug!("vsock: guest connect to {path:?} failed: {e}");
                self.loose_reset(h)
            }
        }
    }

    fn loose_reset(&mut self, h: &Header) {
        if h.op == op::RST || self.loose_rst.len() >= MAX_LOOSE_RST {
            return;
        }
        self.loose_rst.push_back(h.rst_reply(HOST_CID));
    }

    /// True if a packet for the guest is waiting.
    pub fn has_rx(&self) -> bool {
        !self.loose_rst.is_empty() || !self.ready.is_empty()
    }

    /// The next packet for the guest with at most `max` payload bytes.
    pub fn next_rx(&mut self, max: usize) -> Option<(Header, Vec<u8>)> {
        if let Some(h) = self.loose_rst.pop_front() {
            return Some((h, Vec::new()));
        }
        for _ in 0..self.ready.len() {
            let Some(t) = self.ready.pop_front() else { break };
            let Some(c) = self.conns.get_mut(&t) else { continue };
            let Some((h, data, verdict)) = c.next_rx(max) else {
                self.sync(t);
                continue;
            };
            if verdict == Verdict::Drop {
                self.remove(t);
            } else {
                self.sync(t);
            }
            return Some((h, data));
        }
        None
    }
}
