//! The real [`VfioLayer`]: `vfio-ioctls` over the legacy container/group
//! interface (the group of the function's IOMMU group, registered with KVM's
//! VFIO device), and [`KvmSlots`], BAR mappings as KVM memory slots.
//!
//! Nothing here runs on a host without VFIO; [`super::preflight`] stops
//! first with a one-line error. These types are exercised only on a host
//! with an IOMMU and a VF bound to vfio-pci (see docs/vmm.md).

use std::path::Path;
use std::sync::Arc;

use kvm_bindings::{
    kvm_create_device, kvm_device_type_KVM_DEV_TYPE_VFIO, kvm_userspace_memory_region,
};
use kvm_ioctls::VmFd;
use vfio_bindings::bindings::vfio::{VFIO_PCI_MSIX_IRQ_INDEX, VFIO_REGION_INFO_FLAG_MMAP};
use vfio_ioctls::{VfioContainer, VfioDevice, VfioDeviceFd};
use vmm_sys_util::eventfd::EventFd;

use super::passthrough::GuestSlots;
use super::{RegionInfo, VfioError, VfioLayer};

/// A function opened through VFIO.
pub struct HostVfio {
    addr: String,
    device: VfioDevice,
    container: Arc<VfioContainer>,
}

impl HostVfio {
    /// Opens the function at sysfs `path` (after [`super::preflight`]).
    pub fn open(vm: &VmFd, addr: &str, path: &Path, group: u32) -> Result<Self, VfioError> {
        let fail = |what: &'static str| {
            move |e: vfio_ioctls::VfioError| match e {
                vfio_ioctls::VfioError::GroupViable => {
                    VfioError::NotViable { addr: addr.to_string(), group }
                }
                e => VfioError::Vfio { addr: addr.to_string(), what, detail: e.to_string() },
            }
        };
        let mut kvm_vfio =
            kvm_create_device { type_: kvm_device_type_KVM_DEV_TYPE_VFIO, fd: 0, flags: 0 };
        let kvm_dev = vm.create_device(&mut kvm_vfio).map_err(|e| VfioError::Vfio {
            addr: addr.to_string(),
            what: "KVM VFIO device",
            detail: e.to_string(),
        })?;
        let handle = Arc::new(VfioDeviceFd::new_from_kvm(kvm_dev));
        let container = Arc::new(VfioContainer::new(Some(handle)).map_err(fail("container"))?);
        let device =
            VfioDevice::new(path, container.clone(), false).map_err(fail("open device"))?;
        Ok(Self { addr: addr.to_string(), device, container })
    }

    fn err(&self, what: &'static str, e: impl std::fmt::Display) -> VfioError {
        VfioError::Vfio { addr: self.addr.clone(), what, detail: e.to_string() }
    }
}

impl VfioLayer for HostVfio {
    fn region(&self, index: u32) -> Option<RegionInfo> {
        let size = self.device.get_region_size(index);
        let mmap = self.device.get_region_flags(index) & VFIO_REGION_INFO_FLAG_MMAP != 0;
        (size > 0).then_some(RegionInfo { size, mmap })
    }

    fn read(&self, index: u32, offset: u64, data: &mut [u8]) {
        data.fill(0xff);
        self.device.region_read(index, data, offset);
    }

    fn write(&self, index: u32, offset: u64, data: &[u8]) {
        self.device.region_write(index, data, offset);
    }

    fn dma_map(&mut self, iova: u64, size: u64, host: u64) -> Result<(), VfioError> {
        // SAFETY: `host..host + size` is guest RAM: a live mapping the VM owns
        // for as long as this device exists (dropped before guest memory), and
        // only ever accessed through volatile guest-memory accessors.
        unsafe { self.container.vfio_dma_map(iova, size as usize, host as *mut u8) }
            .map_err(|e| self.err("DMA map", e))
    }

    fn dma_unmap(&mut self, iova: u64, size: u64) {
        if let Err(e) = self.container.vfio_dma_unmap(iova, size as usize) {
            tracing::warn!("VF {}: DMA unmap {iova:#x}: {e}", self.addr);
        }
    }

