//! The vsock stream-socket layer, independent of the transport ("sans-IO").
//!
//! [`Vsock::on_packet`] takes packets from the device; the application calls
//! [`Vsock::listen`], [`Vsock::accept`], [`Vsock::read`], [`Vsock::write`], [`Vsock::close`];
//! [`Vsock::poll_transmit`] yields the packets to send. Credit accounting follows the spec and
//! Linux's `virtio_transport_common.c`: each side advertises `buf_alloc` and `fwd_cnt` in every
//! header, a sender never has more than `peer_buf_alloc - (tx_cnt - peer_fwd_cnt)` bytes in
//! flight, and the receiver sends a CREDIT_UPDATE when the peer's view of its free space runs low.

extern crate alloc;

use alloc::collections::VecDeque;
use alloc::vec::Vec;

use crate::proto::{op, Header, SHUTDOWN_RCV, SHUTDOWN_SEND, TYPE_STREAM};

/// Largest payload this side puts in one packet.
pub const MAX_PKT_PAYLOAD: usize = 64 * 1024;
/// Default receive buffer per connection (what we advertise as `buf_alloc`).
pub const DEFAULT_BUF_ALLOC: u32 = 256 * 1024;
/// Connections accepted but not yet taken by [`Vsock::accept`], per listener set.
pub const ACCEPT_BACKLOG: usize = 128;

/// Errors of socket calls.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Error {
    /// Nothing to read now, or no send credit now: poll the device and retry.
    WouldBlock,
    /// The connection was reset by the peer or the transport, or is closed for writing.
    Closed,
    /// No such connection (closed and forgotten, or never existed).
    NotConnected,
    /// The port is already listened on.
    PortInUse,
}

/// A connection handle (unique for the socket layer's lifetime).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ConnId(pub u64);

/// A packet to transmit: header and payload.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Packet {
    /// The header (`len` equals `payload.len()`).
    pub hdr: Header,
    /// The payload (RW packets only).
    pub payload: Vec<u8>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    Connected,
    /// We sent SHUTDOWN after `close`; waiting for the peer's RST (or SHUTDOWN).
    Closing,
    /// Reset by the peer; kept until the application closes it.
    Reset,
}

struct Conn {
    id: ConnId,
    local_port: u32,
    peer_cid: u64,
    peer_port: u32,
    state: State,
    rx: VecDeque<u8>,
    /// Bytes received in total (mod 2^32).
    rx_cnt: u32,
    /// Bytes the application consumed (mod 2^32), our `fwd_cnt`.
    fwd_cnt: u32,
    /// `fwd_cnt` as last advertised to the peer.
    fwd_sent: u32,
    peer_buf_alloc: u32,
    peer_fwd_cnt: u32,
    tx_cnt: u32,
    peer_shutdown: u32,
    credit_requested: bool,
    closed_by_app: bool,
}

impl Conn {
    fn peer_credit(&self) -> u32 {
        self.peer_buf_alloc.saturating_sub(self.tx_cnt.wrapping_sub(self.peer_fwd_cnt))
    }
}

/// The socket layer of one vsock device.
pub struct Vsock {
    cid: u64,
    buf_alloc: u32,
    listeners: Vec<u32>,
    conns: Vec<Conn>,
    backlog: VecDeque<ConnId>,
    outbox: VecDeque<Packet>,
    next_id: u64,
}

impl Vsock {
    /// A socket layer for a guest with context id `cid`.
    pub fn new(cid: u64) -> Self {
        Self::with_buf_alloc(cid, DEFAULT_BUF_ALLOC)
    }

    /// As [`Vsock::new`], advertising `buf_alloc` bytes of receive buffer per connection.
    pub fn with_buf_alloc(cid: u64, buf_alloc: u32) -> Self {
        Self {
            cid,
            buf_alloc: buf_alloc.max(1),
            listeners: Vec::new(),
            conns: Vec::new(),
            backlog: VecDeque::new(),
            outbox: VecDeque::new(),
            next_id: 1,
        }
    }

    /// Our context id.
    pub fn cid(&self) -> u64 {
        self.cid
    }

    /// Accepts connections to `port` from now on.
    pub fn listen(&mut self, port: u32) -> Result<(), Error> {
        if self.listeners.contains(&port) {
            return Err(Error::PortInUse);
        }
        self.listeners.push(port);
        Ok(())
    }

    /// The next established incoming connection, if any.
    pub fn accept(&mut self) -> Option<ConnId> {
        self.backlog.pop_front()
    }

    /// The (local port, peer CID, peer port) of a connection.
    pub fn addr(&self, id: ConnId) -> Option<(u32, u64, u32)> {
        self.find(id).map(|c| (c.local_port, c.peer_cid, c.peer_port))
    }

    /// Number of live connections (including ones closing).
    pub fn conn_count(&self) -> usize {
        self.conns.len()
    }

    fn find(&self, id: ConnId) -> Option<&Conn> {
        self.conns.iter().find(|c| c.id == id)
    }

