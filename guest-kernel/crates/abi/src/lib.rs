//! kore-guest-abi: the contract between Kore's ring 0 (`kore-kernel`) and ring 3 (`kore-rt`).
//!
//! * **Entry into ring 3.** Every vCPU enters the user image's ELF entry point at CPL 3 with
//!   `rdi` = address of a user-readable copy of the [`BootInfo`] (see [`UserLayout::info_copy`]),
//!   `rsi` = CPU index, `rdx` = vCPU count, `rsp` = top of that CPU's user stack (16-byte
//!   aligned), RFLAGS.IF = 0 (ring 3 is never interrupted; interrupts stay pending until
//!   the vCPU waits), CS = 0x33, SS = 0x2b.
//! * **Kernel calls.** `int3` with the call number in `rax` ([`call`]), arguments in `rdi`,
//!   `rsi`; the result comes back in `rax`. The kernel clobbers only `rax`, `rcx`, `rdx`, `rsi`,
//!   `rdi` (and the flags). Any other `int n` faults on this KVM; `syscall` never reaches ring 0.
//! * **No kernel call needed** for: serial output and exit (the TSS I/O bitmap lets ring 3 use
//!   the serial and debug-exit ports), the TSC (`rdtsc` is native), IPIs (the LAPIC page is
//!   mapped for ring 3), virtio doorbells and rings (the device window is user memory).
//! * **Exit statuses** ([`status`]) are what the VM's debug-exit port receives.
#![no_std]

pub use kore_boot_abi::{entry, layout, ports, BootInfo, DeviceKind, MemKind};

/// Kernel-call numbers (`rax` at `int3`).
pub mod call {
    /// `exit(status)`: ends the VM with `status` (`rdi`). Does not return.
    pub const EXIT: u64 = 0;
    /// `log(ptr, len)`: writes `len` (`rsi`) bytes at `ptr` (`rdi`) to the serial console.
    /// Returns 0, or `u64::MAX` if the range is not user memory.
    pub const LOG: u64 = 1;
    /// `wait()`: halts this vCPU until any interrupt (a device IRQ or a wake IPI) arrives,
    /// then returns 0. An interrupt that arrived since the last wait returns at once.
    pub const WAIT: u64 = 2;
    /// `map_bar(function, bar)`: maps memory BAR `bar` (`rsi`, 0..6) of the PCI function at
    /// ECAM offset `function` (`rdi`, `dev << 15 | func << 12`) for ring 3, 4 KiB pages,
    /// uncached (PCD|PWT), no-execute. Only BARs inside [`crate::layout::PCI_MMIO32_BASE`]'s window
    /// or the 64-bit window ([`crate::pci_high_window`]) are mapped, and only their pages. Returns the BAR's address in `rax` and its size in
    /// `rdx`, or a [`crate::map_bar`] error code in `rax`.
    pub const MAP_BAR: u64 = 3;
    /// Returned in `rax` for an unknown call number.
    pub const BAD_CALL: u64 = u64::MAX;
}

/// Error codes of [`call::MAP_BAR`] (in `rax`; never a valid BAR address).
pub mod map_bar {
    /// The boot info has no PCI host bridge at the layout's ECAM window.
    pub const NO_BRIDGE: u64 = u64::MAX - 1;
    /// The function offset or BAR index is out of range, or no function is there.
    pub const NO_FUNCTION: u64 = u64::MAX - 2;
    /// The slot holds no memory BAR (unimplemented, I/O, or a 64-bit BAR's upper half).
    pub const NO_BAR: u64 = u64::MAX - 3;
    /// The BAR is not inside a PCI BAR window (32-bit or [`super::pci_high_window`]).
    pub const OUTSIDE_WINDOW: u64 = u64::MAX - 4;
    /// The kernel's page tables for BAR mappings are used up.
    pub const NO_PAGE_TABLES: u64 = u64::MAX - 5;
    /// Whether `rax` is one of these codes (or [`super::call::BAD_CALL`]).
    pub const fn is_error(rax: u64) -> bool {
        rax >= NO_PAGE_TABLES
    }
}

/// First interrupt vector the kernel gives PCI functions' MSI-X messages, when the boot
/// info has a PCI host bridge. Vectors `MSIX_VECTOR_BASE..+MSIX_VECTORS` take the same path
/// as every device interrupt: they end a [`call::WAIT`] (or make the next one return at once).
pub const MSIX_VECTOR_BASE: u8 = 0x40;
/// Number of MSI-X vectors with a kernel gate.
pub const MSIX_VECTORS: u8 = 16;
const _: () = assert!(
    MSIX_VECTOR_BASE as u32 >= layout::VIRTIO_VECTOR_BASE + kore_boot_abi::MAX_DEVICES as u32
        && (MSIX_VECTOR_BASE + MSIX_VECTORS) < WAKE_VECTOR
);

