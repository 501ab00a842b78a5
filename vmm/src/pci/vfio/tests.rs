//! Unit tests of the VFIO path against a fake device (no VFIO here).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use super::passthrough::{GuestSlots, VfioPci, Wiring};
use super::plan::{self, DmaMapping};
use super::*;
use crate::pci::config::reg;
use crate::pci::host::BarAllocator;
use crate::pci::msix::{MsiMessage, MsiSink, Msix, CTL_ENABLE};
use crate::pci::PciDevice;

/// Everything the fake saw, shared with the test.
#[derive(Default, Debug)]
struct Log {
    config: Vec<u8>,
    bar_writes: Vec<(u32, u64, Vec<u8>)>,
    dma: Vec<(u64, u64, u64)>,
    unmapped: Vec<(u64, u64)>,
    msix_enabled: Option<usize>,
    resets: u32,
    mmaps: HashMap<u64, (u32, u64, u64)>,
    slots: Vec<(u64, u64, u64)>,
    fail_dma_at: Option<u64>,
}

#[derive(Clone)]
struct Fake(Arc<Mutex<Log>>);

/// A VF: vendor 0x10de, BAR0 32-bit 16 MiB, BAR2 64-bit 1 GiB prefetchable,
/// BAR1 32-bit 256 bytes, BAR4 32-bit 64 KiB holding the MSI-X table (4
/// vectors) at 0x2000 and the PBA at 0x3000, an I/O BAR 5; capabilities:
/// PM (0x40) -> MSI-X (0x50).
fn fake() -> Fake {
    let mut c = vec![0u8; 256];
    let put = |c: &mut Vec<u8>, at: usize, v: u32| c[at..at + 4].copy_from_slice(&v.to_le_bytes());
    put(&mut c, 0, 0x2330_10de);
    put(&mut c, 4, 1 << 20);
    put(&mut c, 0x10, 0);
    put(&mut c, 0x18, 0b1100);
    put(&mut c, 0x20, 0);
    put(&mut c, 0x24, 1);
    put(&mut c, 0x30, 0xfff0_0000);
    c[0x34] = 0x40;
    put(&mut c, 0x40, 0x0003_5001);
    put(&mut c, 0x50, 0x0003_0011);
    put(&mut c, 0x54, 0x2004);
    put(&mut c, 0x58, 0x3004);
    Fake(Arc::new(Mutex::new(Log { config: c, ..Log::default() })))
}

impl VfioLayer for Fake {
    fn region(&self, index: u32) -> Option<RegionInfo> {
        let size = match index {
            0 => 16 << 20,
            2 => 1 << 30,
            4 => 64 << 10,
            1 => 256,
            5 => 256,
            CONFIG_REGION => 256,
            _ => return None,
        };
        Some(RegionInfo { size, mmap: index != CONFIG_REGION })
    }
    fn read(&self, index: u32, offset: u64, data: &mut [u8]) {
        let l = self.0.lock().unwrap();
        let o = offset as usize;
        if index == CONFIG_REGION && o + data.len() <= 256 {
            data.copy_from_slice(&l.config[o..o + data.len()]);
        } else {
            data.fill(0xab);
        }
    }
    fn write(&self, index: u32, offset: u64, data: &[u8]) {
        let mut l = self.0.lock().unwrap();
        let o = offset as usize;
        if index == CONFIG_REGION && o + data.len() <= 256 {
            l.config[o..o + data.len()].copy_from_slice(data);
        } else {
            l.bar_writes.push((index, offset, data.to_vec()));
        }
    }
    fn dma_map(&mut self, iova: u64, size: u64, host: u64) -> Result<(), VfioError> {
        let mut l = self.0.lock().unwrap();
        if l.fail_dma_at == Some(iova) {
            let addr = "fake".to_string();
            return Err(VfioError::Vfio { addr, what: "DMA map", detail: "EFAULT".into() });
        }
        l.dma.push((iova, size, host));
        Ok(())
    }
    fn dma_unmap(&mut self, iova: u64, size: u64) {
        self.0.lock().unwrap().unmapped.push((iova, size));
    }
    fn enable_msix(&mut self, fds: &[&vmm_sys_util::eventfd::EventFd]) -> Result<(), VfioError> {
        self.0.lock().unwrap().msix_enabled = Some(fds.len());
        Ok(())
    }
    fn disable_msix(&mut self) {
        self.0.lock().unwrap().msix_enabled = None;
    }
    fn reset(&mut self) {
        self.0.lock().unwrap().resets += 1;
    }
    fn mmap(&mut self, index: u32, offset: u64, size: u64) -> Result<u64, VfioError> {
        let mut l = self.0.lock().unwrap();
        let host = 0x7f00_0000_0000 + l.mmaps.len() as u64 * (1 << 32);
        l.mmaps.insert(host, (index, offset, size));
        Ok(host)
    }
    fn munmap(&mut self, host: u64, size: u64) {
        let mut l = self.0.lock().unwrap();
        assert_eq!(l.mmaps.remove(&host).map(|m| m.2), Some(size), "unmaps what was mapped");
    }
}

