//! One vsock stream connection between a guest port and a host Unix stream.
//!
//! Flow control follows virtio 1.2 §5.10.6.3: every packet we send carries
//! our `buf_alloc` ([`BUF_ALLOC`]) and `fwd_cnt` (bytes written to the host
//! stream); we never put more bytes into the guest's receive queue than
//! `peer_buf_alloc - (tx_cnt - peer_fwd_cnt)`. Both directions are bounded:
//! at most [`TO_GUEST_CAP`] bytes read ahead from the host stream, at most
//! [`BUF_ALLOC`] bytes of guest data waiting for the host to read (a guest
//! that sends past its credit gets its connection reset).

use std::collections::VecDeque;
use std::io::{ErrorKind, Read, Write};
use std::os::unix::net::UnixStream;

use super::packet::{op, Header, HOST_CID, SHUTDOWN_RCV, SHUTDOWN_SEND, TYPE_STREAM};

/// Receive buffer we advertise per connection (guest-to-host bytes the host
/// has not read yet).
pub const BUF_ALLOC: u32 = 256 * 1024;
/// Host bytes read ahead per connection while waiting for guest buffers.
pub const TO_GUEST_CAP: usize = 64 * 1024;
/// Most bytes taken from a host stream after its client hung up.
pub const HANGUP_DRAIN_MAX: usize = 4 << 20;
/// Longest `CONNECT <port>\n` line (Firecracker's limit).
pub const CONNECT_LINE_MAX: usize = 32;

/// Where a connection is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum State {
    /// A host client connected to the Unix socket; waiting for `CONNECT <port>\n`.
    AwaitConnect,
    /// We sent the guest a REQUEST; waiting for RESPONSE or RST.
    LocalInit,
    /// Data flows.
    Established,
}

/// Control packets waiting to be sent to the guest (bit set).
mod pend {
    pub const REQUEST: u8 = 1;
    pub const RESPONSE: u8 = 2;
    pub const CREDIT_UPDATE: u8 = 4;
    pub const CREDIT_REQUEST: u8 = 8;
    pub const RST: u8 = 16;
}

/// What the muxer should do with a connection after an event.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Keep it.
    Keep,
    /// Drop it now (stream closed, no RST owed to the guest).
    Drop,
}

impl std::fmt::Debug for Conn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{:?} host {} guest {} pending {:#x} to_guest {} to_host {} tx_cnt {} peer_buf {} \
             peer_fwd {} credit {} rx_cnt {} fwd_cnt {} fwd_sent {} shut {} eof {}/{} gone {} creq {}",
            self.state,
            self.host_port,
            self.guest_port,
            self.pending,
            self.to_guest.len(),
            self.to_host.len(),
            self.tx_cnt,
            self.peer_buf_alloc,
            self.peer_fwd_cnt,
            self.peer_credit(),
            self.rx_cnt,
            self.fwd_cnt,
            self.fwd_sent,
            self.guest_shut,
            self.host_eof,
            self.eof_sent,
            self.host_gone,
            self.credit_requested
        )
    }
}

/// A connection.
pub struct Conn {
    /// The host side of the connection.
    pub stream: UnixStream,
    /// Lifecycle state.
    pub state: State,
    /// Port on the host side (CID 2).
    pub host_port: u32,
    /// Port on the guest side.
    pub guest_port: u32,
    guest_cid: u64,
    /// Partial `CONNECT` line.
    line: Vec<u8>,
    pending: u8,
    /// Host bytes not yet given to the guest.
    to_guest: VecDeque<u8>,
    /// Guest bytes not yet written to the host stream (after `preamble`).
    to_host: VecDeque<u8>,
    /// Bytes at the front of `to_host` that are ours (the `OK` line), not
    /// the guest's: they do not count for flow control.
    preamble: usize,
    /// Bytes put into the guest's receive queue (mod 2^32).
    tx_cnt: u32,
    peer_buf_alloc: u32,
    peer_fwd_cnt: u32,
    /// Guest bytes accepted (mod 2^32).
    rx_cnt: u32,
    /// Guest bytes written to the host stream (mod 2^32): our `fwd_cnt`.
    fwd_cnt: u32,
    /// `fwd_cnt` as last told to the guest.
    fwd_sent: u32,
    /// The host stream reached end of file.
    host_eof: bool,
    /// We told the guest (SHUTDOWN SEND) that the host sends no more.
    eof_sent: bool,
    /// The host stream is gone (hang-up or write error).
    host_gone: bool,
    /// Shutdown flags the guest sent.
    guest_shut: u32,
    credit_requested: bool,
    /// We shut the host stream's write side.
    host_write_shut: bool,
}

