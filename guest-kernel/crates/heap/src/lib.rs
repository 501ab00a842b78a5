//! kore-heap: the ring-3 heap of the Kore guest.
//!
//! One region of memory (given by the kernel at boot) serves every vCPU. Small requests
//! (up to [`MAX_SMALL`] bytes) come from power-of-two size classes, each a free list of
//! blocks carved from 64 KiB slabs; larger ones are page runs (4 KiB units) from an
//! address-sorted, coalescing first-fit free list. One [`SpinLock`] guards it all: the engine
//! allocates at load time and between steps, not in its inner loops.
//!
//! Free lists are intrusive: a free block stores the list link in its own first bytes.
#![no_std]

use core::alloc::{GlobalAlloc, Layout};
use core::ptr;

use kore_sync::SpinLock;

/// Page size of the run allocator.
pub const PAGE: usize = 4096;
/// Largest size (and alignment) served from the size classes.
pub const MAX_SMALL: usize = 2048;
/// Bytes taken from the page runs to refill one size class.
pub const SLAB: usize = 64 * 1024;
const MIN_CLASS_SHIFT: u32 = 4; // 16 bytes
const CLASSES: usize = 8; // 16 .. 2048

/// Counters describing the heap (bytes).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Size of the region given to [`Heap::init`] (after page alignment).
    pub total: usize,
    /// Bytes in free page runs (small-class free blocks are not counted).
    pub free_pages: usize,
    /// Bytes handed out and not yet freed (rounded to class or page sizes).
    pub in_use: usize,
}

/// A thread-safe heap over one memory region; usable as `#[global_allocator]`.
pub struct Heap {
    inner: SpinLock<Inner>,
}

struct Inner {
    classes: [usize; CLASSES],
    runs: usize,
    stats: Stats,
}

/// Header of a free page run, stored at its start.
#[repr(C)]
struct Run {
    size: usize,
    next: usize,
}

impl Default for Heap {
    fn default() -> Self {
        Self::empty()
    }
}

impl Heap {
    /// A heap with no memory: every allocation fails until [`Heap::init`].
    pub const fn empty() -> Self {
        Self {
            inner: SpinLock::new(Inner {
                classes: [0; CLASSES],
                runs: 0,
                stats: Stats { total: 0, free_pages: 0, in_use: 0 },
            }),
        }
    }

    /// Adds the region `[start, start + len)` to the heap (trimmed to whole pages).
    ///
    /// # Safety
    /// The region must be readable and writable memory that nothing else uses for as long as
    /// the heap lives, and must not overlap memory given earlier.
    pub unsafe fn init(&self, start: usize, len: usize) {
        let lo = align_up(start, PAGE);
        let hi = start.saturating_add(len) & !(PAGE - 1);
        if hi <= lo {
            return;
        }
        let mut inner = self.inner.lock();
        inner.stats.total += hi - lo;
        // SAFETY: the caller gives us `[lo, hi)`, page aligned and unused.
        unsafe { inner.free_run(lo, hi - lo) };
    }

    /// Allocates memory for `layout`; null when the heap is exhausted.
    pub fn alloc(&self, layout: Layout) -> *mut u8 {
        let mut inner = self.inner.lock();
        match class_of(layout) {
            // SAFETY: the lists only hold blocks of the region given to `init`.
            Some(c) => unsafe { inner.alloc_small(c) },
            None => {
                let size = align_up(layout.size().max(1), PAGE);
                // SAFETY: as above.
                let p = unsafe { inner.alloc_run(size, layout.align().max(PAGE)) };
                if !p.is_null() {
                    inner.stats.in_use += size;
                }
                p
            }
        }
    }