    fn enable_msix(&mut self, fds: &[&EventFd]) -> Result<(), VfioError> {
        self.device
            .enable_irq(VFIO_PCI_MSIX_IRQ_INDEX, fds.to_vec())
            .map_err(|e| self.err("MSI-X enable", e))
    }

    fn disable_msix(&mut self) {
        if let Err(e) = self.device.disable_irq(VFIO_PCI_MSIX_IRQ_INDEX) {
            tracing::warn!("VF {}: MSI-X disable: {e}", self.addr);
        }
    }

    fn reset(&mut self) {
        self.device.reset();
    }

    fn mmap(&mut self, index: u32, offset: u64, size: u64) -> Result<u64, VfioError> {
        let file_offset = self.device.get_region_offset(index) + offset;
        // SAFETY: a fresh shared mapping of the device fd at a kernel-chosen
        // address; the result is checked below and unmapped in `munmap`.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                size as usize,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                std::os::fd::AsRawFd::as_raw_fd(&self.device),
                file_offset as libc::off_t,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(self.err("BAR mmap", std::io::Error::last_os_error()));
        }
        Ok(p as u64)
    }

    fn munmap(&mut self, host: u64, size: u64) {
        // SAFETY: `host..host + size` is a mapping made by `mmap` above and no
        // longer registered with KVM (the slot was removed first).
        unsafe { libc::munmap(host as *mut libc::c_void, size as usize) };
    }
}

/// BAR mappings as KVM memory slots, numbered from `first`.
pub struct KvmSlots {
    vm: Arc<VmFd>,
    next: u32,
    live: Vec<(u32, u64)>,
}

impl KvmSlots {
    /// Slots `first..` of `vm` (above those of guest RAM).
    pub fn new(vm: Arc<VmFd>, first: u32) -> Self {
        Self { vm, next: first, live: Vec::new() }
    }

    fn set(&self, slot: u32, gpa: u64, size: u64, host: u64) -> Result<(), kvm_ioctls::Error> {
        let region = kvm_userspace_memory_region {
            slot,
            flags: 0,
            guest_phys_addr: gpa,
            memory_size: size,
            userspace_addr: host,
        };
        // SAFETY: `host..host + size` is a live device mapping owned by the
        // VfioPci that asked for it; it removes the slot (size 0) before
        // unmapping it.
        unsafe { self.vm.set_user_memory_region(region) }
    }
}

impl GuestSlots for KvmSlots {
    fn map(&mut self, gpa: u64, size: u64, host: u64) -> Result<u32, String> {
        let slot = self.next;
        self.set(slot, gpa, size, host).map_err(|e| e.to_string())?;
        self.next += 1;
        self.live.push((slot, gpa));
        Ok(slot)
    }

    fn unmap(&mut self, handle: u32) {
        if let Some(i) = self.live.iter().position(|(s, _)| *s == handle) {
            let (slot, gpa) = self.live.remove(i);
            if let Err(e) = self.set(slot, gpa, 0, 0) {
                tracing::warn!("removing KVM slot {slot}: {e}");
            }
        }
    }
}

/// Real KVM: a BAR-sized host mapping becomes a memory slot and goes away
/// again (the slot half of passthrough; the VFIO half needs a VFIO host).
#[cfg(all(test, feature = "kvm-tests"))]
mod tests {
    use super::*;
    use vm_memory::{GuestAddress, GuestMemoryBackend, GuestMemoryMmap};

    #[test]
    fn kvm_slots_map_and_unmap() {
        let kvm = kvm_ioctls::Kvm::new().unwrap();
        let vm = Arc::new(kvm.create_vm().unwrap());
        let bar = GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), 0x4000)]).unwrap();
        let host = bar.iter().next().unwrap().as_ptr() as u64;
        let mut slots = KvmSlots::new(vm, 16);
        let a = slots.map(0xc000_0000, 0x2000, host).unwrap();
        let b = slots.map(0xc000_3000, 0x1000, host + 0x3000).unwrap();
        assert_eq!((a, b), (16, 17));
        assert!(slots.map(0xc000_0000, 0x1000, host).is_err(), "overlapping slot refused");
        slots.unmap(a);
        slots.unmap(b);
        assert!(slots.live.is_empty());
        // The range is free again.
        slots.map(0xc000_0000, 0x1000, host).unwrap();
    }
}
