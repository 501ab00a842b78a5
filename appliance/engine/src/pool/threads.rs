//! [`ThreadPool`]: `n - 1` std threads plus the caller as worker 0.
//!
//! Hot path without locks or allocation: the caller publishes the job (a
//! pointer to the closure) and bumps `epoch`; workers spin on `epoch` for a
//! while, then park (the caller unparks sleepers after publishing). Each
//! worker bumps `done` when its call returns; the caller spins until all
//! have. Past a short spin, both waits yield the core on every check, so a
//! busy machine's scheduler can run the thread being waited for. A worker's
//! panic is caught and re-raised on the caller.

use std::cell::UnsafeCell;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::{self, JoinHandle, Thread};

use super::Parallel;

/// Waiting steps ([`wait_step`]) before a waiting worker parks: a short
/// spin, then yields (about 50-300 us on an idle machine).
const SPINS: u32 = SPINS_BEFORE_YIELD + (1 << 8);

/// Spins before a waiter also yields its core on every further spin: when
/// more threads are runnable than there are cores (other processes busy),
/// the thread it waits for may be the one that needs the core.
const SPINS_BEFORE_YIELD: u32 = 1 << 10;

/// One step of a wait that has spun `spins` times: a pause, and past
/// [`SPINS_BEFORE_YIELD`] a yield to the OS scheduler.
fn wait_step(spins: u32) {
    if spins < SPINS_BEFORE_YIELD {
        core::hint::spin_loop();
    } else {
        thread::yield_now();
    }
}

type Job = *const (dyn Fn(usize, usize) + Sync);

struct Shared {
    /// Incremented once per published job (and on shutdown).
    epoch: AtomicUsize,
    /// Workers (1..n) that finished the current job.
    done: AtomicUsize,
    /// Set when some worker's call panicked.
    panicked: AtomicBool,
    /// Set by `Drop`.
    shutdown: AtomicBool,
    /// Per worker 1..n: parked (or about to park) waiting for a job.
    sleeping: Vec<AtomicBool>,
    /// The current job; written by the caller only while no worker reads it.
    job: UnsafeCell<Option<Job>>,
    workers: usize,
}

// SAFETY: `job` is written only by the thread holding `busy` in `ThreadPool::run`,
// before the `epoch` release-store, and read by workers only after the matching
// acquire-load and before they bump `done`; the caller waits for every `done`
// before the closure (and the next write) can go away. The closure is `Sync`.
unsafe impl Sync for Shared {}
// SAFETY: as above; the raw job pointer is only dereferenced under that protocol.
unsafe impl Send for Shared {}

/// A fixed set of worker threads; see the module docs.
pub struct ThreadPool {
    shared: Arc<Shared>,
    threads: Vec<JoinHandle<()>>,
    handles: Vec<Thread>,
    /// Held during `run`; a second concurrent or nested `run` goes serial.
    busy: AtomicBool,
}

impl ThreadPool {
    /// A pool of `workers` workers (the caller counts as one; 0 means 1).
    pub fn new(workers: usize) -> Self {
        let workers = workers.max(1);
        let shared = Arc::new(Shared {
            epoch: AtomicUsize::new(0),
            done: AtomicUsize::new(0),
            panicked: AtomicBool::new(false),
            shutdown: AtomicBool::new(false),
            sleeping: (0..workers).map(|_| AtomicBool::new(false)).collect(),
            job: UnsafeCell::new(None),
            workers,
        });
        let threads: Vec<JoinHandle<()>> = (1..workers)
            .map(|w| {
                let s = Arc::clone(&shared);
                thread::Builder::new()
                    .name(format!("kore-worker-{w}"))
                    .spawn(move || worker_loop(&s, w))
                    .expect("spawning a worker thread")
            })
            .collect();
        let handles = threads.iter().map(|t| t.thread().clone()).collect();
        ThreadPool { shared, threads, handles, busy: AtomicBool::new(false) }
    }

    /// One worker per available core.
    pub fn with_all_cores() -> Self {
        Self::new(thread::available_parallelism().map(|n| n.get()).unwrap_or(1))
    }
}

impl Parallel for ThreadPool {
    fn workers(&self) -> usize {
        self.shared.workers
    }