    /// Frees memory from [`Heap::alloc`].
    ///
    /// # Safety
    /// `ptr` must come from `alloc` on this heap with the same `layout`, and not be freed yet.
    pub unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        let mut inner = self.inner.lock();
        match class_of(layout) {
            // SAFETY: the caller guarantees `ptr` is a live block of class `c`.
            Some(c) => unsafe { inner.free_small(ptr as usize, c) },
            None => {
                let size = align_up(layout.size().max(1), PAGE);
                // SAFETY: the caller guarantees `ptr` is a live run of `size` bytes.
                unsafe { inner.free_run(ptr as usize, size) };
                inner.stats.in_use -= size;
            }
        }
    }

    /// Current counters.
    pub fn stats(&self) -> Stats {
        self.inner.lock().stats
    }
}

// SAFETY: `alloc` returns blocks of at least `layout.size()` bytes aligned to `layout.align()`
// (size classes are naturally aligned powers of two, runs are aligned explicitly), blocks are
// never handed out twice, and the lock serialises all list updates.
unsafe impl GlobalAlloc for Heap {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        Heap::alloc(self, layout)
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: forwarded from the caller.
        unsafe { Heap::dealloc(self, ptr, layout) }
    }
}

/// The size class of a small layout (`None` for a page run).
fn class_of(layout: Layout) -> Option<usize> {
    let need = layout.size().max(layout.align()).max(1 << MIN_CLASS_SHIFT);
    if need > MAX_SMALL {
        return None;
    }
    let shift = usize::BITS - (need - 1).leading_zeros();
    Some((shift - MIN_CLASS_SHIFT) as usize)
}

const fn class_size(c: usize) -> usize {
    1 << (c as u32 + MIN_CLASS_SHIFT)
}

const fn align_up(x: usize, a: usize) -> usize {
    (x + a - 1) & !(a - 1)
}

impl Inner {
    /// # Safety: list heads point at free blocks of the heap region.
    unsafe fn alloc_small(&mut self, c: usize) -> *mut u8 {
        if self.classes[c] == 0 {
            // SAFETY: forwarded.
            let slab = unsafe { self.alloc_run(SLAB, PAGE) } as usize;
            if slab == 0 {
                return ptr::null_mut();
            }
            for block in (slab..slab + SLAB).step_by(class_size(c)).rev() {
                // SAFETY: `block` lies in the fresh slab, which we own.
                unsafe { self.push_small(block, c) };
            }
        }
        let block = self.classes[c];
        // SAFETY: `block` is a free block; its first word is the next link.
        self.classes[c] = unsafe { (block as *const usize).read() };
        self.stats.in_use += class_size(c);
        block as *mut u8
    }

    /// # Safety: `block` is a live block of class `c` inside the region.
    unsafe fn free_small(&mut self, block: usize, c: usize) {
        // SAFETY: forwarded.
        unsafe { self.push_small(block, c) };
        self.stats.in_use -= class_size(c);
    }

    /// # Safety: `block` is an unused block of class `c` inside the region.
    unsafe fn push_small(&mut self, block: usize, c: usize) {
        // SAFETY: the block is ours; blocks are >= 16 bytes and 16-aligned.
        unsafe { (block as *mut usize).write(self.classes[c]) };
        self.classes[c] = block;
    }

    /// First fit of `size` bytes (a page multiple) at alignment `align` (>= PAGE).
    ///
    /// # Safety: the run list is well formed.
    unsafe fn alloc_run(&mut self, size: usize, align: usize) -> *mut u8 {
        let mut prev = 0usize;
        let mut cur = self.runs;
        while cur != 0 {
            // SAFETY: `cur` is a free run header.
            let Run { size: rsize, next } = unsafe { (cur as *const Run).read() };
            let start = align_up(cur, align);
            if start.checked_add(size).is_some_and(|end| end <= cur + rsize) {
                self.unlink(prev, next);
                self.stats.free_pages -= rsize;
                if start > cur {
                    // SAFETY: the front remainder is part of the run we just removed.
                    unsafe { self.free_run(cur, start - cur) };
                }
                if start + size < cur + rsize {
                    // SAFETY: as above, the tail remainder.
                    unsafe { self.free_run(start + size, cur + rsize - start - size) };
                }
                return start as *mut u8;
            }
            prev = cur;
            cur = next;
        }
        ptr::null_mut()
    }

