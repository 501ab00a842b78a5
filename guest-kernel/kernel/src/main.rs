//! Kore, the guest kernel: ring 0.
//!
//! Ring 0 on this project's KVM is emulated (~1 µs per instruction) and dies on any SIMD
//! instruction, so it does as little as possible: on CPU 0 it checks the [`BootInfo`], fills
//! the IDT, copies the boot info where ring 3 can read it and releases the other vCPUs; on every
//! CPU it enables the local APIC and enters the ring-3 image with `iretq`. After that it only
//! runs for the `int3` kernel calls ([`kore_guest_abi::call`]), interrupts taken while a vCPU
//! waits, `MAP_BAR` (PCI BARs for ring-3 drivers, [`pci`]), and exceptions (reported on the
//! serial console, then the VM exits). The VMM has already
//! built the page tables (kernel supervisor-only, user image and heap user, pack read-only),
//! the GDT, the TSS and the control registers (see `kore-boot-abi`).
#![no_std]
#![no_main]

mod console;
mod idt;
mod pci;
mod trap;

use core::sync::atomic::{AtomicU64, Ordering};

use kore_guest_abi::{layout, status, BootInfo, UserLayout, SPURIOUS_VECTOR};

core::arch::global_asm!(
    ".section .text._start,\"ax\"",
    ".global _start",
    "_start:",
    // The VMM gives rdi = boot info, rsi = CPU index, rdx = vCPU count, rsp = kernel stack.
    "call {kmain}",
    "ud2",
    kmain = sym kmain,
);

/// Ring-3 entry point, set by CPU 0 before it releases the other CPUs.
static USER_ENTRY: AtomicU64 = AtomicU64::new(0);
/// Bottom of CPU 0's user stack (see `UserLayout::stacks`).
static USER_STACKS: AtomicU64 = AtomicU64::new(0);
/// The user-readable boot-info copy.
static USER_INFO: AtomicU64 = AtomicU64::new(0);

/// Boot path of every CPU (called from `_start`).
extern "sysv64" fn kmain(info: *const BootInfo, cpu: u64, ncpus: u64) -> ! {
    if cpu == 0 {
        // SAFETY: the entry contract puts the VMM-written boot info's address in rdi.
        boot_cpu0(unsafe { &*info });
    }
    idt::load();
    lapic_enable();
    let (entry, info_copy) =
        (USER_ENTRY.load(Ordering::Acquire), USER_INFO.load(Ordering::Acquire));
    let stack = USER_STACKS.load(Ordering::Acquire) + (cpu + 1) * kore_guest_abi::USER_STACK_SIZE;
    // SAFETY: CPU 0 computed these from a validated boot info; the image and stack are user memory.
    unsafe { enter_user(entry, stack, info_copy, cpu, ncpus) }
}

/// CPU 0's one-time setup.
fn boot_cpu0(info: &BootInfo) {
    if info.validate().is_err() {
        console::fail(b"kore: boot info rejected (magic, version or size): rebuild the VMM and kernel together\n", status::BAD_BOOT);
    }
    let lay = match UserLayout::new(info) {
        Ok(l) => l,
        Err(kore_guest_abi::LayoutError::NoUserImage) => console::fail(
            b"kore: no ring-3 user image in the boot info: give the VMM one\n",
            status::BAD_BOOT,
        ),
        Err(kore_guest_abi::LayoutError::NoUserMemory) => console::fail(
            b"kore: not enough usable RAM for ring-3 stacks: give the VM more memory\n",
            status::BAD_BOOT,
        ),
    };
    let pci = pci::init(info);
    idt::install(info, pci);
    // SAFETY: `info_copy` is the start of a usable RAM region of at least 2 MiB that nothing else
    // uses yet (UserLayout reserves it); the source is the VMM's block of exactly this size.
    unsafe {
        core::ptr::copy_nonoverlapping(
            info as *const BootInfo as *const u8,
            lay.info_copy as *mut u8,
            core::mem::size_of::<BootInfo>(),
        )
    };
    USER_ENTRY.store(lay.entry, Ordering::Relaxed);
    USER_STACKS.store(lay.stacks, Ordering::Relaxed);
    USER_INFO.store(lay.info_copy, Ordering::Release);
    if info.vcpu_count > 1 {
        // SAFETY: the release port is the VMM's (boot ABI); writing it starts the other CPUs.
        unsafe {
            core::arch::asm!("out dx, al", in("dx") info.smp_release_port, in("al") 1u8, options(nomem, nostack))
        };
    }
}

/// Software-enables this CPU's local APIC (spurious vector 0xff), so device interrupts and
/// wake IPIs are delivered.
fn lapic_enable() {
    let svr = (layout::LAPIC_BASE + 0xf0) as *mut u32;
    // SAFETY: the LAPIC page is mapped (device window, uncached); SVR is a 32-bit register.
    unsafe { svr.write_volatile(0x100 | SPURIOUS_VECTOR as u32) };
}

/// Drops to ring 3 at `entry` with the ring-3 entry registers (see `kore-guest-abi`).
///
/// # Safety
/// `entry` must be code and `stack` the top of a stack in user-mapped memory.
unsafe fn enter_user(entry: u64, stack: u64, info: u64, cpu: u64, ncpus: u64) -> ! {
    // SAFETY: builds an iretq frame to CPL 3 (user SS 0x2b, CS 0x33, RFLAGS with IF = 0);
    // the caller guarantees the target.
    unsafe {
        core::arch::asm!(
            "push {user_ds}",
            "push {stack}",
            "push 0x2",
            "push {user_cs}",
            "push {entry}",
            "xor eax, eax",
            "xor ebx, ebx",
            "xor ecx, ecx",
            "xor ebp, ebp",
            "xor r8d, r8d",
            "xor r9d, r9d",
            "xor r10d, r10d",
            "xor r11d, r11d",
            "iretq",
            stack = in(reg) stack,
            entry = in(reg) entry,
            user_ds = const kore_guest_abi::entry::USER_DS,
            user_cs = const kore_guest_abi::entry::USER_CS,
            in("rdi") info,
            in("rsi") cpu,
            in("rdx") ncpus,
            options(noreturn),
        )
    }
}

#[panic_handler]
fn panic(p: &core::panic::PanicInfo) -> ! {
    console::write(b"kore: kernel panic at ");
    if let Some(loc) = p.location() {
        console::write(loc.file().as_bytes());
        console::write(b":");
        console::dec(loc.line() as u64);
    }
    console::fail(b"\n", status::KERNEL_PANIC)
}
