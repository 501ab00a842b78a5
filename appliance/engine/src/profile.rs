//! Where a forward's time goes: an off-by-default, process-wide tally of
//! time per [`Part`] (trunk matmuls, DeltaNet, attention, head, the rest),
//! which `bench` turns on around its prefill.
//!
//! Time is counted in TSC ticks: shares need no clock rate, and RDTSC runs
//! natively in the guest's ring 3 too (elsewhere nothing is counted). Scopes
//! nest and the innermost part counts, except that the products inside a
//! [`Part::Head`] scope stay the head's. Scopes are opened on the thread
//! that runs the forward (around pool runs, not inside them), and the tally
//! assumes one forward at a time while it is on: only the bench turns it on.

use core::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering::Relaxed};

/// A part of a forward whose time is tallied.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Part {
    /// Everything outside the other parts (embedding, norms, residual adds,
    /// the MLP's activation, quantizing outside products, ...).
    Rest = 0,
    /// Weight products of the trunk (projections and MLPs).
    Matmul = 1,
    /// The DeltaNet layers' own work (conv, recurrence, gated norm), not
    /// their projections.
    DeltaNet = 2,
    /// The full-attention layers' own work (RoPE, norms, attention over the
    /// cache), not their projections.
    Attention = 3,
    /// The output head (lm_head products included).
    Head = 4,
}

/// Number of [`Part`]s.
pub const PARTS: usize = 5;

impl Part {
    /// Every part, in `repr` order.
    pub const ALL: [Part; PARTS] =
        [Part::Rest, Part::Matmul, Part::DeltaNet, Part::Attention, Part::Head];

    /// Lower-case name, as `bench` reports it.
    pub fn name(self) -> &'static str {
        match self {
            Part::Rest => "rest",
            Part::Matmul => "trunk_matmuls",
            Part::DeltaNet => "deltanet",
            Part::Attention => "attention",
            Part::Head => "head",
        }
    }
}

static ON: AtomicBool = AtomicBool::new(false);
static CURRENT: AtomicU8 = AtomicU8::new(0);
static SINCE: AtomicU64 = AtomicU64::new(0);
static TICKS: [AtomicU64; PARTS] = [const { AtomicU64::new(0) }; PARTS];

fn now() -> u64 {
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: RDTSC has no preconditions on x86_64 (it is not disabled
        // by CR4.TSD in the guest nor on Linux hosts).
        #[allow(unused_unsafe)]
        unsafe {
            core::arch::x86_64::_rdtsc()
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    0
}

/// Charges the time since the last switch to the current part and makes
/// `to` current.
fn switch(to: u8) {
    let t = now();
    let since = SINCE.swap(t, Relaxed);
    let from = CURRENT.swap(to, Relaxed);
    TICKS[usize::from(from).min(PARTS - 1)].fetch_add(t.saturating_sub(since), Relaxed);
}

/// An open scope: its part counts until it is dropped.
#[must_use = "the part counts only while the scope lives"]
pub struct Scope {
    prev: Option<u8>,
}

impl Drop for Scope {
    fn drop(&mut self) {
        if let Some(prev) = self.prev {
            if ON.load(Relaxed) {
                switch(prev);
            }
        }
    }
}

/// Counts the time until the returned scope drops as `part` (nothing when
/// the tally is off).
pub fn scope(part: Part) -> Scope {
    if !ON.load(Relaxed) {
        return Scope { prev: None };
    }
    let cur = CURRENT.load(Relaxed);
    let to = if cur == Part::Head as u8 { cur } else { part as u8 };
    switch(to);
    Scope { prev: Some(cur) }
}

/// Zeroes the tally and turns it on, counting from now as [`Part::Rest`].
pub fn start() {
    for t in &TICKS {
        t.store(0, Relaxed);
    }
    CURRENT.store(Part::Rest as u8, Relaxed);
    SINCE.store(now(), Relaxed);
    ON.store(true, Relaxed);
}

/// Turns the tally off and returns the ticks per part ([`Part::ALL`] order);
/// all zero where there is no TSC.
pub fn stop() -> [u64; PARTS] {
    if ON.load(Relaxed) {
        switch(Part::Rest as u8);
        ON.store(false, Relaxed);
    }
    core::array::from_fn(|i| TICKS[i].load(Relaxed))
}

/// Each part's share of the total of `ticks` (named), or empty when nothing
/// was counted.
pub fn shares(ticks: &[u64; PARTS]) -> alloc::vec::Vec<(&'static str, f64)> {
    let total: u64 = ticks.iter().sum();
    if total == 0 {
        return alloc::vec::Vec::new();
    }
    Part::ALL.iter().zip(ticks).map(|(p, &t)| (p.name(), t as f64 / total as f64)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Burns a little time so every scope has ticks.
    fn spin() {
        let mut x = 0u64;
        for i in 0..20_000u64 {
            x = core::hint::black_box(x.wrapping_mul(31).wrapping_add(i));
        }
        core::hint::black_box(x);
    }

    #[test]
    fn nested_scopes_charge_the_innermost_part_and_the_head_keeps_its_products() {
        start();
        spin();
        {
            let _d = scope(Part::DeltaNet);
            spin();
            {
                let _m = scope(Part::Matmul);
                spin();
            }
            spin();
        }
        {
            let _h = scope(Part::Head);
            let _m = scope(Part::Matmul);
            spin();
        }
        let ticks = stop();
        if !cfg!(target_arch = "x86_64") {
            assert!(shares(&ticks).is_empty());
            return;
        }
        for p in [Part::Rest, Part::Matmul, Part::DeltaNet, Part::Head] {
            assert!(ticks[p as usize] > 0, "{p:?}: {ticks:?}");
        }
        let s = shares(&ticks);
        assert!((s.iter().map(|e| e.1).sum::<f64>() - 1.0).abs() < 1e-9, "{s:?}");
        // Off: scopes count nothing.
        let before = stop();
        {
            let _a = scope(Part::Attention);
            spin();
        }
        assert_eq!(stop(), before);
    }
}
