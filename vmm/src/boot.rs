//! Writes the boot structures into guest RAM: page tables, per-CPU GDT and
//! TSS, the zeroed IDT and the [`BootInfo`] block.

use kore_boot_abi::entry::{gdt_entries, tss_descriptor, TSS_LIMIT};
use kore_boot_abi::layout::{self, pte, GIB, HUGE_PAGE, PAGE};
use kore_boot_abi::{ports, BootInfo, ImageInfo, MemKind};
use vm_memory::{Bytes, GuestAddress, GuestMemory};

use crate::memory::RamPlan;

/// Errors writing boot structures.
#[derive(Debug, thiserror::Error)]
pub enum BootError {
    /// A boot structure would land outside guest RAM (a VMM bug or a too small VM).
    #[error("boot structure at {0:#x} is outside guest RAM: give the VM more memory")]
    Write(u64),
    /// The boot-info tables overflowed.
    #[error("boot info: {0}")]
    Info(kore_boot_abi::BootInfoError),
}

fn w64<M: GuestMemory>(mem: &M, gpa: u64, v: u64) -> Result<(), BootError> {
    mem.write_obj(v, GuestAddress(gpa)).map_err(|_| BootError::Write(gpa))
}

/// The flags of the 2 MiB page at `gpa`, or `None` if it stays unmapped.
pub fn page_flags(plan: &RamPlan, pack_end: u64, gpa: u64) -> Option<u64> {
    let rw = pte::PRESENT | pte::WRITABLE | pte::HUGE;
    if (layout::DEVICE_WINDOW..layout::DEVICE_WINDOW_END).contains(&gpa) {
        return Some(rw | pte::USER | pte::NX | pte::PCD | pte::PWT);
    }
    if !plan.ranges.iter().any(|r| gpa >= r.base && gpa < r.base + r.size) {
        return None;
    }
    Some(if gpa < layout::USER_IMAGE_BASE {
        rw
    } else if gpa < layout::USER_IMAGE_LIMIT {
        rw | pte::USER
    } else if gpa >= layout::PACK_BASE && gpa < pack_end {
        pte::PRESENT | pte::HUGE | pte::USER | pte::NX
    } else {
        rw | pte::USER | pte::NX
    })
}

/// Builds the identity page tables (2 MiB pages) for `plan`.
pub fn write_page_tables<M: GuestMemory>(
    mem: &M,
    plan: &RamPlan,
    pack_end: u64,
) -> Result<(), BootError> {
    let top = plan.end().max(layout::DEVICE_WINDOW_END);
    let gibs = top.div_ceil(GIB);
    let table = pte::PRESENT | pte::WRITABLE | pte::USER;
    w64(mem, layout::PML4, layout::PDPT | table)?;
    let mut pd = vec![0u8; PAGE as usize];
    for g in 0..gibs {
        let pd_gpa = layout::PD_BASE + g * PAGE;
        w64(mem, layout::PDPT + g * 8, pd_gpa | table)?;
        for i in 0..512u64 {
            let gpa = g * GIB + i * HUGE_PAGE;
            let e = page_flags(plan, pack_end, gpa).map_or(0, |f| gpa | f);
            pd[i as usize * 8..i as usize * 8 + 8].copy_from_slice(&e.to_le_bytes());
        }
        mem.write_slice(&pd, GuestAddress(pd_gpa)).map_err(|_| BootError::Write(pd_gpa))?;
    }
    Ok(())
}

/// Writes CPU `cpu`'s GDT and TSS (RSP0, IST1, I/O bitmap).
pub fn write_cpu_tables<M: GuestMemory>(mem: &M, cpu: u32) -> Result<(), BootError> {
    let gdt = layout::gdt(cpu);
    let mut g = [0u64; layout::GDT_ENTRIES as usize];
    g[..8].copy_from_slice(&gdt_entries());
    let tss = layout::tss(cpu);
    let [lo, hi] = tss_descriptor(tss, TSS_LIMIT);
    g[8] = lo;
    g[9] = hi;
    let bytes: Vec<u8> = g.iter().flat_map(|v| v.to_le_bytes()).collect();
    mem.write_slice(&bytes, GuestAddress(gdt)).map_err(|_| BootError::Write(gdt))?;

    let mut t = vec![0u8; TSS_LIMIT as usize + 1];
    t[4..12].copy_from_slice(&layout::stack_top(cpu).to_le_bytes()); // RSP0
    t[0x24..0x2c].copy_from_slice(&layout::ist1_top(cpu).to_le_bytes()); // IST1
    t[0x66..0x68].copy_from_slice(&(layout::TSS_IOMAP_OFFSET as u16).to_le_bytes());
    let map = layout::TSS_IOMAP_OFFSET as usize;
    for port in 0..layout::IOMAP_PORTS as u16 {
        if !ports::ring3_allowed(port) {
            t[map + port as usize / 8] |= 1 << (port % 8);
        }
    }
    t[map + layout::IOMAP_PORTS as usize / 8] = 0xff;
    mem.write_slice(&t, GuestAddress(tss)).map_err(|_| BootError::Write(tss))
}

/// Everything the boot-info block describes.
pub struct BootParams<'a> {
    /// RAM plan.
    pub plan: &'a RamPlan,
    /// vCPU count.
    pub vcpus: u32,
    /// TSC kHz.
    pub tsc_khz: u64,
    /// The XCR0 the vCPUs were given.
    pub xcr0: u64,
    /// Kernel as loaded.
    pub kernel: ImageInfo,
    /// User image as loaded.
    pub user_image: ImageInfo,
    /// Preloaded files: (name, gpa, size).
    pub files: Vec<(String, u64, u64)>,
    /// Devices.
    pub devices: Vec<kore_boot_abi::Device>,
    /// Command line.
    pub cmdline: &'a str,
}