impl GuestSlots for Fake {
    fn map(&mut self, gpa: u64, size: u64, host: u64) -> Result<u32, String> {
        let mut l = self.0.lock().unwrap();
        l.slots.push((gpa, size, host));
        Ok(l.slots.len() as u32 - 1)
    }
    fn unmap(&mut self, handle: u32) {
        self.0.lock().unwrap().slots[handle as usize].1 = 0;
    }
}

struct NullSink;
impl MsiSink for NullSink {
    fn route(&mut self, _: u16, _: Option<MsiMessage>) {}
    fn fire(&mut self, _: u16) {}
}

const RAM: [(u64, u64, u64); 2] =
    [(0, 3 << 30, 0x7000_0000_0000), (4 << 30, 2 << 30, 0x7000_c000_0000)];

fn open(f: &Fake) -> Result<VfioPci, VfioError> {
    let mut b32 = BarAllocator::new("32-bit", 0xc000_0000, 256 << 20);
    let mut b64 = BarAllocator::new("64-bit", 8 << 30, 64 << 30);
    let mut msix = |n: u16| -> Result<(Msix, Vec<_>), String> {
        let fds = (0..n).map(|_| vmm_sys_util::eventfd::EventFd::new(0).unwrap()).collect();
        Ok((Msix::new(n, Box::new(NullSink)), fds))
    };
    let w = Wiring { ram: &RAM, bars32: &mut b32, bars64: &mut b64, msix: &mut msix };
    VfioPci::open("0000:3b:00.2", Box::new(f.clone()), Box::new(f.clone()), w)
}

fn cfg32(d: &mut VfioPci, off: u16) -> u32 {
    let mut b = [0u8; 4];
    d.config_read(off, &mut b);
    u32::from_le_bytes(b)
}

#[test]
fn dma_maps_every_ram_range_and_nothing_else() {
    let f = fake();
    let dev = open(&f).unwrap();
    let want: Vec<_> = RAM.to_vec();
    assert_eq!(f.0.lock().unwrap().dma, want);
    assert_eq!(dev.dma()[1], DmaMapping { iova: 4 << 30, size: 2 << 30, host: 0x7000_c000_0000 });
    assert!(plan::dma_plan(&[(0, 0x2000, 1), (0x1000, 0x1000, 2)]).is_err(), "overlap");
    assert!(plan::dma_plan(&[(0, 0, 1)]).is_err(), "empty");
}

#[test]
fn msix_capability_is_found_through_the_list() {
    let f = fake();
    let l = plan::find_msix(&f).unwrap();
    assert_eq!((l.cap, l.vectors, l.table, l.pba), (0x50, 4, (4, 0x2000), (4, 0x3000)));
    // A looping list ends.
    f.0.lock().unwrap().config[0x51] = 0x40;
    f.0.lock().unwrap().config[0x50] = 0x05;
    assert_eq!(plan::find_msix(&f), None);
}

