//! Host tests against a fake bus-0 configuration space and a fake MSI-X BAR.

extern crate std;

use core::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::vec::Vec;

use crate::bar::{self, Bar, BarKind};
use crate::cap::{self, msix_control, MsixCap};
use crate::msix::{self, Mmio, MsixError, Table};
use crate::{command, enumerate, find, reg, ConfigSpace, Function, Header, Width};

/// One fake function: 4 KiB of config space; BAR `i` keeps only its writable bits.
struct FakeFn {
    space: [u8; 4096],
    bar_writable: [u32; 6],
}

#[derive(Default)]
struct FakeBus {
    fns: RefCell<BTreeMap<(u8, u8), FakeFn>>,
    bar_writes_while_decoding: Cell<u32>,
    writes: RefCell<Vec<(u16, Width, u32)>>,
}

fn f(dev: u8, func: u8) -> Function {
    Function::new(dev, func).unwrap()
}

impl FakeBus {
    fn add(&self, dev: u8, func: u8, vendor: u16, device: u16, header_type: u8) {
        let mut space = [0u8; 4096];
        space[0..2].copy_from_slice(&vendor.to_le_bytes());
        space[2..4].copy_from_slice(&device.to_le_bytes());
        space[8..12].copy_from_slice(&(0xff00_0001u32).to_le_bytes()); // class ff0000, rev 1
        space[0x0e] = header_type;
        self.fns.borrow_mut().insert((dev, func), FakeFn { space, bar_writable: [0; 6] });
    }

    /// Sets BAR slot `i`'s read-only type bits + value and which bits software may write.
    fn set_bar(&self, fun: Function, i: usize, value: u32, writable: u32) {
        let mut fns = self.fns.borrow_mut();
        let ff = fns.get_mut(&(fun.dev(), fun.func())).unwrap();
        ff.bar_writable[i] = writable;
        let r = 0x10 + 4 * i;
        ff.space[r..r + 4].copy_from_slice(&value.to_le_bytes());
    }

    fn poke(&self, fun: Function, r: u16, bytes: &[u8]) {
        let mut fns = self.fns.borrow_mut();
        let ff = fns.get_mut(&(fun.dev(), fun.func())).unwrap();
        ff.space[r as usize..r as usize + bytes.len()].copy_from_slice(bytes);
    }
}

impl ConfigSpace for FakeBus {
    fn read(&self, fun: Function, r: u16, w: Width) -> u32 {
        assert_eq!(r % w as u16, 0, "unaligned read {r:#x}");
        let fns = self.fns.borrow();
        let Some(ff) = fns.get(&(fun.dev(), fun.func())) else {
            return u32::MAX >> (32 - 8 * w as u32);
        };
        let mut b = [0u8; 4];
        b[..w as usize].copy_from_slice(&ff.space[r as usize..r as usize + w as usize]);
        u32::from_le_bytes(b)
    }

    fn write(&self, fun: Function, r: u16, w: Width, v: u32) {
        assert_eq!(r % w as u16, 0, "unaligned write {r:#x}");
        self.writes.borrow_mut().push((r, w, v));
        let mut fns = self.fns.borrow_mut();
        let Some(ff) = fns.get_mut(&(fun.dev(), fun.func())) else { return };
        let cmd = u16::from_le_bytes([ff.space[4], ff.space[5]]);
        if (0x10..0x28).contains(&r) {
            assert_eq!(w, Width::U32, "BARs are written whole");
            if cmd & (command::MEMORY | command::IO) != 0 {
                self.bar_writes_while_decoding.set(self.bar_writes_while_decoding.get() + 1);
            }
            let i = (r as usize - 0x10) / 4;
            let old = u32::from_le_bytes(ff.space[r as usize..r as usize + 4].try_into().unwrap());
            let m = ff.bar_writable[i];
            let new = (old & !m) | (v & m);
            ff.space[r as usize..r as usize + 4].copy_from_slice(&new.to_le_bytes());
            return;
        }
        if r < 4 || r == reg::STATUS {
            return; // ids and status are read-only here
        }
        let bytes = v.to_le_bytes();
        ff.space[r as usize..r as usize + w as usize].copy_from_slice(&bytes[..w as usize]);
    }
}

#[test]
fn ecam_offsets_follow_the_bus0_layout() {
    assert_eq!(f(3, 2).ecam_offset(), 3 << 15 | 2 << 12);
    assert_eq!(Function::from_ecam_offset(3 << 15 | 2 << 12), Some(f(3, 2)));
    assert_eq!(Function::from_ecam_offset(0x1234), None);
    assert_eq!(Function::from_ecam_offset(crate::BUS_SPACE), None);
    assert_eq!(Function::new(32, 0), None);
    assert_eq!(Function::new(0, 8), None);
}

