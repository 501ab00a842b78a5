//! The fixed guest-physical layout.
//!
//! Guest RAM is split around a 1 GiB device hole below 4 GiB:
//!
//! | guest-physical range | contents | initial mapping |
//! | --- | --- | --- |
//! | `0x0000_0000..0x0000_1000` | unused (null page) | supervisor RW |
//! | [`IDT`] `0x1000` (4 KiB) | IDT, zeroed, loaded with limit 4095 | supervisor RW |
//! | [`PML4`] `0x2000`, [`PDPT`] `0x3000` | page-table roots | supervisor RW |
//! | [`BOOT_INFO`] `0x8000` (32 KiB) | [`crate::BootInfo`] | supervisor RW |
//! | [`CPU_PAGES`] `0x1_0000` (4 KiB per CPU) | per-CPU GDT at +0, TSS at +[`TSS_OFFSET`] | supervisor RW |
//! | [`PD_BASE`] `0x10_0000` (1 MiB) | page directories, one per GiB | supervisor RW |
//! | [`STACKS`] `0x20_0000` (64 KiB per CPU) | per-CPU IST1 stack then kernel stack | supervisor RW |
//! | [`KERNEL_BASE`]..[`KERNEL_LIMIT`] (8..32 MiB) | kernel ELF segments | supervisor RWX |
//! | [`USER_IMAGE_BASE`]..[`USER_IMAGE_LIMIT`] (32..96 MiB) | user ELF segments, then free RAM | user RWX |
//! | [`HEAP_BASE`]..low RAM end (at most [`LOW_RAM_LIMIT`] = 3 GiB) | free RAM | user RW, NX |
//! | [`DEVICE_WINDOW`]..4 GiB | PCI 32-bit BARs ([`PCI_MMIO32_BASE`]), virtio-mmio ([`VIRTIO_MMIO_BASE`]), PCI ECAM ([`PCI_ECAM_BASE`]), IOAPIC, LAPIC | user RW, NX, uncached |
//! | [`PACK_BASE`] = 4 GiB.. | preloaded files, each 2 MiB aligned | user **read-only**, NX |
//! | after the pack | the rest of the guest's RAM, if it exceeds 3 GiB | user RW, NX |
//!
//! The guest's RAM (its "memory size") fills `0..3 GiB` first; what does not
//! fit continues after the preloaded files. The [`crate::BootInfo`] memory map
//! lists what actually exists; always use it rather than assuming sizes.
//!
//! Paging: 4-level, identity map, **2 MiB pages only** (1 GiB pages fault on
//! some nested hypervisors). The page directory for GiB `g` is at
//! `PD_BASE + g * 4096`, so the PDE of the 2 MiB page holding address `a`
//! is at [`pde_address`]`(a)`. The kernel may rewrite PDEs (e.g. make heap
//! pages supervisor-only, or split a 2 MiB page into 4 KiB pages) and then
//! reload CR3 or `invlpg`.
//!
//! ```
//! use kore_boot_abi::layout::*;
//! assert_eq!(pde_address(0), PD_BASE);
//! assert_eq!(pde_address(PACK_BASE), PD_BASE + 4 * 4096);
//! assert_eq!(stack_top(0), STACKS + STACK_SLOT);
//! assert!(KERNEL_BASE % HUGE_PAGE == 0 && PACK_BASE % HUGE_PAGE == 0);
//! ```

/// Size of a guest page-table large page (2 MiB).
pub const HUGE_PAGE: u64 = 2 << 20;
/// Size of a small page (4 KiB).
pub const PAGE: u64 = 4096;
/// One GiB.
pub const GIB: u64 = 1 << 30;