impl Conn {
    /// A host client connection waiting for its `CONNECT` line.
    pub fn from_host(stream: UnixStream, guest_cid: u64) -> Self {
        Self::new(stream, State::AwaitConnect, 0, 0, guest_cid)
    }

    /// A connection the guest asked for (REQUEST to host port `host_port`),
    /// already connected to the host listener: a RESPONSE is pending.
    pub fn from_guest(stream: UnixStream, h: &Header) -> Self {
        let mut c = Self::new(stream, State::Established, h.dst_port, h.src_port, h.src_cid);
        c.peer_buf_alloc = h.buf_alloc;
        c.peer_fwd_cnt = h.fwd_cnt;
        c.pending = pend::RESPONSE;
        c
    }

    fn new(stream: UnixStream, state: State, host_port: u32, guest_port: u32, cid: u64) -> Self {
        Self {
            stream,
            state,
            host_port,
            guest_port,
            guest_cid: cid,
            line: Vec::new(),
            pending: 0,
            to_guest: VecDeque::new(),
            to_host: VecDeque::new(),
            preamble: 0,
            tx_cnt: 0,
            peer_buf_alloc: 0,
            peer_fwd_cnt: 0,
            rx_cnt: 0,
            fwd_cnt: 0,
            fwd_sent: 0,
            host_eof: false,
            eof_sent: false,
            host_gone: false,
            guest_shut: 0,
            credit_requested: false,
            host_write_shut: false,
        }
    }

    /// Bytes we may still put into the guest's receive queue.
    pub fn peer_credit(&self) -> u32 {
        let in_flight = self.tx_cnt.wrapping_sub(self.peer_fwd_cnt);
        self.peer_buf_alloc.saturating_sub(in_flight)
    }

    /// Whether the host stream should be polled for reading / writing.
    pub fn interest(&self) -> (bool, bool) {
        if self.host_gone {
            return (false, false);
        }
        let read = match self.state {
            State::AwaitConnect => true,
            State::LocalInit => false,
            State::Established => {
                !self.host_eof
                    && self.guest_shut & SHUTDOWN_RCV == 0
                    && self.to_guest.len() < TO_GUEST_CAP
                    && (self.to_guest.len() as u64) < self.peer_credit() as u64
            }
        };
        (read, !self.to_host.is_empty())
    }

    /// True if a packet for the guest is ready.
    pub fn wants_rx(&self) -> bool {
        if self.pending != 0 {
            return true;
        }
        if self.state != State::Established {
            return false;
        }
        let data = !self.to_guest.is_empty() && self.guest_shut & SHUTDOWN_RCV == 0;
        (data && self.peer_credit() > 0)
            || (self.host_eof && self.to_guest.is_empty() && !self.eof_sent)
    }

    fn header(&mut self, op: u16, flags: u32, len: u32) -> Header {
        self.fwd_sent = self.fwd_cnt;
        Header {
            src_cid: HOST_CID,
            dst_cid: self.guest_cid,
            src_port: self.host_port,
            dst_port: self.guest_port,
            len,
            type_: TYPE_STREAM,
            op,
            flags,
            buf_alloc: BUF_ALLOC,
            fwd_cnt: self.fwd_cnt,
        }
    }

    /// The next packet for the guest, with at most `max` payload bytes.
    /// Returns the packet and whether the connection must be dropped after it
    /// (an RST was sent).
    pub fn next_rx(&mut self, max: usize) -> Option<(Header, Vec<u8>, Verdict)> {
        for (bit, o) in [
            (pend::RST, op::RST),
            (pend::REQUEST, op::REQUEST),
            (pend::RESPONSE, op::RESPONSE),
            (pend::CREDIT_UPDATE, op::CREDIT_UPDATE),
            (pend::CREDIT_REQUEST, op::CREDIT_REQUEST),
        ] {
            if self.pending & bit != 0 {
                self.pending &= !bit;
                let v = if o == op::RST { Verdict::Drop } else { Verdict::Keep };
                return Some((self.header(o, 0, 0), Vec::new(), v));
            }
        }
        if self.state != State::Established {
            return None;
        }
        let n = self.to_guest.len().min(max).min(self.peer_credit() as usize);
        if n > 0 && self.guest_shut & SHUTDOWN_RCV == 0 {
            let data: Vec<u8> = self.to_guest.drain(..n).collect();
            self.tx_cnt = self.tx_cnt.wrapping_add(n as u32);
            let h = self.header(op::RW, 0, n as u32);
            self.settle();
            return Some((h, data, Verdict::Keep));
        }
        if self.host_eof && self.to_guest.is_empty() && !self.eof_sent {
            self.eof_sent = true;
            let h = self.header(op::SHUTDOWN, SHUTDOWN_SEND, 0);
            self.settle();
            return Some((h, Vec::new(), Verdict::Keep));
        }
        None
    }