    fn index(&self, id: ConnId) -> Option<usize> {
        self.conns.iter().position(|c| c.id == id)
    }

    /// Bytes ready to read on `id`.
    pub fn readable(&self, id: ConnId) -> usize {
        self.find(id).map_or(0, |c| c.rx.len())
    }

    /// True when no more data will arrive on `id` (peer shut down sending, reset, or gone).
    pub fn at_eof(&self, id: ConnId) -> bool {
        self.find(id)
            .is_none_or(|c| c.state == State::Reset || c.peer_shutdown & SHUTDOWN_SEND != 0)
    }

    /// Reads into `buf`. `Ok(0)` means end of stream; `Err(WouldBlock)` means no data yet.
    pub fn read(&mut self, id: ConnId, buf: &mut [u8]) -> Result<usize, Error> {
        let i = self.index(id).ok_or(Error::NotConnected)?;
        let c = &mut self.conns[i];
        if c.rx.is_empty() {
            if c.state == State::Reset || c.peer_shutdown & SHUTDOWN_SEND != 0 || buf.is_empty() {
                return Ok(0);
            }
            return Err(Error::WouldBlock);
        }
        let n = buf.len().min(c.rx.len());
        let (front, back) = c.rx.as_slices();
        let k = n.min(front.len());
        buf[..k].copy_from_slice(&front[..k]);
        buf[k..n].copy_from_slice(&back[..n - k]);
        c.rx.drain(..n);
        c.fwd_cnt = c.fwd_cnt.wrapping_add(n as u32);
        // The peer believes our free space is buf_alloc - (rx_cnt - fwd_sent); refresh it once
        // that drops below a quarter of the buffer.
        let peer_view_free = self.buf_alloc.saturating_sub(c.rx_cnt.wrapping_sub(c.fwd_sent));
        if peer_view_free < self.buf_alloc / 4 {
            self.send_ctrl(i, op::CREDIT_UPDATE, 0);
        }
        Ok(n)
    }

    /// Queues as much of `data` as the peer's credit allows; returns how much.
    /// `Err(WouldBlock)` when the credit is zero (a CREDIT_REQUEST is sent once).
    pub fn write(&mut self, id: ConnId, data: &[u8]) -> Result<usize, Error> {
        let i = self.index(id).ok_or(Error::NotConnected)?;
        let c = &self.conns[i];
        if c.state != State::Connected || c.closed_by_app || c.peer_shutdown & SHUTDOWN_RCV != 0 {
            return Err(Error::Closed);
        }
        if data.is_empty() {
            return Ok(0);
        }
        let credit = c.peer_credit() as usize;
        if credit == 0 {
            if !c.credit_requested {
                self.conns[i].credit_requested = true;
                self.send_ctrl(i, op::CREDIT_REQUEST, 0);
            }
            return Err(Error::WouldBlock);
        }
        let n = data.len().min(credit);
        for chunk in data[..n].chunks(MAX_PKT_PAYLOAD) {
            let hdr = self.header(i, op::RW, 0, chunk.len() as u32);
            self.outbox.push_back(Packet { hdr, payload: chunk.to_vec() });
            let c = &mut self.conns[i];
            c.tx_cnt = c.tx_cnt.wrapping_add(chunk.len() as u32);
        }
        Ok(n)
    }

    /// Send credit available on `id` now.
    pub fn send_credit(&self, id: ConnId) -> usize {
        self.find(id).map_or(0, |c| c.peer_credit() as usize)
    }

    /// Closes `id`: a full SHUTDOWN to the peer, then the connection is forgotten when the peer
    /// answers with RST (or at once if it was reset already).
    pub fn close(&mut self, id: ConnId) {
        let Some(i) = self.index(id) else { return };
        if self.conns[i].closed_by_app {
            return;
        }
        self.backlog.retain(|&b| b != id);
        let c = &mut self.conns[i];
        c.closed_by_app = true;
        match c.state {
            State::Reset => {
                self.conns.remove(i);
            }
            _ if c.peer_shutdown == SHUTDOWN_RCV | SHUTDOWN_SEND => {
                self.send_ctrl(i, op::RST, 0);
                self.conns.remove(i);
            }
            _ => {
                c.state = State::Closing;
                self.send_ctrl(i, op::SHUTDOWN, SHUTDOWN_RCV | SHUTDOWN_SEND);
            }
        }
    }

    /// The next packet to transmit.
    pub fn poll_transmit(&mut self) -> Option<Packet> {
        self.outbox.pop_front()
    }

    /// Puts a packet back at the head of the queue (the transport had no room).
    pub fn unpoll_transmit(&mut self, p: Packet) {
        self.outbox.push_front(p);
    }

    /// True if packets wait for transmission.
    pub fn has_transmit(&self) -> bool {
        !self.outbox.is_empty()
    }

