//! kore-rt: the ring-3 runtime Kore images (the appliance) run on.
//!
//! An image is a `#![no_std] #![no_main]` binary for `x86_64-unknown-linux-gnu` (hard-float, so
//! SSE/AVX/AVX-512 code runs natively in ring 3) linked by `kore-rt-build`. It names its main
//! function with [`main!`]. Every vCPU enters `_start` at CPL 3 (see `kore-guest-abi`);
//! CPU 0 sets up the heap over the boot-info memory map, then runs the image's main, whose
//! return value becomes the VM's exit status. The other CPUs become [`smp`] pool workers.
//!
//! Provided: a global allocator ([`kore_heap::Heap`]), [`clock`] (TSC), [`console`] output
//! and `println!`, [`kcall`] wrappers (exit, log, wait), [`smp`] (parallel jobs over all
//! vCPUs, wake IPIs), spin locks and barriers ([`sync`]), [`pci`] (config space, BARs mapped
//! by the kernel, MSI-X vectors), and a panic handler that prints the message and exits with
//! `status::PANIC`.
#![no_std]

pub mod clock;
pub mod console;
pub mod kcall;
mod mem;
mod panic;
pub mod pci;
pub mod smp;
pub mod vsock;

pub use kore_guest_abi::{self as abi, status, BootInfo};
pub use kore_sync as sync;

use core::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};

use kore_guest_abi::{extra_heap_regions, UserLayout};

/// The global allocator: one heap over the user RAM of the boot-info memory map.
#[global_allocator]
pub static HEAP: kore_heap::Heap = kore_heap::Heap::empty();

static INFO: AtomicU64 = AtomicU64::new(0);
static NCPUS: AtomicU32 = AtomicU32::new(1);
static READY: AtomicBool = AtomicBool::new(false);
/// Bottom of CPU 0's user stack: `cpu_id` derives the CPU from the stack pointer.
static STACKS: AtomicU64 = AtomicU64::new(0);

core::arch::global_asm!(
    ".section .text._start,\"ax\"",
    ".global _start",
    "_start:",
    // rdi = boot-info copy, rsi = CPU index, rdx = vCPU count (kernel -> ring-3 contract).
    "and rsp, -16",
    "xor ebp, ebp",
    "call {start}",
    "ud2",
    start = sym start,
);

extern "Rust" {
    /// The image's main (defined by [`main!`]).
    fn __kore_main() -> u32;
}

/// Defines the image's main function: `kore_rt::main!(my_main);` with `fn my_main() -> u32`.
/// It runs on CPU 0 once the heap is ready; its result is the VM's exit status.
#[macro_export]
macro_rules! main {
    ($f:path) => {
        #[unsafe(no_mangle)]
        fn __kore_main() -> u32 {
            let f: fn() -> u32 = $f;
            f()
        }
    };
}

extern "sysv64" fn start(info: *const BootInfo, cpu: u64, ncpus: u64) -> ! {
    if cpu == 0 {
        // SAFETY: the kernel passes the address of its user-readable boot-info copy, which
        // stays unchanged for the VM's lifetime.
        let info_ref = unsafe { &*info };
        init_heap(info_ref);
        INFO.store(info as u64, Ordering::Relaxed);
        NCPUS.store(ncpus as u32, Ordering::Relaxed);
        clock::init(info_ref.tsc_khz);
        READY.store(true, Ordering::Release);
        // SAFETY: `main!` defines `__kore_main` with this signature.
        let status = unsafe { __kore_main() };
        kcall::exit(status)
    }
    while !READY.load(Ordering::Acquire) {
        core::hint::spin_loop();
    }
    smp::worker_loop(cpu as usize)
}

fn init_heap(info: &BootInfo) {
    let Ok(lay) = UserLayout::new(info) else {
        console::write(b"kore-rt: no usable memory for the heap\n");
        kcall::exit(status::OUT_OF_MEMORY)
    };
    STACKS.store(lay.stacks, Ordering::Relaxed);
    // SAFETY: the layout's heap and the extra usable regions are user RAM that only ring 3
    // uses (the kernel placed the info copy and stacks outside them).
    unsafe {
        HEAP.init(lay.heap_start as usize, (lay.heap_end - lay.heap_start) as usize);
        for (base, size) in extra_heap_regions(info, &lay) {
            HEAP.init(base as usize, size as usize);
        }
    }
}

/// The boot info (a read-only copy the kernel made for ring 3).
pub fn boot_info() -> &'static BootInfo {
    let p = INFO.load(Ordering::Relaxed) as *const BootInfo;
    assert!(!p.is_null(), "boot_info() before the runtime started");
    // SAFETY: set once by CPU 0 before any other code runs; the copy is never written again.
    unsafe { &*p }
}

/// A file the VMM preloaded (e.g. the pack's weights), as read-only bytes.
pub fn preloaded(name: &[u8]) -> Option<&'static [u8]> {
    let f = boot_info().file(name)?;
    // SAFETY: the VMM placed the file at [gpa, gpa + size) in RAM mapped read-only for ring 3,
    // and nothing writes it while the VM runs.
    Some(unsafe { core::slice::from_raw_parts(f.gpa as *const u8, f.size as usize) })
}

/// All preloaded files: (name, bytes).
pub fn preloaded_files() -> impl Iterator<Item = (&'static [u8], &'static [u8])> {
    boot_info().files().iter().filter_map(|f| Some((f.name(), preloaded(f.name())?)))
}

/// Number of vCPUs.
pub fn cpu_count() -> usize {
    NCPUS.load(Ordering::Relaxed) as usize
}

/// The calling vCPU's index (0 is the boot CPU), from the stack pointer: each CPU runs on its
/// own `USER_STACK_SIZE` slot of the user layout (no trap, unlike reading the APIC id).
pub fn cpu_id() -> usize {
    let rsp: u64;
    // SAFETY: reads the stack pointer only.
    unsafe {
        core::arch::asm!("mov {}, rsp", out(reg) rsp, options(nomem, nostack, preserves_flags))
    };
    (rsp.wrapping_sub(STACKS.load(Ordering::Relaxed)) / abi::USER_STACK_SIZE) as usize
}

/// The calling vCPU's local APIC id (a trapped MMIO read; equals `cpu_id()` under our VMM).
pub fn apic_id() -> usize {
    // SAFETY: the LAPIC page is mapped for ring 3 (device window); the ID register is readable.
    (unsafe { ((abi::layout::LAPIC_BASE + 0x20) as *const u32).read_volatile() } >> 24) as usize
}

/// The `rust_eh_personality` symbol the prebuilt `core`/`alloc` reference; never called
/// because images are built with `panic = "abort"`.
#[unsafe(no_mangle)]
pub extern "C" fn rust_eh_personality() {}

/// `_Unwind_Resume`, referenced by landing pads in the prebuilt `alloc` (e.g. `format`);
/// never reached because images are built with `panic = "abort"`. Exits as a panic would.
#[unsafe(no_mangle)]
pub extern "C" fn _Unwind_Resume() -> ! {
    console::write_unlocked(b"kore-rt: _Unwind_Resume reached (unwinding is not supported)\n");
    kcall::exit(status::PANIC)
}