#[test]
fn enumeration_probes_functions_only_behind_multi_function_devices() {
    let bus = FakeBus::default();
    bus.add(0, 0, 0x8086, 0x0d57, 0x00);
    bus.add(3, 0, 0x1af4, 0x1000, 0x80); // multi-function
    bus.add(3, 2, 0x1af4, 0x1001, 0x00);
    bus.add(5, 0, 0x1234, 0x4b44, 0x00); // single function...
    bus.add(5, 1, 0xdead, 0xbeef, 0x00); // ...so this one is not probed
    let found: Vec<_> = enumerate(&bus).map(|h| (h.function, h.vendor, h.device)).collect();
    assert_eq!(
        found,
        [
            (f(0, 0), 0x8086, 0x0d57),
            (f(3, 0), 0x1af4, 0x1000),
            (f(3, 2), 0x1af4, 0x1001),
            (f(5, 0), 0x1234, 0x4b44)
        ]
    );
    let h = find(&bus, 0x1234, 0x4b44).unwrap();
    assert_eq!(h.function, f(5, 0));
    assert_eq!((h.revision, h.class, h.header_type, h.multi_function), (1, 0xff0000, 0, false));
    assert_eq!(h.bar_count(), 6);
    assert!(find(&bus, 0xdead, 0xbeef).is_none());
    assert!(Header::read(&bus, f(7, 0)).is_none(), "absent functions read vendor 0xffff");
}

#[test]
fn bars_are_decoded_sized_and_restored() {
    let bus = FakeBus::default();
    bus.add(1, 0, 0x1234, 0x4b44, 0);
    let fun = f(1, 0);
    bus.set_bar(fun, 0, 0xc000_0000, 0xffff_f000); // 32-bit mem, 4 KiB
    bus.set_bar(fun, 1, 0xc001_0000 | 8, 0xffff_0000); // 32-bit prefetchable, 64 KiB
    bus.set_bar(fun, 2, 0x0000_6001, 0x0000_ffe0); // I/O, 32 bytes, 16 address bits
    bus.set_bar(fun, 3, 0x4 | 8, 0); // 64-bit prefetchable: low half
    bus.set_bar(fun, 4, 0x0000_0010, 0xffff_fffc); // high half: 16 GiB at 0x10_0000_0000
                                                   // slot 5 unimplemented (reads 0, no writable bits)
    bus.poke(fun, reg::COMMAND, &(command::MEMORY | command::BUS_MASTER).to_le_bytes());
    let hdr = Header::read(&bus, fun).unwrap();
    let before: Vec<u32> = (0..6).map(|i| bus.read32(fun, 0x10 + 4 * i)).collect();
    let bars = bar::probe_all(&bus, &hdr);
    let mem =
        |index, kind, prefetchable, base, size| Some(Bar { index, kind, prefetchable, base, size });
    assert_eq!(bars[0], mem(0, BarKind::Mem32, false, 0xc000_0000, 4096));
    assert_eq!(bars[1], mem(1, BarKind::Mem32, true, 0xc001_0000, 64 << 10));
    assert_eq!(bars[2], mem(2, BarKind::Io, false, 0x6000, 32));
    assert_eq!(bars[3], mem(3, BarKind::Mem64, true, 0x10_0000_0000, 16 << 30));
    assert_eq!((bars[4], bars[5]), (None, None), "upper half and unimplemented slot");
    let after: Vec<u32> = (0..6).map(|i| bus.read32(fun, 0x10 + 4 * i)).collect();
    assert_eq!(before, after, "BARs restored");
    assert_eq!(
        bus.read16(fun, reg::COMMAND),
        command::MEMORY | command::BUS_MASTER,
        "command restored"
    );
    assert_eq!(bus.bar_writes_while_decoding.get(), 0, "decoding was off while sizing");
    assert_eq!(bar::probe(&bus, &hdr, 3).unwrap().end(), Some(0x14_0000_0000));
    assert!(bar::probe(&bus, &hdr, 9).is_none());
}

#[test]
fn malformed_bars_are_not_reported() {
    let bus = FakeBus::default();
    bus.add(2, 0, 0x1234, 0x0001, 0);
    let fun = f(2, 0);
    bus.set_bar(fun, 0, 0xc000_0000, 0xff0f_f000); // mask with a hole: not a power of two
    bus.set_bar(fun, 1, 0x2, 0xffff_f000); // reserved type 1
    bus.set_bar(fun, 5, 0x4, 0xffff_f000); // 64-bit BAR in the last slot
    let bars = bar::probe_all(&bus, &Header::read(&bus, fun).unwrap());
    assert!(bars.iter().all(Option::is_none), "{bars:?}");
    // A bridge (header type 1) has two BARs only.
    bus.add(4, 0, 0x1234, 0x0002, 1);
    bus.set_bar(f(4, 0), 2, 0xc000_0000, 0xffff_f000);
    let h = Header::read(&bus, f(4, 0)).unwrap();
    assert_eq!(h.bar_count(), 2);
    assert!(bar::probe(&bus, &h, 2).is_none());
}

