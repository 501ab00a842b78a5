//! Host tests of the boot ABI.

use super::*;
use core::mem::{offset_of, size_of};

#[test]
fn no_padding_and_serialisation_matches_layout() {
    // Sum of field sizes equals the struct size: no implicit padding, so
    // to_bytes() is exactly the in-memory representation.
    let fields = 8 + 4 * 3 + 2 * 4 + 4 + 8 + 8 + 2 * 24 + 8 + 8 + 4 * 4;
    let arrays = MAX_MEM_REGIONS * size_of::<MemRegion>()
        + MAX_FILES * size_of::<PreloadedFile>()
        + MAX_DEVICES * size_of::<Device>()
        + MAX_CMDLINE;
    assert_eq!(size_of::<BootInfo>(), fields + arrays);
    assert_eq!(size_of::<MemRegion>(), 24);
    assert_eq!(size_of::<PreloadedFile>(), 24 + MAX_FILE_NAME);
    assert_eq!(size_of::<Device>(), 40);
    assert_eq!(offset_of!(BootInfo, ap_entry), BootInfo::AP_ENTRY_OFFSET);

    let mut info = BootInfo::new();
    info.vcpu_count = 3;
    info.tsc_khz = 2_596_000;
    info.ap_entry = 0x1122_3344_5566_7788;
    info.xcr0 = 0x7;
    info.push_file(b"weights.safetensors", layout::PACK_BASE, 12345).unwrap();
    info.set_cmdline(b"hello").unwrap();
    let mut bytes = [0u8; size_of::<BootInfo>()];
    info.to_bytes(&mut bytes);
    let at = |off: usize, n: usize| &bytes[off..off + n];
    assert_eq!(at(0, 8), b"KOREBOOT");
    assert_eq!(at(offset_of!(BootInfo, vcpu_count), 4), &3u32.to_le_bytes());
    assert_eq!(at(offset_of!(BootInfo, tsc_khz), 8), &2_596_000u64.to_le_bytes());
    assert_eq!(at(BootInfo::AP_ENTRY_OFFSET, 8), &0x1122_3344_5566_7788u64.to_le_bytes());
    assert_eq!(at(offset_of!(BootInfo, xcr0), 8), &0x7u64.to_le_bytes());
    assert_eq!(at(offset_of!(BootInfo, files_len), 4), &1u32.to_le_bytes());
    let f0 = offset_of!(BootInfo, files);
    assert_eq!(at(f0, 8), &layout::PACK_BASE.to_le_bytes());
    assert_eq!(at(f0 + 24, 19), b"weights.safetensors");
    assert_eq!(at(offset_of!(BootInfo, cmdline), 5), b"hello");
    assert_eq!(at(offset_of!(BootInfo, marker_port), 2), &ports::MARKER.to_le_bytes());
}

#[test]
fn validate_rejects_bad_blocks() {
    let mut info = BootInfo::new();
    assert_eq!(info.validate(), Ok(()));
    info.magic = 1;
    assert_eq!(info.validate(), Err(BootInfoError::BadMagic));
    let mut info = BootInfo::new();
    info.version = 99;
    assert_eq!(info.validate(), Err(BootInfoError::VersionMismatch { found: 99 }));
    let mut info = BootInfo::new();
    info.mem_map_len = MAX_MEM_REGIONS as u32 + 1;
    assert_eq!(info.validate(), Err(BootInfoError::LengthOutOfRange));
    let mut info = BootInfo::new();
    info.push_mem_region(0x20_0000, 0x20_0000, MemKind::Usable).unwrap();
    info.push_mem_region(0x30_0000, 0x20_0000, MemKind::Usable).unwrap();
    assert_eq!(info.validate(), Err(BootInfoError::BadMemoryMap));
    let mut info = BootInfo::new();
    info.push_mem_region(0, 0x20_0000, MemKind::Usable).unwrap();
    info.mem_map[0].kind = 77;
    assert_eq!(info.validate(), Err(BootInfoError::BadMemoryMap));
}

#[test]
fn tables_fill_up_cleanly() {
    let mut info = BootInfo::new();
    for i in 0..MAX_FILES {
        info.push_file(b"f", i as u64, 1).unwrap();
    }
    assert_eq!(info.push_file(b"g", 0, 1), Err(BootInfoError::Full));
    assert_eq!(info.push_file(&[b'x'; MAX_FILE_NAME + 1], 0, 1), Err(BootInfoError::TooLong));
    assert_eq!(info.set_cmdline(&[b'x'; MAX_CMDLINE + 1]), Err(BootInfoError::TooLong));
    assert!(info.file(b"f").is_some());
    assert!(info.file(b"nope").is_none());
    for _ in 0..MAX_DEVICES {
        info.push_device(Device::default()).unwrap();
    }
    assert_eq!(info.push_device(Device::default()), Err(BootInfoError::Full));
}

#[test]
fn layout_is_consistent() {
    use layout::*;
    assert_eq!(stack_top(1) - STACK_SLOT, stack_top(0));
    assert!(ist1_top(0) < stack_top(0));
    assert_eq!(tss(2), CPU_PAGES + 2 * PAGE + TSS_OFFSET);
    assert_eq!(pde_address(0x20_0000), PD_BASE + 8);
    assert_eq!(pde_address(GIB + 0x40_0000), PD_BASE + PAGE + 16);
    assert_eq!(align_up_huge(1), HUGE_PAGE);
    assert_eq!(align_up_huge(HUGE_PAGE), HUGE_PAGE);
    assert_eq!(align_up_huge(u64::MAX), !(HUGE_PAGE - 1));
    const {
        assert!(VIRTIO_MMIO_BASE >= DEVICE_WINDOW && VIRTIO_MMIO_BASE < IOAPIC_BASE);
        assert!(LAPIC_BASE < DEVICE_WINDOW_END);
        assert!(HEAP_BASE < MIN_MEMORY);
    }
}

#[test]
fn tss_descriptor_encodes_base_and_limit() {
    let [lo, hi] = entry::tss_descriptor(0x1234_5678_9abc_def0, 0x1_2345);
    assert_eq!(lo & 0xffff, 0x2345);
    assert_eq!((lo >> 16) & 0xff_ffff, 0xbc_def0);
    assert_eq!((lo >> 40) & 0xff, 0x89);
    assert_eq!((lo >> 48) & 0xf, 1);
    assert_eq!(lo >> 56, 0x9a);
    assert_eq!(hi, 0x1234_5678);
    assert_eq!(entry::TSS_LIMIT as u64, layout::TSS_IOMAP_OFFSET + 0x400 / 8);
}

#[test]
fn ring3_ports() {
    for p in 0x3f8..0x400 {
        assert!(ports::ring3_allowed(p));
    }
    assert!(!ports::ring3_allowed(0x3f7));
    assert!(!ports::ring3_allowed(0x400));
    assert!((ports::DEBUG_EXIT as u64) < layout::IOMAP_PORTS);
    assert!((ports::MARKER as u64) < layout::IOMAP_PORTS);
}

#[test]
fn pci_windows() {
    assert_eq!(layout::pci_ecam_offset(0, 0, 0), 0);
    assert_eq!(layout::pci_ecam_offset(1, 0, 0x10), 0x8010);
    assert_eq!(layout::pci_ecam_offset(31, 7, 0xffc), layout::PCI_ECAM_SIZE - 4);
    assert_eq!(DeviceKind::PciHostBridge as u32, 2);
    // Where the windows sit is checked at compile time (layout.rs).
}