    /// Prepares for a device reset; returns false if the connection must go.
    /// A client still waiting for its `CONNECT` line, or whose REQUEST the
    /// guest has not answered, was never the guest's: it stays, with its
    /// REQUEST (re)queued for the new driver instance.
    pub fn survive_reset(&mut self) -> bool {
        match self.state {
            State::AwaitConnect => !self.host_gone,
            State::LocalInit if !self.host_gone => {
                self.pending = pend::REQUEST;
                true
            }
            _ => false,
        }
    }

    /// Queues an RST for the guest; the connection is dropped once it is sent.
    pub fn reset(&mut self) {
        self.pending = pend::RST;
        self.host_gone = true;
    }

    /// The guest answered our REQUEST: tell the host client `OK <port>`.
    fn established(&mut self) {
        self.state = State::Established;
        let ok = format!("OK {}\n", self.host_port);
        for (i, b) in ok.bytes().enumerate() {
            self.to_host.insert(i, b);
        }
        self.preamble = ok.len();
    }

    /// Handles a packet from the guest for this connection.
    pub fn on_guest_packet(&mut self, h: &Header, payload: &[u8]) -> Verdict {
        self.peer_buf_alloc = h.buf_alloc;
        self.peer_fwd_cnt = h.fwd_cnt;
        if self.peer_credit() > 0 {
            self.credit_requested = false;
        }
        match (h.op, self.state) {
            (op::RST, _) => return Verdict::Drop,
            (op::RESPONSE, State::LocalInit) => self.established(),
            (op::RW, State::Established) => self.on_guest_data(payload),
            (op::CREDIT_UPDATE, State::Established) => {}
            (op::CREDIT_REQUEST, State::Established) => self.pending |= pend::CREDIT_UPDATE,
            (op::SHUTDOWN, State::Established) => {
                self.guest_shut |= h.flags & (SHUTDOWN_RCV | SHUTDOWN_SEND);
                if self.guest_shut & SHUTDOWN_RCV != 0 {
                    self.to_guest.clear();
                }
            }
            _ => self.reset(), // Anything else breaks the protocol.
        }
        self.settle();
        Verdict::Keep
    }

    fn on_guest_data(&mut self, payload: &[u8]) {
        if self.guest_shut & SHUTDOWN_SEND != 0 {
            return self.reset(); // Data after the guest said it sends no more.
        }
        if self.to_host.len() - self.preamble + payload.len() > BUF_ALLOC as usize {
            tracing::debug!("vsock: guest port {} overran its credit", self.guest_port);
            return self.reset();
        }
        self.rx_cnt = self.rx_cnt.wrapping_add(payload.len() as u32);
        if self.host_gone {
            self.fwd_cnt = self.rx_cnt; // Discarded, as if consumed.
            return;
        }
        self.to_host.extend(payload);
        self.flush_to_host();
    }