fn with_caps(bus: &FakeBus, fun: Function, caps: &[(u16, u8, u8)]) {
    bus.poke(fun, reg::STATUS, &reg::STATUS_CAP_LIST.to_le_bytes());
    bus.poke(fun, reg::CAP_PTR, &[caps.first().map_or(0, |c| c.0 as u8)]);
    for &(off, id, next) in caps {
        bus.poke(fun, off, &[id, next]);
    }
}

#[test]
fn capability_walk_follows_the_list_and_is_bounded() {
    let bus = FakeBus::default();
    bus.add(1, 0, 0x1234, 0x4b44, 0);
    let fun = f(1, 0);
    assert_eq!(cap::capabilities(&bus, fun).count(), 0, "no list bit, no capabilities");
    // Low two pointer bits are reserved and ignored.
    with_caps(&bus, fun, &[(0x40, cap::ID_MSI, 0x53), (0x50, cap::ID_MSIX, 0x00)]);
    let caps: Vec<_> = cap::capabilities(&bus, fun).map(|c| (c.id, c.offset)).collect();
    assert_eq!(caps, [(cap::ID_MSI, 0x40), (cap::ID_MSIX, 0x50)]);
    assert_eq!(cap::find(&bus, fun, cap::ID_MSIX).unwrap().offset, 0x50);
    assert!(cap::find(&bus, fun, 0x10).is_none());
    // A list that points at itself ends after 48 entries; one into the header ends at once.
    with_caps(&bus, fun, &[(0x40, 0x09, 0x40)]);
    assert_eq!(cap::capabilities(&bus, fun).count(), 48);
    with_caps(&bus, fun, &[(0x40, 0x09, 0x10)]);
    assert_eq!(cap::capabilities(&bus, fun).count(), 1);
}

#[test]
fn msix_capability_is_decoded_and_enabled_through_its_control_register() {
    let bus = FakeBus::default();
    bus.add(1, 0, 0x1234, 0x4b44, 0);
    let fun = f(1, 0);
    with_caps(&bus, fun, &[(0x40, cap::ID_MSIX, 0)]);
    bus.poke(fun, 0x42, &0u16.to_le_bytes()); // table size 1
    bus.poke(fun, 0x44, &2u32.to_le_bytes()); // table: BAR2 + 0
    bus.poke(fun, 0x48, &(0x800u32 | 2).to_le_bytes()); // PBA: BAR2 + 0x800
    let m = MsixCap::find(&bus, fun).unwrap();
    assert_eq!((m.offset, m.table_size, m.table_bar, m.table_offset), (0x40, 1, 2, 0));
    assert_eq!((m.pba_bar, m.pba_offset), (2, 0x800));
    bus.writes.borrow_mut().clear();
    m.enable_masked(&bus);
    assert_eq!(m.control(&bus), msix_control::ENABLE | msix_control::FUNCTION_MASK);
    m.unmask_function(&bus);
    assert_eq!(m.control(&bus), msix_control::ENABLE);
    m.disable(&bus);
    assert_eq!(m.control(&bus), 0);
    let w = bus.writes.borrow();
    assert!(w.iter().all(|&(r, width, _)| r == 0x42 && width == Width::U16), "{w:?}");
    assert!(MsixCap::find(&bus, f(9, 0)).is_none());
}

#[test]
fn command_bits_are_set_with_16_bit_writes() {
    let bus = FakeBus::default();
    bus.add(1, 0, 0x1234, 0x4b44, 0);
    let fun = f(1, 0);
    crate::enable(&bus, fun, command::MEMORY | command::BUS_MASTER);
    assert_eq!(bus.read16(fun, reg::COMMAND), 6);
    crate::disable(&bus, fun, command::BUS_MASTER);
    assert_eq!(bus.read16(fun, reg::COMMAND), 2);
    assert!(bus.writes.borrow().iter().all(|&(r, w, _)| r == reg::COMMAND && w == Width::U16));
}

/// A fake BAR: 4 KiB of 32-bit registers with a write log.
struct FakeBar {
    regs: RefCell<[u32; 1024]>,
    log: RefCell<Vec<(u64, u32)>>,
}

impl Mmio for &FakeBar {
    fn read32(&self, off: u64) -> u32 {
        self.regs.borrow()[off as usize / 4]
    }
    fn write32(&self, off: u64, v: u32) {
        self.log.borrow_mut().push((off, v));
        self.regs.borrow_mut()[off as usize / 4] = v;
    }
}

