//! The process's allocator: the system's, with every allocation of
//! [`MIN_BYTES`] or more advised for transparent 2 MiB pages before its
//! first touch.
//!
//! Natively the engine's large buffers (the KV cache above all, read whole
//! every decode step at depth, and the prefill chunk's activations) would
//! otherwise sit on 4 KiB pages while the weights sit on 2 MiB ones (a
//! resident copy, `kore_pack::safetensors`), and in the guest everything sits
//! on 2 MiB pages. Under nested paging a TLB miss is a two-level walk:
//! docs/benchmarks.md ("Transparent hugepages for the engine's buffers") has
//! what it costs at depth. The advice changes how the kernel backs the pages,
//! never their contents; hosts with transparent hugepages off ignore it.

use std::alloc::{GlobalAlloc, Layout, System};

/// Allocations at least this large are advised (two hugepages: the advice
/// covers only the 2 MiB-aligned part of an allocation).
pub const MIN_BYTES: usize = 4 << 20;

/// The transparent hugepage size on x86-64.
const HUGE: usize = 2 << 20;

/// [`System`], advising large allocations for transparent hugepages.
pub struct HugeAdvised;

/// The 2 MiB-aligned pages inside `[addr, addr + len)`: `(start, bytes)`,
/// `None` when they would be empty or the allocation is under [`MIN_BYTES`].
pub fn advised_range(addr: usize, len: usize) -> Option<(usize, usize)> {
    if len < MIN_BYTES {
        return None;
    }
    let start = addr.checked_next_multiple_of(HUGE)?;
    let end = addr.checked_add(len)? & !(HUGE - 1);
    (end > start).then(|| (start, end - start))
}

fn advise(ptr: *mut u8, len: usize) {
    if ptr.is_null() {
        return;
    }
    if let Some((start, bytes)) = advised_range(ptr as usize, len) {
        // SAFETY: [start, start + bytes) lies inside the live allocation at
        // `ptr` of `len` bytes; MADV_HUGEPAGE only changes how the kernel backs
        // those pages, never what they hold. A refusal costs only the advice.
        unsafe { libc::madvise(start as *mut libc::c_void, bytes, libc::MADV_HUGEPAGE) };
    }
}

// SAFETY: every call forwards to `System` with the caller's arguments and
// returns its result unchanged; `advise` only hints at pages inside the
// allocation just returned.
unsafe impl GlobalAlloc for HugeAdvised {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded with the caller's guarantees.
        let p = unsafe { System.alloc(layout) };
        advise(p, layout.size());
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded with the caller's guarantees.
        let p = unsafe { System.alloc_zeroed(layout) };
        advise(p, layout.size());
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: forwarded with the caller's guarantees.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: forwarded with the caller's guarantees.
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if new_size > layout.size() {
            advise(p, new_size);
        }
        p
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: usize = 1 << 20;

    #[test]
    fn only_the_aligned_hugepages_of_a_large_allocation_are_advised() {
        assert_eq!(advised_range(0x1000, 3 * MIB), None, "under the minimum");
        assert_eq!(advised_range(4 * MIB, 4 * MIB), Some((4 * MIB, 4 * MIB)));
        // Unaligned: the first partial hugepage and the last are left out.
        assert_eq!(advised_range(4 * MIB + 16, 4 * MIB), Some((6 * MIB, 2 * MIB)));
        assert_eq!(advised_range(4 * MIB + 16, 5 * MIB), Some((6 * MIB, 2 * MIB)));
        assert_eq!(advised_range(usize::MAX - MIB, 8 * MIB), None, "no overflow");
    }

    #[test]
    fn a_large_allocation_is_advised() {
        // The test binary's allocator is the system's: call ours directly.
        let layout = Layout::from_size_align(16 * MIB, 64).unwrap();
        // SAFETY: a non-zero layout; freed below with the same layout.
        let p = unsafe { HugeAdvised.alloc_zeroed(layout) };
        assert!(!p.is_null());
        let (start, _) = advised_range(p as usize, layout.size()).unwrap();
        let flags = kore_pack::safetensors::smaps_field(start, "VmFlags").unwrap();
        // SAFETY: allocated above with `layout`.
        unsafe { HugeAdvised.dealloc(p, layout) };
        assert!(flags.split(' ').any(|f| f == "hg"), "no MADV_HUGEPAGE (hg) in {flags}");
    }
}
