//! Tests of the kore-dma device against fake guest memory.

use std::sync::{Arc, Mutex};

use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

use super::*;
use crate::pci::config::reg;
use crate::pci::msix::{MsiMessage, MsiSink, CTL_ENABLE};

const MIB: u64 = 1 << 20;
const PACK: u64 = 4 << 30;

#[derive(Clone, Default)]
struct Fires(Arc<Mutex<u32>>);

impl MsiSink for Fires {
    fn route(&mut self, _: u16, _: Option<MsiMessage>) {}
    fn fire(&mut self, _: u16) {
        *self.0.lock().unwrap() += 1;
    }
}

struct Rig {
    dev: KoreDma,
    mem: GuestMemoryMmap,
    fires: Fires,
}

/// RAM `[0, 2 MiB)` read-write; a "pack" `[4 GiB, +1 MiB)` read-only.
fn rig() -> Rig {
    let mem = GuestMemoryMmap::from_ranges(&[
        (GuestAddress(0), 2 * MIB as usize),
        (GuestAddress(PACK), MIB as usize),
    ])
    .unwrap();
    let dma = DmaMemory::new(
        mem.clone(),
        vec![0..2 * MIB, PACK..PACK + MIB],
        std::iter::once(0..2 * MIB).collect(),
    );
    let fires = Fires::default();
    let dev = KoreDma::new(0xc000_0000, 0xc000_1000, dma, Box::new(fires.clone())).unwrap();
    Rig { dev, mem, fires }
}

impl Rig {
    fn cfg_w32(&mut self, off: u16, v: u32) {
        self.dev.config_write(off, &v.to_le_bytes());
    }
    fn cfg_r32(&mut self, off: u16) -> u32 {
        let mut d = [0u8; 4];
        self.dev.config_read(off, &mut d);
        u32::from_le_bytes(d)
    }
    fn w64(&mut self, off: u64, v: u64) {
        self.dev.bar_write(0, off, &v.to_le_bytes());
    }
    fn r32(&mut self, off: u64) -> u32 {
        let mut d = [0u8; 4];
        self.dev.bar_read(0, off, &mut d);
        u32::from_le_bytes(d)
    }
    fn r64(&mut self, off: u64) -> u64 {
        let mut d = [0u8; 8];
        self.dev.bar_read(0, off, &mut d);
        u64::from_le_bytes(d)
    }
    /// Memory + bus master on, MSI-X enabled with vector 0 unmasked.
    fn enable(&mut self) {
        self.cfg_w32(reg::COMMAND, u32::from(cmd::MEMORY | cmd::BUS_MASTER));
        self.dev.bar_write(2, 0, &0xfee0_0000u64.to_le_bytes());
        self.dev.bar_write(2, 8, &0x40u64.to_le_bytes());
        let cap = self.dev.msix_cap;
        self.cfg_w32(cap, u32::from(CTL_ENABLE) << 16);
    }
    fn copy(&mut self, src: u64, dst: u64, len: u64) -> (u32, u32) {
        self.w64(regs::SRC, src);
        self.w64(regs::DST, dst);
        self.w64(regs::LEN, len);
        self.dev.bar_write(0, regs::DOORBELL, &1u32.to_le_bytes());
        (self.r32(regs::STATUS), self.r32(regs::ERROR))
    }
    fn fired(&self) -> u32 {
        *self.fires.0.lock().unwrap()
    }
}

#[test]
fn identity_registers_and_capability() {
    let mut r = rig();
    assert_eq!(r.cfg_r32(reg::ID), 0x4b44_1234);
    assert_eq!(r.cfg_r32(reg::CLASS), 0xff00_0001);
    assert_eq!(r.cfg_r32(reg::BAR0), 0xc000_0000);
    assert_eq!(r.cfg_r32(reg::BAR0 + 8), 0xc000_1000);
    let cap = r.cfg_r32(reg::CAP_PTR) as u16 & 0xff;
    let head = r.cfg_r32(cap);
    assert_eq!(head & 0xff, 0x11, "MSI-X capability");
    assert_eq!(head >> 16 & 0x7ff, 0, "one vector");
    assert_eq!(r.cfg_r32(cap + 4), 2, "table in BAR2 at 0");
    assert_eq!(r.cfg_r32(cap + 8), 0x802, "PBA in BAR2 at 0x800");
    assert_eq!(r.r32(regs::MAGIC), MAGIC);
    assert_eq!(r.r32(regs::VERSION), 1);
    assert_eq!(r.r64(regs::MAGIC), u64::from(MAGIC) | 1 << 32);
    assert_eq!(r.r32(regs::STATUS), status::IDLE);
}

