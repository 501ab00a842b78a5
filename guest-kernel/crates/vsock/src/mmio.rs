//! The virtio-mmio (version 2) transport of the vsock device, driven from ring 3.
//!
//! Queues: 0 = rx (device-writable buffers, header and payload in one buffer, as Linux posts
//! them), 1 = tx (a device-readable header descriptor, then a payload descriptor when there is
//! data), 2 = event. Doorbells are writes to `QueueNotify` (the VMM backs them with ioeventfd).
//! Ring memory and buffers come from the global allocator; the guest is identity-mapped, so
//! their addresses are guest-physical addresses.

extern crate alloc;

use alloc::boxed::Box;
use alloc::vec;
use alloc::vec::Vec;
use core::alloc::Layout;

use kore_virtq::{Buffer, QueueAddrs, SplitQueue};

use crate::proto::{Header, EVENT_TRANSPORT_RESET, HDR_LEN};
use crate::socket::Vsock;

pub use kore_boot_abi::virtio::mmio::{reg, status, F_VERSION_1, MAGIC_VALUE};
pub use kore_boot_abi::virtio::vsock::DEVICE_ID as VSOCK_DEVICE_ID;

/// Queue size this driver asks for (or the device maximum if smaller).
pub const QUEUE_SIZE: u16 = 128;
/// Bytes per receive buffer (header included).
pub const RX_BUF_LEN: usize = 16 * 1024;

const RX: u32 = kore_boot_abi::virtio::vsock::RX_QUEUE;
const TX: u32 = kore_boot_abi::virtio::vsock::TX_QUEUE;
const EVENT: u32 = kore_boot_abi::virtio::vsock::EVENT_QUEUE;

/// Access to a device's register window.
pub trait Mmio {
    /// Reads a 32-bit register.
    fn read32(&self, off: u64) -> u32;
    /// Writes a 32-bit register.
    fn write32(&self, off: u64, v: u32);
}

/// Registers at a fixed (identity-mapped) address: the real device.
pub struct VolatileMmio {
    base: usize,
}

impl VolatileMmio {
    /// The register window at `base`.
    ///
    /// # Safety
    /// `base` must be a mapped virtio-mmio register window (4 KiB) for the object's lifetime.
    pub unsafe fn new(base: usize) -> Self {
        Self { base }
    }
}

impl Mmio for VolatileMmio {
    fn read32(&self, off: u64) -> u32 {
        debug_assert!(off < 4096 && off.is_multiple_of(4), "register offset {off:#x}");
        // SAFETY: `new`'s contract; offsets are register offsets inside the window.
        unsafe { ((self.base + off as usize) as *const u32).read_volatile() }
    }
    fn write32(&self, off: u64, v: u32) {
        debug_assert!(off < 4096 && off.is_multiple_of(4), "register offset {off:#x}");
        // SAFETY: as in `read32`.
        unsafe { ((self.base + off as usize) as *mut u32).write_volatile(v) }
    }
}

/// Why the device could not be brought up.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DriverError {
    /// No virtio-mmio device at the address (bad magic): check the boot info's device window.
    NotVirtio,
    /// A legacy (version 1) or unknown transport version: the VMM must offer version 2.
    BadVersion(u32),
    /// Not a vsock device.
    NotVsock(u32),
    /// The device does not offer `VIRTIO_F_VERSION_1`.
    NoVersion1,
    /// The device refused our features (FEATURES_OK did not stick).
    FeaturesRejected,
    /// A required queue is missing (its `QueueNumMax` is 0).
    NoQueue(u32),
    /// Out of memory for rings or buffers.
    OutOfMemory,
    /// The device returned a bad descriptor id (a device bug; reset the device).
    Ring(kore_virtq::Error),
}

/// Ring memory for one queue (page aligned, from the global allocator).
struct RingMem {
    ptr: *mut u8,
    layout: Layout,
}

impl RingMem {
    fn new(size: u16) -> Result<Self, DriverError> {
        let layout = Layout::from_size_align(QueueAddrs::footprint(size), 4096)
            .map_err(|_| DriverError::OutOfMemory)?;
        // SAFETY: non-zero size.
        let ptr = unsafe { alloc::alloc::alloc_zeroed(layout) };
        if ptr.is_null() {
            return Err(DriverError::OutOfMemory);
        }
        Ok(Self { ptr, layout })
    }
}

impl Drop for RingMem {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this layout.
        unsafe { alloc::alloc::dealloc(self.ptr, self.layout) }
    }
}

struct Queue {
    q: SplitQueue,
    _mem: RingMem,
    /// Buffer owned by each in-flight chain, by head id.
    bufs: Vec<Option<Box<[u8]>>>,
}

