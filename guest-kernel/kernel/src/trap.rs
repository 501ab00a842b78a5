//! Entry stubs (assembly) and the exception report.
//!
//! * `kcall_entry` (vector 3, DPL 3): the `int3` kernel-call gate. Its paths are a handful of
//!   instructions each because ring 0 is emulated: `WAIT` returns at once if this CPU's
//!   `WOKEN` flag is set (an interrupt arrived since the last wait), else `sti; hlt; cli`; either
//!   way it clears the flag. `EXIT` is an `out`, `LOG` an `out` loop over user memory,
//!   `MAP_BAR` a call into [`crate::pci`] (setup only, so its cost does not matter).
//! * `irq_entry`: sets this CPU's `WOKEN` flag, EOIs the local APIC and returns; the interrupt's
//!   only job is to end a `hlt`. It saves what it uses: although ring 3 runs with IF = 0, the
//!   PVM host here sometimes delivers a device interrupt while ring 3 runs, so the stub must not
//!   trust any register and must leave a trace that the next `WAIT` sees (else that wake-up is
//!   lost). The CPU index comes from the stack pointer: both entries run on the CPU's own
//!   kernel stack in `[STACKS + cpu * STACK_SLOT, +STACK_SLOT)`.
//! * `exc<N>`: push the vector (and a zero error code where the CPU pushes none), save all
//!   registers and call [`exception`], which prints them with CR2 and ends the VM.

use kore_guest_abi::{call, layout, ports, status, USER_BASE};

use crate::console;

core::arch::global_asm!(
    ".section .text.kcall,\"ax\"",
    ".global kore_kcall_entry",
    "kore_kcall_entry:",
    "cmp rax, {wait}",
    "je 22f",
    "cmp rax, {log}",
    "je 33f",
    "test rax, rax",
    "je 44f",
    "cmp rax, {map_bar}",
    "je 99f",
    "mov rax, -1",
    "iretq",
    // map_bar(rdi = function, rsi = bar) -> rax, rdx: a Rust call; r8-r11 are not call
    // clobbers of the gate, so they are saved; the stack is realigned and DF cleared.
    "99:",
    "push rbp",
    "mov rbp, rsp",
    "push r8",
    "push r9",
    "push r10",
    "push r11",
    "and rsp, -16",
    "cld",
    "call {map_bar_call}",
    "lea rsp, [rbp - 32]",
    "pop r11",
    "pop r10",
    "pop r9",
    "pop r8",
    "pop rbp",
    "iretq",
    // wait: an interrupt taken since the last wait (flag set) ends it at once; interrupts
    // pending in the LAPIC end the hlt at once (sti shadow). rax, rcx are call clobbers.
    "22:",
    "mov rax, rsp",
    "sub rax, {stacks}",
    "shr rax, {slot_shift}",
    "lea rcx, [rip + {woken}]",
    "add rcx, rax",
    "cmp byte ptr [rcx], 0",
    "jne 23f",
    "sti",
    "hlt",
    "cli",
    "23:",
    "mov byte ptr [rcx], 0",
    "iretq",
    // log(rdi = ptr, rsi = len): only user memory, no wrap-around.
    "33:",
    "mov rcx, rsi",
    "mov rax, {user_base}",
    "cmp rdi, rax",
    "jb 55f",
    "mov rax, rdi",
    "add rax, rcx",
    "jc 55f",
    "test rcx, rcx",
    "jz 66f",
    "mov rsi, rdi",
    "mov dx, {com1}",
    "cld",
    "77:",
    "lodsb",
    "out dx, al",
    "dec rcx",
    "jnz 77b",
    "66:",
    "xor eax, eax",
    "iretq",
    "55:",
    "mov rax, -1",
    "iretq",
    // exit(rdi = status)
    "44:",
    "mov eax, edi",
    "mov dx, {exit_port}",
    "out dx, eax",
    "88:",
    "hlt",
    "jmp 88b",
    "",
    ".global kore_irq_entry",
    "kore_irq_entry:",
    "push rax",
    "push rcx",
    "mov rax, rsp",
    "sub rax, {stacks}",
    "shr rax, {slot_shift}",
    "lea rcx, [rip + {woken}]",
    "mov byte ptr [rcx + rax], 1",
    "mov rax, {eoi}",
    "mov dword ptr [rax], eax",
    "pop rcx",
    "pop rax",
    "iretq",
    "",
    ".global kore_spurious_entry",
    "kore_spurious_entry:",
    "iretq",
    wait = const call::WAIT,
    log = const call::LOG,
    map_bar = const call::MAP_BAR,
    map_bar_call = sym crate::pci::map_bar_call,
    user_base = const USER_BASE,
    com1 = const ports::SERIAL_COM1,
    exit_port = const ports::DEBUG_EXIT,
    eoi = const layout::LAPIC_BASE + 0xb0,
    stacks = const layout::STACKS,
    slot_shift = const SLOT_SHIFT,
    woken = sym WOKEN,
);

