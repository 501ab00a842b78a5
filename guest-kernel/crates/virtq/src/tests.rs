//! Driver ring logic against the device view over plain memory.
extern crate std;
use std::vec;
use std::vec::Vec;

use super::*;

/// 16-byte aligned zeroed memory for rings and buffers.
struct Mem(Vec<u128>);
impl Mem {
    fn new(bytes: usize) -> Self {
        Mem(vec![0u128; bytes.div_ceil(16)])
    }
    fn addr(&self) -> u64 {
        self.0.as_ptr() as u64
    }
}

fn queue(size: u16) -> (Mem, SplitQueue) {
    let mem = Mem::new(QueueAddrs::footprint(size));
    // SAFETY: `mem` holds the footprint and lives as long as the queue in each test.
    let q = unsafe { SplitQueue::new(QueueAddrs::contiguous(mem.addr(), size), size) }.unwrap();
    (mem, q)
}

fn buf(addr: u64, len: u32, writable: bool) -> Buffer {
    Buffer { addr, len, writable }
}

#[test]
fn layout_matches_the_spec_sizes() {
    let a = QueueAddrs::contiguous(0x1000, 256);
    assert_eq!(a.avail, 0x1000 + 16 * 256);
    assert_eq!(a.used, (a.avail + 6 + 512).div_ceil(4) * 4);
    assert_eq!(QueueAddrs::footprint(256) as u64, a.used + 6 + 8 * 256 - 0x1000);
}

#[test]
fn rejects_bad_sizes_and_alignment() {
    let mem = Mem::new(QueueAddrs::footprint(8) + 16);
    // SAFETY: memory is large enough; the calls fail before touching it or use it fully.
    unsafe {
        assert_eq!(
            SplitQueue::new(QueueAddrs::contiguous(mem.addr(), 8), 6).err(),
            Some(Error::BadSize)
        );
        assert_eq!(
            SplitQueue::new(QueueAddrs::contiguous(mem.addr() + 8, 8), 8).err(),
            Some(Error::Misaligned)
        );
    }
}

#[test]
fn chains_reach_the_device_in_order_with_flags() {
    let (_m, mut q) = queue(8);
    // SAFETY: same rings.
    let mut dev = unsafe { device::DeviceQueue::new(q.addrs(), 8) };
    let h1 = q.add(&[buf(0x100, 44, false), buf(0x200, 10, false)]).unwrap();
    let h2 = q.add(&[buf(0x300, 4096, true)]).unwrap();
    assert_eq!(q.num_free(), 5);
    let (d1, c1) = dev.pop_avail().unwrap();
    assert_eq!(d1, h1);
    assert_eq!(c1.len(), 2);
    assert_eq!((c1[0].addr, c1[0].len, c1[0].flags), (0x100, 44, VIRTQ_DESC_F_NEXT));
    assert_eq!((c1[1].addr, c1[1].len, c1[1].flags), (0x200, 10, 0));
    let (d2, c2) = dev.pop_avail().unwrap();
    assert_eq!(d2, h2);
    assert_eq!((c2[0].len, c2[0].flags), (4096, VIRTQ_DESC_F_WRITE));
    assert!(dev.pop_avail().is_none());
    // Completed out of order.
    dev.push_used(h2, 100);
    dev.push_used(h1, 0);
    assert_eq!(q.pop_used(), Some(Ok(Used { id: h2, len: 100 })));
    assert_eq!(q.pop_used(), Some(Ok(Used { id: h1, len: 0 })));
    assert_eq!(q.pop_used(), None);
    assert_eq!(q.num_free(), 8);
}

#[test]
fn full_queue_refuses_then_recovers_across_index_wrap() {
    let (_m, mut q) = queue(4);
    // SAFETY: same rings.
    let mut dev = unsafe { device::DeviceQueue::new(q.addrs(), 4) };
    // Many rounds so the free-running u16 indices wrap past 65535.
    for round in 0..70_000u32 {
        let a = q.add(&[buf(round as u64, 1, true), buf(2, 2, true)]).unwrap();
        let b = q.add(&[buf(3, 3, false), buf(4, 4, false)]).unwrap();
        assert_eq!(q.add(&[buf(5, 5, false)]), Err(Error::Full));
        let (ha, ca) = dev.pop_avail().unwrap();
        assert_eq!((ha, ca[0].addr), (a, round as u64));
        let (hb, _) = dev.pop_avail().unwrap();
        assert_eq!(hb, b);
        dev.push_used(b, 7);
        dev.push_used(a, 3);
        assert_eq!(q.pop_used().unwrap().unwrap(), Used { id: b, len: 7 });
        assert_eq!(q.pop_used().unwrap().unwrap(), Used { id: a, len: 3 });
        assert_eq!(q.num_free(), 4);
    }
}

#[test]
fn bogus_used_ids_are_errors_not_corruption() {
    let (_m, mut q) = queue(4);
    // SAFETY: same rings.
    let mut dev = unsafe { device::DeviceQueue::new(q.addrs(), 4) };
    let h = q.add(&[buf(1, 1, true)]).unwrap();
    dev.push_used(9, 0); // out of range
    assert_eq!(q.pop_used(), Some(Err(Error::BadUsedId(9))));
    dev.push_used(h, 1);
    assert_eq!(q.pop_used(), Some(Ok(Used { id: h, len: 1 })));
    dev.push_used(h, 1); // returned twice
    assert_eq!(q.pop_used(), Some(Err(Error::BadUsedId(h as u32))));
    assert_eq!(q.num_free(), 4);
    assert_eq!(q.add(&[]), Err(Error::EmptyChain));
}

#[test]
fn notification_suppression_is_honoured() {
    let (_m, mut q) = queue(4);
    // SAFETY: same rings.
    let mut dev = unsafe { device::DeviceQueue::new(q.addrs(), 4) };
    assert!(q.needs_notify());
    dev.set_used_flags(VIRTQ_USED_F_NO_NOTIFY);
    assert!(!q.needs_notify());
    q.set_interrupts(false);
    // SAFETY: avail flags is the ring's first u16.
    assert_eq!(unsafe { (q.addrs().avail as *const u16).read() }, VIRTQ_AVAIL_F_NO_INTERRUPT);
}