impl Queue {
    /// Posts `buf` as one device-writable buffer; the queue owns it until it is used.
    fn post_writable(&mut self, buf: Box<[u8]>) -> Result<(), DriverError> {
        let b = Buffer { addr: buf.as_ptr() as u64, len: buf.len() as u32, writable: true };
        let head = self.q.add(&[b]).map_err(DriverError::Ring)?;
        self.bufs[head as usize] = Some(buf);
        Ok(())
    }
}

/// The vsock device: transport, queues and the socket layer.
pub struct VsockDevice<M: Mmio> {
    mmio: M,
    rx: Queue,
    tx: Queue,
    event: Queue,
    /// The sockets.
    pub sockets: Vsock,
}

impl<M: Mmio> VsockDevice<M> {
    /// Resets and initialises the device (virtio 1.2 §3.1.1), posts receive and event buffers
    /// and sets DRIVER_OK.
    pub fn new(mmio: M) -> Result<Self, DriverError> {
        if mmio.read32(reg::MAGIC) != MAGIC_VALUE {
            return Err(DriverError::NotVirtio);
        }
        match mmio.read32(reg::VERSION) {
            2 => {}
            v => return Err(DriverError::BadVersion(v)),
        }
        match mmio.read32(reg::DEVICE_ID) {
            VSOCK_DEVICE_ID => {}
            id => return Err(DriverError::NotVsock(id)),
        }
        mmio.write32(reg::STATUS, 0);
        mmio.write32(reg::STATUS, status::ACKNOWLEDGE);
        mmio.write32(reg::STATUS, status::ACKNOWLEDGE | status::DRIVER);
        mmio.write32(reg::DEVICE_FEATURES_SEL, 1);
        let hi = mmio.read32(reg::DEVICE_FEATURES) as u64;
        if (hi << 32) & F_VERSION_1 == 0 {
            mmio.write32(reg::STATUS, status::FAILED);
            return Err(DriverError::NoVersion1);
        }
        mmio.write32(reg::DRIVER_FEATURES_SEL, 0);
        mmio.write32(reg::DRIVER_FEATURES, 0);
        mmio.write32(reg::DRIVER_FEATURES_SEL, 1);
        mmio.write32(reg::DRIVER_FEATURES, (F_VERSION_1 >> 32) as u32);
        let s = status::ACKNOWLEDGE | status::DRIVER | status::FEATURES_OK;
        mmio.write32(reg::STATUS, s);
        if mmio.read32(reg::STATUS) & status::FEATURES_OK == 0 {
            mmio.write32(reg::STATUS, status::FAILED);
            return Err(DriverError::FeaturesRejected);
        }
        let cid = read_cid(&mmio);
        let setup = |idx| {
            setup_queue(&mmio, idx).inspect_err(|_| mmio.write32(reg::STATUS, status::FAILED))
        };
        let (rx, tx, event) = (setup(RX)?, setup(TX)?, setup(EVENT)?);
        let mut dev = Self { mmio, rx, tx, event, sockets: Vsock::new(cid) };
        while dev.rx.q.num_free() > 0 {
            dev.post(RX, RX_BUF_LEN)?;
        }
        while dev.event.q.num_free() > 0 {
            dev.post(EVENT, 8)?;
        }
        dev.mmio.write32(reg::STATUS, s | status::DRIVER_OK);
        dev.mmio.write32(reg::QUEUE_NOTIFY, RX);
        dev.mmio.write32(reg::QUEUE_NOTIFY, EVENT);
        Ok(dev)
    }

    fn queue(&mut self, idx: u32) -> &mut Queue {
        match idx {
            RX => &mut self.rx,
            TX => &mut self.tx,
            _ => &mut self.event,
        }
    }

    /// Posts one device-writable buffer of `len` bytes on queue `idx`.
    fn post(&mut self, idx: u32, len: usize) -> Result<(), DriverError> {
        self.queue(idx).post_writable(vec![0u8; len].into_boxed_slice())
    }

    /// True when every packet the socket layer queued has been handed to the device and the
    /// device has returned all transmit buffers (nothing is in flight towards the host).
    pub fn tx_idle(&self) -> bool {
        !self.sockets.has_transmit() && self.tx.q.num_free() == self.tx.q.size()
    }

    /// Reads and acknowledges the interrupt status (call after a wake-up); returns it.
    pub fn ack_interrupt(&mut self) -> u32 {
        let s = self.mmio.read32(reg::INTERRUPT_STATUS);
        if s != 0 {
            self.mmio.write32(reg::INTERRUPT_ACK, s);
        }
        s
    }

