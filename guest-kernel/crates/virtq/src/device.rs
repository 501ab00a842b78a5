//! The device's side of a split virtqueue, for fake devices in tests.
//!
//! Addresses are taken as host pointers (tests identity-map "guest memory" onto their own).

extern crate alloc;
use alloc::vec::Vec;
use core::sync::atomic::{fence, Ordering};

use crate::{Desc, QueueAddrs, VIRTQ_DESC_F_NEXT};

/// Device view of one queue.
pub struct DeviceQueue {
    addrs: QueueAddrs,
    size: u16,
    last_avail: u16,
    used_idx: u16,
}

impl DeviceQueue {
    /// A device view of the rings at `addrs` (as configured by the driver).
    ///
    /// # Safety
    /// The rings must be live memory of a queue of `size` entries for the view's lifetime.
    pub unsafe fn new(addrs: QueueAddrs, size: u16) -> Self {
        Self { addrs, size, last_avail: 0, used_idx: 0 }
    }

    /// The next available chain: its head id and descriptors, in order.
    pub fn pop_avail(&mut self) -> Option<(u16, Vec<Desc>)> {
        // SAFETY: idx is the second u16 of the available ring (see `new`).
        let idx = unsafe { (self.addrs.avail as *const u16).add(1).read_volatile() };
        fence(Ordering::Acquire);
        if idx == self.last_avail {
            return None;
        }
        let slot = (self.last_avail % self.size) as usize;
        // SAFETY: ring entries follow flags and idx; `slot < size`.
        let head = unsafe { (self.addrs.avail as *const u16).add(2 + slot).read_volatile() };
        self.last_avail = self.last_avail.wrapping_add(1);
        let mut chain = Vec::new();
        let mut cur = head;
        loop {
            assert!(cur < self.size && chain.len() < self.size as usize, "corrupt chain");
            // SAFETY: `cur < size`, inside the descriptor table.
            let d = unsafe { (self.addrs.desc as *const Desc).add(cur as usize).read_volatile() };
            chain.push(d);
            if d.flags & VIRTQ_DESC_F_NEXT == 0 {
                break;
            }
            cur = d.next;
        }
        Some((head, chain))
    }

    /// Returns chain `head` to the driver with `len` bytes written.
    pub fn push_used(&mut self, head: u16, len: u32) {
        let slot = (self.used_idx % self.size) as u64;
        let elem = self.addrs.used + 4 + 8 * slot;
        // SAFETY: the element lies inside the used ring (`slot < size`).
        unsafe {
            (elem as *mut u32).write_volatile(head as u32);
            ((elem + 4) as *mut u32).write_volatile(len);
        }
        self.used_idx = self.used_idx.wrapping_add(1);
        fence(Ordering::Release);
        // SAFETY: idx is the second u16 of the used ring.
        unsafe { (self.addrs.used as *mut u16).add(1).write_volatile(self.used_idx) };
    }

    /// Sets the used ring's flags (e.g. `VIRTQ_USED_F_NO_NOTIFY`).
    pub fn set_used_flags(&mut self, flags: u16) {
        // SAFETY: flags is the first u16 of the used ring.
        unsafe { (self.addrs.used as *mut u16).write_volatile(flags) };
    }

    /// Copies `len` bytes of guest memory at `addr`.
    pub fn read_mem(addr: u64, len: usize) -> Vec<u8> {
        // SAFETY: tests pass buffer addresses the driver placed in descriptors.
        unsafe { core::slice::from_raw_parts(addr as *const u8, len) }.to_vec()
    }

    /// Writes `data` into guest memory at `addr`.
    pub fn write_mem(addr: u64, data: &[u8]) {
        // SAFETY: as in `read_mem`, for device-writable buffers.
        unsafe { core::ptr::copy_nonoverlapping(data.as_ptr(), addr as *mut u8, data.len()) }
    }
}
