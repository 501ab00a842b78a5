//! Tests of the emulated configuration space.

use super::*;

fn read32(c: &ConfigSpace, off: u16) -> u32 {
    let mut d = [0u8; 4];
    c.read(off, &mut d);
    u32::from_le_bytes(d)
}

fn write32(c: &mut ConfigSpace, off: u16, v: u32) {
    assert!(c.write(off, &v.to_le_bytes()));
}

fn dev() -> ConfigSpace {
    let mut c = ConfigSpace::new(0x1234, 0x4b44, 0xff_0000, 1);
    let bar = |addr, size, is_64| BarSpec { addr, size, is_64, prefetchable: false };
    c.add_bar(0, bar(0xc000_0000, 0x1000, false)).unwrap();
    c.add_bar(2, bar(0x40_0000_0000, 0x4000_0000, true)).unwrap();
    c
}

#[test]
fn header_identity_and_readonly_fields() {
    let mut c = dev();
    assert_eq!(read32(&c, reg::ID), 0x4b44_1234);
    assert_eq!(read32(&c, reg::CLASS), 0xff00_0001);
    write32(&mut c, reg::ID, 0);
    write32(&mut c, reg::CLASS, 0);
    assert_eq!(read32(&c, reg::ID), 0x4b44_1234, "IDs are read-only");
    assert_eq!(read32(&c, reg::CLASS), 0xff00_0001);
    let mut b = [0u8; 2];
    c.read(reg::ID + 2, &mut b);
    assert_eq!(u16::from_le_bytes(b), 0x4b44);
    let mut b = [0u8; 1];
    c.read(reg::CLASS, &mut b);
    assert_eq!(b[0], 1, "revision byte");
}

#[test]
fn command_register_masks_and_byte_writes() {
    let mut c = dev();
    assert_eq!(c.command(), 0, "the VMM leaves the command register 0");
    assert!(c.write(reg::COMMAND, &[0xff]));
    assert_eq!(c.command(), cmd::MEMORY | cmd::BUS_MASTER);
    assert!(c.write(reg::COMMAND + 1, &[0xff]));
    assert_eq!(c.command(), cmd::MEMORY | cmd::BUS_MASTER | cmd::INTX_DISABLE);
    // A write of the status half does not touch the command half.
    assert!(c.write(reg::COMMAND + 2, &[0, 0]));
    assert_eq!(c.command(), cmd::MEMORY | cmd::BUS_MASTER | cmd::INTX_DISABLE);
}

#[test]
fn misaligned_and_odd_sizes_are_refused() {
    let mut c = dev();
    let mut d = [0u8; 4];
    c.read(reg::COMMAND + 1, &mut d);
    assert_eq!(d, [0xff; 4]);
    let mut d3 = [0u8; 3];
    c.read(0, &mut d3);
    assert_eq!(d3, [0xff; 3]);
    assert!(!c.write(reg::COMMAND + 2, &[1, 2, 3, 4]));
    assert!(!c.write(reg::COMMAND, &[7u8; 8]));
    assert!(!c.write(0x1000, &[0; 4]));
    let mut e = [1u8; 4];
    c.read(0x100, &mut e);
    assert_eq!(e, [0; 4], "extended space reads as zero");
    assert_eq!(c.command(), 0);
}

#[test]
fn bar_sizing_32bit_and_restore() {
    let mut c = dev();
    assert_eq!(read32(&c, reg::BAR0), 0xc000_0000);
    write32(&mut c, reg::BAR0, 0xffff_ffff);
    assert_eq!(read32(&c, reg::BAR0), 0xffff_f000, "4 KiB, 32-bit, non-prefetchable");
    write32(&mut c, reg::BAR0 + 4, 0xffff_ffff);
    assert_eq!(read32(&c, reg::BAR0 + 4), 0, "an unimplemented BAR sizes to 0");
    write32(&mut c, reg::BAR0, 0xc000_0000);
    assert_eq!(c.bar_addr(0), Some(0xc000_0000));
    // Low bits are dropped: an unaligned address cannot be programmed.
    write32(&mut c, reg::BAR0, 0xc000_0123);
    assert_eq!(read32(&c, reg::BAR0), 0xc000_0000);
}

