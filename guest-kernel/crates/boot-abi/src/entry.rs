//! The per-vCPU entry contract: the CPU state every vCPU starts in.
//!
//! # Registers at entry
//!
//! | register | value |
//! | --- | --- |
//! | `rip` | CPU 0: the kernel ELF entry. Other CPUs: [`crate::BootInfo::ap_entry`] if non-zero when released, else the kernel entry |
//! | `rdi` | [`crate::layout::BOOT_INFO`] (address of [`crate::BootInfo`]) |
//! | `rsi` | CPU index (0 = boot CPU; APIC id = CPU index) |
//! | `rdx` | vCPU count |
//! | `rsp` | [`crate::layout::stack_top`]`(cpu)`, 16-byte aligned |
//! | other GPRs | 0 |
//! | `rflags` | `0x2` (interrupts off) |
//! | `cs` / `ss` | [`KERNEL_CS`] / [`KERNEL_DS`]; `ds`, `es` = [`KERNEL_DS`]; `fs`, `gs` = 0 with base 0 |
//! | `tr` | [`TSS_SELECTOR`]: the CPU's own TSS (RSP0 = its stack top, IST1 = its IST stack, I/O bitmap) |
//! | GDTR | [`crate::layout::gdt`]`(cpu)`, limit 127 |
//! | IDTR | [`crate::layout::IDT`] (zeroed), limit 4095 |
//! | `cr0` | [`CR0`]: PE, MP, ET, NE, WP, PG (EM clear) |
//! | `cr3` | [`crate::layout::PML4`] |
//! | `cr4` | [`CR4`] (PAE, PGE, OSFXSR, OSXMMEXCPT, OSXSAVE) plus FSGSBASE when the CPU has it |
//! | `efer` | [`EFER`]: SCE, LME, LMA, NXE |
//! | `xcr0` | [`XCR0_WANTED`] masked by what the CPU supports (x87, SSE, AVX, AVX-512 state) |
//! | MSRs | `STAR` = [`STAR`], `LSTAR`/`CSTAR`/`SFMASK` = 0, PAT = power-on default |
//! | LAPIC | xAPIC at [`crate::layout::LAPIC_BASE`], enabled; LINT0 masked (no 8259 PIC interrupts), LINT1 NMI |
//!
//! CPUID shows the host's SIMD features (SSE..AVX-512, FMA, F16C, XSAVE,
//! OSXSAVE) even where KVM's own list lacks them; the guest may use them in
//! ring 3 at once. On nested (PVM) hosts ring 0 must stay SIMD-free: AVX or
//! XSAVE at CPL0 stops the VM there.
//!
//! # Segment selectors (Linux's GDT layout)
//!
//! ```
//! use kore_boot_abi::entry::*;
//! assert_eq!((KERNEL_CS, KERNEL_DS, USER_CS32, USER_DS, USER_CS), (0x10, 0x18, 0x23, 0x2b, 0x33));
//! assert_eq!(STAR, 0x0023_0010_0000_0000);
//! assert_eq!(gdt_entries()[2], 0x00af_9b00_0000_ffff); // 64-bit kernel code
//! ```

/// 32-bit kernel code segment (GDT slot 1), unused in long mode.
pub const KERNEL_CS32: u16 = 0x08;
/// 64-bit kernel code segment (GDT slot 2).
pub const KERNEL_CS: u16 = 0x10;
/// Kernel data/stack segment (GDT slot 3).
pub const KERNEL_DS: u16 = 0x18;
/// 32-bit user code segment (GDT slot 4, RPL 3).
pub const USER_CS32: u16 = 0x23;
/// User data/stack segment (GDT slot 5, RPL 3).
pub const USER_DS: u16 = 0x2b;
/// 64-bit user code segment (GDT slot 6, RPL 3). Enter ring 3 with `iretq`
/// using `cs = USER_CS`, `ss = USER_DS`.
pub const USER_CS: u16 = 0x33;
/// TSS selector (GDT slots 8-9, a 16-byte system descriptor).
pub const TSS_SELECTOR: u16 = 0x40;
/// `IA32_STAR` value: SYSCALL CS = 0x10, SYSRET base = 0x23 (Linux's).
pub const STAR: u64 = 0x0023_0010_0000_0000;

/// The code/data descriptors of every CPU's GDT, slots 0..7 (slots 8-9 hold
/// that CPU's TSS descriptor, see [`tss_descriptor`]; 10-15 are zero).
pub const fn gdt_entries() -> [u64; 8] {
    [
        0,                     // 0x00 null
        0x00cf_9b00_0000_ffff, // 0x08 kernel code, 32-bit
        0x00af_9b00_0000_ffff, // 0x10 kernel code, 64-bit (L)
        0x00cf_9300_0000_ffff, // 0x18 kernel data
        0x00cf_fb00_0000_ffff, // 0x20 user code, 32-bit, DPL 3
        0x00cf_f300_0000_ffff, // 0x28 user data, DPL 3
        0x00af_fb00_0000_ffff, // 0x30 user code, 64-bit, DPL 3
        0,                     // 0x38 unused
    ]
}

/// The two 8-byte halves of a 64-bit available-TSS descriptor (type 9) for a
/// TSS at `base` with byte limit `limit`.
pub const fn tss_descriptor(base: u64, limit: u32) -> [u64; 2] {
    let low = (limit as u64 & 0xffff)
        | ((base & 0xff_ffff) << 16)
        | (0x89u64 << 40) // present, DPL 0, type 9
        | (((limit as u64 >> 16) & 0xf) << 48)
        | (((base >> 24) & 0xff) << 56);
    [low, base >> 32]
}

/// CR0 at entry: PE | MP | ET | NE | WP | PG.
pub const CR0: u64 = (1 << 0) | (1 << 1) | (1 << 4) | (1 << 5) | (1 << 16) | (1 << 31);
/// CR4 at entry (before the optional FSGSBASE bit): PAE | PGE | OSFXSR |
/// OSXMMEXCPT | OSXSAVE.
pub const CR4: u64 = (1 << 5) | (1 << 7) | (1 << 9) | (1 << 10) | (1 << 18);
/// CR4.FSGSBASE, set when CPUID reports FSGSBASE (lets ring 3 use
/// `wrfsbase` for thread-local storage).
pub const CR4_FSGSBASE: u64 = 1 << 16;
/// EFER at entry: SCE | LME | LMA | NXE.
pub const EFER: u64 = (1 << 0) | (1 << 8) | (1 << 10) | (1 << 11);
/// XCR0 the VMM asks for: x87 | SSE | AVX | opmask | ZMM_Hi256 | Hi16_ZMM.
/// The value set is this masked by the CPU's supported XCR0 bits.
pub const XCR0_WANTED: u64 = 0xe7;
/// RFLAGS at entry.
pub const RFLAGS: u64 = 0x2;

/// Byte limit of each TSS: 104-byte TSS, the I/O bitmap, one `0xff` byte.
pub const TSS_LIMIT: u32 =
    (crate::layout::TSS_IOMAP_OFFSET + crate::layout::IOMAP_PORTS / 8 + 1 - 1) as u32;