    fn run(&self, f: &(dyn Fn(usize, usize) + Sync)) {
        let n = self.shared.workers;
        if n == 1 || self.busy.swap(true, Ordering::Acquire) {
            // One worker, or nested/concurrent use: do every part here.
            (0..n).for_each(|w| f(w, n));
            return;
        }
        let s = &*self.shared;
        // SAFETY: erasing the lifetime is sound because this function does not
        // return before every worker has finished calling `f` (the `done` wait).
        let job: Job = unsafe { core::mem::transmute::<&(dyn Fn(usize, usize) + Sync), Job>(f) };
        // SAFETY: no worker reads `job` now: they all finished the previous job.
        unsafe { *s.job.get() = Some(job) };
        s.done.store(0, Ordering::Relaxed);
        s.epoch.fetch_add(1, Ordering::SeqCst);
        for (w, h) in self.handles.iter().enumerate() {
            if s.sleeping[w + 1].load(Ordering::SeqCst) {
                h.unpark();
            }
        }
        let mine = catch_unwind(AssertUnwindSafe(|| f(0, n)));
        let mut spins = 0u32;
        while s.done.load(Ordering::Acquire) != n - 1 {
            wait_step(spins);
            spins = spins.saturating_add(1);
        }
        self.busy.store(false, Ordering::Release);
        if let Err(p) = mine {
            std::panic::resume_unwind(p);
        }
        if s.panicked.swap(false, Ordering::Relaxed) {
            panic!("a worker thread panicked (see its message above)");
        }
    }
}

fn worker_loop(s: &Shared, w: usize) {
    let mut seen = 0usize;
    loop {
        let mut spins = 0u32;
        let epoch = loop {
            let e = s.epoch.load(Ordering::Acquire);
            if e != seen {
                break e;
            }
            if spins < SPINS {
                wait_step(spins);
                spins += 1;
                continue;
            }
            s.sleeping[w].store(true, Ordering::SeqCst);
            if s.epoch.load(Ordering::SeqCst) == seen {
                thread::park();
            }
            s.sleeping[w].store(false, Ordering::SeqCst);
        };
        seen = epoch;
        if s.shutdown.load(Ordering::Acquire) {
            return;
        }
        // SAFETY: published before the epoch bump we acquired; valid until we bump `done`.
        let job = unsafe { (*s.job.get()).expect("job published with the epoch") };
        // SAFETY: the caller keeps the closure alive until `done` reaches n - 1.
        let f = unsafe { &*job };
        if catch_unwind(AssertUnwindSafe(|| f(w, s.workers))).is_err() {
            s.panicked.store(true, Ordering::Relaxed);
        }
        s.done.fetch_add(1, Ordering::Release);
    }
}

impl Drop for ThreadPool {
    fn drop(&mut self) {
        self.shared.shutdown.store(true, Ordering::Release);
        self.shared.epoch.fetch_add(1, Ordering::Release);
        for h in &self.handles {
            h.unpark();
        }
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_worker_runs_once_per_call() {
        for n in 1..5 {
            let pool = ThreadPool::new(n);
            assert_eq!(pool.workers(), n);
            let hits: Vec<AtomicUsize> = (0..n).map(|_| AtomicUsize::new(0)).collect();
            for _ in 0..1000 {
                pool.run(&|w, m| {
                    assert_eq!(m, n);
                    hits[w].fetch_add(1, Ordering::Relaxed);
                });
            }
            assert!(hits.iter().all(|h| h.load(Ordering::Relaxed) == 1000));
        }
    }

    #[test]
    fn wakes_parked_workers() {
        let pool = ThreadPool::new(3);
        let sum = AtomicUsize::new(0);
        for i in 0..3 {
            // Long enough for the workers to park between calls.
            thread::sleep(std::time::Duration::from_millis(20));
            pool.run(&|w, _| {
                sum.fetch_add(w + i, Ordering::Relaxed);
            });
        }
        let expected: usize = (0..3).flat_map(|i| (0..3).map(move |w| w + i)).sum();
        assert_eq!(sum.load(Ordering::Relaxed), expected);
    }

    #[test]
    fn nested_run_goes_serial() {
        let pool = ThreadPool::new(2);
        let count = AtomicUsize::new(0);
        pool.run(&|_, _| {
            pool.run(&|_, _| {
                count.fetch_add(1, Ordering::Relaxed);
            });
        });
        assert_eq!(count.load(Ordering::Relaxed), 4);
    }

    #[test]
    fn worker_panic_reaches_the_caller() {
        let pool = ThreadPool::new(2);
        let r = catch_unwind(AssertUnwindSafe(|| {
            pool.run(&|w, _| assert!(w != 1, "worker 1 fails on purpose"));
        }));
        assert!(r.is_err());
        // The pool still works afterwards.
        let c = AtomicUsize::new(0);
        pool.run(&|_, _| {
            c.fetch_add(1, Ordering::Relaxed);
        });
        assert_eq!(c.load(Ordering::Relaxed), 2);
    }
}
