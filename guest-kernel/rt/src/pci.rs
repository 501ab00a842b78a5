//! PCI from ring 3: configuration space through the ECAM window, BARs mapped by the kernel.
//!
//! [`config`] gives bus 0's configuration space (kore-pci over the boot info's host
//! bridge); [`map_bar`] asks the kernel for one memory BAR's pages (uncached) and returns
//! its registers as [`BarRegs`]; MSI-X messages use the vectors
//! `MSIX_VECTOR_BASE..+MSIX_VECTORS`, whose interrupts end a [`crate::kcall::wait`].

pub use kore_pci::msix::Mmio;
pub use kore_pci::{bar, cap, command, enumerate, find, msix, Ecam, Function, Header};

pub use crate::kcall::MapBarError;
use kore_guest_abi::{layout, DeviceKind, MSIX_VECTORS, MSIX_VECTOR_BASE};

/// Bus 0's configuration space, if the VMM attached a PCI host bridge.
pub fn config() -> Option<Ecam> {
    let bridge = crate::boot_info().devices().iter().find(|d| {
        d.kind == DeviceKind::PciHostBridge as u32 && d.mmio_base == layout::PCI_ECAM_BASE
    })?;
    // SAFETY: the ECAM window is in the device window, mapped uncached for ring 3 (boot ABI).
    Some(unsafe { Ecam::new(bridge.mmio_base as usize) })
}

/// Prints one console line per function on bus 0 (`<tag>: pci DD.F VVVV:DDDD rev R class
/// CCCCCC`); nothing without a host bridge.
pub fn list(tag: &str) {
    let Some(cfg) = config() else { return };
    for h in enumerate(&cfg) {
        let f = h.function;
        crate::println!(
            "{tag}: pci {:02x}.{} {:04x}:{:04x} rev {} class {:06x}",
            f.dev(),
            f.func(),
            h.vendor,
            h.device,
            h.revision,
            h.class
        );
    }
}

/// The interrupt vector for MSI-X message `i` (< `MSIX_VECTORS`), or `None`.
pub fn msix_vector(i: u8) -> Option<u8> {
    (i < MSIX_VECTORS).then_some(MSIX_VECTOR_BASE + i)
}

/// A memory BAR the kernel mapped for ring 3.
#[derive(Clone, Copy, Debug)]
pub struct BarRegs {
    base: u64,
    size: u64,
}

/// Maps memory BAR `index` of `f` (see [`crate::kcall::map_bar`]). Call it while setting the
/// device up: the kernel sizes the BAR, switching the function's decoding off for a moment.
pub fn map_bar(f: Function, index: u8) -> Result<BarRegs, MapBarError> {
    let (base, size) = crate::kcall::map_bar(f.ecam_offset(), index)?;
    Ok(BarRegs { base, size })
}

impl BarRegs {
    /// The BAR's guest-physical (= virtual) address.
    pub fn base(&self) -> u64 {
        self.base
    }

    /// The BAR's size in bytes.
    pub fn size(&self) -> u64 {
        self.size
    }

    fn at<T>(&self, off: u64) -> *mut T {
        let w = core::mem::size_of::<T>() as u64;
        assert!(
            off.checked_add(w).is_some_and(|e| e <= self.size.max(layout::PAGE)),
            "BAR offset {off:#x} outside the BAR"
        );
        (self.base + off) as *mut T
    }

    /// Reads a byte (for tests of odd-width accesses).
    pub fn read8(&self, off: u64) -> u8 {
        // SAFETY: `at` keeps the access inside the mapped BAR pages.
        unsafe { self.at::<u8>(off).read_volatile() }
    }

    /// Writes a byte (for tests of odd-width accesses).
    pub fn write8(&self, off: u64, v: u8) {
        // SAFETY: as for `read8`.
        unsafe { self.at::<u8>(off).write_volatile(v) }
    }
}

impl Mmio for BarRegs {
    fn read32(&self, off: u64) -> u32 {
        debug_assert!(off.is_multiple_of(4));
        // SAFETY: the kernel mapped the BAR's pages for ring 3, uncached; `at` bounds the offset.
        unsafe { self.at::<u32>(off).read_volatile() }
    }

    fn write32(&self, off: u64, v: u32) {
        debug_assert!(off.is_multiple_of(4));
        // SAFETY: as for `read32`.
        unsafe { self.at::<u32>(off).write_volatile(v) }
    }

    fn read64(&self, off: u64) -> u64 {
        debug_assert!(off.is_multiple_of(8));
        // SAFETY: as for `read32`.
        unsafe { self.at::<u64>(off).read_volatile() }
    }

    fn write64(&self, off: u64, v: u64) {
        debug_assert!(off.is_multiple_of(8));
        // SAFETY: as for `read32`.
        unsafe { self.at::<u64>(off).write_volatile(v) }
    }
}