/// `log2(STACK_SLOT)`: the CPU index is `(rsp - STACKS) >> SLOT_SHIFT` on its kernel stack.
const SLOT_SHIFT: u32 = layout::STACK_SLOT.trailing_zeros();
const _: () = assert!(1 << SLOT_SHIFT == layout::STACK_SLOT && layout::STACKS < 1 << 31);

/// Per-CPU "an interrupt arrived since the last WAIT" flags (written only by the stubs above).
static WOKEN: [core::sync::atomic::AtomicU8; layout::MAX_VCPUS as usize] =
    [const { core::sync::atomic::AtomicU8::new(0) }; layout::MAX_VCPUS as usize];

core::arch::global_asm!(
    ".section .text.exc,\"ax\"",
    ".irp n, 0,1,2,3,4,5,6,7,9,15,16,18,19,20,22,23,24,25,26,27,28,31",
    "kore_exc\\n:",
    "push 0",
    "push \\n",
    "jmp kore_exc_common",
    ".endr",
    ".irp n, 8,10,11,12,13,14,17,21,29,30",
    "kore_exc\\n:",
    "push \\n",
    "jmp kore_exc_common",
    ".endr",
    "kore_exc_common:",
    "push r15",
    "push r14",
    "push r13",
    "push r12",
    "push r11",
    "push r10",
    "push r9",
    "push r8",
    "push rbp",
    "push rdi",
    "push rsi",
    "push rdx",
    "push rcx",
    "push rbx",
    "push rax",
    "mov rdi, rsp",
    "and rsp, -16",
    "call {exception}",
    "ud2",
    ".section .rodata.exc,\"a\"",
    ".balign 8",
    ".global kore_exc_table",
    "kore_exc_table:",
    ".irp n, 0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,21,22,23,24,25,26,27,28,29,30,31",
    ".quad kore_exc\\n",
    ".endr",
    exception = sym exception,
);

extern "C" {
    static kore_exc_table: [u64; 32];
    fn kore_kcall_entry();
    fn kore_irq_entry();
    fn kore_spurious_entry();
}

/// Addresses of the 32 exception stubs.
pub fn exception_stubs() -> [u64; 32] {
    // SAFETY: a read-only table of addresses emitted above.
    unsafe { kore_exc_table }
}

/// Address of the kernel-call gate.
pub fn kcall_entry() -> u64 {
    kore_kcall_entry as *const () as u64
}

/// Address of the device/IPI interrupt stub.
pub fn irq_entry() -> u64 {
    kore_irq_entry as *const () as u64
}

/// Address of the spurious-interrupt stub.
pub fn spurious_entry() -> u64 {
    kore_spurious_entry as *const () as u64
}

/// Registers saved by `kore_exc_common`, lowest address first, then the CPU's frame.
#[repr(C)]
pub struct Frame {
    gpr: [u64; 15],
    vector: u64,
    error: u64,
    rip: u64,
    cs: u64,
    rflags: u64,
    rsp: u64,
    ss: u64,
}

const GPR_NAMES: [&[u8; 3]; 15] = [
    b"rax", b"rbx", b"rcx", b"rdx", b"rsi", b"rdi", b"rbp", b" r8", b" r9", b"r10", b"r11", b"r12",
    b"r13", b"r14", b"r15",
];

fn field(name: &[u8], v: u64) {
    console::write(b" ");
    console::write(name);
    console::write(b"=");
    console::hex(v);
}

/// Prints the exception and the registers, then ends the VM with `EXCEPTION_BASE + vector`.
extern "sysv64" fn exception(f: &Frame) -> ! {
    let cr2: u64;
    // SAFETY: reading CR2 has no side effects.
    unsafe {
        core::arch::asm!("mov {}, cr2", out(reg) cr2, options(nomem, nostack, preserves_flags))
    };
    // SAFETY: the LAPIC ID register is readable MMIO (device window).
    let apic_id = unsafe { ((layout::LAPIC_BASE + 0x20) as *const u32).read_volatile() } >> 24;
    console::write(b"\nkore: CPU exception vector=");
    console::dec(f.vector);
    console::write(if f.cs & 3 == 3 { b" in ring 3" } else { b" in ring 0" });
    console::write(b" cpu=");
    console::dec(apic_id as u64);
    console::write(b"\n");
    field(b"err", f.error);
    field(b"cr2", cr2);
    field(b"rip", f.rip);
    field(b"cs", f.cs);
    field(b"rflags", f.rflags);
    field(b"rsp", f.rsp);
    field(b"ss", f.ss);
    for (i, (name, v)) in GPR_NAMES.iter().zip(f.gpr).enumerate() {
        if i % 4 == 0 {
            console::write(b"\n");
        }
        field(&name[..], v);
    }
    console::write(b"\n");
    console::exit(status::EXCEPTION_BASE + (f.vector as u32 & 31))
}
