//! The PCI host bridge of a VM: the ECAM window and the BAR windows on the
//! MMIO bus, the functions behind them (the kore-dma test device when asked
//! for, a VFIO passthrough function when [`VmConfig::vf`] is set), their
//! MSI-X through KVM, and the boot-info entry that describes it.
//! A VM without PCI functions gets no bridge at all.

use std::ops::Range;
use std::sync::{Arc, Mutex};

use kore_boot_abi::{layout, Device, DeviceKind};
use kvm_ioctls::VmFd;
use vm_memory::GuestMemoryMmap;

use super::{DeviceError, Devices};
use crate::config::VmConfig;
use crate::memory::RamPlan;
use crate::pci::host::{BarAllocator, BarWindow, Ecam, PciRoot};
use crate::pci::irq::GsiRouter;
use crate::pci::PciDevice;

/// Guest RAM as DMA sees it: everything readable, the preloaded files not writable.
pub fn dma_ranges(plan: &RamPlan) -> (Vec<Range<u64>>, Vec<Range<u64>>) {
    let readable: Vec<_> = plan.ranges.iter().map(|r| r.base..r.base + r.size).collect();
    let pack = layout::PACK_BASE..layout::PACK_BASE + plan.pack_bytes;
    let writable = readable
        .iter()
        .map(|r| if r.start == pack.start { pack.end.min(r.end)..r.end } else { r.clone() })
        .filter(|r| !r.is_empty())
        .collect();
    (readable, writable)
}

/// The 64-bit BAR window: from the first GiB boundary at or above the end
/// of guest RAM (and 4 GiB), 64 GiB, capped at the highest address the
/// guest's page-directory area covers (`MAX_PD` GiB).
pub fn mmio64_window(plan: &RamPlan) -> (u64, u64) {
    let base = plan.end().max(layout::DEVICE_WINDOW_END).next_multiple_of(layout::GIB);
    let top = (layout::MAX_PD * layout::GIB).min(base + 64 * layout::GIB);
    (base, top.saturating_sub(base))
}

/// The functions this VM's configuration asks for, with BARs placed.
fn functions(
    vm: &Arc<VmFd>,
    mem: &GuestMemoryMmap,
    plan: &RamPlan,
    config: &VmConfig,
    router: &Arc<GsiRouter>,
    bars32: &mut BarAllocator,
) -> Result<Vec<Arc<Mutex<dyn PciDevice>>>, DeviceError> {
    let mut fns: Vec<Arc<Mutex<dyn PciDevice>>> = Vec::new();
    #[cfg(feature = "test-devices")]
    if config.pci_test_device {
        fns.push(kore_dma(mem, plan, router, bars32)?);
    }
    if let Some(addr) = &config.vf {
        fns.push(vfio_function(vm, mem, plan, addr, router, bars32)?);
    }
    Ok(fns)
}

/// Opens the VF and presents it (checks first, so a missing piece is named).
fn vfio_function(
    vm: &Arc<VmFd>,
    mem: &GuestMemoryMmap,
    plan: &RamPlan,
    addr: &str,
    router: &Arc<GsiRouter>,
    bars32: &mut BarAllocator,
) -> Result<Arc<Mutex<dyn PciDevice>>, DeviceError> {
    use crate::pci::irq::KvmMsiSink;
    use crate::pci::msix::Msix;
    use crate::pci::vfio::host::{HostVfio, KvmSlots};
    use crate::pci::vfio::passthrough::{VfioPci, Wiring};
    use vm_memory::{GuestMemoryBackend, GuestMemoryRegion};
    let (path, group) = crate::pci::vfio::preflight(std::path::Path::new("/"), addr)?;
    let layer = HostVfio::open(vm, addr, &path, group)?;
    let ram: Vec<(u64, u64, u64)> =
        mem.iter().map(|r| (r.start_addr().0, r.len(), r.as_ptr() as u64)).collect();
    let (base64, size64) = mmio64_window(plan);
    let mut bars64 = BarAllocator::new("64-bit", base64, size64);
    let mut msix = |n: u16| -> Result<(Msix, Vec<_>), String> {
        let sink = KvmMsiSink::new(router.clone(), n).map_err(|e| e.to_string())?;
        let (sink, fds) = sink.into_passthrough().map_err(|e| e.to_string())?;
        Ok((Msix::new(n, Box::new(sink)), fds))
    };
    let w = Wiring { ram: &ram, bars32, bars64: &mut bars64, msix: &mut msix };
    let slots = Box::new(KvmSlots::new(vm.clone(), VFIO_FIRST_SLOT));
    let dev = VfioPci::open(addr, Box::new(layer), slots, w)?;
    for b in dev.bars() {
        tracing::info!("VF {addr}: BAR{} at {:#x} ({:#x} bytes)", b.index, b.addr, b.size);
    }
    Ok(Arc::new(Mutex::new(dev)))
}

