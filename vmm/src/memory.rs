//! Guest RAM: the region plan around the device hole and its hugetlb backing.
//!
//! RAM comes from one `memfd` created with `MFD_HUGETLB` and mapped
//! `MAP_SHARED` without `MAP_NORESERVE`, so the kernel reserves every
//! hugepage at `mmap` time: a short pool is a clear error here, never a
//! `SIGBUS` later.

use std::fs::File;
use std::os::fd::FromRawFd;

use kore_boot_abi::layout::{self, align_up_huge, GIB};
use vm_memory::{FileOffset, GuestAddress, GuestMemoryMmap, GuestRegionMmap, MmapRegion};

use crate::config::HugePageSize;

/// Errors creating guest memory.
#[derive(Debug, thiserror::Error)]
pub enum MemoryError {
    /// Too few free hugepages.
    #[error(
        "not enough free {size_name} hugepages: the VM needs {needed} pages ({needed_mib} MiB) and {free} are free; \
         reserve them as root with `echo {total_wanted} > /sys/kernel/mm/hugepages/{size_name}/nr_hugepages` \
         (or pick another --hugepages size)"
    )]
    HugepagesShort {
        /// The sysfs pool name.
        size_name: &'static str,
        /// Pages needed.
        needed: u64,
        /// MiB needed.
        needed_mib: u64,
        /// Pages free right now.
        free: u64,
        /// A total for `nr_hugepages` that would be enough.
        total_wanted: u64,
    },
    /// The requested size does not fit the layout.
    #[error("guest memory of {requested_mib} MiB is invalid: {reason}")]
    BadSize {
        /// What was asked for.
        requested_mib: u64,
        /// Why it is invalid and what to do.
        reason: &'static str,
    },
    /// A system call failed.
    #[error("creating guest memory failed in {what}: {source}")]
    Os {
        /// The call.
        what: &'static str,
        /// The OS error.
        source: std::io::Error,
    },
    /// vm-memory rejected the regions (a bug in the plan).
    #[error("guest memory regions rejected: {0}")]
    Regions(String),
}

/// One contiguous guest RAM range.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RamRange {
    /// Guest-physical start.
    pub base: u64,
    /// Size in bytes.
    pub size: u64,
}

/// The guest RAM plan: which guest-physical ranges are RAM and where the
/// preloaded files go.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RamPlan {
    /// RAM ranges, ascending.
    pub ranges: Vec<RamRange>,
    /// Bytes reserved for preloaded files at [`layout::PACK_BASE`].
    pub pack_bytes: u64,
    /// End of the guest's own RAM below the hole.
    pub low_end: u64,
}

impl RamPlan {
    /// Plans `memory` bytes of guest RAM plus `pack_bytes` for preloaded
    /// files, with every range a multiple of `page`.
    pub fn new(memory: u64, pack_bytes: u64, page: u64) -> Result<Self, MemoryError> {
        let mib = memory >> 20;
        if memory < layout::MIN_MEMORY {
            return Err(MemoryError::BadSize {
                requested_mib: mib,
                reason: "give the guest at least 128 MiB",
            });
        }
        let round = |x: u64| x.div_ceil(page) * page;
        let low =
            round(align_up_huge(memory.min(layout::LOW_RAM_LIMIT))).min(layout::LOW_RAM_LIMIT);
        let rest = memory.saturating_sub(low);
        let pack_bytes = align_up_huge(pack_bytes);
        let mut ranges = vec![RamRange { base: 0, size: low }];
        if pack_bytes + rest > 0 {
            let size = round(align_up_huge(pack_bytes + rest));
            ranges.push(RamRange { base: layout::PACK_BASE, size });
            if layout::PACK_BASE + size > layout::MAX_PD * GIB {
                return Err(MemoryError::BadSize {
                    requested_mib: mib,
                    reason: "guest RAM plus preloaded files exceed 252 GiB: use a smaller pack or memory size",
                });
            }
        }
        Ok(Self { ranges, pack_bytes, low_end: low })
    }

    /// Total RAM bytes.
    pub fn total(&self) -> u64 {
        self.ranges.iter().map(|r| r.size).sum()
    }

    /// Highest guest-physical RAM address (exclusive).
    pub fn end(&self) -> u64 {
        self.ranges.last().map(|r| r.base + r.size).unwrap_or(0)
    }
}

/// Guest RAM: the vm-memory mapping and the memfd behind it.
pub struct GuestRam {
    /// The mapped guest memory.
    pub mem: GuestMemoryMmap,
    /// The plan it follows.
    pub plan: RamPlan,
    /// Host address of each range's mapping (same order as `plan.ranges`).
    pub host_addrs: Vec<u64>,
}

fn hugepage_count(size: HugePageSize, file: &str) -> u64 {
    let p = format!("/sys/kernel/mm/hugepages/{}/{file}", size.sysfs_name());
    std::fs::read_to_string(p).ok().and_then(|s| s.trim().parse().ok()).unwrap_or(0)
}