    /// Writes buffered guest bytes to the host stream (non-blocking).
    fn flush_to_host(&mut self) {
        while !self.to_host.is_empty() && !self.host_gone {
            let (a, _) = self.to_host.as_slices();
            match self.stream.write(a) {
                Ok(0) => self.host_gone = true,
                Ok(n) => {
                    self.to_host.drain(..n);
                    let ours = n.min(self.preamble);
                    self.preamble -= ours;
                    self.fwd_cnt = self.fwd_cnt.wrapping_add((n - ours) as u32);
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(_) => self.host_gone = true,
            }
        }
    }

    /// Follow-up after any change: credit updates, half-close, close.
    fn settle(&mut self) {
        if self.pending & pend::RST != 0 {
            return;
        }
        if self.host_gone {
            // The host side is gone: finish what the guest may read, then RST.
            if self.to_guest.is_empty() || self.guest_shut & SHUTDOWN_RCV != 0 {
                self.reset();
            }
            return;
        }
        if self.state != State::Established {
            return;
        }
        // Refresh the guest's view of our buffer once less than half of it
        // looks free.
        let unseen = self.rx_cnt.wrapping_sub(self.fwd_sent);
        if self.fwd_cnt != self.fwd_sent && unseen > BUF_ALLOC / 2 {
            self.pending |= pend::CREDIT_UPDATE;
        }
        if self.peer_credit() == 0 && !self.host_eof && !self.credit_requested {
            self.credit_requested = true;
            self.pending |= pend::CREDIT_REQUEST;
        }
        if self.to_host.is_empty() && self.guest_shut & SHUTDOWN_SEND != 0 && !self.host_write_shut
        {
            self.host_write_shut = true;
            let _ = self.stream.shutdown(std::net::Shutdown::Write);
        }
        let guest_done = self.guest_shut == SHUTDOWN_RCV | SHUTDOWN_SEND;
        let both_eof = self.guest_shut & SHUTDOWN_SEND != 0 && self.eof_sent;
        if self.to_host.is_empty() && (guest_done || both_eof) {
            // Nothing more can flow: finish with RST (virtio 1.2 §5.10.6.6).
            self.reset();
        }
    }

    /// The host stream is readable / writable / hung up.
    pub fn on_host_event(&mut self, readable: bool, writable: bool, hangup: bool) -> Verdict {
        if writable {
            self.flush_to_host();
        }
        if readable || hangup {
            if self.state == State::AwaitConnect {
                return self.read_connect_line(hangup);
            }
            self.read_from_host();
        }
        if hangup {
            // The client closed its socket: nobody reads what the guest sends.
            // What it wrote before closing still goes to the guest: take it
            // now (bounded by the kernel's socket buffer and HANGUP_DRAIN_MAX),
            // as the stream is no longer polled.
            self.drain_after_hangup();
            self.host_eof = true;
            self.host_gone = true;
            if self.state == State::LocalInit {
                self.reset();
            }
        }
        self.settle();
        Verdict::Keep
    }

    fn drain_after_hangup(&mut self) {
        if self.state != State::Established || self.host_eof {
            return;
        }
        let mut buf = [0u8; 16 * 1024];
        while self.to_guest.len() < HANGUP_DRAIN_MAX {
            match self.stream.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => self.to_guest.extend(&buf[..n]),
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(_) => break,
            }
        }
    }

    fn read_from_host(&mut self) {
        if self.state != State::Established || self.host_eof {
            return;
        }
        let room =
            TO_GUEST_CAP.min(self.peer_credit() as usize).saturating_sub(self.to_guest.len());
        if room == 0 {
            return;
        }
        let mut buf = vec![0u8; room];
        match self.stream.read(&mut buf) {
            Ok(0) => self.host_eof = true,
            Ok(n) => self.to_guest.extend(&buf[..n]),
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::Interrupted) => {}
            Err(_) => self.host_gone = true,
        }
    }

    /// Reads the `CONNECT <port>\n` line; on success the connection moves to
    /// [`State::LocalInit`] with a REQUEST pending and `host_port` still 0
    /// (the muxer assigns it).
    fn read_connect_line(&mut self, hangup: bool) -> Verdict {
        let mut buf = [0u8; CONNECT_LINE_MAX];
        let room = CONNECT_LINE_MAX - self.line.len();
        match self.stream.read(&mut buf[..room]) {
            Ok(0) => return Verdict::Drop,
            Ok(n) => self.line.extend_from_slice(&buf[..n]),
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::Interrupted) => {
                return if hangup { Verdict::Drop } else { Verdict::Keep };
            }
            Err(_) => return Verdict::Drop,
        }
        let Some(nl) = self.line.iter().position(|&b| b == b'\n') else {
            return if self.line.len() >= CONNECT_LINE_MAX { Verdict::Drop } else { Verdict::Keep };
        };
        let Some(port) = parse_connect(&self.line[..nl]) else {
            tracing::debug!("vsock: bad host handshake {:?}", String::from_utf8_lossy(&self.line));
            return Verdict::Drop;
        };
        // Bytes after the line are data for the guest.
        self.to_guest.extend(&self.line[nl + 1..]);
        self.line = Vec::new();
        self.guest_port = port;
        self.state = State::LocalInit;
        self.pending = pend::REQUEST;
        self.peer_buf_alloc = 0;
        Verdict::Keep
    }

    /// True once the host stream must no longer be polled (hung up or failed).
    pub fn host_gone(&self) -> bool {
        self.host_gone
    }
}

/// Parses `CONNECT <port>` (keyword case-insensitive, one space, decimal port).
pub fn parse_connect(line: &[u8]) -> Option<u32> {
    let s = std::str::from_utf8(line).ok()?.trim_end_matches('\r');
    let (kw, port) = s.split_once(' ')?;
    if !kw.eq_ignore_ascii_case("connect")
        || port.is_empty()
        || !port.bytes().all(|b| b.is_ascii_digit())
    {
        return None;
    }
    port.parse().ok()
}