/// First KVM memory slot for passed-through BARs (guest RAM uses 0 and 1).
const VFIO_FIRST_SLOT: u32 = 16;

#[cfg(feature = "test-devices")]
fn kore_dma(
    mem: &GuestMemoryMmap,
    plan: &RamPlan,
    router: &Arc<GsiRouter>,
    bars32: &mut BarAllocator,
) -> Result<Arc<Mutex<dyn PciDevice>>, DeviceError> {
    use crate::pci::irq::KvmMsiSink;
    use crate::pci::kore_dma::{DmaMemory, KoreDma, BAR_SIZE};
    let (readable, writable) = dma_ranges(plan);
    let dma = DmaMemory::new(mem.clone(), readable, writable);
    let sink = KvmMsiSink::new(router.clone(), 1)?;
    let (bar0, bar2) = (bars32.alloc(BAR_SIZE)?, bars32.alloc(BAR_SIZE)?);
    let dev = KoreDma::new(bar0, bar2, dma, Box::new(sink))?;
    tracing::info!("PCI 00:00.0 kore-dma test device, BAR0 {bar0:#x}, BAR2 {bar2:#x}");
    Ok(Arc::new(Mutex::new(dev)))
}

/// Builds the bus if any function is configured: ECAM and BAR windows on
/// the MMIO bus, a [`DeviceKind::PciHostBridge`] boot entry.
pub fn attach_pci(
    vm: &Arc<VmFd>,
    mem: &GuestMemoryMmap,
    plan: &RamPlan,
    config: &VmConfig,
    devices: &mut Devices,
) -> Result<(), DeviceError> {
    let router = Arc::new(GsiRouter::new(vm.clone()));
    let mut bars32 = BarAllocator::new("32-bit", layout::PCI_MMIO32_BASE, layout::PCI_MMIO32_SIZE);
    let fns = functions(vm, mem, plan, config, &router, &mut bars32)?;
    if fns.is_empty() {
        return Ok(());
    }
    let mut root = PciRoot::new();
    for f in fns {
        root.add(f)?;
    }
    let root = Arc::new(root);
    devices.mmio.insert(
        Arc::new(Mutex::new(Ecam(root.clone()))),
        layout::PCI_ECAM_BASE,
        layout::PCI_ECAM_SIZE,
    )?;
    let window = BarWindow { root: root.clone(), base: layout::PCI_MMIO32_BASE };
    devices.mmio.insert(
        Arc::new(Mutex::new(window)),
        layout::PCI_MMIO32_BASE,
        layout::PCI_MMIO32_SIZE,
    )?;
    let (base64, size64) = mmio64_window(plan);
    if config.vf.is_some() && size64 > 0 {
        let window = BarWindow { root, base: base64 };
        devices.mmio.insert(Arc::new(Mutex::new(window)), base64, size64)?;
    }
    devices.boot.push(Device {
        kind: DeviceKind::PciHostBridge as u32,
        gsi: 0,
        mmio_base: layout::PCI_ECAM_BASE,
        mmio_size: layout::PCI_ECAM_SIZE,
        vector: 0,
        reserved: 0,
        arg0: layout::PCI_MMIO32_BASE,
    });
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dma_never_writes_the_pack() {
        let plan = RamPlan::new(256 << 20, 6 << 20, 2 << 20).unwrap();
        let (r, w) = dma_ranges(&plan);
        let pack = layout::PACK_BASE;
        assert_eq!(r, vec![0..256 << 20, pack..pack + (6 << 20)]);
        assert_eq!(w, vec![0..256 << 20], "the high range is all pack: nothing writable there");
        let plan = RamPlan::new(4 << 30, 6 << 20, 2 << 20).unwrap();
        let (_, w) = dma_ranges(&plan);
        assert_eq!(w[1].start, pack + (6 << 20), "RAM after the pack is writable");
    }

    #[test]
    fn mmio64_window_sits_above_ram() {
        let gib = layout::GIB;
        let small = RamPlan::new(256 << 20, 0, 2 << 20).unwrap();
        assert_eq!(mmio64_window(&small), (4 * gib, 64 * gib));
        let big = RamPlan::new(8 * gib, 20 * gib + 4096, 2 << 20).unwrap();
        let (base, size) = mmio64_window(&big);
        assert!(base >= big.end() && base % gib == 0 && size == 64 * gib);
        let huge = RamPlan::new(200 * gib, 0, 2 << 20).unwrap();
        let (base, size) = mmio64_window(&huge);
        assert_eq!(base + size, layout::MAX_PD * gib, "capped at what page tables reach");
    }
}
