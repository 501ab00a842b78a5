//! The vCPU pool: CPU 0 runs the image's main; CPUs 1.. run [`parallel`] jobs.
//!
//! An idle worker spins for [`spin_ns`] (native in ring 3, ~0.1 µs wake-up), then sleeps in
//! the kernel's WAIT (no host CPU used); [`parallel`] wakes sleepers with an IPI
//! ([`WAKE_VECTOR`]) written straight to the local APIC from ring 3.

use core::sync::atomic::{AtomicBool, AtomicPtr, AtomicU32, AtomicU64, Ordering};

use kore_guest_abi::{layout, WAKE_VECTOR};
use kore_sync::SpinLock;

use crate::{clock, cpu_count, kcall};

/// Most vCPUs the pool serves.
pub const MAX_CPUS: usize = layout::MAX_VCPUS as usize;

struct Task<'a> {
    f: &'a (dyn Fn(usize, usize) + Sync),
}

static CALL: SpinLock<()> = SpinLock::new(());
static GEN: AtomicU32 = AtomicU32::new(0);
static TASK: AtomicPtr<()> = AtomicPtr::new(core::ptr::null_mut());
static DONE: AtomicU32 = AtomicU32::new(0);
static SLEEPING: [AtomicBool; MAX_CPUS] = [const { AtomicBool::new(false) }; MAX_CPUS];
static SPIN_NS: AtomicU64 = AtomicU64::new(200_000);

/// How long an idle worker spins before it halts (default 200 µs).
pub fn spin_ns() -> u64 {
    SPIN_NS.load(Ordering::Relaxed)
}

/// Sets the idle spin time (0 = halt at once when idle).
pub fn set_spin_ns(ns: u64) {
    SPIN_NS.store(ns, Ordering::Relaxed);
}

/// Runs `f(index, count)` on every vCPU (the caller is index 0) and returns when all are done.
/// Call it from CPU 0; a call from a worker (e.g. nested inside a job) runs `f(0, 1)` inline.
pub fn parallel(f: &(dyn Fn(usize, usize) + Sync)) {
    let n = cpu_count().min(MAX_CPUS);
    if n <= 1 || crate::cpu_id() != 0 {
        f(0, 1);
        return;
    }
    let _g = CALL.lock();
    let task = Task { f };
    TASK.store(&task as *const Task<'_> as *mut (), Ordering::Release);
    DONE.store(0, Ordering::Relaxed);
    GEN.fetch_add(1, Ordering::SeqCst);
    for (cpu, sleeping) in SLEEPING.iter().enumerate().take(n).skip(1) {
        if sleeping.load(Ordering::SeqCst) {
            wake(cpu);
        }
    }
    f(0, n);
    while DONE.load(Ordering::Acquire) < (n - 1) as u32 {
        core::hint::spin_loop();
    }
    TASK.store(core::ptr::null_mut(), Ordering::Relaxed);
}

/// Sends the wake IPI to `cpu` (ends its WAIT, or makes its next WAIT return at once).
pub fn wake(cpu: usize) {
    let lapic = layout::LAPIC_BASE;
    // SAFETY: the LAPIC page is mapped for ring 3; ICR high then low sends a fixed IPI.
    // Ring 3 runs with interrupts off, so nothing interleaves the two writes on this CPU.
    unsafe {
        ((lapic + 0x310) as *mut u32).write_volatile((cpu as u32) << 24);
        ((lapic + 0x300) as *mut u32).write_volatile(0x4000 | WAKE_VECTOR as u32);
    }
}

/// A worker vCPU's life: wait for a job generation, run it, count it done.
pub(crate) fn worker_loop(cpu: usize) -> ! {
    if cpu >= MAX_CPUS {
        loop {
            kcall::wait();
        }
    }
    // Generation 0 is "no job yet": a worker that starts late still runs the first job.
    let mut seen = 0;
    loop {
        let mut since = clock::ticks();
        let gen = loop {
            let g = GEN.load(Ordering::Acquire);
            if g != seen {
                break g;
            }
            if clock::ticks_to_ns(clock::ticks() - since) > spin_ns() {
                SLEEPING[cpu].store(true, Ordering::SeqCst);
                if GEN.load(Ordering::SeqCst) == seen {
                    kcall::wait();
                }
                SLEEPING[cpu].store(false, Ordering::SeqCst);
                since = clock::ticks();
            }
            core::hint::spin_loop();
        };
        seen = gen;
        let task = TASK.load(Ordering::Acquire) as *const Task<'_>;
        // SAFETY: `parallel` stored the task before bumping GEN and keeps it alive until every
        // worker has counted itself done below.
        let f = unsafe { (*task).f };
        f(cpu, cpu_count().min(MAX_CPUS));
        DONE.fetch_add(1, Ordering::Release);
    }
}