    fn unlink(&mut self, prev: usize, next: usize) {
        if prev == 0 {
            self.runs = next;
        } else {
            // SAFETY: `prev` is a free run header (the caller walked to it).
            unsafe { (*(prev as *mut Run)).next = next };
        }
    }

    /// Returns the run `[addr, addr + size)` to the sorted list, merging neighbours.
    ///
    /// # Safety: the run is page aligned, inside the region and not in the list.
    unsafe fn free_run(&mut self, addr: usize, size: usize) {
        self.stats.free_pages += size;
        let mut prev = 0usize;
        let mut cur = self.runs;
        while cur != 0 && cur < addr {
            prev = cur;
            // SAFETY: `cur` is a free run header.
            cur = unsafe { (*(cur as *const Run)).next };
        }
        let (start, mut len, mut next) = (addr, size, cur);
        // SAFETY: `cur` and `prev` are free run headers; `addr` is ours to write.
        unsafe {
            if cur != 0 && addr + size == cur {
                len += (*(cur as *const Run)).size;
                next = (*(cur as *const Run)).next;
            }
            if prev != 0 && prev + (*(prev as *const Run)).size == addr {
                len += (*(prev as *const Run)).size;
                (*(prev as *mut Run)).size = len;
                (*(prev as *mut Run)).next = next;
                return;
            }
            (start as *mut Run).write(Run { size: len, next });
        }
        self.unlink(prev, start);
    }
}

#[cfg(test)]
mod tests {
    extern crate std;
    use super::*;
    use std::vec::Vec;

    /// A page-aligned arena from the host allocator.
    struct Arena {
        base: *mut u8,
        layout: Layout,
    }
    impl Arena {
        fn new(len: usize) -> Self {
            let layout = Layout::from_size_align(len, PAGE).unwrap();
            // SAFETY: non-zero size.
            let base = unsafe { std::alloc::alloc(layout) };
            assert!(!base.is_null());
            Self { base, layout }
        }
        fn heap(&self) -> Heap {
            let h = Heap::empty();
            // SAFETY: the arena is ours and outlives the heap in every test.
            unsafe { h.init(self.base as usize, self.layout.size()) };
            h
        }
        fn contains(&self, p: *mut u8, len: usize) -> bool {
            let (b, p) = (self.base as usize, p as usize);
            p >= b && p + len <= b + self.layout.size()
        }
    }
    impl Drop for Arena {
        fn drop(&mut self) {
            // SAFETY: allocated in `new` with this layout.
            unsafe { std::alloc::dealloc(self.base, self.layout) };
        }
    }

    fn lay(size: usize, align: usize) -> Layout {
        Layout::from_size_align(size, align).unwrap()
    }

    #[test]
    fn classes_round_up_to_powers_of_two() {
        assert_eq!(class_of(lay(1, 1)), Some(0));
        assert_eq!(class_of(lay(16, 8)), Some(0));
        assert_eq!(class_of(lay(17, 8)), Some(1));
        assert_eq!(class_of(lay(8, 64)), Some(2));
        assert_eq!(class_of(lay(2048, 8)), Some(7));
        assert_eq!(class_of(lay(2049, 8)), None);
        assert_eq!(class_of(lay(8, 4096)), None);
    }

    #[test]
    fn blocks_are_aligned_disjoint_and_in_the_arena() {
        let arena = Arena::new(1 << 20);
        let heap = arena.heap();
        let mut got: Vec<(usize, usize)> = Vec::new();
        for (i, &(size, align)) in
            [(1, 1), (24, 8), (100, 32), (2048, 2048), (5000, 8), (3, 8192), (70_000, 4096)]
                .iter()
                .cycle()
                .take(40)
                .enumerate()
        {
            let p = heap.alloc(lay(size, align));
            assert!(!p.is_null(), "allocation {i} failed");
            assert_eq!(p as usize % align, 0);
            assert!(arena.contains(p, size));
            // SAFETY: the block is ours; fill it to catch overlaps below.
            unsafe { p.write_bytes(i as u8, size) };
            got.push((p as usize, size));
        }
        got.sort();
        for w in got.windows(2) {
            assert!(w[0].0 + w[0].1 <= w[1].0, "overlap {:x?}", w);
        }
    }

