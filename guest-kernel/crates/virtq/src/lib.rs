//! kore-virtq: split virtqueues (virtio 1.2 §2.7), driver side, over plain memory.
//!
//! The guest identity-maps its memory, so ring addresses are both pointers and the
//! guest-physical addresses the device is told. The queue does not negotiate
//! `VIRTIO_F_EVENT_IDX`: the driver notifies unless the device sets `VIRTQ_USED_F_NO_NOTIFY`.
//! With the `device` feature, [`device::DeviceQueue`] gives the device's side of the same
//! rings, which tests use as a fake device.
#![no_std]

#[cfg(feature = "device")]
pub mod device;

use core::sync::atomic::{fence, Ordering};

/// Descriptor flag: the chain continues at `next`.
pub const VIRTQ_DESC_F_NEXT: u16 = 1;
/// Descriptor flag: the device writes this buffer.
pub const VIRTQ_DESC_F_WRITE: u16 = 2;
/// Used-ring flag: the device asks not to be notified.
pub const VIRTQ_USED_F_NO_NOTIFY: u16 = 1;
/// Marker this driver keeps in the flags of free descriptors (not a spec flag; the device
/// never sees free descriptors) to catch a chain returned twice.
const DESC_FREE: u16 = 0x8000;
/// Available-ring flag: the driver asks for no interrupts.
pub const VIRTQ_AVAIL_F_NO_INTERRUPT: u16 = 1;

/// Errors of queue operations.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Error {
    /// Not enough free descriptors: reap used buffers first.
    Full,
    /// A chain needs at least one buffer.
    EmptyChain,
    /// The queue size must be a power of two between 1 and 32768.
    BadSize,
    /// The ring memory is not aligned as the spec requires (16/2/4 bytes).
    Misaligned,
    /// The device returned a descriptor id that is not an outstanding chain head.
    BadUsedId(u32),
}

/// One descriptor of the table (spec layout).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Desc {
    /// Guest-physical buffer address.
    pub addr: u64,
    /// Buffer length in bytes.
    pub len: u32,
    /// `VIRTQ_DESC_F_*`.
    pub flags: u16,
    /// Next descriptor when `flags` has `NEXT`.
    pub next: u16,
}

/// A buffer to place in a chain.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Buffer {
    /// Guest-physical address.
    pub addr: u64,
    /// Length in bytes.
    pub len: u32,
    /// True if the device writes it (device-readable otherwise).
    pub writable: bool,
}

/// A completed chain from the used ring.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Used {
    /// Head descriptor id returned by [`SplitQueue::add`].
    pub id: u16,
    /// Bytes the device wrote into the chain's writable buffers.
    pub len: u32,
}

/// Where a queue's three areas live (guest-physical addresses).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QueueAddrs {
    /// Descriptor table (16-byte aligned, 16 bytes per entry).
    pub desc: u64,
    /// Driver area, the available ring (2-byte aligned, 6 + 2n bytes).
    pub avail: u64,
    /// Device area, the used ring (4-byte aligned, 6 + 8n bytes).
    pub used: u64,
}

impl QueueAddrs {
    /// Bytes needed for a queue of `size` entries laid out contiguously by [`Self::contiguous`].
    pub const fn footprint(size: u16) -> usize {
        let n = size as usize;
        let avail_end = 16 * n + 6 + 2 * n;
        avail_end.div_ceil(4) * 4 + 6 + 8 * n
    }

    /// The three areas packed one after another from `base` (16-byte aligned).
    pub const fn contiguous(base: u64, size: u16) -> Self {
        let n = size as u64;
        let avail = base + 16 * n;
        let used = (avail + 6 + 2 * n).div_ceil(4) * 4;
        Self { desc: base, avail, used }
    }
}

/// Driver side of one split virtqueue.
pub struct SplitQueue {
    addrs: QueueAddrs,
    size: u16,
    free_head: u16,
    num_free: u16,
    avail_idx: u16,
    last_used: u16,
}

// SAFETY: the queue owns its ring memory (see `new`); it holds raw addresses only.
unsafe impl Send for SplitQueue {}

impl SplitQueue {
    /// Takes over the ring memory at `addrs` for a queue of `size` entries and zeroes it.
    ///
    /// # Safety
    /// The three areas must be valid, writable, identity-mapped memory of the sizes given in
    /// [`QueueAddrs`], used by nothing but this queue and its device for the queue's lifetime.
    pub unsafe fn new(addrs: QueueAddrs, size: u16) -> Result<Self, Error> {
        if size == 0 || !size.is_power_of_two() || size > 32768 {
            return Err(Error::BadSize);
        }
        if !addrs.desc.is_multiple_of(16)
            || !addrs.avail.is_multiple_of(2)
            || !addrs.used.is_multiple_of(4)
        {
            return Err(Error::Misaligned);
        }
        let n = size as usize;
        // SAFETY: the caller gives us these areas with these sizes.
        unsafe {
            core::ptr::write_bytes(addrs.desc as *mut u8, 0, 16 * n);
            core::ptr::write_bytes(addrs.avail as *mut u8, 0, 6 + 2 * n);
            core::ptr::write_bytes(addrs.used as *mut u8, 0, 6 + 8 * n);
        }
        let mut q = Self { addrs, size, free_head: 0, num_free: size, avail_idx: 0, last_used: 0 };
        for i in 0..size {
            q.write_desc(
                i,
                Desc { next: i.wrapping_add(1) % size, flags: DESC_FREE, ..Desc::default() },
            );
        }
        Ok(q)
    }

    /// The ring addresses (to tell the device).
    pub fn addrs(&self) -> QueueAddrs {
        self.addrs
    }

