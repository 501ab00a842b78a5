//! Tests of the ECAM decode, BAR routing and the BAR allocator.

use super::*;
use crate::pci::config::{cmd, reg, BarSpec, ConfigSpace};

/// A function with one 4 KiB scratch BAR.
struct Scratch {
    config: ConfigSpace,
    mem: Vec<u8>,
}

impl Scratch {
    fn new(addr: u64) -> Self {
        let mut config = ConfigSpace::new(0x1234, 0x1111, 0, 0);
        let spec = BarSpec { addr, size: 0x1000, is_64: false, prefetchable: false };
        config.add_bar(0, spec).unwrap();
        Self { config, mem: vec![0; 0x1000] }
    }
}

impl PciDevice for Scratch {
    fn config_read(&mut self, offset: u16, data: &mut [u8]) {
        self.config.read(offset, data);
    }
    fn config_write(&mut self, offset: u16, data: &[u8]) {
        self.config.write(offset, data);
    }
    fn decoded_bars(&self) -> Vec<(usize, u64, u64)> {
        self.config.decoded_bars()
    }
    fn bar_read(&mut self, _bar: usize, offset: u64, data: &mut [u8]) {
        let o = offset as usize;
        data.copy_from_slice(&self.mem[o..o + data.len()]);
    }
    fn bar_write(&mut self, _bar: usize, offset: u64, data: &[u8]) {
        let o = offset as usize;
        self.mem[o..o + data.len()].copy_from_slice(data);
    }
}

fn root() -> PciRoot {
    let mut r = PciRoot::new();
    r.add(Arc::new(Mutex::new(Scratch::new(0xc000_0000)))).unwrap();
    r.add(Arc::new(Mutex::new(Scratch::new(0xc000_1000)))).unwrap();
    r
}

fn cfg32(r: &PciRoot, dev: u64, reg: u16) -> u32 {
    let mut d = [0u8; 4];
    r.config_read(dev << 15 | u64::from(reg), &mut d);
    u32::from_le_bytes(d)
}

#[test]
fn ecam_decodes_devices_and_absent_functions() {
    let r = root();
    assert_eq!(cfg32(&r, 0, reg::ID), 0x1111_1234);
    assert_eq!(cfg32(&r, 1, reg::ID), 0x1111_1234);
    assert_eq!(cfg32(&r, 2, reg::ID), 0xffff_ffff, "empty slot");
    let mut d = [0u8; 2];
    r.config_read(1 << 12, &mut d); // device 0, function 1
    assert_eq!(d, [0xff; 2]);
    r.config_read(1 << 20, &mut d); // past bus 0
    assert_eq!(d, [0xff; 2]);
    r.config_read(1, &mut d); // misaligned
    assert_eq!(d, [0xff; 2]);
    r.config_write(1 << 12 | 4, &[0xff; 4]); // writes to absent functions vanish
    r.config_write(2 << 15 | 4, &[0xff; 4]);
}

#[test]
fn bars_decode_only_with_memory_enabled() {
    let r = root();
    let mut d = [0u8; 4];
    r.mem_write(0xc000_0010, &[1, 2, 3, 4]);
    r.mem_read(0xc000_0010, &mut d);
    assert_eq!(d, [0xff; 4], "Memory Space off: nothing decodes");
    r.config_write(u64::from(reg::COMMAND), &u32::from(cmd::MEMORY).to_le_bytes());
    r.mem_write(0xc000_0010, &[1, 2, 3, 4]);
    r.mem_read(0xc000_0010, &mut d);
    assert_eq!(d, [1, 2, 3, 4]);
    r.mem_read(0xc000_1010, &mut d);
    assert_eq!(d, [0xff; 4], "device 1 still off");
}

#[test]
fn bar_moves_take_effect() {
    let r = root();
    r.config_write(u64::from(reg::COMMAND), &u32::from(cmd::MEMORY).to_le_bytes());
    r.mem_write(0xc000_0000, &[9; 4]);
    r.config_write(u64::from(reg::BAR0), &0xc010_0000u32.to_le_bytes());
    let mut d = [0u8; 4];
    r.mem_read(0xc000_0000, &mut d);
    assert_eq!(d, [0xff; 4], "old address no longer decodes");
    r.mem_read(0xc010_0000, &mut d);
    assert_eq!(d, [9; 4]);
    // Sizing (all-ones) stops decoding until restored.
    r.config_write(u64::from(reg::BAR0), &[0xff; 4]);
    assert_eq!(cfg32(&r, 0, reg::BAR0), 0xffff_f000);
    r.mem_read(0xc010_0000, &mut d);
    assert_eq!(d, [0xff; 4]);
}

#[test]
fn windows_offset_into_guest_addresses() {
    let r = Arc::new(root());
    r.config_write(u64::from(reg::COMMAND), &u32::from(cmd::MEMORY).to_le_bytes());
    let mut w = BarWindow { root: r.clone(), base: 0xc000_0000 };
    w.write(0x20, &[5; 8]);
    let mut d = [0u8; 8];
    w.read(0x20, &mut d);
    assert_eq!(d, [5; 8]);
    let mut e = Ecam(r);
    let mut id = [0u8; 4];
    e.read(0, &mut id);
    assert_eq!(u32::from_le_bytes(id), 0x1111_1234);
}

#[test]
fn bus_is_full_after_32() {
    let mut r = PciRoot::new();
    for i in 0..SLOTS as u64 {
        r.add(Arc::new(Mutex::new(Scratch::new(i << 12)))).unwrap();
    }
    let extra = Arc::new(Mutex::new(Scratch::new(0)));
    assert_eq!(r.add(extra).unwrap_err(), HostError::BusFull);
}

#[test]
fn allocator_aligns_and_runs_out() {
    let mut a = BarAllocator::new("32-bit", 0xc000_0000, 0x1_0000);
    assert_eq!(a.alloc(0x1000), Ok(0xc000_0000));
    assert_eq!(a.alloc(0x4000), Ok(0xc000_4000), "naturally aligned");
    assert_eq!(a.alloc(0x1000), Ok(0xc000_8000));
    assert!(matches!(a.alloc(0x1_0000), Err(HostError::NoRoom { .. })));
    assert!(matches!(a.alloc(0x3000), Err(HostError::NoRoom { .. })));
    let mut b = BarAllocator::new("64-bit", u64::MAX - 0xfff, 0x1000);
    assert!(b.alloc(0x2000).is_err());
}