#[test]
fn copies_and_signals() {
    let mut r = rig();
    r.enable();
    let data: Vec<u8> = (0..5000u32).map(|i| (i * 7) as u8).collect();
    r.mem.write_slice(&data, GuestAddress(0x1000)).unwrap();
    assert_eq!(r.copy(0x1000, 0x10_0003, 5000), (status::DONE, 0));
    let mut out = vec![0u8; 5000];
    r.mem.read_slice(&mut out, GuestAddress(0x10_0003)).unwrap();
    assert_eq!(out, data);
    assert_eq!(r.r64(regs::COMPLETED), 1);
    assert_eq!(r.fired(), 1);
    // Registers read back, also as 32-bit halves.
    r.w64(regs::SRC, 0x1_2345_6789);
    assert_eq!(r.r32(regs::SRC), 0x2345_6789);
    assert_eq!(r.r32(regs::SRC + 4), 1);
    r.dev.bar_write(0, regs::SRC + 4, &0u32.to_le_bytes());
    assert_eq!(r.r64(regs::SRC), 0x2345_6789);
}

#[test]
fn overlapping_copies_are_memmove() {
    let mut r = rig();
    r.enable();
    let data: Vec<u8> = (0..64u8).collect();
    r.mem.write_slice(&data, GuestAddress(0x2000)).unwrap();
    assert_eq!(r.copy(0x2000, 0x2010, 64), (status::DONE, 0));
    let mut out = vec![0u8; 64];
    r.mem.read_slice(&mut out, GuestAddress(0x2010)).unwrap();
    assert_eq!(out, data);
}

#[test]
fn reading_the_pack_is_fine_writing_it_is_not() {
    let mut r = rig();
    r.enable();
    r.mem.write_slice(b"weights", GuestAddress(PACK)).unwrap();
    assert_eq!(r.copy(PACK, 0x3000, 7), (status::DONE, 0));
    assert_eq!(r.copy(0x3000, PACK, 7), (status::ERROR, DmaError::Destination as u32));
}

#[test]
fn refusals_are_reported_and_signalled() {
    let mut r = rig();
    r.enable();
    let bad = [
        (0, 0x1000, 0, DmaError::Length),
        (0, 0x1000, MAX_LEN + 1, DmaError::Length),
        (3 << 30, 0x1000, 16, DmaError::Source), // the device hole
        (2 * MIB - 8, 0x1000, 16, DmaError::Source), // runs off the end of RAM
        (PACK + MIB - 1, 0x1000, 2, DmaError::Source),
        (0x1000, 2 * MIB, 1, DmaError::Destination),
        (0x1000, u64::MAX - 3, 8, DmaError::Destination), // wraps
        (u64::MAX, 0x1000, 2, DmaError::Source),
    ];
    for (i, (src, dst, len, e)) in bad.iter().enumerate() {
        assert_eq!(r.copy(*src, *dst, *len), (status::ERROR, *e as u32), "case {i}");
    }
    assert_eq!(r.r64(regs::COMPLETED), bad.len() as u64);
    assert_eq!(r.fired(), bad.len() as u32, "each refusal raises the vector");
    r.cfg_w32(reg::COMMAND, u32::from(cmd::MEMORY));
    assert_eq!(r.copy(0, 0x1000, 8), (status::ERROR, DmaError::BusMaster as u32));
    assert_eq!(r.copy(0, 0x1000, 8).1, DmaError::BusMaster as u32);
}

#[test]
fn masked_vector_pends_in_the_pba() {
    let mut r = rig();
    r.enable();
    r.dev.bar_write(2, 12, &1u32.to_le_bytes()); // mask entry 0
    r.copy(0, 0x1000, 8);
    assert_eq!(r.fired(), 0);
    let mut d = [0u8; 8];
    r.dev.bar_read(2, PBA_OFFSET, &mut d);
    assert_eq!(u64::from_le_bytes(d), 1);
    r.dev.bar_write(2, 12, &0u32.to_le_bytes());
    assert_eq!(r.fired(), 1);
    r.dev.bar_read(2, PBA_OFFSET, &mut d);
    assert_eq!(u64::from_le_bytes(d), 0);
}

#[test]
fn garbage_accesses_never_panic() {
    let mut r = rig();
    r.enable();
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    for _ in 0..20_000 {
        let (bar, off, len) =
            ((next() % 6) as usize, next() % 0x1400, [1, 2, 3, 4, 8, 16][(next() % 6) as usize]);
        let v = next().to_le_bytes().repeat(2);
        if next() % 2 == 0 {
            r.dev.bar_write(bar, off, &v[..len]);
        } else {
            let mut d = vec![0u8; len];
            r.dev.bar_read(bar, off, &mut d);
        }
        let c = (next() % 0x1000) as u16;
        let l = [1usize, 2, 4][(next() % 3) as usize];
        r.dev.config_write(c & !(l as u16 - 1), &v[..l]);
    }
    // Still a working device after the noise once it is set up again.
    r.cfg_w32(reg::BAR0, 0xc000_0000);
    r.enable();
    r.dev.bar_write(2, 12, &0u32.to_le_bytes());
    assert_eq!(r.copy(0x100, 0x200, 16), (status::DONE, 0));
}
