//! Hugepage pools (`/sys/kernel/mm/hugepages/hugepages-*kB`): reading them,
//! and growing one so the appliance's memory fits, confirming what the
//! kernel actually granted.

use super::{Changes, HostError, Sys};
use std::fmt;
use std::str::FromStr;

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

/// The page size backing guest memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum HugepageSize {
    /// 2 MiB pages (the default).
    #[default]
    M2,
    /// 1 GiB pages.
    G1,
    /// Ordinary 4 KiB pages (slower; no reservation needed).
    Off,
}

impl HugepageSize {
    /// Page size in bytes, `None` when off.
    pub fn bytes(self) -> Option<u64> {
        match self {
            HugepageSize::M2 => Some(2 * MIB),
            HugepageSize::G1 => Some(GIB),
            HugepageSize::Off => None,
        }
    }

    /// Human label: "2 MiB", "1 GiB" or "off".
    pub fn label(self) -> &'static str {
        match self {
            HugepageSize::M2 => "2 MiB",
            HugepageSize::G1 => "1 GiB",
            HugepageSize::Off => "off",
        }
    }

    /// The pool's sysfs directory, `None` when off.
    pub fn pool_dir(self) -> Option<&'static str> {
        match self {
            HugepageSize::M2 => Some("/sys/kernel/mm/hugepages/hugepages-2048kB"),
            HugepageSize::G1 => Some("/sys/kernel/mm/hugepages/hugepages-1048576kB"),
            HugepageSize::Off => None,
        }
    }

    /// Kernel command-line parameters that reserve `pages` of this size at boot.
    pub fn boot_param(self, pages: u64) -> String {
        match self {
            HugepageSize::M2 => format!("hugepagesz=2M hugepages={pages}"),
            HugepageSize::G1 => format!("default_hugepagesz=1G hugepagesz=1G hugepages={pages}"),
            HugepageSize::Off => String::new(),
        }
    }
}

impl fmt::Display for HugepageSize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            HugepageSize::M2 => "2M",
            HugepageSize::G1 => "1G",
            HugepageSize::Off => "off",
        })
    }
}

impl FromStr for HugepageSize {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.trim().to_ascii_lowercase().as_str() {
            "2m" | "2mib" | "2mb" | "2048k" | "2048kb" => Ok(HugepageSize::M2),
            "1g" | "1gib" | "1gb" | "1048576k" | "1048576kb" => Ok(HugepageSize::G1),
            "off" | "none" | "no" => Ok(HugepageSize::Off),
            _ => Err(format!("`{s}` is not a hugepage size: use 2M, 1G or off")),
        }
    }
}

/// One hugepage pool's counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pool {
    /// The page size.
    pub size: HugepageSize,
    /// nr_hugepages: pages in the pool.
    pub total: u64,
    /// free_hugepages: pages not mapped by anyone.
    pub free: u64,
    /// resv_hugepages: free pages already promised to a mapping.
    pub reserved: u64,
}

impl Pool {
    /// Pages a new mapping can still get.
    pub fn available(&self) -> u64 {
        self.free.saturating_sub(self.reserved)
    }
}

/// Reads a pool; `Ok(None)` if the kernel has no pool of this size (or `Off`).
pub fn read_pool(sys: &dyn Sys, size: HugepageSize) -> Result<Option<Pool>, HostError> {
    let Some(dir) = size.pool_dir() else { return Ok(None) };
    if !sys.exists(dir) {
        return Ok(None);
    }
    let total = sys.read_u64(&format!("{dir}/nr_hugepages"))?;
    let free = sys.read_u64(&format!("{dir}/free_hugepages"))?;
    let reserved_path = format!("{dir}/resv_hugepages");
    let reserved = if sys.exists(&reserved_path) { sys.read_u64(&reserved_path)? } else { 0 };
    Ok(Some(Pool { size, total, free, reserved }))
}

/// Pages of `size` needed to hold `bytes` (rounded up); 0 when off.
pub fn pages_for(bytes: u64, size: HugepageSize) -> u64 {
    size.bytes().map_or(0, |page| bytes.div_ceil(page))
}

/// What [`reserve`] found and did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reservation {
    /// Pages the appliance needs.
    pub needed: u64,
    /// The pool before.
    pub before: Option<Pool>,
    /// nr_hugepages afterwards (as re-read from the kernel; the planned value in a dry run).
    pub total_after: u64,
}

/// Fix for a missing pool of `size`.
pub fn no_pool_fix(size: HugepageSize) -> &'static str {
    match size {
        HugepageSize::G1 => "this CPU or kernel has no 1 GiB pages (CPU flag pdpe1gb): set `hugepage_size = \"2M\"` in launch.toml or pass `--hugepage-size 2M`",
        _ => "this kernel has no hugetlbfs support: use a stock Ubuntu kernel, or set `hugepage_size = \"off\"` (slower)",
    }
}

/// Grows the pool of `size` so `needed_bytes` fit in its available pages,
/// then re-reads it to confirm. Never shrinks a pool. On a short grant the
/// pool is put back as it was and [`HostError::PoolShort`] says what to do.
pub fn reserve(
    changes: &mut Changes<'_>,
    size: HugepageSize,
    needed_bytes: u64,
) -> Result<Reservation, HostError> {
    let sys = changes.sys();
    let Some(dir) = size.pool_dir() else {
        changes.note(
            "[ok] hugepages off: guest memory uses ordinary pages (slower); nothing to reserve",
        )?;
        return Ok(Reservation { needed: 0, before: None, total_after: 0 });
    };
    let pool = read_pool(sys, size)?.ok_or_else(|| HostError::NoPool {
        size: size.label().to_string(),
        path: sys.shown(dir),
        fix: no_pool_fix(size),
    })?;
    let needed = pages_for(needed_bytes, size);
    if pool.available() >= needed {
        changes.note(&format!(
            "[ok] {} hugepages: {} available of {} in the pool, {} needed",
            size.label(),
            pool.available(),
            pool.total,
            needed
        ))?;
        return Ok(Reservation { needed, before: Some(pool), total_after: pool.total });
    }
    let target = pool.total + (needed - pool.available());
    let nr_path = format!("{dir}/nr_hugepages");
    let why = format!(
        "reserve {needed} x {} for the appliance (pool {} -> {target})",
        size.label(),
        pool.total
    );
    changes.write(&nr_path, &target.to_string(), &why)?;
    if changes.dry_run() {
        return Ok(Reservation { needed, before: Some(pool), total_after: target });
    }
    let granted = sys.read_u64(&nr_path)?;
    if granted < target {
        // Give back the partial grant so the memory is not left locked away.
        let restore =
            changes.write(&nr_path, &pool.total.to_string(), "give back the partial reservation");
        if let Err(err) = restore {
            tracing::warn!("could not restore the hugepage pool: {err}");
        }
        return Err(HostError::PoolShort {
            size: size.label().to_string(),
            wanted: target,
            granted,
            needed_mib: needed_bytes.div_ceil(MIB),
            boot_param: size.boot_param(target),
        });
    }
    changes.note(&format!(
        "[ok] {} hugepages: the kernel granted {granted} (pool was {}); to keep them across reboots add `{}` to the kernel command line",
        size.label(),
        pool.total,
        size.boot_param(granted)
    ))?;
    Ok(Reservation { needed, before: Some(pool), total_after: granted })
}