/// Exit statuses written to the debug-exit port.
pub mod status {
    /// Success.
    pub const OK: u32 = 0;
    /// A CPU exception: `EXCEPTION_BASE + vector` (64..=95); the console has the registers.
    pub const EXCEPTION_BASE: u32 = 64;
    /// The kernel found the boot info unusable (bad magic, version, no user image or memory).
    pub const BAD_BOOT: u32 = 63;
    /// The kernel itself panicked (a bug; the console has the location).
    pub const KERNEL_PANIC: u32 = 62;
    /// A ring-3 panic (the message is on the console).
    pub const PANIC: u32 = 101;
    /// A ring-3 allocation failure.
    pub const OUT_OF_MEMORY: u32 = 102;
}

/// Interrupt vector a vCPU sends another to wake it from [`call::WAIT`].
pub const WAKE_VECTOR: u8 = 0xf0;
/// The LAPIC spurious-interrupt vector (no EOI).
pub const SPURIOUS_VECTOR: u8 = 0xff;
/// Size of each CPU's ring-3 stack.
pub const USER_STACK_SIZE: u64 = 2 << 20;
/// Lowest address of memory mapped for ring 3.
pub const USER_BASE: u64 = layout::USER_IMAGE_BASE;

/// Why no [`UserLayout`] could be made.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LayoutError {
    /// No usable RAM region at or above `HEAP_BASE` holds the info copy and the stacks:
    /// give the VM more memory.
    NoUserMemory,
    /// The boot info has no ring-3 user image: pass one to the VMM.
    NoUserImage,
}

/// Where ring 3's boot data, stacks and first heap region live (all in the first usable
/// RAM region at or above [`layout::HEAP_BASE`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UserLayout {
    /// The user-readable copy of the [`BootInfo`] (start of the region).
    pub info_copy: u64,
    /// Bottom of CPU 0's stack; CPU `i`'s stack is `[stacks + i * USER_STACK_SIZE, +USER_STACK_SIZE)`.
    pub stacks: u64,
    /// The heap: from the end of the stacks to the end of the region.
    pub heap_start: u64,
    /// End (exclusive) of the heap.
    pub heap_end: u64,
    /// The user image's entry point.
    pub entry: u64,
}

impl UserLayout {
    /// Computes the layout for `info` (valid boot info).
    pub fn new(info: &BootInfo) -> Result<Self, LayoutError> {
        if info.user_image.entry == 0 {
            return Err(LayoutError::NoUserImage);
        }
        let ncpus = info.vcpu_count.max(1) as u64;
        // The copy gets a whole 2 MiB page, so stacks and heap stay 2 MiB aligned.
        let need = layout::HUGE_PAGE + ncpus * USER_STACK_SIZE + layout::HUGE_PAGE;
        let r = info
            .mem_regions()
            .iter()
            .find(|r| {
                r.kind == MemKind::Usable as u32 && r.base >= layout::HEAP_BASE && r.size >= need
            })
            .ok_or(LayoutError::NoUserMemory)?;
        let stacks = r.base + layout::HUGE_PAGE;
        Ok(Self {
            info_copy: r.base,
            stacks,
            heap_start: stacks + ncpus * USER_STACK_SIZE,
            heap_end: r.base + r.size,
            entry: info.user_image.entry,
        })
    }

    /// Top of CPU `cpu`'s user stack (its initial `rsp`).
    pub fn stack_top(&self, cpu: u64) -> u64 {
        self.stacks + (cpu + 1) * USER_STACK_SIZE
    }
}

/// Usable RAM regions ring 3 may use as heap besides [`UserLayout`]'s own: every usable
/// region at or above [`layout::HEAP_BASE`] other than the one holding the layout.
pub fn extra_heap_regions<'a>(
    info: &'a BootInfo,
    lay: &'a UserLayout,
) -> impl Iterator<Item = (u64, u64)> + 'a {
    info.mem_regions()
        .iter()
        .filter(move |r| {
            r.kind == MemKind::Usable as u32
                && r.base >= layout::HEAP_BASE
                && r.base != lay.info_copy
        })
        .map(|r| (r.base, r.size))
}