/// The IDT (256 x 16-byte gates), zeroed by the VMM, loaded with limit 4095.
pub const IDT: u64 = 0x1000;
/// The PML4 (CR3 at entry).
pub const PML4: u64 = 0x2000;
/// The single page-directory-pointer table (covers 512 GiB).
pub const PDPT: u64 = 0x3000;
/// The [`crate::BootInfo`] block.
pub const BOOT_INFO: u64 = 0x8000;
/// Room reserved for the [`crate::BootInfo`] block.
pub const BOOT_INFO_SIZE: u64 = 0x8000;
/// Per-CPU descriptor pages: CPU `i`'s page is at `CPU_PAGES + i * 4096`.
pub const CPU_PAGES: u64 = 0x1_0000;
/// Offset of the GDT in a CPU page (16 entries, limit 127).
pub const GDT_OFFSET: u64 = 0;
/// Number of 8-byte GDT slots in each CPU's GDT.
pub const GDT_ENTRIES: u64 = 16;
/// Offset of the 64-bit TSS in a CPU page.
pub const TSS_OFFSET: u64 = 0x100;
/// Offset of the I/O-permission bitmap inside the TSS (the TSS's
/// `iomap_base` field holds this value).
pub const TSS_IOMAP_OFFSET: u64 = 0x68;
/// Ports covered by the I/O bitmap: `0..IOMAP_PORTS`; ports above are denied
/// to ring 3. The bitmap is followed by one `0xff` byte.
pub const IOMAP_PORTS: u64 = 0x400;
/// Page directories: GiB `g` is described by the 4 KiB table at
/// `PD_BASE + g * 4096`.
pub const PD_BASE: u64 = 0x10_0000;
/// Number of page directories reserved, i.e. the highest mappable
/// guest-physical address in GiB.
pub const MAX_PD: u64 = 256;
/// Per-CPU stacks: CPU `i` owns `[STACKS + i * STACK_SLOT, +STACK_SLOT)`.
pub const STACKS: u64 = 0x20_0000;
/// Size of one CPU's stack slot: the lowest [`IST_STACK_SIZE`] bytes are the
/// IST1 stack, the rest is the kernel stack (initial RSP and TSS.RSP0).
pub const STACK_SLOT: u64 = 64 << 10;
/// Size of the IST1 stack at the bottom of each stack slot.
pub const IST_STACK_SIZE: u64 = 16 << 10;
/// Maximum number of vCPUs.
pub const MAX_VCPUS: u32 = 64;
/// End of the VMM's boot data (stacks included).
pub const BOOT_DATA_END: u64 = STACKS + MAX_VCPUS as u64 * STACK_SLOT;

/// Kernel ELF segments must load (by physical address) in
/// `[KERNEL_BASE, KERNEL_LIMIT)`.
pub const KERNEL_BASE: u64 = 8 << 20;
/// End of the kernel region.
pub const KERNEL_LIMIT: u64 = 32 << 20;
/// User-image ELF segments (and kernel ELF segments meant for ring 3) must
/// load in `[USER_IMAGE_BASE, USER_IMAGE_LIMIT)`; this region is mapped
/// user-accessible and executable.
pub const USER_IMAGE_BASE: u64 = 32 << 20;
/// End of the user-image region.
pub const USER_IMAGE_LIMIT: u64 = 96 << 20;
/// Start of the free RAM that is mapped user RW, no-execute.
pub const HEAP_BASE: u64 = USER_IMAGE_LIMIT;
/// Smallest guest memory size the VMM accepts.
pub const MIN_MEMORY: u64 = 128 << 20;

/// RAM below the device hole ends at most here (3 GiB).
pub const LOW_RAM_LIMIT: u64 = 3 * GIB;
/// The device window `[DEVICE_WINDOW, 4 GiB)`: never RAM.
pub const DEVICE_WINDOW: u64 = 3 * GIB;
/// End of the device window.
pub const DEVICE_WINDOW_END: u64 = 4 * GIB;
/// First virtio-mmio device's registers; device `i` is at
/// `VIRTIO_MMIO_BASE + i * VIRTIO_MMIO_SIZE`.
pub const VIRTIO_MMIO_BASE: u64 = 0xd000_0000;
/// Size of one virtio-mmio register window.
pub const VIRTIO_MMIO_SIZE: u64 = 0x1000;
/// GSI (IOAPIC pin) of the first virtio-mmio device; device `i` uses `+i`.
pub const VIRTIO_GSI_BASE: u32 = 5;
/// IOAPIC vector the VMM programs for the first virtio-mmio device's GSI;
/// device `i` uses `+i`.
pub const VIRTIO_VECTOR_BASE: u32 = 0x30;
/// 32-bit memory BARs of PCI functions: the VMM assigns every 32-bit memory
/// BAR inside `[PCI_MMIO32_BASE, PCI_MMIO32_BASE + PCI_MMIO32_SIZE)`,
/// naturally aligned, before boot.
pub const PCI_MMIO32_BASE: u64 = 0xc000_0000;
/// Size of the 32-bit PCI BAR window (256 MiB).
pub const PCI_MMIO32_SIZE: u64 = 256 << 20;
/// The PCI host bridge's ECAM configuration window (bus 0 only): function
/// `dev.func`'s 4 KiB config space is at [`pci_ecam_offset`]`(dev, func, 0)`.
pub const PCI_ECAM_BASE: u64 = 0xe000_0000;
/// Size of the ECAM window: 32 devices x 8 functions x 4 KiB (1 MiB).
pub const PCI_ECAM_SIZE: u64 = 1 << 20;
/// The IOAPIC's MMIO page.
pub const IOAPIC_BASE: u64 = 0xfec0_0000;
/// The local APIC's MMIO page (xAPIC mode).
pub const LAPIC_BASE: u64 = 0xfee0_0000;