    /// The transport was reset: every connection is gone (reads see end of stream).
    pub fn reset_all(&mut self, new_cid: u64) {
        self.cid = new_cid;
        self.conns.retain(|c| !c.closed_by_app);
        for c in &mut self.conns {
            c.state = State::Reset;
        }
        self.outbox.clear();
    }

    fn header(&mut self, i: usize, op: u16, flags: u32, len: u32) -> Header {
        let c = &mut self.conns[i];
        c.fwd_sent = c.fwd_cnt;
        Header {
            src_cid: self.cid,
            dst_cid: c.peer_cid,
            src_port: c.local_port,
            dst_port: c.peer_port,
            len,
            type_: TYPE_STREAM,
            op,
            flags,
            buf_alloc: self.buf_alloc,
            fwd_cnt: c.fwd_cnt,
        }
    }

    fn send_ctrl(&mut self, i: usize, op: u16, flags: u32) {
        let hdr = self.header(i, op, flags, 0);
        self.outbox.push_back(Packet { hdr, payload: Vec::new() });
    }

    fn reply_rst(&mut self, h: &Header) {
        let hdr = h.rst_reply(self.cid);
        self.outbox.push_back(Packet { hdr, payload: Vec::new() });
    }

    /// Handles one packet from the device (`payload` is the data after the header; bytes past
    /// `h.len` are ignored, a short payload is treated as malformed and dropped).
    pub fn on_packet(&mut self, h: &Header, payload: &[u8]) {
        if h.dst_cid != self.cid || payload.len() < h.len as usize {
            return;
        }
        if h.type_ != TYPE_STREAM {
            if h.op != op::RST {
                self.reply_rst(h);
            }
            return;
        }
        let payload = &payload[..h.len as usize];
        let found = self.conns.iter().position(|c| {
            c.local_port == h.dst_port && c.peer_cid == h.src_cid && c.peer_port == h.src_port
        });
        match found {
            None => self.on_unknown(h),
            Some(i) => self.on_conn(i, h, payload),
        }
    }

    fn on_unknown(&mut self, h: &Header) {
        match h.op {
            op::REQUEST
                if self.listeners.contains(&h.dst_port) && self.backlog.len() < ACCEPT_BACKLOG =>
            {
                let id = ConnId(self.next_id);
                self.next_id += 1;
                self.conns.push(Conn {
                    id,
                    local_port: h.dst_port,
                    peer_cid: h.src_cid,
                    peer_port: h.src_port,
                    state: State::Connected,
                    rx: VecDeque::new(),
                    rx_cnt: 0,
                    fwd_cnt: 0,
                    fwd_sent: 0,
                    peer_buf_alloc: h.buf_alloc,
                    peer_fwd_cnt: h.fwd_cnt,
                    tx_cnt: 0,
                    peer_shutdown: 0,
                    credit_requested: false,
                    closed_by_app: false,
                });
                let i = self.conns.len() - 1;
                self.send_ctrl(i, op::RESPONSE, 0);
                self.backlog.push_back(id);
            }
            op::RST => {}
            _ => self.reply_rst(h),
        }
    }

    fn on_conn(&mut self, i: usize, h: &Header, payload: &[u8]) {
        {
            let c = &mut self.conns[i];
            c.peer_buf_alloc = h.buf_alloc;
            c.peer_fwd_cnt = h.fwd_cnt;
            if c.peer_credit() > 0 {
                c.credit_requested = false;
            }
        }
        match h.op {
            op::RW => {
                let c = &mut self.conns[i];
                if c.state != State::Connected {
                    return;
                }
                if c.rx.len() + payload.len() > self.buf_alloc as usize {
                    // The peer ignored our credit: reset, as Linux does.
                    self.send_ctrl(i, op::RST, 0);
                    self.mark_reset(i);
                    return;
                }
                if !c.closed_by_app {
                    c.rx.extend(payload);
                }
                c.rx_cnt = c.rx_cnt.wrapping_add(payload.len() as u32);
                if c.closed_by_app {
                    c.fwd_cnt = c.rx_cnt;
                }
            }
            op::CREDIT_REQUEST => self.send_ctrl(i, op::CREDIT_UPDATE, 0),
            op::SHUTDOWN => {
                let c = &mut self.conns[i];
                c.peer_shutdown |= h.flags & (SHUTDOWN_RCV | SHUTDOWN_SEND);
                if c.peer_shutdown == SHUTDOWN_RCV | SHUTDOWN_SEND
                    && (c.closed_by_app || c.rx.is_empty())
                {
                    // Fully shut down on both sides (or nothing left to deliver): finish with RST.
                    self.send_ctrl(i, op::RST, 0);
                    self.mark_reset(i);
                }
            }
            op::RST => self.mark_reset(i),
            op::REQUEST => {
                // A second request for a live connection: refuse it without touching ours.
                self.reply_rst(h);
            }
            _ => {}
        }
    }

    fn mark_reset(&mut self, i: usize) {
        if self.conns[i].closed_by_app {
            self.conns.remove(i);
        } else {
            self.conns[i].state = State::Reset;
        }
    }
}