/// Where 64-bit PCI BARs may lie, `[base, end)`: from the first GiB boundary at or above the
/// end of every memory-map region (RAM, the pack) and 4 GiB, up to the highest address the
/// page-directory area covers (`MAX_PD` GiB). Nothing the guest has lies there, so mapping
/// it for ring 3 gives away no memory. The VMM assigns passthrough functions' 64-bit BARs in
/// this range (docs/vmm.md). Empty (`base >= end`) if memory reaches the limit.
pub fn pci_high_window(info: &BootInfo) -> (u64, u64) {
    let top = info.mem_regions().iter().map(|r| r.base.saturating_add(r.size)).max().unwrap_or(0);
    let base = top.max(layout::DEVICE_WINDOW_END).next_multiple_of(layout::GIB);
    (base, layout::MAX_PD * layout::GIB)
}

/// The two quadwords of a 64-bit interrupt gate (IF cleared on entry) to `handler` in code
/// segment `selector`, callable from privilege `dpl`, switching to stack IST`ist` (0 = none).
pub const fn interrupt_gate(handler: u64, selector: u16, dpl: u8, ist: u8) -> [u64; 2] {
    let attr = 0x8e | ((dpl as u64 & 3) << 5); // present, 64-bit interrupt gate
    let lo = (handler & 0xffff)
        | ((selector as u64) << 16)
        | ((ist as u64 & 7) << 32)
        | (attr << 40)
        | (((handler >> 16) & 0xffff) << 48);
    [lo, handler >> 32]
}

#[cfg(test)]
mod tests {
    #[test]
    fn gate_encoding_matches_the_sdm_layout() {
        let g = interrupt_gate(0x1234_5678_9abc_def0, 0x10, 3, 1);
        assert_eq!(g[1], 0x1234_5678, "offset 63:32");
        assert_eq!(g[0] & 0xffff, 0xdef0, "offset 15:0");
        assert_eq!((g[0] >> 48) & 0xffff, 0x9abc, "offset 31:16");
        assert_eq!((g[0] >> 16) & 0xffff, 0x10, "selector");
        assert_eq!((g[0] >> 32) & 7, 1, "IST");
        assert_eq!((g[0] >> 40) & 0xff, 0xee, "P=1 DPL=3 type=0xE");
        assert_eq!((interrupt_gate(0, 0x10, 0, 0)[0] >> 40) & 0xff, 0x8e);
    }

    use super::*;

    fn info(regions: &[(u64, u64, MemKind)]) -> BootInfo {
        let mut i = BootInfo::new();
        i.vcpu_count = 4;
        i.user_image.entry = 0x200_0000;
        for &(b, s, k) in regions {
            i.push_mem_region(b, s, k).unwrap();
        }
        i
    }

    #[test]
    fn layout_uses_first_big_enough_heap_region() {
        let mib = 1 << 20;
        let i = info(&[
            (0, 8 * mib, MemKind::BootData),
            (32 * mib, 2 * mib, MemKind::UserImage),
            (34 * mib, 62 * mib, MemKind::Usable), // below HEAP_BASE: not for the layout
            (96 * mib, 4 * mib, MemKind::Usable),  // too small for 4 stacks
            (200 * mib, 100 * mib, MemKind::Usable),
        ]);
        let l = UserLayout::new(&i).unwrap();
        assert_eq!(l.info_copy, 200 * mib);
        assert_eq!(l.stacks, 202 * mib);
        assert_eq!(l.stack_top(0), 204 * mib);
        assert_eq!(l.stack_top(3), 210 * mib);
        assert_eq!((l.heap_start, l.heap_end), (210 * mib, 300 * mib));
        let extra: std::vec::Vec<_> = extra_heap_regions(&i, &l).collect();
        assert_eq!(extra, [(96 * mib, 4 * mib)]);
    }

    #[test]
    fn the_pci_high_window_starts_above_all_memory() {
        let gib = layout::GIB;
        let end = layout::MAX_PD * gib;
        let small = info(&[(96 << 20, 160 << 20, MemKind::Usable)]);
        assert_eq!(pci_high_window(&small), (4 * gib, end));
        let pack = info(&[
            (96 << 20, 2 * gib, MemKind::Usable),
            (3 * gib, gib, MemKind::Device),
            (4 * gib, 5 * gib + 12345, MemKind::Preloaded),
        ]);
        assert_eq!(pci_high_window(&pack), (10 * gib, end));
        let full = info(&[(4 * gib, end, MemKind::Usable)]);
        let (b, e) = pci_high_window(&full);
        assert!(b >= e, "no room left: {b:#x}..{e:#x}");
    }

    #[test]
    fn layout_errors_say_what_is_missing() {
        let mut i = info(&[(96 << 20, 4 << 20, MemKind::Usable)]);
        assert_eq!(UserLayout::new(&i), Err(LayoutError::NoUserMemory));
        i.user_image.entry = 0;
        assert_eq!(UserLayout::new(&i), Err(LayoutError::NoUserImage));
    }

    extern crate std;
}
