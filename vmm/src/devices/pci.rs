//! The PCI host bridge of a VM: the ECAM window and the BAR windows on the
//! MMIO bus, the functions behind them (the kore-dma test device when asked
//! for), their MSI-X through KVM, and the boot-info entry that describes it.
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

/// The functions this VM's configuration asks for, with BARs placed.
fn functions(
    _vm: &Arc<VmFd>,
    _mem: &GuestMemoryMmap,
    _plan: &RamPlan,
    _config: &VmConfig,
    _router: &Arc<GsiRouter>,
    _bars32: &mut BarAllocator,
) -> Result<Vec<Arc<Mutex<dyn PciDevice>>>, DeviceError> {
    #[allow(unused_mut)]
    let mut fns: Vec<Arc<Mutex<dyn PciDevice>>> = Vec::new();
    #[cfg(feature = "test-devices")]
    if _config.pci_test_device {
        fns.push(kore_dma(_mem, _plan, _router, _bars32)?);
    }
    Ok(fns)
}

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
    let window = BarWindow { root, base: layout::PCI_MMIO32_BASE };
    devices.mmio.insert(
        Arc::new(Mutex::new(window)),
        layout::PCI_MMIO32_BASE,
        layout::PCI_MMIO32_SIZE,
    )?;
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
}
