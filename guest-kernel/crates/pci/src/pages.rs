//! How a BAR's 4 KiB pages fall into 2 MiB pages, for a kernel that maps BARs with 2 MiB
//! pages where a BAR covers them whole and 4 KiB pages elsewhere.

/// A 2 MiB page.
pub const HUGE: u64 = 2 << 20;
/// A 4 KiB page.
pub const PAGE: u64 = 4096;

/// A piece of a page range inside one 2 MiB page.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Chunk {
    /// The whole 2 MiB page at this address.
    Whole(u64),
    /// The 4 KiB pages `[start, end)` of one 2 MiB page.
    Pages {
        /// First page.
        start: u64,
        /// End (exclusive), at most the end of that 2 MiB page.
        end: u64,
    },
}

/// The page range holding `[base, base + size)`: rounded out to 4 KiB pages; `None` if
/// empty or it wraps.
pub fn page_range(base: u64, size: u64) -> Option<(u64, u64)> {
    let end = base.checked_add(size)?.checked_next_multiple_of(PAGE)?;
    (size > 0).then_some((base & !(PAGE - 1), end))
}

/// `[start, end)` (4 KiB aligned) split at 2 MiB boundaries, in address order.
pub fn chunks(start: u64, end: u64) -> impl Iterator<Item = Chunk> {
    debug_assert!(start.is_multiple_of(PAGE) && end.is_multiple_of(PAGE));
    let mut a = start;
    core::iter::from_fn(move || {
        if a >= end {
            return None;
        }
        let huge_end = (a | (HUGE - 1)).saturating_add(1);
        let c = if a.is_multiple_of(HUGE) && end >= huge_end {
            Chunk::Whole(a)
        } else {
            Chunk::Pages { start: a, end: end.min(huge_end) }
        };
        a = huge_end;
        Some(c)
    })
}