    /// Moves packets between the rings and the socket layer. Returns true if anything moved
    /// (call again until false, then wait for an interrupt).
    pub fn poll(&mut self) -> Result<bool, DriverError> {
        let mut progress = false;
        let mut reposted = false;
        while let Some(used) = self.rx.q.pop_used() {
            let used = used.map_err(DriverError::Ring)?;
            let buf = self.rx.bufs[used.id as usize].take();
            if let Some(buf) = buf {
                let n = (used.len as usize).min(buf.len());
                if let Some(h) = Header::decode(&buf[..n]) {
                    self.sockets.on_packet(&h, &buf[HDR_LEN..n]);
                }
                // Re-post the same buffer.
                self.rx.post_writable(buf)?;
                reposted = true;
            }
            progress = true;
        }
        while let Some(used) = self.event.q.pop_used() {
            let used = used.map_err(DriverError::Ring)?;
            if let Some(buf) = self.event.bufs[used.id as usize].take() {
                let id = u32::from_le_bytes([buf[0], buf[1], buf[2], buf[3]]);
                if used.len >= 4 && id == EVENT_TRANSPORT_RESET {
                    let cid = read_cid(&self.mmio);
                    self.sockets.reset_all(cid);
                }
                self.event.post_writable(buf)?;
            }
            progress = true;
        }
        while let Some(used) = self.tx.q.pop_used() {
            let used = used.map_err(DriverError::Ring)?;
            self.tx.bufs[used.id as usize] = None;
            progress = true;
        }
        let mut sent = false;
        while self.tx.q.num_free() >= 2 {
            let Some(p) = self.sockets.poll_transmit() else { break };
            let mut buf = Vec::with_capacity(HDR_LEN + p.payload.len());
            buf.extend_from_slice(&p.hdr.encode());
            buf.extend_from_slice(&p.payload);
            let buf = buf.into_boxed_slice();
            let base = buf.as_ptr() as u64;
            let hdr = Buffer { addr: base, len: HDR_LEN as u32, writable: false };
            let data = Buffer {
                addr: base + HDR_LEN as u64,
                len: p.payload.len() as u32,
                writable: false,
            };
            let chain: &[Buffer] = if p.payload.is_empty() { &[hdr] } else { &[hdr, data] };
            let head = self.tx.q.add(chain).map_err(DriverError::Ring)?;
            self.tx.bufs[head as usize] = Some(buf);
            sent = true;
        }
        if sent && self.tx.q.needs_notify() {
            self.mmio.write32(reg::QUEUE_NOTIFY, TX);
        }
        if reposted && self.rx.q.needs_notify() {
            self.mmio.write32(reg::QUEUE_NOTIFY, RX);
        }
        Ok(progress || sent)
    }
}

impl<M: Mmio> Drop for VsockDevice<M> {
    /// Resets the device before the ring memory and buffers are freed: the device may still own
    /// buffers (e.g. a SHUTDOWN just queued), and after a reset it must not touch them
    /// (virtio 1.2 §2.1.2); without it the device could read freed, reused memory.
    fn drop(&mut self) {
        self.mmio.write32(reg::STATUS, 0);
    }
}

fn read_cid<M: Mmio>(mmio: &M) -> u64 {
    mmio.read32(reg::CONFIG) as u64 | (mmio.read32(reg::CONFIG + 4) as u64) << 32
}

fn setup_queue<M: Mmio>(mmio: &M, idx: u32) -> Result<Queue, DriverError> {
    mmio.write32(reg::QUEUE_SEL, idx);
    let max = mmio.read32(reg::QUEUE_NUM_MAX);
    if max == 0 {
        return Err(DriverError::NoQueue(idx));
    }
    // The largest power of two <= min(max, QUEUE_SIZE).
    let want = max.min(QUEUE_SIZE as u32);
    let size = 1u16 << (31 - want.leading_zeros());
    let mem = RingMem::new(size)?;
    let addrs = QueueAddrs::contiguous(mem.ptr as u64, size);
    // SAFETY: `mem` is a fresh, page-aligned allocation of the queue's footprint, kept alive
    // (and not otherwise used) as long as the queue.
    let q = unsafe { SplitQueue::new(addrs, size) }.map_err(DriverError::Ring)?;
    mmio.write32(reg::QUEUE_NUM, size as u32);
    for (lo, v) in [
        (reg::QUEUE_DESC_LOW, addrs.desc),
        (reg::QUEUE_DRIVER_LOW, addrs.avail),
        (reg::QUEUE_DEVICE_LOW, addrs.used),
    ] {
        mmio.write32(lo, v as u32);
        mmio.write32(lo + 4, (v >> 32) as u32);
    }
    mmio.write32(reg::QUEUE_READY, 1);
    Ok(Queue { q, _mem: mem, bufs: (0..size).map(|_| None).collect() })
}
