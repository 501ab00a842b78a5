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