/// Preloaded files start here (4 GiB), each at a 2 MiB-aligned address.
pub const PACK_BASE: u64 = 4 * GIB;

/// Guest-physical address of CPU `cpu`'s descriptor page.
pub const fn cpu_page(cpu: u32) -> u64 {
    CPU_PAGES + cpu as u64 * PAGE
}

/// Guest-physical address of CPU `cpu`'s GDT.
pub const fn gdt(cpu: u32) -> u64 {
    cpu_page(cpu) + GDT_OFFSET
}

/// Guest-physical address of CPU `cpu`'s TSS.
pub const fn tss(cpu: u32) -> u64 {
    cpu_page(cpu) + TSS_OFFSET
}

/// Top of CPU `cpu`'s kernel stack: its initial RSP and its TSS.RSP0.
pub const fn stack_top(cpu: u32) -> u64 {
    STACKS + (cpu as u64 + 1) * STACK_SLOT
}

/// Top of CPU `cpu`'s IST1 stack (TSS.IST1), for double faults and NMIs.
pub const fn ist1_top(cpu: u32) -> u64 {
    STACKS + cpu as u64 * STACK_SLOT + IST_STACK_SIZE
}

/// Guest-physical address of the PDE mapping the 2 MiB page holding `gpa`.
pub const fn pde_address(gpa: u64) -> u64 {
    PD_BASE + (gpa >> 30) * PAGE + ((gpa >> 21) & 511) * 8
}

/// Offset inside the ECAM window of config register `reg` (0..4096) of PCI
/// function `dev.func` on bus 0 (`dev` < 32, `func` < 8).
pub const fn pci_ecam_offset(dev: u8, func: u8, reg: u16) -> u64 {
    ((dev as u64 & 31) << 15) | ((func as u64 & 7) << 12) | (reg as u64 & 0xfff)
}

/// Rounds `x` up to a multiple of [`HUGE_PAGE`] (saturating).
pub const fn align_up_huge(x: u64) -> u64 {
    match x.checked_add(HUGE_PAGE - 1) {
        Some(v) => v & !(HUGE_PAGE - 1),
        None => !(HUGE_PAGE - 1),
    }
}

/// Page-table entry bits the VMM uses (x86-64 4-level paging).
pub mod pte {
    /// Present.
    pub const PRESENT: u64 = 1 << 0;
    /// Writable.
    pub const WRITABLE: u64 = 1 << 1;
    /// User-accessible (U/S).
    pub const USER: u64 = 1 << 2;
    /// Write-through.
    pub const PWT: u64 = 1 << 3;
    /// Cache disable.
    pub const PCD: u64 = 1 << 4;
    /// Page size: a PDE maps a 2 MiB page.
    pub const HUGE: u64 = 1 << 7;
    /// No-execute (EFER.NXE is set at entry).
    pub const NX: u64 = 1 << 63;
}

const _: () = assert!(CPU_PAGES + MAX_VCPUS as u64 * PAGE <= PD_BASE);
const _: () = assert!(BOOT_INFO + BOOT_INFO_SIZE <= CPU_PAGES);
const _: () = assert!(BOOT_DATA_END <= KERNEL_BASE);
const _: () = assert!(DEVICE_WINDOW <= PCI_MMIO32_BASE);
const _: () = assert!(PCI_MMIO32_BASE + PCI_MMIO32_SIZE <= VIRTIO_MMIO_BASE);
const _: () = assert!(PCI_ECAM_BASE + PCI_ECAM_SIZE <= IOAPIC_BASE);
const _: () = assert!(TSS_OFFSET + TSS_IOMAP_OFFSET + IOMAP_PORTS / 8 < PAGE);
