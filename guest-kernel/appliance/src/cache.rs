//! The prefix cache's link to the host's disk tier (docs/architecture.md, "Prefix cache"):
//! the guest has no disk, so the host connects to vsock port [`CACHE_PORT`] after boot and
//! hands over the pack's checkpoint files it keeps (each offered to the engine's memory
//! tier), then a zero-length frame, which the guest answers with one when it has taken them
//! all; from then on the guest sends the checkpoints its engine persists (message
//! boundaries, prompt and generation ends) for the host to keep.
//!
//! Before it stops the VM the host sends another zero-length frame; the guest answers with one
//! once every queued checkpoint is out, so a one-shot command keeps what it computed.
//!
//! Frames in both directions: a little-endian `u64` length, then that many bytes of a
//! checkpoint file (kore-engine's `snapshot::file` format, checked whole by whoever takes it:
//! `ModelEngine::offer` here, `DiskTier::persist_bytes` on the host). A checkpoint goes out a
//! piece at a time: each turn of the serve loop, between engine steps, encodes at most
//! [`PIECE`] bytes of it and sends them as far as the host's credit allows, so a transfer (a
//! 2b 8192-token file is ~220 MB) goes out between engine steps instead of waiting for an
//! idle moment, and the guest never holds more than one piece of a file.

use alloc::collections::VecDeque;
use alloc::rc::Rc;
use alloc::vec::Vec;
use core::cell::RefCell;

use kore_appliance::{Checkpoint, CheckpointStore};
use kore_engine::snapshot::file::{Decoded, EncodeCursor, Identity};
use kore_rt::vsock::{ConnId as VConn, Device, Error as VError};
use kore_rt::{kcall, println};

/// The vsock port the host connects to for checkpoint files.
pub const CACHE_PORT: u32 = 1026;
/// Checkpoints waiting to go out at most; later ones are dropped (counted).
const OUTBOX: usize = 4;
/// The largest frame accepted (a bound on a bad length, far above any real file).
const MAX_FRAME: u64 = 1 << 36;
/// Bytes of a file encoded per turn of the serve loop at most.
const PIECE: usize = 1 << 20;

/// Checkpoints the engine persisted, waiting for the link.
type Outbox = Rc<RefCell<VecDeque<Checkpoint>>>;

/// The engine's store in the guest: queues checkpoints for the host.
pub struct GuestStore(Outbox);

impl CheckpointStore for GuestStore {
    fn persist(&mut self, checkpoint: Checkpoint) {
        let mut q = self.0.borrow_mut();
        if q.len() < OUTBOX {
            q.push_back(checkpoint);
        }
    }

    /// Nothing: the host offered every file it had when it connected.
    fn fetch(
        &mut self,
        _prompt: &[u32],
        _deeper_than: usize,
        _usable: &dyn Fn(usize) -> bool,
        _identity: &Identity,
    ) -> Option<Decoded> {
        None
    }
}

/// What the link hands a received file to (the engine's `offer`).
pub trait Offer {
    /// Takes one checkpoint file; the tokens it covers, or why not.
    fn offer_file(&mut self, bytes: &[u8]) -> Result<usize, alloc::string::String>;
}

impl Offer for kore_appliance::ModelEngine<'_> {
    fn offer_file(&mut self, bytes: &[u8]) -> Result<usize, alloc::string::String> {
        self.offer(bytes).map_err(|e| alloc::format!("{e}"))
    }
}

/// The host's connection on [`CACHE_PORT`] and the frame being read.
pub struct Link {
    conn: Option<VConn>,
    outbox: Outbox,
    head: Vec<u8>,
    /// The frame being read (its whole length, allocated when it starts) and
    /// how much of it has arrived.
    frame: Vec<u8>,
    filled: usize,
    want: Option<usize>,
    offered: u64,
    /// The checkpoint going out.
    sending: Option<Sending>,
    /// The host's hand-over ended (its first zero frame).
    handed: bool,
    /// The host asked to be told when the outbox is empty (a later zero frame).
    drain: bool,
}

/// A checkpoint going out: how far its file is encoded, and the encoded
/// piece not yet sent.
struct Sending {
    checkpoint: Checkpoint,
    cursor: EncodeCursor,
    piece: Vec<u8>,
    sent: usize,
}

impl Sending {
    /// The frame of `checkpoint`: its length first.
    fn new(checkpoint: Checkpoint) -> Sending {
        let piece = (checkpoint.file_bytes() as u64).to_le_bytes().to_vec();
        Sending { checkpoint, cursor: EncodeCursor::default(), piece, sent: 0 }
    }

    /// The bytes to send next, encoding the next piece when the last one is
    /// out (empty once the whole file is); `None` when memory for a piece is
    /// short.
    fn unsent(&mut self) -> Option<&[u8]> {
        if self.sent == self.piece.len() && !self.cursor.done() {
            self.piece.clear();
            self.piece.try_reserve(PIECE).ok()?;
            let (piece, cursor) = (&mut self.piece, &mut self.cursor);
            self.checkpoint.encode_some(cursor, PIECE, &mut |b| piece.extend_from_slice(b));
            self.sent = 0;
        }
        Some(&self.piece[self.sent..])
    }
}

impl Link {
    /// A link and the store whose checkpoints it sends.
    pub fn new() -> (Link, GuestStore) {
        let outbox: Outbox = Rc::new(RefCell::new(VecDeque::new()));
        let link = Link {
            conn: None,
            outbox: Rc::clone(&outbox),
            head: Vec::new(),
            frame: Vec::new(),
            filled: 0,
            want: None,
            offered: 0,
            sending: None,
            handed: false,
            drain: false,
        };
        (link, GuestStore(outbox))
    }

