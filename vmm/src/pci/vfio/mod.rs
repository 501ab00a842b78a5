//! VFIO passthrough of a host PCI function (an SR-IOV VF) to the guest.
//!
//! The device is reached through [`VfioLayer`], a small trait over what the
//! VMM needs from VFIO: region info and access, DMA mapping, MSI-X eventfds,
//! BAR mmap and reset. [`host::HostVfio`] implements it with `vfio-ioctls`
//! (container + group of the function's IOMMU group); unit tests implement
//! it with a fake. On top of it:
//!
//! - [`plan`]: which guest memory is DMA-mapped (every RAM range, nothing
//!   else), where each BAR goes in guest-physical space and which of its
//!   pages are mapped straight to the device versus trapped (MSI-X table
//!   and PBA), and where the MSI-X capability is.
//! - [`passthrough::VfioPci`]: the [`super::PciDevice`]: config space passed
//!   through except BARs (emulated, with sizing), the ROM BAR (absent) and
//!   MSI-X (emulated with [`super::msix::Msix`], the device's vectors wired
//!   to KVM irqfds); reset on start and stop, teardown on drop.
//! - [`preflight`]: one-line errors naming what is missing before anything
//!   is opened (`/dev/vfio`, the device, its driver, its IOMMU group).

pub mod host;
pub mod passthrough;
pub mod plan;

use std::path::{Path, PathBuf};

use vmm_sys_util::eventfd::EventFd;

/// Errors setting up passthrough. Each names what is missing or wrong.
#[derive(Debug, thiserror::Error)]
pub enum VfioError {
    /// The address is not `DDDD:BB:DD.F`.
    #[error("--vf {0}: not a PCI address (want DDDD:BB:DD.F, e.g. 0000:3b:00.2)")]
    BadAddress(String),
    /// No VFIO on this host.
    #[error(
        "--vf {addr}: /dev/vfio does not exist: this host has no VFIO (enable the IOMMU with \
         intel_iommu=on or amd_iommu=on and load vfio-pci, see docs/host-setup.md)"
    )]
    NoVfio {
        /// The function asked for.
        addr: String,
    },
    /// No such PCI function.
    #[error("--vf {addr}: no such PCI device ({} does not exist)", path.display())]
    NoDevice {
        /// The function asked for.
        addr: String,
        /// Its sysfs path.
        path: PathBuf,
    },
    /// The function is bound to another driver (or none).
    #[error("--vf {addr}: bound to {driver}, not vfio-pci (run `kore-launch setup`)")]
    WrongDriver {
        /// The function.
        addr: String,
        /// Its driver, or "no driver".
        driver: String,
    },
    /// The function has no IOMMU group.
    #[error("--vf {addr}: no IOMMU group (the IOMMU is off: intel_iommu=on or amd_iommu=on)")]
    NoGroup {
        /// The function.
        addr: String,
    },
    /// The group's device node is missing.
    #[error("--vf {addr}: /dev/vfio/{group} does not exist (is vfio-pci bound?)")]
    NoGroupNode {
        /// The function.
        addr: String,
        /// Its IOMMU group.
        group: u32,
    },
    /// The group is not viable.
    #[error(
        "--vf {addr}: IOMMU group {group} is not viable: bind every device in it to vfio-pci \
         (or no driver)"
    )]
    NotViable {
        /// The function.
        addr: String,
        /// Its IOMMU group.
        group: u32,
    },
    /// A VFIO call failed.
    #[error("--vf {addr}: VFIO {what} failed: {detail}")]
    Vfio {
        /// The function.
        addr: String,
        /// The operation.
        what: &'static str,
        /// The error.
        detail: String,
    },
    /// The device cannot be presented (no usable BAR, bad capability...).
    #[error("--vf {addr}: {reason}")]
    Unsupported {
        /// The function.
        addr: String,
        /// Why.
        reason: String,
    },
}

/// What VFIO says about one region (a BAR, the config space...).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RegionInfo {
    /// Size in bytes (0: absent).
    pub size: u64,
    /// The region can be mmapped.
    pub mmap: bool,
}