#[test]
fn bars_are_placed_and_msix_pages_trapped() {
    let f = fake();
    let dev = open(&f).unwrap();
    let b = dev.bars();
    assert_eq!(b.len(), 4, "BAR0, BAR1, BAR2 (64-bit), BAR4; the I/O BAR 5 is skipped");
    assert_eq!((b[0].index, b[0].addr, b[0].is_64), (0, 0xc000_0000, false));
    assert_eq!((b[1].index, b[1].addr, b[1].size), (1, 0xc100_0000, 0x1000), "a page at least");
    assert_eq!((b[2].index, b[2].addr, b[2].is_64, b[2].prefetchable), (2, 8 << 30, true, true));
    assert_eq!((b[3].index, b[3].addr), (4, 0xc101_0000));
    assert_eq!(b[0].direct, vec![0..16 << 20]);
    assert!(b[1].direct.is_empty(), "a sub-page BAR is trapped whole");
    assert_eq!(b[3].direct, vec![0..0x2000, 0x4000..0x1_0000], "table + PBA pages trapped");
    let l = f.0.lock().unwrap();
    let slots: Vec<_> = l.slots.iter().map(|s| (s.0, s.1)).collect();
    assert_eq!(
        slots,
        vec![
            (0xc000_0000, 16 << 20),
            (8 << 30, 1 << 30),
            (0xc101_0000, 0x2000),
            (0xc101_4000, 0xc000)
        ]
    );
    assert_eq!(l.resets, 1, "reset on open");
}

#[test]
fn config_space_is_virtualised() {
    let f = fake();
    let mut d = open(&f).unwrap();
    assert_eq!(cfg32(&mut d, reg::ID), 0x2330_10de, "passed through");
    assert_eq!(cfg32(&mut d, reg::BAR0), 0xc000_0000);
    assert_eq!(cfg32(&mut d, reg::BAR0 + 8), 0xc);
    assert_eq!(cfg32(&mut d, reg::BAR0 + 12), 2);
    assert_eq!(cfg32(&mut d, 0x30), 0, "no ROM");
    // Sizing BAR2 (64-bit, 1 GiB) answers from the shadow; the device never sees it.
    d.config_write(reg::BAR0 + 8, &[0xff; 4]);
    d.config_write(reg::BAR0 + 12, &[0xff; 4]);
    assert_eq!(cfg32(&mut d, reg::BAR0 + 8), 0xc000_000c);
    assert_eq!(cfg32(&mut d, reg::BAR0 + 12), 0xffff_ffff);
    assert_eq!(&f.0.lock().unwrap().config[0x18..0x20], &[0xc, 0, 0, 0, 0, 0, 0, 0]);
    d.config_write(0x30, &[0xff; 4]);
    assert_eq!(cfg32(&mut d, 0x30), 0);
    // Command goes to the device and drives decoding.
    d.config_write(reg::COMMAND, &6u16.to_le_bytes());
    assert_eq!(f.0.lock().unwrap().config[4], 6);
    assert_eq!(d.decoded_bars().len(), 3, "BAR2 mid-sizing does not decode");
}

#[test]
fn msix_enable_is_emulated_and_wired_to_vfio() {
    let f = fake();
    let mut d = open(&f).unwrap();
    let ctl = |d: &mut VfioPci| cfg32(d, 0x50) >> 16;
    assert_eq!(ctl(&mut d), 3, "table size 4, not enabled");
    d.config_write(0x52, &CTL_ENABLE.to_le_bytes());
    assert_eq!(ctl(&mut d), 0x8003);
    assert_eq!(f.0.lock().unwrap().msix_enabled, Some(4));
    assert_eq!(f.0.lock().unwrap().config[0x53], 0, "the device's own control is untouched");
    // The table is emulated; the PBA and other BAR bytes come from the device.
    d.bar_write(4, 0x2000, &0xfee0_0000u32.to_le_bytes());
    let mut b = [0u8; 4];
    d.bar_read(4, 0x2000, &mut b);
    assert_eq!(u32::from_le_bytes(b), 0xfee0_0000);
    d.bar_write(4, 0x3000, &[1; 4]);
    d.bar_read(4, 0x3000, &mut b);
    assert_eq!(b, [0xab; 4]);
    assert!(f.0.lock().unwrap().bar_writes.is_empty(), "PBA writes are dropped");
    d.config_write(0x50, &0u32.to_le_bytes());
    assert_eq!(f.0.lock().unwrap().msix_enabled, None);
}

