//! Time from the TSC (`rdtsc` is native in ring 3; its rate is `BootInfo::tsc_khz`).

use core::sync::atomic::{AtomicU64, Ordering};

static TSC_KHZ: AtomicU64 = AtomicU64::new(0);

pub(crate) fn init(khz: u64) {
    TSC_KHZ.store(khz.max(1), Ordering::Relaxed);
}

/// The raw time-stamp counter.
#[inline]
pub fn ticks() -> u64 {
    // SAFETY: rdtsc has no side effects.
    unsafe { core::arch::x86_64::_rdtsc() }
}

/// TSC frequency in kHz.
pub fn tsc_khz() -> u64 {
    TSC_KHZ.load(Ordering::Relaxed).max(1)
}

/// Converts a tick count to nanoseconds.
pub fn ticks_to_ns(t: u64) -> u64 {
    (t as u128 * 1_000_000 / tsc_khz() as u128) as u64
}

/// Nanoseconds since the TSC's zero (VM start, roughly).
pub fn now_ns() -> u64 {
    ticks_to_ns(ticks())
}

/// Spins for at least `ns` nanoseconds.
pub fn spin_ns(ns: u64) {
    let end = ticks() + (ns as u128 * tsc_khz() as u128 / 1_000_000) as u64;
    while ticks() < end {
        core::hint::spin_loop();
    }
}
