//! Kernel calls: `int3` with the call number in `rax` (see `kore-guest-abi`).

use kore_guest_abi::call;

/// Ends the VM with `status`.
pub fn exit(status: u32) -> ! {
    // SAFETY: the EXIT call does not return.
    unsafe {
        core::arch::asm!("int3", in("rax") call::EXIT, in("rdi") status as u64, options(noreturn))
    }
}

/// Writes `msg` to the serial console through the kernel (slow: a ring-0 loop; prefer
/// [`crate::console`], which writes the port from ring 3). Returns false if refused.
pub fn log(msg: &[u8]) -> bool {
    let ret: u64;
    // SAFETY: the kernel only reads `msg` (user memory); it clobbers rax, rcx, rdx, rsi, rdi.
    unsafe {
        core::arch::asm!("int3", inout("rax") call::LOG => ret, inout("rdi") msg.as_ptr() => _,
            inout("rsi") msg.len() => _, out("rcx") _, out("rdx") _, options(nostack))
    };
    ret == 0
}

/// Halts this vCPU until an interrupt (device or wake IPI) arrives. Interrupts that arrived
/// since the last wait make it return at once, so "check, then wait" loses no wake-up.
pub fn wait() {
    // SAFETY: the WAIT call only halts; it clobbers rax, rcx, rdx, rsi, rdi.
    unsafe {
        core::arch::asm!("int3", inout("rax") call::WAIT => _, out("rcx") _, out("rdx") _,
            out("rsi") _, out("rdi") _, options(nostack))
    };
}

/// Makes a kernel call with an unknown number: the cheapest ring-3 -> ring-0 -> ring-3 round
/// trip (for measuring the gate). Returns what the kernel returned (`call::BAD_CALL`).
pub fn null_call() -> u64 {
    let ret: u64;
    // SAFETY: unknown call numbers only return BAD_CALL; clobbers as for the other calls.
    unsafe {
        core::arch::asm!("int3", inout("rax") 0xffffu64 => ret, out("rcx") _, out("rdx") _,
            out("rsi") _, out("rdi") _, options(nostack))
    };
    ret
}

/// Why [`map_bar`] refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MapBarError {
    /// No PCI host bridge in the boot info.
    NoBridge,
    /// No such function (or a bad BAR index).
    NoFunction,
    /// That slot is not a memory BAR.
    NoBar,
    /// The BAR lies outside the PCI BAR windows (32-bit, and 64-bit above all memory).
    OutsideWindow,
    /// The kernel ran out of page tables for BAR mappings.
    NoPageTables,
    /// The kernel does not know the call (an older kernel).
    Unsupported,
}

impl core::fmt::Display for MapBarError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(match self {
            Self::NoBridge => "no PCI host bridge in the boot info",
            Self::NoFunction => "no such PCI function or BAR index",
            Self::NoBar => "not a memory BAR",
            Self::OutsideWindow => "BAR outside the PCI BAR windows",
            Self::NoPageTables => "the kernel's BAR page tables are used up",
            Self::Unsupported => "the kernel has no MAP_BAR call",
        })
    }
}

/// Asks the kernel to map memory BAR `bar` of the PCI function at ECAM offset `function`
/// for ring 3 (uncached, only the BAR's pages). Returns the BAR's (address, size).
pub fn map_bar(function: u64, bar: u8) -> Result<(u64, u64), MapBarError> {
    use kore_guest_abi::map_bar as e;
    let (rax, rdx): (u64, u64);
    // SAFETY: MAP_BAR only changes page tables of the PCI BAR window; it clobbers rax, rcx,
    // rdx, rsi, rdi like every call.
    unsafe {
        core::arch::asm!("int3", inout("rax") call::MAP_BAR => rax, inout("rdi") function => _,
            inout("rsi") bar as u64 => _, out("rcx") _, out("rdx") rdx, options(nostack))
    };
    Err(match rax {
        e::NO_BRIDGE => MapBarError::NoBridge,
        e::NO_FUNCTION => MapBarError::NoFunction,
        e::NO_BAR => MapBarError::NoBar,
        e::OUTSIDE_WINDOW => MapBarError::OutsideWindow,
        e::NO_PAGE_TABLES => MapBarError::NoPageTables,
        call::BAD_CALL => MapBarError::Unsupported,
        _ => return Ok((rax, rdx)),
    })
}
