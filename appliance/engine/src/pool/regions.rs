//! [`Regions`]: items `0..n` cut into one contiguous region per worker; a
//! worker takes its own region's items front to back, then steals the other
//! regions' items from their backs.
//!
//! Matrix products use it for their weight chunks: every worker streams one
//! long run of consecutive rows (so a software prefetch past a chunk's end
//! already covers the next chunk, and the hardware prefetchers see one
//! stream), while a worker the OS delays still loses only what the others
//! steal from its tail. Taking an item is one compare-and-swap on the
//! region's cursor; nothing allocates past [`Regions::new`].
//!
//! ```
//! use kore_engine::pool::Regions;
//! let r = Regions::new(5, 2); // worker 0 owns 0..3, worker 1 owns 3..5
//! assert_eq!(r.take(1), Some(3));
//! assert_eq!(r.take(1), Some(4));
//! assert_eq!(r.take(1), Some(2)); // stolen from the back of worker 0's region
//! assert_eq!(r.take(0), Some(0));
//! assert_eq!(r.take(0), Some(1));
//! assert_eq!(r.take(0), None);
//! ```

use alloc::vec::Vec;
use core::sync::atomic::{AtomicU64, Ordering};

use super::split;

/// One region's remaining items `front..back`, packed as `back << 32 | front`;
/// on its own cache line so the workers' cursors do not share one.
#[repr(align(64))]
struct Cursor(AtomicU64);

impl Cursor {
    fn new(front: usize, back: usize) -> Self {
        Cursor(AtomicU64::new(((back as u64) << 32) | front as u64))
    }

    /// Takes the front item (`from_back == false`) or the back item.
    fn take(&self, from_back: bool) -> Option<usize> {
        let mut v = self.0.load(Ordering::Relaxed);
        loop {
            let (front, back) = (v & 0xFFFF_FFFF, v >> 32);
            if front >= back {
                return None;
            }
            let (new, item) = if from_back { (v - (1 << 32), back - 1) } else { (v + 1, front) };
            match self.0.compare_exchange_weak(v, new, Ordering::Relaxed, Ordering::Relaxed) {
                Ok(_) => return Some(item as usize),
                Err(now) => v = now,
            }
        }
    }
}

/// Items `0..n` split into per-worker regions; see the module docs.
pub struct Regions {
    cursors: Vec<Cursor>,
}

impl Regions {
    /// `n` items (below 2^32) over `workers` regions (at least one), as even
    /// as [`split`] makes them.
    pub fn new(n: usize, workers: usize) -> Self {
        assert!(n < (1 << 32), "at most 2^32 - 1 items");
        let workers = workers.max(1);
        let cursors = (0..workers)
            .map(|w| {
                let r = split(n, w, workers, 1);
                Cursor::new(r.start, r.end)
            })
            .collect();
        Regions { cursors }
    }

    /// The next item for `worker` (taken modulo the region count), or `None`
    /// when every item has been taken. Every item is returned exactly once
    /// over all callers.
    pub fn take(&self, worker: usize) -> Option<usize> {
        let n = self.cursors.len();
        let own = worker % n;
        self.cursors[own]
            .take(false)
            .or_else(|| (1..n).find_map(|k| self.cursors[(own + k) % n].take(true)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lone_worker_takes_everything() {
        for workers in 1..5 {
            let r = Regions::new(10, workers);
            let mut got = Vec::new();
            while let Some(i) = r.take(0) {
                got.push(i);
            }
            if workers == 1 {
                assert_eq!(got, (0..10).collect::<Vec<_>>(), "one region is taken in order");
            }
            got.sort_unstable();
            assert_eq!(got, (0..10).collect::<Vec<_>>(), "{workers} regions");
        }
    }

    #[test]
    fn own_region_comes_first_and_in_order() {
        let r = Regions::new(12, 3); // 0..4, 4..8, 8..12
        assert_eq!((0..4).map(|_| r.take(1).unwrap()).collect::<Vec<_>>(), [4, 5, 6, 7]);
        assert_eq!(r.take(1), Some(11)); // then the back of worker 2's region
        assert_eq!(r.take(2), Some(8));
    }

    #[test]
    fn empty_and_tiny_inputs() {
        assert_eq!(Regions::new(0, 3).take(2), None);
        let r = Regions::new(1, 4);
        assert_eq!(r.take(3), Some(0));
        assert_eq!(r.take(0), None);
    }

    #[test]
    fn concurrent_workers_take_every_item_once() {
        use std::sync::atomic::AtomicU8;
        for (n, workers) in [(1000, 2), (997, 3), (5, 4), (64, 8)] {
            let r = Regions::new(n, workers);
            let seen: Vec<AtomicU8> = (0..n).map(|_| AtomicU8::new(0)).collect();
            std::thread::scope(|s| {
                for w in 0..workers {
                    let (r, seen) = (&r, &seen);
                    s.spawn(move || {
                        while let Some(i) = r.take(w) {
                            seen[i].fetch_add(1, Ordering::Relaxed);
                        }
                    });
                }
            });
            assert!(seen.iter().all(|c| c.load(Ordering::Relaxed) == 1), "n {n} w {workers}");
        }
    }
}
