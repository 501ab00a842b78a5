//! `test=pci-evil`: a guest that abuses kore-dma and the PCI bus, then checks that the device
//! still works. Every probe prints one `pci-evil:` line saying what the guest saw; the VM test
//! reads them. The abuse stays within what this guest survives itself (no NMI/INIT messages,
//! no DMA over its own kernel): the point is that the VMM survives and reports errors.

extern crate alloc;

use alloc::format;
use alloc::string::String;
use alloc::vec;

use kore_kdma::{reg, Error};
use kore_rt::abi::layout;
use kore_rt::pci::{self, command, msix::Mmio};
use kore_rt::{kcall, println};

use crate::pcidev::{self, Dev};

const BAR0: u16 = kore_pci::reg::BAR0;

/// Runs every probe; `Err` only if the device no longer works afterwards.
pub fn run() -> Result<(), String> {
    let dev = pcidev::open()?;
    config_abuse(&dev);
    bar_abuse(&dev);
    dma_abuse(&dev);
    msix_abuse(&dev);
    busy_doorbell(&dev);
    still_works(&dev)
}

fn config_abuse(dev: &Dev) {
    use kore_pci::ConfigSpace;
    let f = dev.hdr.function;
    let ecam = layout::PCI_ECAM_BASE + f.ecam_offset();
    // SAFETY: the ECAM window is user-mapped; an unaligned 4-byte read at +2 is the test.
    let unaligned = unsafe { ((ecam + 2) as *const u32).read_unaligned() };
    dev.cfg.write32(f, 0, 0xdead_beef); // vendor/device ids are read-only
    let ids = dev.cfg.read32(f, 0);
    let absent = kore_pci::Function::new(31, 7).map(|g| dev.cfg.read16(g, 0));
    println!(
        "kore-test-image: pci-evil: config unaligned read {unaligned:#x}, ids after write {ids:#x}, absent vendor {absent:x?}"
    );
}

fn bar_abuse(dev: &Dev) {
    use kore_pci::ConfigSpace;
    let (cfg, f) = (&dev.cfg, dev.hdr.function);
    let orig = cfg.read32(f, BAR0);
    for (what, v) in [("RAM", 0x0800_0000u32), ("LAPIC", 0xfee0_0000), ("all-ones", u32::MAX)] {
        cfg.write32(f, BAR0, v);
        let now = cfg.read32(f, BAR0);
        let map = pci::map_bar(f, 0);
        println!(
            "kore-test-image: pci-evil: bar0 <- {what} {v:#x}: reads {now:#x}, map_bar {map:?}"
        );
    }
    cfg.write32(f, BAR0 + 4, 0x1234_5678); // BAR1: unimplemented
    let bar1 = (cfg.read32(f, BAR0 + 4), pci::map_bar(f, 1).err());
    cfg.write32(f, BAR0, orig);
    let magic = dev.dma.regs().read32(reg::MAGIC);
    println!(
        "kore-test-image: pci-evil: bar1 garbage reads {:#x}, map_bar {:?}; bar0 restored, magic {magic:#x}",
        bar1.0, bar1.1
    );
    pool_exhaustion(dev, orig);
    let bad_index = pci::map_bar(f, 6).err();
    let no_fn = kore_pci::Function::new(31, 0).map(|g| pci::map_bar(g, 0).err());
    println!("kore-test-image: pci-evil: map_bar bar6 {bad_index:?}, absent function {no_fn:?}");
}

/// Moves BAR0 to 9 fresh 2 MiB pages of the window and maps each: the kernel's pool of page
/// tables (8, one already used for the device's own BARs) runs out with a clear error.
fn pool_exhaustion(dev: &Dev, orig: u32) {
    use kore_pci::ConfigSpace;
    let (cfg, f) = (&dev.cfg, dev.hdr.function);
    let mut mapped = 0;
    let mut last = None;
    for k in 0..9u32 {
        cfg.write32(f, BAR0, layout::PCI_MMIO32_BASE as u32 + (64 << 20) + k * (2 << 20));
        match pci::map_bar(f, 0) {
            Ok(_) => mapped += 1,
            Err(e) => {
                last = Some(e);
                break;
            }
        }
    }
    cfg.write32(f, BAR0, orig);
    println!("kore-test-image: pci-evil: bar0 moved to fresh 2 MiB pages: {mapped} mapped, then {last:?}");
}

/// The end of the highest usable RAM region.
fn ram_end() -> u64 {
    let info = kore_rt::boot_info();
    let usable =
        info.mem_regions().iter().filter(|r| r.kind == kore_rt::abi::MemKind::Usable as u32);
    usable.map(|r| r.base + r.size).max().unwrap_or(0)
}

