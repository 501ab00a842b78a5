//! PCI for ring 3: MSI-X gates and the `MAP_BAR` kernel call.
//!
//! Ring 3 owns configuration space (the ECAM window stays user-mapped, like the virtio
//! registers), but not the 32-bit BAR window: at boot CPU 0 clears the user bit of the
//! window's 2 MiB pages, and `MAP_BAR` gives ring 3 exactly the 4 KiB pages of one memory
//! BAR, uncached (PCD|PWT) and no-execute. 64-bit BARs may also lie in the high window above
//! all memory (`kore_guest_abi::pci_high_window`), which the VMM leaves unmapped: `MAP_BAR`
//! builds its page directory there. The kernel reads and sizes the BAR itself
//! (kore-pci) rather than trusting ring 3's numbers, and maps nothing outside the windows, so
//! a BAR that ring 3 reprogrammed to point at RAM or the kernel is refused: whatever ring 3
//! does with configuration space, `MAP_BAR` never gives it RAM it lacked. (Ring 3 can still
//! move a BAR onto another function's BAR pages and map those; it owns config space anyway.)
//! A 2 MiB page a BAR only partly covers is split into a page table from a small static
//! pool; its other entries stay not present. Mappings are never taken back.

use core::cell::UnsafeCell;
use core::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

use kore_guest_abi::layout::{self, pte};
use kore_guest_abi::{map_bar, pci_high_window, BootInfo, DeviceKind};
use kore_pci::pages::{self, Chunk};
use kore_pci::{bar, Ecam, Function, Header};

const WINDOW: u64 = layout::PCI_MMIO32_BASE;
const WINDOW_END: u64 = layout::PCI_MMIO32_BASE + layout::PCI_MMIO32_SIZE;
/// Page tables for split 2 MiB pages (one per 2 MiB page that BARs cover only in part).
const POOL: usize = 8;
/// Bits of a user BAR page (leaf PTE) and of a PDE pointing at a page table.
const LEAF: u64 = pte::PRESENT | pte::WRITABLE | pte::USER | pte::PWT | pte::PCD | pte::NX;
const TABLE: u64 = pte::PRESENT | pte::WRITABLE | pte::USER;
const ADDR_MASK: u64 = 0x000f_ffff_ffff_f000;

#[repr(C, align(4096))]
struct PageTable([u64; 512]);

struct Pool(UnsafeCell<[PageTable; POOL]>);
// SAFETY: only `map_chunk` and `split`, under `LOCK`, touch the tables.
unsafe impl Sync for Pool {}

static TABLES: Pool = Pool(UnsafeCell::new([const { PageTable([0; 512]) }; POOL]));
static USED: AtomicUsize = AtomicUsize::new(0);
static LOCK: AtomicBool = AtomicBool::new(false);
static BRIDGE: AtomicBool = AtomicBool::new(false);
/// The 64-bit BAR window `[HIGH, HIGH_END)` (`kore_guest_abi::pci_high_window`).
static HIGH: AtomicU64 = AtomicU64::new(0);
static HIGH_END: AtomicU64 = AtomicU64::new(0);

/// CPU 0 at boot: whether the boot info has the PCI host bridge at the layout's windows. If
/// so, takes the BAR window away from ring 3 (until `MAP_BAR`).
pub fn init(info: &BootInfo) -> bool {
    let found = info.devices().iter().any(|d| {
        d.kind == DeviceKind::PciHostBridge as u32
            && d.mmio_base == layout::PCI_ECAM_BASE
            && d.mmio_size == layout::PCI_ECAM_SIZE
            && d.arg0 == WINDOW
    });
    if found {
        let mut a = WINDOW;
        while a < WINDOW_END {
            let p = layout::pde_address(a) as *mut u64;
            // SAFETY: the VMM built page directories for the whole device window (boot ABI);
            // no CPU has touched the BAR window yet, so no TLB holds it.
            unsafe { p.write_volatile(p.read_volatile() & !pte::USER) };
            a += layout::HUGE_PAGE;
        }
        let (high, high_end) = pci_high_window(info);
        HIGH.store(high, Ordering::Relaxed);
        HIGH_END.store(high_end, Ordering::Relaxed);
        BRIDGE.store(true, Ordering::Release);
    }
    found
}

/// `rax`:`rdx` of a kernel call.
#[repr(C)]
pub struct Ret(u64, u64);

/// The `MAP_BAR` call (from the kernel-call gate, interrupts off).
pub extern "sysv64" fn map_bar_call(function: u64, index: u64) -> Ret {
    match map_bar(function, index) {
        Ok((base, size)) => Ret(base, size),
        Err(code) => Ret(code, 0),
    }
}