/// VFIO region index of the PCI config space.
pub const CONFIG_REGION: u32 = 7;

/// What the VMM needs from a VFIO device (a fake in unit tests).
pub trait VfioLayer: Send {
    /// Region `index` (0..=5 BARs, [`CONFIG_REGION`]), if present.
    fn region(&self, index: u32) -> Option<RegionInfo>;
    /// Reads `data.len()` bytes at `offset` of region `index`.
    fn read(&self, index: u32, offset: u64, data: &mut [u8]);
    /// Writes `data` at `offset` of region `index`.
    fn write(&self, index: u32, offset: u64, data: &[u8]);
    /// Maps `[iova, iova + size)` for device DMA to host memory at `host`.
    fn dma_map(&mut self, iova: u64, size: u64, host: u64) -> Result<(), VfioError>;
    /// Undoes a [`VfioLayer::dma_map`].
    fn dma_unmap(&mut self, iova: u64, size: u64);
    /// Points the device's MSI-X vectors at `fds` (vector i -> fds\[i\]).
    fn enable_msix(&mut self, fds: &[&EventFd]) -> Result<(), VfioError>;
    /// Turns the device's MSI-X off.
    fn disable_msix(&mut self);
    /// Resets the function (if it supports reset).
    fn reset(&mut self);
    /// Maps `size` bytes at `offset` of region `index` into this process;
    /// returns the host address.
    fn mmap(&mut self, index: u32, offset: u64, size: u64) -> Result<u64, VfioError>;
    /// Undoes a [`VfioLayer::mmap`].
    fn munmap(&mut self, host: u64, size: u64);
}

/// Checks `addr` is `DDDD:BB:DD.F` (hex) and returns it lower-cased.
pub fn parse_address(addr: &str) -> Result<String, VfioError> {
    let bad = || VfioError::BadAddress(addr.to_string());
    let (dbd, func) = addr.rsplit_once('.').ok_or_else(bad)?;
    let parts: Vec<&str> = dbd.split(':').collect();
    let hex = |s: &str, n: usize| s.len() == n && s.chars().all(|c| c.is_ascii_hexdigit());
    let ok = parts.len() == 3
        && hex(parts[0], 4)
        && hex(parts[1], 2)
        && hex(parts[2], 2)
        && u8::from_str_radix(parts[2], 16).is_ok_and(|d| d < 32)
        && func.len() == 1
        && func.chars().all(|c| ('0'..='7').contains(&c));
    ok.then(|| addr.to_ascii_lowercase()).ok_or_else(bad)
}

/// Checks, under filesystem root `root` ("/" on a host), that VFIO exists
/// and `addr` is a function bound to vfio-pci with an IOMMU group whose
/// node exists. Returns the function's sysfs path and group.
pub fn preflight(root: &Path, addr: &str) -> Result<(PathBuf, u32), VfioError> {
    let addr = parse_address(addr)?;
    if !root.join("dev/vfio").exists() {
        return Err(VfioError::NoVfio { addr });
    }
    let path = root.join("sys/bus/pci/devices").join(&addr);
    if !path.exists() {
        return Err(VfioError::NoDevice { addr, path });
    }
    let link_name = |p: PathBuf| {
        std::fs::read_link(p)
            .ok()
            .and_then(|l| l.file_name().map(|n| n.to_string_lossy().into_owned()))
    };
    let driver = link_name(path.join("driver")).unwrap_or_else(|| "no driver".into());
    if driver != "vfio-pci" {
        return Err(VfioError::WrongDriver { addr, driver });
    }
    let group = link_name(path.join("iommu_group")).and_then(|g| g.parse::<u32>().ok());
    let Some(group) = group else { return Err(VfioError::NoGroup { addr }) };
    if !root.join("dev/vfio").join(group.to_string()).exists() {
        return Err(VfioError::NoGroupNode { addr, group });
    }
    Ok((path, group))
}

#[cfg(test)]
mod tests;