#[test]
fn msix_entries_are_masked_while_they_change() {
    let bar = FakeBar { regs: RefCell::new([0; 1024]), log: RefCell::new(Vec::new()) };
    let t = Table::new(&bar, 0x100, 2);
    assert_eq!(msix::message(3, 0x41), (0xfee0_3000, 0x41));
    t.program(1, 3, 0x41, false).unwrap();
    assert_eq!(t.read(1).unwrap(), (0xfee0_3000, 0x41, 0));
    let log = bar.log.borrow().clone();
    assert_eq!(log.first(), Some(&(0x110 + 12, 1)), "masked first: {log:x?}");
    assert_eq!(log.last(), Some(&(0x110 + 12, 0)), "unmasked last: {log:x?}");
    t.program(0, 0, 0x40, true).unwrap();
    assert_eq!(t.read(0).unwrap(), (0xfee0_0000, 0x40, 1));
    t.set_masked(0, false).unwrap();
    assert_eq!(t.read(0).unwrap().2, 0);
    assert_eq!(t.program(2, 0, 0x40, false), Err(MsixError::NoSuchEntry));
    assert_eq!(t.program(0, 0, 14, false), Err(MsixError::BadVector));
    assert_eq!(t.set_masked(5, true), Err(MsixError::NoSuchEntry));
    bar.regs.borrow_mut()[0x800 / 4 + 1] = 1 << 3; // entry 35 pending
    assert!(msix::pending(&&bar, 0x800, 35));
    assert!(!msix::pending(&&bar, 0x800, 34));
}

#[test]
fn bar_pages_split_at_2mib_boundaries() {
    use crate::pages::{chunks, page_range, Chunk, HUGE};
    let mib = 1 << 20;
    assert_eq!(page_range(0xc000_0010, 0x100), Some((0xc000_0000, 0xc000_1000)));
    assert_eq!(page_range(0xc000_0000, 0), None);
    assert_eq!(page_range(u64::MAX - 10, 100), None);
    let all = |s, e| chunks(s, e).collect::<Vec<_>>();
    // Two 4 KiB BARs in one 2 MiB page.
    let base = 0xc000_0000u64;
    assert_eq!(all(base, base + 8192), [Chunk::Pages { start: base, end: base + 8192 }]);
    // A 4 MiB BAR, 2 MiB aligned: two whole pages.
    assert_eq!(all(base, base + 4 * mib), [Chunk::Whole(base), Chunk::Whole(base + HUGE)]);
    // 1..4 MiB: the second half of one 2 MiB page, then a whole one.
    assert_eq!(
        all(base + mib, base + 4 * mib),
        [Chunk::Pages { start: base + mib, end: base + HUGE }, Chunk::Whole(base + HUGE)]
    );
    // Crossing a boundary with partial pages on both sides.
    assert_eq!(
        all(base + HUGE - 4096, base + HUGE + 4096),
        [
            Chunk::Pages { start: base + HUGE - 4096, end: base + HUGE },
            Chunk::Pages { start: base + HUGE, end: base + HUGE + 4096 }
        ]
    );
    assert!(all(base, base).is_empty());
}

#[test]
fn ecam_accesses_land_at_the_function_offsets() {
    use crate::Ecam;
    // A heap buffer stands in for the 1 MiB window (u64 elements keep it 8-byte aligned).
    let mut window = std::vec![0u64; crate::BUS_SPACE as usize / 8];
    let base = window.as_mut_ptr() as usize;
    // SAFETY: `window` is BUS_SPACE bytes, outlives `ecam`, and is only accessed through it.
    let ecam = unsafe { Ecam::new(base) };
    let fun = f(3, 2);
    ecam.write32(fun, 0x10, 0xc000_0000);
    ecam.write16(fun, reg::COMMAND, 0x0006);
    ecam.write(fun, 0x3c, Width::U8, 0xab);
    let byte = |off: u64| {
        let b = window[(off / 8) as usize].to_le_bytes();
        b[(off % 8) as usize]
    };
    let at = fun.ecam_offset();
    assert_eq!(
        [byte(at + 0x10), byte(at + 0x11), byte(at + 0x12), byte(at + 0x13)],
        [0, 0, 0, 0xc0]
    );
    assert_eq!([byte(at + 4), byte(at + 5), byte(at + 6)], [6, 0, 0], "16-bit write only");
    assert_eq!(byte(at + 0x3c), 0xab);
    assert_eq!(ecam.read32(fun, 0x10), 0xc000_0000);
    assert_eq!(ecam.read8(fun, 0x3c), 0xab);
    assert_eq!(ecam.read16(f(3, 1), reg::COMMAND), 0, "a neighbour function is untouched");
}