fn dma_abuse(dev: &Dev) {
    let buf = vec![0x5au8; 8192];
    let ok = buf.as_ptr() as u64;
    let end = ram_end();
    let cases: [(&str, u64, u64, u64); 8] = [
        ("src in the device window", layout::VIRTIO_MMIO_BASE, ok, 64),
        ("dst on its own BAR", ok, dev.dma.regs().base(), 64),
        ("dst far above RAM", ok, 1 << 46, 64),
        ("src wrapping around", u64::MAX - 7, ok, 16),
        ("src crossing the end of RAM", end - 4096, ok, 8192),
        ("length 0", ok, ok + 4096, 0),
        ("length 64 MiB + 1", ok, ok + 4096, kore_kdma::MAX_LEN + 1),
        ("dst in the ECAM window", ok, layout::PCI_ECAM_BASE, 64),
    ];
    for (what, src, dst, len) in cases {
        report(what, dev.dma.copy(src, dst, len, kcall::wait));
    }
    if let Some((_, file)) = kore_rt::preloaded_files().next() {
        let n = file.len().min(64);
        let gpa = file.as_ptr() as u64;
        report("dst in the read-only pack", dev.dma.copy(ok, gpa, n as u64, kcall::wait));
        let mut got = vec![0u8; n];
        let r = dev.dma.copy(gpa, got.as_mut_ptr() as u64, n as u64, kcall::wait);
        let same = got[..] == file[..n];
        report(
            if same { "src in the pack (data equal)" } else { "src in the pack (DATA DIFFERS)" },
            r,
        );
    }
    kore_pci::disable(&dev.cfg, dev.hdr.function, command::BUS_MASTER);
    report("bus master off", dev.dma.copy(ok, ok + 4096, 64, kcall::wait));
    kore_pci::enable(&dev.cfg, dev.hdr.function, command::BUS_MASTER);
}

fn report(what: &str, r: Result<kore_kdma::Completion, Error>) {
    let outcome = match r {
        Ok(_) => String::from("done"),
        Err(Error::Device(e)) => format!("error {e:?}"),
        Err(e) => format!("{e}"),
    };
    println!("kore-test-image: pci-evil: dma {what}: {outcome}");
}

/// Garbage MSI-X entries (each then used by a small copy, polled, not waited for), writes
/// past the table and into the PBA, odd-width writes; then entry 0 is reprogrammed.
fn msix_abuse(dev: &Dev) {
    let t = dev.table.bar();
    let buf = vec![1u8; 4096];
    let a = buf.as_ptr() as u64;
    let cases: [(&str, u32, u32, u32); 4] = [
        ("address outside the APIC window", 0x1234_5678, 0, 0x41),
        ("upper address set", 0xfee0_0000, 0xdead_beef, 0x41),
        ("another CPU's vector 0x4f", 0xfee0_0000, 0, 0x4f),
        ("absent APIC id 0x7f", 0xfee7_f000, 0, 0x41),
    ];
    for (what, lo, hi, data) in cases {
        t.write32(0, lo);
        t.write32(4, hi);
        t.write32(8, data);
        t.write32(12, 0);
        let target = dev.dma.completed() + 1;
        dev.dma.start(a, a + 2048, 1024);
        let finished = dev.poll_completed(target, 2000);
        println!(
            "kore-test-image: pci-evil: msix {what}: copy finished={finished}, status {:?}",
            dev.dma.status()
        );
    }
    for off in (0x10..0x800).step_by(0x1f0) {
        t.write32(off, 0xffff_ffff); // entries past the table size
    }
    t.write32(dev.msix.pba_offset as u64, 0xffff_ffff); // the PBA is read-only
    dev.table.bar().write8(1, 0xaa); // odd-width write into entry 0
    dev.dma.regs().write8(reg::DOORBELL, 1); // odd-width doorbell: ignored
    let pba = t.read32(dev.msix.pba_offset as u64);
    dev.reprogram();
    println!("kore-test-image: pci-evil: msix table scribbled past the end, pba reads {pba:#x}, entry 0 reprogrammed");
}

/// Two doorbells back to back on a 32 MiB copy: the second may find the device busy.
fn busy_doorbell(dev: &Dev) {
    let mut big = vec![0u8; 64 << 20];
    let a = big.as_mut_ptr() as u64;
    let before = dev.dma.completed();
    dev.dma.start(a, a + (32 << 20), 32 << 20);
    dev.dma.regs().write32(reg::DOORBELL, 1);
    let (status, error) = (dev.dma.status(), dev.dma.error());
    let both = dev.poll_completed(before + 2, 5000);
    let n = dev.dma.completed() - before;
    println!(
        "kore-test-image: pci-evil: doorbell while busy: status {status:?} error {error:?} right after, {n} completion(s) (both={both})"
    );
    big[0] = 0;
}

fn still_works(dev: &Dev) -> Result<(), String> {
    let src: alloc::vec::Vec<u8> = (0..100_000u32).map(|i| (i * 7) as u8).collect();
    let mut dst = vec![0u8; src.len()];
    let c = dev
        .dma
        .copy(src.as_ptr() as u64, dst.as_mut_ptr() as u64, src.len() as u64, kcall::wait)
        .map_err(|e| format!("copy after the abuse: {e}"))?;
    if src != dst {
        return Err("copy after the abuse: data differs".into());
    }
    println!(
        "kore-test-image: pci-evil: device still works ({} wait(s)), completed {}",
        c.waits,
        dev.dma.completed()
    );
    Ok(())
}