#[test]
fn bar_sizing_64bit() {
    let mut c = dev();
    let lo = reg::BAR0 + 8;
    assert_eq!(read32(&c, lo), 0x4 /* 64-bit type */);
    assert_eq!(read32(&c, lo + 4), 0x40);
    write32(&mut c, lo, 0xffff_ffff);
    write32(&mut c, lo + 4, 0xffff_ffff);
    assert_eq!(read32(&c, lo), 0xc000_0004);
    assert_eq!(read32(&c, lo + 4), 0xffff_ffff);
    let size = !(u64::from(read32(&c, lo + 4)) << 32 | u64::from(read32(&c, lo) & !0xf)) + 1;
    assert_eq!(size, 0x4000_0000);
    write32(&mut c, lo, 0);
    write32(&mut c, lo + 4, 0x40);
    assert_eq!(c.bar_addr(2), Some(0x40_0000_0000));
}

#[test]
fn decoding_follows_memory_enable_and_sizing() {
    let mut c = dev();
    assert!(c.decoded_bars().is_empty(), "Memory Space off");
    write32(&mut c, reg::COMMAND, u32::from(cmd::MEMORY));
    assert_eq!(c.decoded_bars(), vec![(0, 0xc000_0000, 0x1000), (2, 0x40_0000_0000, 0x4000_0000)]);
    write32(&mut c, reg::BAR0, 0xffff_ffff);
    assert_eq!(c.decoded_bars().len(), 1, "a BAR being sized does not decode");
}

#[test]
fn bad_bars_are_refused() {
    let mut c = ConfigSpace::new(1, 2, 0, 0);
    let bar = |addr, size, is_64| BarSpec { addr, size, is_64, prefetchable: false };
    let err = |r: Result<(), ConfigError>| matches!(r, Err(ConfigError::BadBar { .. }));
    assert!(err(c.add_bar(6, bar(0, 0x1000, false))));
    assert!(err(c.add_bar(5, bar(0, 0x1000, true))));
    assert!(err(c.add_bar(0, bar(0x800, 0x1000, false))));
    assert!(err(c.add_bar(0, bar(0, 0x1800, false))));
    assert!(err(c.add_bar(0, bar(0x1_0000_0000, 0x1000, false))));
    c.add_bar(0, bar(0, 0x1000, true)).unwrap();
    assert!(err(c.add_bar(1, bar(0x1000, 0x1000, false))));
    assert!(err(c.add_bar(0, bar(0x1000, 0x1000, false))));
}

#[test]
fn capability_list_is_linked() {
    let mut c = ConfigSpace::new(1, 2, 0, 0);
    assert_eq!(read32(&c, reg::COMMAND) & STATUS_CAP_LIST, 0);
    let a = c.add_capability(&[0x11, 0xee, 1, 2], &[0, 0, 0xff, 0]).unwrap();
    let b = c.add_capability(&[0x09, 0, 7, 7, 7, 7], &[0; 6]).unwrap();
    assert_eq!(read32(&c, reg::COMMAND) & STATUS_CAP_LIST, STATUS_CAP_LIST);
    let mut p = [0u8];
    c.read(reg::CAP_PTR, &mut p);
    assert_eq!(p[0] as u16, a);
    c.read(a + 1, &mut p);
    assert_eq!(p[0] as u16, b, "next pointer filled in");
    c.read(b + 1, &mut p);
    assert_eq!(p[0], 0, "list ends");
    assert!(c.write(a, &[0xff, 0xff, 0xff, 0xff]));
    assert_eq!(read32(&c, a), u32::from_le_bytes([0x11, b as u8, 0xff, 2]));
    let big = [0u8; 200];
    assert_eq!(c.add_capability(&big, &big), Err(ConfigError::NoRoom(200)));
}
