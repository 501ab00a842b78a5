//! Worker pools: every heavy op splits its rows across `workers()` workers.
//!
//! [`Parallel`] is object-safe and `no_std`: the host implements it with
//! threads ([`ThreadPool`], feature `std`), the Kore guest with its vCPUs
//! (`kore-rt` `smp::parallel`). [`Serial`] runs everything on the caller.
//!
//! Contract of `run(f)`: calls `f(worker, n)` exactly once for every
//! `worker in 0..n` (`n = workers()`), possibly concurrently, and returns
//! only after every call has returned. `f` must not call `run` on the same
//! pool again (nested calls are run serially by [`ThreadPool`]).

use core::fmt;
use core::ops::Range;

/// A raw pointer to an `f32` buffer whose disjoint parts the workers of one
/// [`Parallel::run`] write (matmul rows, DeltaNet heads, attention items).
#[derive(Clone, Copy)]
pub(crate) struct SharedMut(*mut f32);
// SAFETY: users hand each part of the buffer to one worker only, and the
// buffer outlives the `Parallel::run` that shares the pointer (`run` returns
// only after every worker has finished).
unsafe impl Sync for SharedMut {}
// SAFETY: as above.
unsafe impl Send for SharedMut {}

impl SharedMut {
    /// Shares `buf` with the workers of the next pool run.
    pub(crate) fn new(buf: &mut [f32]) -> Self {
        SharedMut(buf.as_mut_ptr())
    }

    /// `len` elements at `off`.
    ///
    /// # Safety
    /// `off + len` is inside the buffer, the buffer is still alive, and no one
    /// else accesses these elements while the slice lives.
    #[allow(clippy::mut_from_ref)]
    pub(crate) unsafe fn slice(&self, off: usize, len: usize) -> &mut [f32] {
        // SAFETY: guaranteed by the caller.
        unsafe { core::slice::from_raw_parts_mut(self.0.add(off), len) }
    }

    /// The same buffer from element `off` on.
    ///
    /// # Safety
    /// `off` is at most the buffer's length.
    pub(crate) unsafe fn offset(&self, off: usize) -> Self {
        // SAFETY: in bounds (or one past the end) by the caller.
        SharedMut(unsafe { self.0.add(off) })
    }
}

/// A set of workers that run one closure each, concurrently.
pub trait Parallel: Sync {
    /// Number of workers (at least 1).
    fn workers(&self) -> usize;
    /// Runs `f(worker, workers)` for every worker and waits for all of them.
    fn run(&self, f: &(dyn Fn(usize, usize) + Sync));
}

/// Runs everything on the calling thread (one worker).
#[derive(Clone, Copy, Debug, Default)]
pub struct Serial;

impl Parallel for Serial {
    fn workers(&self) -> usize {
        1
    }
    fn run(&self, f: &(dyn Fn(usize, usize) + Sync)) {
        f(0, 1);
    }
}

/// The part of `0..n` that `worker` of `workers` takes: contiguous, in
/// multiples of `align` (except the last part), as even as possible.
pub fn split(n: usize, worker: usize, workers: usize, align: usize) -> Range<usize> {
    let align = align.max(1);
    let units = n.div_ceil(align);
    let workers = workers.max(1);
    let (base, extra) = (units / workers, units % workers);
    let start = worker * base + worker.min(extra);
    let end = start + base + usize::from(worker < extra);
    (start * align).min(n)..(end * align).min(n)
}

/// A borrowed pool with a `Debug` impl, for structs that derive `Debug`.
#[derive(Clone, Copy)]
pub struct PoolRef<'a>(pub &'a dyn Parallel);

impl fmt::Debug for PoolRef<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Pool({} workers)", self.0.workers())
    }
}

impl Default for PoolRef<'_> {
    fn default() -> Self {
        PoolRef(&Serial)
    }
}

mod regions;
pub use regions::Regions;

#[cfg(feature = "std")]
mod threads;
#[cfg(feature = "std")]
pub use threads::ThreadPool;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_covers_everything_once() {
        for n in [0, 1, 5, 16, 17, 100, 1000] {
            for workers in 1..6 {
                for align in [1, 4, 16] {
                    let mut next = 0;
                    for w in 0..workers {
                        let r = split(n, w, workers, align);
                        assert_eq!(r.start, next, "n={n} w={w}/{workers} a={align}");
                        assert!(r.end >= r.start);
                        if r.end < n {
                            assert_eq!(r.end % align, 0);
                        }
                        next = r.end;
                    }
                    assert_eq!(next, n);
                }
            }
        }
    }

    #[test]
    fn serial_runs_worker_zero() {
        use core::sync::atomic::{AtomicUsize, Ordering};
        let hits = AtomicUsize::new(0);
        Serial.run(&|w, n| {
            assert_eq!((w, n), (0, 1));
            hits.fetch_add(1, Ordering::Relaxed);
        });
        assert_eq!(hits.load(Ordering::Relaxed), 1);
    }
}