fn map_bar(function: u64, index: u64) -> Result<(u64, u64), u64> {
    if !BRIDGE.load(Ordering::Acquire) {
        return Err(map_bar::NO_BRIDGE);
    }
    let f = Function::from_ecam_offset(function).ok_or(map_bar::NO_FUNCTION)?;
    // SAFETY: the bridge is at the layout's ECAM window (checked in `init`), mapped uncached.
    let ecam = unsafe { Ecam::new(layout::PCI_ECAM_BASE as usize) };
    let hdr = Header::read(&ecam, f).ok_or(map_bar::NO_FUNCTION)?;
    let b =
        bar::probe(&ecam, &hdr, index as usize).filter(|b| b.is_memory()).ok_or(map_bar::NO_BAR)?;
    let (start, end) = pages::page_range(b.base, b.size).ok_or(map_bar::OUTSIDE_WINDOW)?;
    let high = HIGH.load(Ordering::Relaxed)..=HIGH_END.load(Ordering::Relaxed);
    let in_high = high.contains(&start) && high.contains(&end);
    if !(in_high || (start >= WINDOW && end <= WINDOW_END)) {
        return Err(map_bar::OUTSIDE_WINDOW);
    }
    while LOCK.swap(true, Ordering::Acquire) {
        core::hint::spin_loop();
    }
    let r = pages::chunks(start, end).try_for_each(map_chunk);
    LOCK.store(false, Ordering::Release);
    r.map(|()| (b.base, b.size))
}

/// Maps one piece of a BAR (inside a window) for ring 3: a whole 2 MiB page gets its user
/// bit back (32-bit window, mapped huge by the VMM) or a fresh huge entry (64-bit window,
/// unmapped until now); anything else gets 4 KiB entries in a pool page table.
fn map_chunk(c: Chunk) -> Result<(), u64> {
    let (start, end) = match c {
        Chunk::Whole(a) => (a, a + layout::HUGE_PAGE),
        Chunk::Pages { start, end } => (start, end),
    };
    directory(start);
    let pde = layout::pde_address(start) as *mut u64;
    // SAFETY: the PDE exists (the VMM's for the 32-bit window, `directory`'s above 4 GiB);
    // only this module (locked) writes window PDEs.
    let v = unsafe { pde.read_volatile() };
    let (present, huge) = (v & pte::PRESENT != 0, v & pte::HUGE != 0);
    let table = match (c, present, huge) {
        (Chunk::Whole(_), true, true) | (Chunk::Whole(_), false, _) => {
            let e = if present { v | pte::USER } else { start | LEAF | pte::HUGE };
            // SAFETY: as above; the 2 MiB page is inside a window and wholly this BAR's.
            unsafe { pde.write_volatile(e) };
            invlpg(start);
            return Ok(());
        }
        (_, true, true) | (_, false, _) => split(pde)?,
        (_, true, false) => own_table(v)?,
    };
    let mut a = start;
    while a < end {
        // SAFETY: `table` is one of the pool's tables, the page table for this 2 MiB page.
        unsafe { (*table).0[((a >> 12) & 511) as usize] = a | LEAF };
        invlpg(a);
        a += layout::PAGE;
    }
    Ok(())
}

/// Above 4 GiB: makes sure the PDPT entry for `a`'s GiB points at its page directory (the
/// VMM's page tables stop at the end of memory); a new directory starts all not-present.
fn directory(a: u64) {
    if a < layout::DEVICE_WINDOW_END {
        return;
    }
    let g = a >> 30;
    debug_assert!(g < layout::MAX_PD);
    let pdpte = (layout::PDPT + g * 8) as *mut u64;
    let pd = layout::PD_BASE + g * layout::PAGE;
    // SAFETY: PDPT and the page-directory area are the kernel's boot data (boot ABI); GiB `g`
    // is above all memory (the 64-bit window), so no one else uses its directory.
    unsafe {
        if pdpte.read_volatile() & pte::PRESENT == 0 {
            core::ptr::write_bytes(pd as *mut u64, 0, 512);
            pdpte.write_volatile(pd | TABLE);
        }
    }
}

/// Replaces a 2 MiB PDE (huge or not present) by a fresh (all not-present) pool page table.
fn split(pde: *mut u64) -> Result<*mut PageTable, u64> {
    let i = USED.load(Ordering::Relaxed);
    if i == POOL {
        return Err(map_bar::NO_PAGE_TABLES);
    }
    USED.store(i + 1, Ordering::Relaxed);
    // SAFETY: table `i` is unused (below USED only ever grows under the lock).
    let table = unsafe { (TABLES.0.get() as *mut PageTable).add(i) };
    // SAFETY: kernel memory is identity mapped, so the table's address is its physical one.
    // The caller's invlpg of each page it maps also drops the old 2 MiB TLB entry.
    unsafe { pde.write_volatile(table as u64 | TABLE) };
    Ok(table)
}

/// The pool table a non-huge window PDE points at (anything else is refused).
fn own_table(pde: u64) -> Result<*mut PageTable, u64> {
    let first = TABLES.0.get() as u64;
    let t = pde & ADDR_MASK;
    let used = USED.load(Ordering::Relaxed) as u64;
    if pde & pte::PRESENT == 0 || t < first || t >= first + used * layout::PAGE {
        return Err(map_bar::NO_PAGE_TABLES);
    }
    Ok(t as *mut PageTable)
}

fn invlpg(a: u64) {
    // SAFETY: invalidating a TLB entry has no other effect.
    unsafe { core::arch::asm!("invlpg [{}]", in(reg) a, options(nostack, preserves_flags)) };
}
