//! PCI: configuration-space emulation, MSI-X, the ECAM host bridge and the
//! functions behind it, in the shape of Cloud Hypervisor's `pci` crate.
//!
//! - [`config::ConfigSpace`]: a type-0 header with memory BARs and a
//!   capability list.
//! - [`msix::Msix`]: the MSI-X capability, table and PBA, with masking.
//! - [`PciDevice`]: what a function implements; the host bridge routes
//!   config (ECAM) and BAR accesses to it.

pub mod config;
pub mod host;
pub mod irq;
// Compiled for unit tests too, so `cargo test -p kore-vmm` always runs its tests.
#[cfg(any(test, feature = "test-devices"))]
pub mod kore_dma;
pub mod msix;
pub mod vfio;

/// A PCI function behind the host bridge.
pub trait PciDevice: Send {
    /// A config read of 1, 2 or 4 aligned bytes at `offset` (< 4096).
    fn config_read(&mut self, offset: u16, data: &mut [u8]);
    /// A config write of 1, 2 or 4 aligned bytes at `offset` (< 4096).
    fn config_write(&mut self, offset: u16, data: &[u8]);
    /// Memory ranges the function decodes now: `(bar, addr, size)`.
    fn decoded_bars(&self) -> Vec<(usize, u64, u64)>;
    /// A read at `offset` inside BAR `bar`.
    fn bar_read(&mut self, bar: usize, offset: u64, data: &mut [u8]);
    /// A write at `offset` inside BAR `bar`.
    fn bar_write(&mut self, bar: usize, offset: u64, data: &[u8]);
}
