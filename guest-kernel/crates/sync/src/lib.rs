//! kore-sync: spin locks and barriers for the Kore guest's ring-3 code.
//!
//! The guest has no scheduler: every vCPU runs one ring-3 thread, so waiting is spinning
//! (with `pause`). These primitives are plain atomics and build and test on the host.
#![no_std]

use core::cell::UnsafeCell;
use core::ops::{Deref, DerefMut};
use core::sync::atomic::{AtomicBool, AtomicU32, Ordering};

/// A test-and-test-and-set spin lock protecting a `T`.
pub struct SpinLock<T> {
    locked: AtomicBool,
    value: UnsafeCell<T>,
}

// SAFETY: the lock hands out `&mut T` to one holder at a time, so sharing the lock between
// threads is sound whenever `T` itself may be sent between threads.
unsafe impl<T: Send> Sync for SpinLock<T> {}
// SAFETY: moving the lock moves the `T`; sound when `T: Send`.
unsafe impl<T: Send> Send for SpinLock<T> {}

impl<T> SpinLock<T> {
    /// A new, unlocked lock holding `value`.
    pub const fn new(value: T) -> Self {
        Self { locked: AtomicBool::new(false), value: UnsafeCell::new(value) }
    }

    /// Spins until the lock is free, then takes it.
    pub fn lock(&self) -> SpinGuard<'_, T> {
        loop {
            if let Some(g) = self.try_lock() {
                return g;
            }
            while self.locked.load(Ordering::Relaxed) {
                core::hint::spin_loop();
            }
        }
    }

    /// Takes the lock if it is free.
    pub fn try_lock(&self) -> Option<SpinGuard<'_, T>> {
        if self.locked.compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed).is_ok() {
            Some(SpinGuard { lock: self })
        } else {
            None
        }
    }

    /// The value, given exclusive access to the lock.
    pub fn get_mut(&mut self) -> &mut T {
        self.value.get_mut()
    }
}

/// Holds a [`SpinLock`]; releases it on drop.
pub struct SpinGuard<'a, T> {
    lock: &'a SpinLock<T>,
}

impl<T> Deref for SpinGuard<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        // SAFETY: this guard exists only while the lock is held, so no other reference exists.
        unsafe { &*self.lock.value.get() }
    }
}

impl<T> DerefMut for SpinGuard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: as in `deref`; `&mut self` makes this the only access through the guard.
        unsafe { &mut *self.lock.value.get() }
    }
}

impl<T> Drop for SpinGuard<'_, T> {
    fn drop(&mut self) {
        self.lock.locked.store(false, Ordering::Release);
    }
}

/// A reusable sense-reversing barrier for a fixed number of participants.
pub struct Barrier {
    count: AtomicU32,
    generation: AtomicU32,
    parties: u32,
}

impl Barrier {
    /// A barrier that releases its waiters when `parties` threads have arrived.
    pub const fn new(parties: u32) -> Self {
        Self { count: AtomicU32::new(0), generation: AtomicU32::new(0), parties }
    }

    /// Number of participants.
    pub fn parties(&self) -> u32 {
        self.parties
    }

    /// Waits until all participants arrived. Returns true on exactly one of them (the last).
    pub fn wait(&self) -> bool {
        let gen = self.generation.load(Ordering::Acquire);
        if self.count.fetch_add(1, Ordering::AcqRel) + 1 == self.parties {
            self.count.store(0, Ordering::Relaxed);
            self.generation.store(gen.wrapping_add(1), Ordering::Release);
            return true;
        }
        while self.generation.load(Ordering::Acquire) == gen {
            core::hint::spin_loop();
        }
        false
    }
}

#[cfg(test)]
mod tests {
    extern crate std;
    use super::*;
    use std::sync::Arc;
    use std::vec::Vec;

    #[test]
    fn lock_counts_exactly_across_threads() {
        let lock = Arc::new(SpinLock::new(0u64));
        let hs: Vec<_> = (0..4)
            .map(|_| {
                let l = lock.clone();
                std::thread::spawn(move || {
                    for _ in 0..5_000 {
                        *l.lock() += 1;
                    }
                })
            })
            .collect();
        for h in hs {
            h.join().unwrap();
        }
        assert_eq!(*lock.lock(), 20_000);
    }

    #[test]
    fn try_lock_fails_while_held() {
        let lock = SpinLock::new(1);
        let g = lock.lock();
        assert!(lock.try_lock().is_none());
        drop(g);
        assert!(lock.try_lock().is_some());
    }

    #[test]
    fn barrier_phases_do_not_overlap() {
        const N: usize = 3;
        let barrier = Arc::new(Barrier::new(N as u32));
        let phase = Arc::new(core::sync::atomic::AtomicUsize::new(0));
        let hs: Vec<_> = (0..N)
            .map(|_| {
                let (b, p) = (barrier.clone(), phase.clone());
                std::thread::spawn(move || {
                    let mut leaders = 0;
                    for round in 0..50 {
                        p.fetch_add(1, Ordering::SeqCst);
                        b.wait();
                        // Everyone has incremented for this round before anyone goes on.
                        assert!(p.load(Ordering::SeqCst) >= (round + 1) * N);
                        if b.wait() {
                            leaders += 1;
                        }
                    }
                    leaders
                })
            })
            .collect();
        let leaders: usize = hs.into_iter().map(|h| h.join().unwrap()).sum();
        assert_eq!(leaders, 50);
    }
}