/// Builds the [`BootInfo`] for `p`.
pub fn boot_info(p: &BootParams<'_>) -> Result<BootInfo, BootError> {
    let mut info = BootInfo::new();
    info.vcpu_count = p.vcpus;
    info.tsc_khz = p.tsc_khz;
    info.xcr0 = p.xcr0;
    info.kernel = p.kernel;
    info.user_image = p.user_image;
    let e = BootError::Info;
    for (name, gpa, size) in &p.files {
        info.push_file(name.as_bytes(), *gpa, *size).map_err(e)?;
    }
    for d in &p.devices {
        info.push_device(*d).map_err(e)?;
    }
    info.set_cmdline(p.cmdline.as_bytes()).map_err(e)?;
    for (base, size, kind) in memory_map(p) {
        info.push_mem_region(base, size, kind).map_err(e)?;
    }
    Ok(info)
}

fn memory_map(p: &BootParams<'_>) -> Vec<(u64, u64, MemKind)> {
    let up = layout::align_up_huge;
    let mut m = vec![(0, layout::BOOT_DATA_END, MemKind::BootData)];
    let mut cur = layout::BOOT_DATA_END;
    let push = |m: &mut Vec<(u64, u64, MemKind)>, cur: &mut u64, start: u64, end: u64, kind| {
        if start > *cur {
            m.push((*cur, start - *cur, MemKind::Usable));
        }
        if end > start {
            m.push((start, end - start, kind));
            *cur = end;
        }
    };
    for (image, kind) in [(p.kernel, MemKind::Kernel), (p.user_image, MemKind::UserImage)] {
        if image.end > 0 {
            push(&mut m, &mut cur, image.start & !(HUGE_PAGE - 1), up(image.end), kind);
        }
    }
    let low_end = p.plan.low_end;
    // The rest of the user-image window is its own region, so that RAM from
    // `HEAP_BASE` (where ring 3 puts its stacks and heap) starts a region of its own.
    if cur < layout::HEAP_BASE && low_end > layout::HEAP_BASE {
        m.push((cur, layout::HEAP_BASE - cur, MemKind::Usable));
        cur = layout::HEAP_BASE;
    }
    if low_end > cur {
        m.push((cur, low_end - cur, MemKind::Usable));
    }
    m.push((
        layout::DEVICE_WINDOW,
        layout::DEVICE_WINDOW_END - layout::DEVICE_WINDOW,
        MemKind::Device,
    ));
    if let Some(high) = p.plan.ranges.get(1) {
        let pack = p.plan.pack_bytes;
        if pack > 0 {
            m.push((high.base, pack, MemKind::Preloaded));
        }
        if high.size > pack {
            m.push((high.base + pack, high.size - pack, MemKind::Usable));
        }
    }
    m
}

/// Writes the boot-info block into guest RAM.
pub fn write_boot_info<M: GuestMemory>(mem: &M, info: &BootInfo) -> Result<(), BootError> {
    let mut bytes = [0u8; core::mem::size_of::<BootInfo>()];
    info.to_bytes(&mut bytes);
    mem.write_slice(&bytes, GuestAddress(layout::BOOT_INFO))
        .map_err(|_| BootError::Write(layout::BOOT_INFO))
}

#[cfg(test)]
mod tests {
    use super::*;
    use vm_memory::GuestMemoryMmap;

    #[test]
    fn page_permissions_per_region() {
        let plan = RamPlan::new(256 << 20, 4 << 20, 2 << 20).unwrap();
        let pack_end = layout::PACK_BASE + (4 << 20);
        let f = |a| page_flags(&plan, pack_end, a);
        assert_eq!(f(layout::KERNEL_BASE).unwrap() & pte::USER, 0);
        assert_ne!(f(layout::USER_IMAGE_BASE).unwrap() & pte::USER, 0);
        assert_eq!(f(layout::USER_IMAGE_BASE).unwrap() & pte::NX, 0);
        assert_ne!(f(layout::HEAP_BASE).unwrap() & pte::NX, 0);
        let pack = f(layout::PACK_BASE).unwrap();
        assert_eq!(pack & pte::WRITABLE, 0);
        assert_ne!(pack & pte::USER, 0);
        assert!(f(256 << 20).is_none());
        assert!(f(pack_end).is_none());
        assert_ne!(f(layout::VIRTIO_MMIO_BASE).unwrap() & pte::PCD, 0);
    }

    #[test]
    fn tables_written() {
        let plan = RamPlan::new(128 << 20, 0, 2 << 20).unwrap();
        let mem = GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), 128 << 20)]).unwrap();
        write_page_tables(&mem, &plan, 0).unwrap();
        write_cpu_tables(&mem, 0).unwrap();
        let pde: u64 =
            mem.read_obj(GuestAddress(layout::pde_address(layout::KERNEL_BASE))).unwrap();
        assert_eq!(pde & !0xfff, layout::KERNEL_BASE);
        let iomap = layout::tss(0) + layout::TSS_IOMAP_OFFSET;
        let b: u8 = mem.read_obj(GuestAddress(iomap + 0x3f8 / 8)).unwrap();
        assert_eq!(b, 0, "COM1 allowed");
        let b: u8 = mem.read_obj(GuestAddress(iomap + 0xf6 / 8)).unwrap();
        assert_eq!(b & (1 << 6), 1 << 6, "SMP release denied");
    }
}