    #[test]
    fn freeing_everything_restores_one_run() {
        let arena = Arena::new(1 << 20);
        let heap = arena.heap();
        let total = heap.stats().free_pages;
        assert_eq!(total, 1 << 20);
        let layouts = [lay(8192, 4096), lay(4096 * 3, 4096), lay(100_000, 65536), lay(4096, 4096)];
        let ptrs: Vec<_> = layouts.iter().map(|&l| heap.alloc(l)).collect();
        assert!(ptrs.iter().all(|p| !p.is_null()));
        assert_eq!(heap.stats().in_use, 8192 + 4096 * 3 + align_up(100_000, PAGE) + 4096);
        // Free in a scrambled order so both forward and backward merges happen.
        for &i in &[2usize, 0, 3, 1] {
            // SAFETY: allocated above with this layout.
            unsafe { heap.dealloc(ptrs[i], layouts[i]) };
        }
        assert_eq!(heap.stats(), Stats { total, free_pages: total, in_use: 0 });
        assert_eq!(heap.inner.lock().runs, arena.base as usize);
        // The whole arena is one run again: a full-size allocation succeeds.
        assert!(!heap.alloc(lay(1 << 20, 4096)).is_null());
    }

    #[test]
    fn exhaustion_returns_null_and_reuse_works() {
        let arena = Arena::new(256 * 1024);
        let heap = arena.heap();
        let l = lay(64 * 1024, 4096);
        let ps: Vec<_> = (0..4).map(|_| heap.alloc(l)).collect();
        assert!(ps.iter().all(|p| !p.is_null()));
        assert!(heap.alloc(l).is_null());
        assert!(heap.alloc(lay(8, 8)).is_null(), "no page left for a slab");
        // SAFETY: allocated above.
        unsafe { heap.dealloc(ps[1], l) };
        assert_eq!(heap.alloc(l), ps[1]);
    }

    #[test]
    fn small_blocks_are_recycled() {
        let arena = Arena::new(1 << 20);
        let heap = arena.heap();
        let a = heap.alloc(lay(40, 8));
        let b = heap.alloc(lay(40, 8));
        assert_ne!(a, b);
        // SAFETY: allocated above.
        unsafe { heap.dealloc(a, lay(40, 8)) };
        assert_eq!(heap.alloc(lay(64, 8)), a, "LIFO reuse within the class");
        assert_eq!(heap.stats().in_use, 128);
    }

    #[test]
    fn threads_share_the_heap() {
        let arena = Arena::new(32 << 20);
        let heap = arena.heap();
        std::thread::scope(|s| {
            for t in 0..4u8 {
                let heap = &heap;
                s.spawn(move || {
                    let mut mine = Vec::new();
                    for i in 0..2000usize {
                        let l = lay(1 + (i * 37) % 5000, 8);
                        let p = heap.alloc(l);
                        assert!(!p.is_null());
                        // SAFETY: our block.
                        unsafe { p.write_bytes(t, l.size()) };
                        mine.push((p, l));
                        if i % 3 == 0 {
                            let (p, l) = mine.swap_remove(i % mine.len());
                            // SAFETY: our block, untouched by other threads if the heap is right.
                            assert!(unsafe { core::slice::from_raw_parts(p, l.size()) }
                                .iter()
                                .all(|&b| b == t));
                            // SAFETY: allocated above with `l`.
                            unsafe { heap.dealloc(p, l) };
                        }
                    }
                    for (p, l) in mine {
                        // SAFETY: as above.
                        unsafe { heap.dealloc(p, l) };
                    }
                });
            }
        });
        assert_eq!(heap.stats().in_use, 0);
    }
}