    /// Queue size (entries).
    pub fn size(&self) -> u16 {
        self.size
    }

    /// Free descriptors.
    pub fn num_free(&self) -> u16 {
        self.num_free
    }

    fn desc_ptr(&self, i: u16) -> *mut Desc {
        (self.addrs.desc as *mut Desc).wrapping_add(i as usize)
    }

    fn write_desc(&mut self, i: u16, d: Desc) {
        // SAFETY: `i < size`, inside the descriptor table we own.
        unsafe { self.desc_ptr(i).write_volatile(d) }
    }

    fn read_desc(&self, i: u16) -> Desc {
        // SAFETY: as in `write_desc`.
        unsafe { self.desc_ptr(i).read_volatile() }
    }

    /// Places a chain of `bufs` in the table and makes it available to the device.
    /// Returns the head id that [`Used::id`] will carry.
    pub fn add(&mut self, bufs: &[Buffer]) -> Result<u16, Error> {
        if bufs.is_empty() {
            return Err(Error::EmptyChain);
        }
        if bufs.len() > self.num_free as usize {
            return Err(Error::Full);
        }
        let head = self.free_head;
        let mut cur = head;
        for (k, b) in bufs.iter().enumerate() {
            let next_free = self.read_desc(cur).next;
            let last = k + 1 == bufs.len();
            let mut flags = if b.writable { VIRTQ_DESC_F_WRITE } else { 0 };
            if !last {
                flags |= VIRTQ_DESC_F_NEXT;
            }
            self.write_desc(
                cur,
                Desc { addr: b.addr, len: b.len, flags, next: if last { 0 } else { next_free } },
            );
            if last {
                self.free_head = next_free;
            }
            cur = next_free;
        }
        self.num_free -= bufs.len() as u16;
        let slot = (self.avail_idx % self.size) as usize;
        let avail = self.addrs.avail as *mut u16;
        // SAFETY: `slot < size`; ring entries follow the 2-byte flags and idx fields.
        unsafe { avail.add(2 + slot).write_volatile(head) };
        self.avail_idx = self.avail_idx.wrapping_add(1);
        // The descriptors and ring entry must be visible before the new index.
        fence(Ordering::Release);
        // SAFETY: `idx` is the second u16 of the available ring.
        unsafe { avail.add(1).write_volatile(self.avail_idx) };
        Ok(head)
    }

    /// True unless the device asked (`VIRTQ_USED_F_NO_NOTIFY`) not to be notified.
    pub fn needs_notify(&self) -> bool {
        fence(Ordering::SeqCst);
        // SAFETY: `flags` is the first u16 of the used ring.
        let flags = unsafe { (self.addrs.used as *const u16).read_volatile() };
        flags & VIRTQ_USED_F_NO_NOTIFY == 0
    }

    /// Asks the device for (true) or not for (false) used-buffer interrupts.
    pub fn set_interrupts(&mut self, on: bool) {
        let flags = if on { 0 } else { VIRTQ_AVAIL_F_NO_INTERRUPT };
        // SAFETY: `flags` is the first u16 of the available ring.
        unsafe { (self.addrs.avail as *mut u16).write_volatile(flags) };
        fence(Ordering::SeqCst);
    }

    /// True if the device has returned chains not yet popped.
    pub fn has_used(&self) -> bool {
        self.used_idx() != self.last_used
    }

    fn used_idx(&self) -> u16 {
        // SAFETY: `idx` is the second u16 of the used ring.
        let idx = unsafe { (self.addrs.used as *const u16).add(1).read_volatile() };
        fence(Ordering::Acquire);
        idx
    }

    /// Takes the next completed chain and frees its descriptors.
    pub fn pop_used(&mut self) -> Option<Result<Used, Error>> {
        if self.used_idx() == self.last_used {
            return None;
        }
        let slot = (self.last_used % self.size) as usize;
        let elem = self.addrs.used + 4 + 8 * slot as u64;
        // SAFETY: `slot < size`; used elements are {u32 id, u32 len} after flags and idx.
        let (id, len) = unsafe {
            ((elem as *const u32).read_volatile(), ((elem + 4) as *const u32).read_volatile())
        };
        self.last_used = self.last_used.wrapping_add(1);
        Some(self.free_chain(id).map(|id| Used { id, len }))
    }

    fn free_chain(&mut self, id: u32) -> Result<u16, Error> {
        if id >= self.size as u32 || self.num_free == self.size {
            return Err(Error::BadUsedId(id));
        }
        let head = id as u16;
        if self.read_desc(head).flags & DESC_FREE != 0 {
            return Err(Error::BadUsedId(id));
        }
        let mut cur = head;
        let mut count = 1u16;
        loop {
            let d = self.read_desc(cur);
            self.write_desc(cur, Desc { flags: d.flags | DESC_FREE, ..d });
            if d.flags & VIRTQ_DESC_F_NEXT == 0 {
                break;
            }
            if count >= self.size - self.num_free || d.next >= self.size {
                return Err(Error::BadUsedId(id));
            }
            cur = d.next;
            count += 1;
        }
        let tail = self.read_desc(cur);
        self.write_desc(cur, Desc { next: self.free_head, flags: DESC_FREE, ..tail });
        self.free_head = head;
        self.num_free += count;
        Ok(head)
    }

    /// Reads a descriptor (tests and diagnostics).
    pub fn desc(&self, i: u16) -> Option<Desc> {
        (i < self.size).then(|| self.read_desc(i))
    }

    /// Ring index the driver will publish next (diagnostics).
    pub fn avail_idx(&self) -> u16 {
        self.avail_idx
    }
}

#[cfg(test)]
mod tests;