/// Pages a new mapping can still get: free minus those other mappings reserved but
/// have not touched yet (`resv_hugepages` counts inside `free_hugepages`).
fn free_hugepages(size: HugePageSize) -> u64 {
    hugepage_count(size, "free_hugepages").saturating_sub(hugepage_count(size, "resv_hugepages"))
}

fn nr_hugepages(size: HugePageSize) -> u64 {
    hugepage_count(size, "nr_hugepages")
}

fn short_error(size: HugePageSize, total: u64) -> MemoryError {
    let needed = total / size.bytes();
    let free = free_hugepages(size);
    MemoryError::HugepagesShort {
        size_name: size.sysfs_name(),
        needed,
        needed_mib: total >> 20,
        free,
        total_wanted: nr_hugepages(size) + needed.saturating_sub(free),
    }
}

fn create_memfd(size: HugePageSize) -> Result<File, MemoryError> {
    let flags = libc::MFD_CLOEXEC
        | match size {
            HugePageSize::Size2M => libc::MFD_HUGETLB | libc::MFD_HUGE_2MB,
            HugePageSize::Size1G => libc::MFD_HUGETLB | libc::MFD_HUGE_1GB,
            HugePageSize::Off => 0,
        };
    // SAFETY: the name is a valid NUL-terminated string; flags are valid.
    let fd = unsafe { libc::memfd_create(c"kore-guest-ram".as_ptr(), flags) };
    if fd < 0 {
        return Err(MemoryError::Os {
            what: "memfd_create",
            source: std::io::Error::last_os_error(),
        });
    }
    // SAFETY: fd was just created and is owned by nobody else.
    Ok(unsafe { File::from_raw_fd(fd) })
}

impl GuestRam {
    /// Creates and maps guest RAM for `plan` with `size` pages.
    pub fn new(plan: RamPlan, size: HugePageSize) -> Result<Self, MemoryError> {
        if size == HugePageSize::Off {
            // The caller chose this (or fell back to it and says so): not a warning here.
            tracing::info!(
                "guest RAM is not backed by hugepages: slower, and not reserved up front"
            );
        }
        let total = plan.total();
        let file = create_memfd(size)?;
        if let Err(e) = file.set_len(total) {
            if e.raw_os_error() == Some(libc::ENOMEM) || e.raw_os_error() == Some(libc::ENOSPC) {
                return Err(short_error(size, total));
            }
            return Err(MemoryError::Os { what: "ftruncate(memfd)", source: e });
        }
        let mut regions = Vec::new();
        let mut host_addrs = Vec::new();
        let mut offset = 0u64;
        for r in &plan.ranges {
            let fo = FileOffset::new(
                file.try_clone().map_err(|e| MemoryError::Os { what: "dup", source: e })?,
                offset,
            );
            let region = MmapRegion::build(
                Some(fo),
                r.size as usize,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
            )
            .map_err(|e| match e {
                vm_memory::mmap::MmapRegionError::Mmap(io)
                    if io.raw_os_error() == Some(libc::ENOMEM) && size != HugePageSize::Off =>
                {
                    short_error(size, total)
                }
                other => MemoryError::Os {
                    what: "mmap",
                    source: std::io::Error::other(other.to_string()),
                },
            })?;
            host_addrs.push(region.as_ptr() as u64);
            let g = GuestRegionMmap::new(region, GuestAddress(r.base))
                .ok_or_else(|| MemoryError::Regions("range overflows".into()))?;
            regions.push(g);
            offset += r.size;
        }
        let mem = GuestMemoryMmap::from_regions(regions)
            .map_err(|e| MemoryError::Regions(e.to_string()))?;
        Ok(Self { mem, plan, host_addrs })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plan_small_without_pack() {
        let p = RamPlan::new(256 << 20, 0, 2 << 20).unwrap();
        assert_eq!(p.ranges, vec![RamRange { base: 0, size: 256 << 20 }]);
    }

    #[test]
    fn plan_pack_goes_to_4g() {
        let p = RamPlan::new(256 << 20, 5, 2 << 20).unwrap();
        assert_eq!(p.ranges[1], RamRange { base: 4 * GIB, size: 2 << 20 });
        let p = RamPlan::new(4 * GIB, 3 * GIB, 1 << 30).unwrap();
        assert_eq!(p.ranges[0], RamRange { base: 0, size: 3 * GIB });
        assert_eq!(p.ranges[1], RamRange { base: 4 * GIB, size: 4 * GIB });
    }

    #[test]
    fn plan_rejects_tiny_and_huge() {
        assert!(matches!(RamPlan::new(1 << 20, 0, 4096), Err(MemoryError::BadSize { .. })));
        assert!(matches!(RamPlan::new(300 * GIB, 0, 4096), Err(MemoryError::BadSize { .. })));
    }
}
