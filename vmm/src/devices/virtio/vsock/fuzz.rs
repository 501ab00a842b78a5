//! The fuzz body for the vsock queue and packet path: arbitrary bytes become
//! guest memory (descriptor tables, ring indices, packet headers, payloads)
//! and the device processes its transmit and receive queues over them.
//! Used by the `vsock_queue` cargo-fuzz target (`fuzz/`) and by a plain test that feeds it
//! pseudo-random inputs, so CI exercises it without nightly.
//!
//! Whatever the input, processing must return without panicking and without
//! touching memory outside the guest region.

use std::path::Path;

use virtio_queue::{Queue, QueueT};
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};
use vmm_sys_util::epoll::Epoll;

use super::muxer::Muxer;
use super::{process_rx, process_tx};

/// Guest memory size of one fuzz case.
pub const MEM_SIZE: usize = 64 * 1024;
/// Queue size used (rings at fixed addresses, see [`run`]).
pub const QUEUE_SIZE: u16 = 16;
/// Guest CID the device is configured with.
pub const GUEST_CID: u64 = 3;

fn queue(base: u64) -> Queue {
    let mut q = Queue::new(QUEUE_SIZE).expect("valid size");
    q.set_desc_table_address(Some(base as u32), Some(0));
    q.set_avail_ring_address(Some(base as u32 + 0x100), Some(0));
    q.set_used_ring_address(Some(base as u32 + 0x200), Some(0));
    q.set_ready(true);
    q
}

/// Runs one case. Layout: tx queue rings at 0x0 (descriptors), 0x100
/// (available), 0x200 (used); rx queue at 0x1000 likewise; `data` is copied
/// to guest address 0, so it decides descriptors, indices and buffers.
pub fn run(data: &[u8]) {
    let mem = GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), MEM_SIZE)])
        .expect("anonymous guest memory");
    let n = data.len().min(MEM_SIZE);
    mem.write_slice(&data[..n], GuestAddress(0)).expect("in range");
    let (mut tx, mut rx) = (queue(0), queue(0x1000));
    let epoll = Epoll::new().expect("epoll");
    // No listener: guest connection requests go to a path that cannot exist.
    let uds = Path::new("/nonexistent/kore-vsock-fuzz");
    let mut mux = Muxer::new(GUEST_CID, uds, None, epoll).expect("muxer");
    for _ in 0..3 {
        process_tx(&mut tx, &mem, &mut mux);
        process_rx(&mut rx, &mem, &mut mux);
    }
}

/// A small deterministic generator (xorshift64*) for the plain-test driver.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// Seeded generator (a zero seed is replaced).
    pub fn new(seed: u64) -> Self {
        Self(seed.max(1))
    }

    /// Next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// A value below `n` (n > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }
}

/// A structured random case: mostly-plausible rings and headers with random
/// corruption, so the fuzz body reaches past the first validity checks.
pub fn random_case(rng: &mut Rng) -> Vec<u8> {
    let mut m = vec![0u8; 0x8000];
    for q in [0usize, 0x1000] {
        let chains = rng.below(QUEUE_SIZE as u64 + 4) as u16;
        for i in 0..QUEUE_SIZE as usize {
            let d = q + 16 * i;
            let addr = (0x2000 + rng.below(0x6000)) & !3;
            let addr = if rng.below(16) == 0 { rng.next_u64() } else { addr };
            let len = match rng.below(4) {
                0 => 44,
                1 => rng.below(0x400) as u32,
                2 => 44 + rng.below(0x200) as u32,
                _ => rng.next_u64() as u32,
            };
            let flags = (rng.below(8) as u16) & if rng.below(4) == 0 { 0xffff } else { 3 };
            let next =
                if rng.below(8) == 0 { rng.next_u64() as u16 } else { (i as u16 + 1) % QUEUE_SIZE };
            m[d..d + 8].copy_from_slice(&addr.to_le_bytes());
            m[d + 8..d + 12].copy_from_slice(&len.to_le_bytes());
            m[d + 12..d + 14].copy_from_slice(&flags.to_le_bytes());
            m[d + 14..d + 16].copy_from_slice(&next.to_le_bytes());
        }
        m[q + 0x102..q + 0x104].copy_from_slice(&chains.to_le_bytes());
        for k in 0..QUEUE_SIZE as usize {
            let head = if rng.below(8) == 0 { rng.next_u64() as u16 } else { rng.below(16) as u16 };
            m[q + 0x104 + 2 * k..q + 0x106 + 2 * k].copy_from_slice(&head.to_le_bytes());
        }
    }
    // Packet headers: plausible vsock headers at random buffer offsets.
    for _ in 0..24 {
        let at = 0x2000 + rng.below(0x5f00) as usize;
        let mut h = [0u8; 44];
        let src_cid = if rng.below(4) == 0 { rng.next_u64() } else { GUEST_CID };
        let dst_cid = if rng.below(4) == 0 { rng.next_u64() } else { 2 };
        h[0..8].copy_from_slice(&src_cid.to_le_bytes());
        h[8..16].copy_from_slice(&dst_cid.to_le_bytes());
        h[16..20].copy_from_slice(&(rng.below(4) as u32 + 1000).to_le_bytes());
        h[20..24].copy_from_slice(&(rng.below(4) as u32 + 2000).to_le_bytes());
        let len = if rng.below(2) == 0 { rng.below(64) as u32 } else { rng.next_u64() as u32 };
        h[24..28].copy_from_slice(&len.to_le_bytes());
        h[28..30].copy_from_slice(&(rng.below(3) as u16).to_le_bytes());
        h[30..32].copy_from_slice(&(rng.below(9) as u16).to_le_bytes());
        h[32..36].copy_from_slice(&(rng.below(4) as u32).to_le_bytes());
        h[36..40].copy_from_slice(&(rng.next_u64() as u32).to_le_bytes());
        h[40..44].copy_from_slice(&(rng.next_u64() as u32).to_le_bytes());
        m[at..at + 44].copy_from_slice(&h);
    }
    m
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fuzz_body_survives_random_cases() {
        let mut rng = Rng::new(0x6b6f_7265);
        for _ in 0..3000 {
            let case = random_case(&mut rng);
            run(&case);
        }
        for len in [0usize, 1, 100, 0x300, MEM_SIZE + 10] {
            let bytes: Vec<u8> = (0..len).map(|_| rng.next_u64() as u8).collect();
            run(&bytes);
        }
    }
}