#[test]
fn drop_undoes_everything_and_resets() {
    let f = fake();
    let mut d = open(&f).unwrap();
    d.config_write(0x52, &CTL_ENABLE.to_le_bytes());
    drop(d);
    let l = f.0.lock().unwrap();
    assert_eq!(l.msix_enabled, None);
    assert!(l.mmaps.is_empty(), "every BAR mapping unmapped");
    assert!(l.slots.iter().all(|s| s.1 == 0), "every KVM slot removed");
    assert_eq!(l.unmapped, vec![(0, 3 << 30), (4 << 30, 2 << 30)]);
    assert_eq!(l.resets, 2, "reset on open and on release");
}

#[test]
fn failure_midway_is_cleaned_up() {
    let f = fake();
    f.0.lock().unwrap().fail_dma_at = Some(4 << 30);
    assert!(matches!(open(&f), Err(VfioError::Vfio { what: "DMA map", .. })));
    let l = f.0.lock().unwrap();
    assert_eq!(l.unmapped, vec![(0, 3 << 30)], "the first range is unmapped again");
    assert_eq!(l.resets, 2);
}

#[test]
fn addresses_are_checked() {
    assert_eq!(parse_address("0000:00:1F.7").unwrap(), "0000:00:1f.7");
    for bad in [
        "",
        "00:1f.7",
        "0000:00:1f",
        "0000:00:1f.8",
        "0000:00:20.0",
        "000g:00:1f.7",
        "0000:00:1f.7x",
    ] {
        assert!(matches!(parse_address(bad), Err(VfioError::BadAddress(_))), "{bad}");
    }
}

#[test]
fn preflight_names_what_is_missing() {
    let root = tempfile_dir();
    let r = root.as_path();
    let msg = |e: VfioError| e.to_string();
    let e = preflight(r, "0000:00:1f.7").unwrap_err();
    assert!(matches!(e, VfioError::NoVfio { .. }));
    assert!(msg(e).contains("/dev/vfio does not exist"));
    std::fs::create_dir_all(r.join("dev/vfio")).unwrap();
    let e = preflight(r, "0000:00:1f.7").unwrap_err();
    assert!(matches!(e, VfioError::NoDevice { .. }), "{e}");
    let dev = r.join("sys/bus/pci/devices/0000:00:1f.7");
    std::fs::create_dir_all(&dev).unwrap();
    assert!(msg(preflight(r, "0000:00:1f.7").unwrap_err()).contains("bound to no driver"));
    std::os::unix::fs::symlink("../../drivers/nvidia", dev.join("driver")).unwrap();
    assert!(
        msg(preflight(r, "0000:00:1f.7").unwrap_err()).contains("bound to nvidia, not vfio-pci")
    );
    std::fs::remove_file(dev.join("driver")).unwrap();
    std::os::unix::fs::symlink("../../drivers/vfio-pci", dev.join("driver")).unwrap();
    assert!(matches!(preflight(r, "0000:00:1f.7"), Err(VfioError::NoGroup { .. })));
    std::os::unix::fs::symlink("../../../kernel/iommu_groups/17", dev.join("iommu_group")).unwrap();
    assert!(matches!(preflight(r, "0000:00:1f.7"), Err(VfioError::NoGroupNode { group: 17, .. })));
    std::fs::write(r.join("dev/vfio/17"), b"").unwrap();
    assert_eq!(preflight(r, "0000:00:1f.7").unwrap(), (dev, 17));
    std::fs::remove_dir_all(r).unwrap();
}

fn tempfile_dir() -> std::path::PathBuf {
    let p = std::env::temp_dir().join(format!("kore-vfio-preflight-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&p);
    std::fs::create_dir_all(&p).unwrap();
    p
}

#[test]
fn this_host_has_no_vfio_and_says_so() {
    let e = preflight(std::path::Path::new("/"), "0000:00:1f.7").unwrap_err();
    if std::path::Path::new("/dev/vfio").exists() {
        // A VFIO host: whatever is wrong, it is not that VFIO is missing.
        assert!(!matches!(e, VfioError::NoVfio { .. }), "{e}");
        return;
    }
    assert_eq!(e.to_string().lines().count(), 1);
    assert!(e.to_string().contains("/dev/vfio does not exist"), "{e}");
}
