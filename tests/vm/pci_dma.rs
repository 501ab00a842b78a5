//! Kore + kore-test-image on the Kore VMM with the emulated PCI DMA engine (kore-dma, kore-vmm
//! feature `test-devices`): the guest finds it on bus 0 by vendor/device id, maps its BARs in
//! ring 3 through the kernel, and runs 1,000 verified DMA copies each completed by MSI-X; a
//! misbehaving guest sees the device's errors and the VMM carries on; the kernel keeps the BAR
//! window from ring 3 outside the mapped BARs.

use std::time::Duration;

use kore_e2e::boot::{boot, config, images, Outcome};

const TIMEOUT: Duration = Duration::from_secs(300);

fn show(o: &Outcome) -> String {
    format!("status {}\nconsole:\n{}", o.status, o.console.join("\n"))
}

fn boot_pci(cmdline: &str) -> Outcome {
    let img = images().unwrap();
    boot(config(&img, 2, cmdline).pci_test_device(true), TIMEOUT).unwrap()
}

/// The number before `suffix` on the console line holding `prefix`.
fn number_before(o: &Outcome, prefix: &str, suffix: &str) -> Option<u64> {
    let line = o.console.iter().find(|l| l.contains(prefix))?;
    let head = &line[..line.find(suffix)?];
    head.rsplit(|c: char| !c.is_ascii_digit()).next()?.parse().ok()
}

#[test]
fn thousand_dma_copies_each_completed_by_msix_are_verified() {
    let o = boot_pci("test=pci-dma copies=1000");
    assert_eq!(o.status, 0, "{}", show(&o));
    for line in [
        "1234:4b44 rev 1 class ff0000",
        "pci kore-dma at",
        "pci-dma: 1000 copies verified",
        "overlapping copy ok (memmove)",
        "10 copies completed by MSI-X on CPU 1 (APIC id 1)",
        "masked vector: pending=true, delivered on unmask, cleared=true",
        "pci-dma ok",
        "0 failure(s)",
    ] {
        assert!(o.said(line), "missing {line:?}\n{}", show(&o));
    }
    assert!(o.said("sizes 1..=2097152"), "the 1-byte and 2 MiB copies ran\n{}", show(&o));
    // Each copy waits at least once, and each return of WAIT needs an interrupt: nothing else
    // interrupts this guest, so 1,000 returns are the 1,000 MSI-X completions.
    let waits = number_before(&o, "copies verified", " interrupt wait(s)").unwrap();
    assert_eq!(waits, 1000, "{}", show(&o));
}

#[test]
fn a_misbehaving_guest_sees_errors_and_the_vmm_carries_on() {
    // A preloaded file stands in for the pack: read-only guest memory the device may read.
    let img = images().unwrap();
    let file = kore_e2e::tiny_pack().join("pack.toml");
    let cfg = config(&img, 2, "test=pci-evil").pci_test_device(true).preload(file);
    let o = boot(cfg, TIMEOUT).unwrap();
    assert_eq!(o.status, 0, "{}", show(&o));
    for line in [
        "config unaligned read 0xffffffff, ids after write 0x4b441234, absent vendor Some(ffff)",
        "bar0 <- RAM 0x8000000: reads 0x8000000, map_bar Err(OutsideWindow)",
        "bar0 <- LAPIC 0xfee00000: reads 0xfee00000, map_bar Err(OutsideWindow)",
        "map_bar Some(NoBar); bar0 restored, magic 0x414d444b",
        "bar0 moved to fresh 2 MiB pages: 7 mapped, then Some(NoPageTables)",
        "map_bar bar6 Some(NoBar), absent function Some(Some(NoFunction))",
        "dma src in the device window: error SourceNotRam",
        "dma dst on its own BAR: error DestinationNotRam",
        "dma dst far above RAM: error DestinationNotRam",
        "dma src wrapping around: error SourceNotRam",
        "dma src crossing the end of RAM: error SourceNotRam",
        "dma length 0: error BadLength",
        "dma length 64 MiB + 1: error BadLength",
        "dma dst in the ECAM window: error DestinationNotRam",
        "dma dst in the read-only pack: error DestinationNotRam",
        "dma src in the pack (data equal): done",
        "dma bus master off: error BusMasterDisabled",
        "msix address outside the APIC window: copy finished=true",
        "msix upper address set: copy finished=true",
        "msix absent APIC id 0x7f: copy finished=true",
        "entry 0 reprogrammed",
        "doorbell while busy:",
        "pci-evil: device still works",
        "pci-evil ok",
    ] {
        assert!(o.said(line), "missing {line:?}\n{}", show(&o));
    }
    // The same process boots the next VM with the device and copies as before.
    let again = boot_pci("test=pci-dma copies=20");
    assert_eq!(again.status, 0, "{}", show(&again));
    assert!(again.said("pci-dma: 20 copies verified"), "{}", show(&again));
}

#[test]
fn ring3_cannot_touch_the_bar_window_outside_its_bars() {
    let o = boot_pci("fault=pci-window");
    assert_eq!(o.status, 64 + 14, "{}", show(&o));
    assert!(o.said("CPU exception vector=14 in ring 3"), "{}", show(&o));
    assert!(o.said("cr2=00000000c8000000"), "{}", show(&o));
}

#[test]
fn the_appliance_lists_the_pci_functions_it_was_given() {
    let img = kore_e2e::boot::appliance_images().unwrap();
    let pack = kore_e2e::tiny_pack();
    let mut cfg = config(&img, 1, "selftest=1").pci_test_device(true);
    for f in ["pack.toml", "weights.safetensors", "tokenizer.json"] {
        cfg = cfg.preload(pack.join(f));
    }
    let o = boot(cfg, TIMEOUT).unwrap();
    assert_eq!(o.status, 0, "{}", show(&o));
    assert!(o.said("kore-appliance: pci 00.0 1234:4b44 rev 1 class ff0000"), "{}", show(&o));
}

#[test]
fn without_the_device_the_pci_mode_says_so() {
    let img = images().unwrap();
    let o = boot(config(&img, 1, "test=pci-dma"), TIMEOUT).unwrap();
    assert_eq!(o.status, 1, "{}", show(&o));
    assert!(o.said("pci-dma FAILED: no PCI host bridge in the boot info"), "{}", show(&o));
}
