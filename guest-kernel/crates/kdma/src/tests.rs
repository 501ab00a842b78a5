//! The driver against a fake kore-dma that copies inside a host buffer when "interrupted".

extern crate std;

use core::cell::{Cell, RefCell};
use std::vec::Vec;

use super::*;

/// Fake device: registers, plus guest "RAM" = `ram` at guest-physical 0x1000.
struct Fake {
    regs: RefCell<[u64; 8]>,
    ram: RefCell<Vec<u8>>,
    doorbells: Cell<u32>,
}

const RAM_BASE: u64 = 0x1000;

impl Mmio for &Fake {
    fn read32(&self, off: u64) -> u32 {
        match off {
            reg::MAGIC => MAGIC,
            reg::VERSION => VERSION,
            reg::STATUS => self.regs.borrow()[4] as u32,
            reg::ERROR => self.regs.borrow()[5] as u32,
            _ => 0,
        }
    }
    fn write32(&self, off: u64, v: u32) {
        assert_eq!((off, v), (reg::DOORBELL, 1), "only the doorbell is a 32-bit write");
        self.doorbells.set(self.doorbells.get() + 1);
        self.regs.borrow_mut()[4] = 1; // busy until the "interrupt"
    }
    fn read64(&self, off: u64) -> u64 {
        assert_eq!(off, reg::COMPLETED);
        self.regs.borrow()[6]
    }
    fn write64(&self, off: u64, v: u64) {
        assert!(matches!(off, reg::SRC | reg::DST | reg::LEN), "{off:#x}");
        self.regs.borrow_mut()[off as usize / 8] = v;
    }
}

impl Fake {
    fn new() -> Self {
        let ram = (0..4096u32).map(|i| i as u8).collect();
        Self { regs: RefCell::new([0; 8]), ram: RefCell::new(ram), doorbells: Cell::new(0) }
    }

    /// Runs the pending copy (what the VMM does), then "raises the interrupt".
    fn finish(&self) {
        let mut r = self.regs.borrow_mut();
        if r[4] != 1 {
            return;
        }
        let (src, dst, len) = (r[1], r[2], r[3]);
        let ram_end = RAM_BASE + self.ram.borrow().len() as u64;
        let inside = |a: u64| a >= RAM_BASE && a.checked_add(len).is_some_and(|e| e <= ram_end);
        let err = if len == 0 || len > MAX_LEN {
            3
        } else if !inside(src) {
            1
        } else if !inside(dst) {
            2
        } else {
            let (s, d, n) = ((src - RAM_BASE) as usize, (dst - RAM_BASE) as usize, len as usize);
            self.ram.borrow_mut().copy_within(s..s + n, d);
            0
        };
        (r[4], r[5]) = if err == 0 { (2, 0) } else { (3, err) };
        r[6] += 1;
    }
}

#[test]
fn copies_complete_through_the_wait_callback() {
    let fake = Fake::new();
    let dma = KoreDma::new(&fake).unwrap();
    assert_eq!(dma.status(), Status::Idle);
    let c = dma.copy(RAM_BASE, RAM_BASE + 2048, 100, || fake.finish()).unwrap();
    assert_eq!(c, Completion { waits: 1 });
    let ram = fake.ram.borrow();
    assert_eq!(&ram[2048..2148], &ram[..100]);
    assert_eq!(dma.completed(), 1);
    assert_eq!(dma.status(), Status::Done);
}

#[test]
fn the_driver_keeps_waiting_until_completed_moves() {
    let fake = Fake::new();
    let dma = KoreDma::new(&fake).unwrap();
    let calls = Cell::new(0);
    let wait = || {
        calls.set(calls.get() + 1);
        if calls.get() == 3 {
            fake.finish(); // two unrelated wake-ups before the device's interrupt
        }
    };
    assert_eq!(dma.copy(RAM_BASE, RAM_BASE + 8, 8, wait).unwrap().waits, 3);
    assert_eq!(fake.doorbells.get(), 1);
}

#[test]
fn device_errors_are_reported() {
    let fake = Fake::new();
    let dma = KoreDma::new(&fake).unwrap();
    let run = |s, d, n| dma.copy(s, d, n, || fake.finish());
    assert_eq!(run(0, RAM_BASE, 16), Err(Error::Device(DeviceError::SourceNotRam)));
    assert_eq!(run(RAM_BASE, 1 << 40, 16), Err(Error::Device(DeviceError::DestinationNotRam)));
    assert_eq!(run(RAM_BASE, RAM_BASE, 0), Err(Error::Device(DeviceError::BadLength)));
    assert_eq!(run(RAM_BASE, RAM_BASE, MAX_LEN + 1), Err(Error::Device(DeviceError::BadLength)));
    assert_eq!(dma.completed(), 4, "errors count as finished copies");
    assert_eq!(DeviceError::from_u32(5), DeviceError::Busy);
    assert_eq!(DeviceError::from_u32(9), DeviceError::Unknown(9));
}

struct Wrong(u32, u32);
impl Mmio for Wrong {
    fn read32(&self, off: u64) -> u32 {
        if off == reg::MAGIC {
            self.0
        } else {
            self.1
        }
    }
    fn write32(&self, _: u64, _: u32) {}
}

#[test]
fn other_devices_are_refused() {
    assert_eq!(KoreDma::new(Wrong(0xffff_ffff, 1)).err(), Some(Error::NotKoreDma { magic: !0 }));
    assert_eq!(KoreDma::new(Wrong(MAGIC, 2)).err(), Some(Error::Version(2)));
}
