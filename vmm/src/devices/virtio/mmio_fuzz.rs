//! The fuzz body for the virtio-mmio register file: arbitrary bytes become a
//! sequence of guest register reads and writes (any offset, any width, any
//! value), driven through [`BusDevice`] exactly as vCPU exits drive it, over a
//! small guest memory the queue addresses may or may not point into. Used by
//! the `virtio_mmio` cargo-fuzz target (`fuzz/`) and by a plain test.
//!
//! Whatever the sequence, the transport must never panic, and a device that
//! reports `DRIVER_OK` must have had every queue address validated.

use vm_memory::{GuestAddress, GuestMemoryMmap};
use vmm_sys_util::eventfd::EventFd;

use super::mmio::{reg, status, MmioTransport};
use crate::devices::bus::BusDevice;

/// Guest memory of one case.
const MEM_SIZE: usize = 64 * 1024;

/// Registers most sequences should hit: the fuzzer also tries everything else.
const REGS: [u64; 20] = [
    reg::MAGIC,
    reg::DEVICE_FEATURES,
    reg::DEVICE_FEATURES_SEL,
    reg::DRIVER_FEATURES,
    reg::DRIVER_FEATURES_SEL,
    reg::QUEUE_SEL,
    reg::QUEUE_NUM_MAX,
    reg::QUEUE_NUM,
    reg::QUEUE_READY,
    reg::QUEUE_NOTIFY,
    reg::INTERRUPT_STATUS,
    reg::INTERRUPT_ACK,
    reg::STATUS,
    reg::QUEUE_DESC_LOW,
    reg::QUEUE_DESC_HIGH,
    reg::QUEUE_DRIVER_LOW,
    reg::QUEUE_DRIVER_HIGH,
    reg::QUEUE_DEVICE_LOW,
    reg::QUEUE_DEVICE_HIGH,
    reg::CONFIG_GENERATION,
];

/// Runs one case: 8 bytes per access (`op`, `reg`, `width`, pad, value u32).
/// `op` bit 0: write (else read); bit 1: `reg` indexes [`REGS`] (else it is a
/// raw offset below 0x200); `width` picks 1, 2, 4 or 8 bytes.
pub fn run(data: &[u8]) {
    let mem = GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), MEM_SIZE)])
        .expect("anonymous guest memory");
    let irq = EventFd::new(0).expect("eventfd");
    let wake = EventFd::new(0).expect("eventfd");
    let mut dev = MmioTransport::new(
        19,
        1 << 32,
        &[128, 128, 16],
        vec![3, 0, 0, 0, 0, 0, 0, 0],
        mem,
        irq,
        wake,
    )
    .expect("valid queue sizes");
    for a in data.chunks_exact(8) {
        let offset = match a[0] & 2 {
            0 => (a[1] as u64) * 2,
            _ => REGS[a[1] as usize % REGS.len()],
        };
        let width = [1usize, 2, 4, 8][(a[2] & 3) as usize];
        let value = u64::from(u32::from_le_bytes([a[4], a[5], a[6], a[7]]));
        let mut buf = value.to_le_bytes();
        match a[0] & 1 {
            1 => dev.write(offset, &buf[..width]),
            _ => dev.read(offset, &mut buf[..width]),
        }
        if dev.status() & status::DRIVER_OK != 0 && !dev.activated() {
            assert!(
                dev.status() & status::DEVICE_NEEDS_RESET != 0
                    || dev.status() & status::FAILED != 0,
                "DRIVER_OK without activation must be refused"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::run;
    use crate::devices::virtio::vsock::fuzz::Rng;

    #[test]
    fn fuzz_body_survives_random_sequences() {
        let mut rng = Rng::new(0x6d6d_696f);
        for _ in 0..2_000 {
            let len = 8 * rng.below(64) as usize;
            let data: Vec<u8> = (0..len).map(|_| rng.next_u64() as u8).collect();
            run(&data);
        }
    }
}