    /// Takes the host's new connection (a second one replaces the first).
    pub fn attach(&mut self, dev: &mut Device, v: VConn) {
        if let Some(old) = self.conn.replace(v) {
            dev.sockets.close(old);
        }
        self.head.clear();
        self.frame = Vec::new();
        self.filled = 0;
        self.want = None;
        self.sending = None;
        self.handed = false;
        self.drain = false;
    }

    /// Reads what the host sent, offering each complete file to `engine`; true if anything
    /// moved.
    pub fn receive(&mut self, dev: &mut Device, engine: &mut dyn Offer) -> bool {
        let Some(v) = self.conn else { return false };
        let mut moved = false;
        loop {
            let got = match self.want {
                None => {
                    let mut b = [0u8; 8];
                    let need = 8 - self.head.len();
                    let r = dev.sockets.read(v, &mut b[..need]);
                    if let Ok(n) = r {
                        self.head.extend_from_slice(&b[..n]);
                    }
                    r
                }
                Some(_) => {
                    let r = dev.sockets.read(v, &mut self.frame[self.filled..]);
                    self.filled += r.as_ref().map_or(0, |&n| n);
                    r
                }
            };
            match got {
                Err(VError::WouldBlock) => return moved,
                // The host closed or reset the link: checkpoints are kept in memory only.
                Ok(0) | Err(_) => {
                    dev.sockets.close(v);
                    self.conn = None;
                    return true;
                }
                Ok(_) => moved = true,
            }
            if !self.step(dev, v, engine) {
                return true;
            }
        }
    }

    /// Acts on a complete length or frame; false when the link was closed.
    fn step(&mut self, dev: &mut Device, v: VConn, engine: &mut dyn Offer) -> bool {
        if self.want.is_none() && self.head.len() == 8 {
            let len = u64::from_le_bytes(self.head[..8].try_into().unwrap_or([0; 8]));
            self.head.clear();
            if len == 0 && !self.handed {
                println!("kore-appliance: prefix cache: {} file(s) from the host", self.offered);
                self.handed = true;
                return write_all(dev, v, &0u64.to_le_bytes());
            }
            if len == 0 {
                // The host stops the VM soon: answer once everything queued is out.
                self.drain = true;
                return true;
            }
            if len > MAX_FRAME || !self.start_frame(len as usize) {
                println!("kore-appliance: prefix cache: frame of {len} bytes refused; link closed");
                dev.sockets.close(v);
                self.conn = None;
                return false;
            }
            self.want = Some(len as usize);
        }
        if self.want.is_some_and(|n| self.filled == n) {
            let file = core::mem::take(&mut self.frame);
            (self.want, self.filled) = (None, 0);
            match engine.offer_file(&file) {
                Ok(_) => self.offered += 1,
                Err(e) => {
                    println!("kore-appliance: prefix cache: ignoring a file from the host: {e}")
                }
            }
        }
        true
    }

    /// Allocates the next frame's `len` bytes once (reads then fill it in
    /// place); false when memory for it is short.
    fn start_frame(&mut self, len: usize) -> bool {
        let mut frame = Vec::new();
        if frame.try_reserve_exact(len).is_err() {
            return false;
        }
        frame.resize(len, 0);
        (self.frame, self.filled) = (frame, 0);
        true
    }

    /// Sends the checkpoint going out (the next queued one when none is) as far as the host's
    /// credit allows, without waiting, encoding at most one [`PIECE`] of it. True if anything
    /// moved.
    pub fn flush(&mut self, dev: &mut Device) -> bool {
        let Some(v) = self.conn else {
            self.outbox.borrow_mut().clear();
            self.sending = None;
            return false;
        };
        if self.sending.is_none() && self.drain && self.outbox.borrow().is_empty() {
            self.drain = false;
            return write_all(dev, v, &0u64.to_le_bytes());
        }
        if self.sending.is_none() {
            let Some(c) = self.outbox.borrow_mut().pop_front() else { return false };
            self.sending = Some(Sending::new(c));
        }
        let Some(out) = self.sending.as_mut() else { return false };
        let Some(bytes) = out.unsent() else {
            // A frame cut short cannot be resumed: the host drops the link's partial file.
            println!("kore-appliance: prefix cache: no memory to send a checkpoint; link closed");
            return self.close(dev, v);
        };
        if bytes.is_empty() {
            self.sending = None;
            return true;
        }
        match dev.sockets.write(v, bytes) {
            Ok(0) | Err(VError::WouldBlock) => false,
            Ok(n) => {
                out.sent += n;
                true
            }
            Err(_) => {
                println!("kore-appliance: prefix cache: the host's link failed; closed");
                self.close(dev, v)
            }
        }
    }

    /// Closes the link (checkpoints are kept in memory only from then on); true.
    fn close(&mut self, dev: &mut Device, v: VConn) -> bool {
        dev.sockets.close(v);
        self.conn = None;
        self.sending = None;
        true
    }
}

/// Writes all of `data` to `v`, moving packets and waiting for credit; false if the
/// connection or the device failed.
fn write_all(dev: &mut Device, v: VConn, mut data: &[u8]) -> bool {
    while !data.is_empty() {
        let wrote = match dev.sockets.write(v, data) {
            Ok(n) => n,
            Err(VError::WouldBlock) => 0,
            Err(_) => return false,
        };
        data = &data[wrote..];
        let mut moved = false;
        loop {
            match dev.poll() {
                Ok(true) => moved = true,
                Ok(false) => break,
                Err(_) => return false,
            }
        }
        if wrote == 0 && !moved && !dev.sockets.has_transmit() {
            kcall::wait();
            dev.ack_interrupt();
        }
    }
    true
}
