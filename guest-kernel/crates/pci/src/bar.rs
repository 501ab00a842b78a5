//! Base address registers: decoding and sizing.
//!
//! Sizing follows the PCI spec: with I/O and memory decoding switched off in the command
//! register, write all-ones to the BAR (both halves of a 64-bit BAR), read back the mask,
//! restore the original value, then restore the command register. A 64-bit BAR takes two
//! slots; the second slot reads as `None`.

use crate::{command, reg, ConfigSpace, Function, Header};

/// What a BAR decodes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BarKind {
    /// I/O ports.
    Io,
    /// Memory below 4 GiB (one slot).
    Mem32,
    /// Memory anywhere (two slots).
    Mem64,
}

/// One implemented BAR.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Bar {
    /// Slot index (0..6); a 64-bit BAR also uses `index + 1`.
    pub index: u8,
    /// What it decodes.
    pub kind: BarKind,
    /// Prefetchable memory.
    pub prefetchable: bool,
    /// Assigned address (as programmed by firmware, here the VMM).
    pub base: u64,
    /// Size in bytes (a power of two).
    pub size: u64,
}

impl Bar {
    /// Whether this is a memory BAR.
    pub fn is_memory(&self) -> bool {
        self.kind != BarKind::Io
    }

    /// End of the decoded range (exclusive), or `None` if it wraps.
    pub fn end(&self) -> Option<u64> {
        self.base.checked_add(self.size)
    }
}

/// The BARs of a function, by slot (`None`: unimplemented, the upper half of a 64-bit BAR,
/// or a malformed BAR such as a 64-bit one in the last slot).
pub type Bars = [Option<Bar>; 6];

/// Decodes and sizes every BAR of the function `hdr` describes (restoring them all).
pub fn probe_all(cfg: &impl ConfigSpace, hdr: &Header) -> Bars {
    let f = hdr.function;
    let cmd = cfg.read16(f, reg::COMMAND);
    cfg.write16(f, reg::COMMAND, cmd & !(command::IO | command::MEMORY));
    let mut out: Bars = [None; 6];
    let count = hdr.bar_count();
    let mut i = 0;
    while i < count {
        let (bar, slots) = probe_slot(cfg, f, i, count);
        out[i] = bar;
        i += slots;
    }
    cfg.write16(f, reg::COMMAND, cmd);
    out
}

/// The BAR in slot `index`, decoded and sized (`None` as in [`Bars`], or out of range).
pub fn probe(cfg: &impl ConfigSpace, hdr: &Header, index: usize) -> Option<Bar> {
    probe_all(cfg, hdr).get(index).copied().flatten()
}

fn bar_reg(i: usize) -> u16 {
    reg::BAR0 + 4 * i as u16
}

/// Writes all-ones to the BAR register at `r`, returns what reads back, restores `orig`.
fn size_mask(cfg: &impl ConfigSpace, f: Function, r: u16, orig: u32) -> u32 {
    cfg.write32(f, r, u32::MAX);
    let mask = cfg.read32(f, r);
    cfg.write32(f, r, orig);
    mask
}

/// Decodes slot `i` (decoding already off); returns the BAR and the slots it uses.
fn probe_slot(cfg: &impl ConfigSpace, f: Function, i: usize, count: usize) -> (Option<Bar>, usize) {
    let r = bar_reg(i);
    let lo = cfg.read32(f, r);
    let lo_mask = size_mask(cfg, f, r, lo);
    if lo & 1 == 1 {
        let m = lo_mask & !3;
        // I/O BARs may implement only the low 16 address bits.
        let m = if m & 0xffff_0000 == 0 { m | 0xffff_0000 } else { m };
        let bar = (lo_mask & !3 != 0).then(|| Bar {
            index: i as u8,
            kind: BarKind::Io,
            prefetchable: false,
            base: (lo & !3) as u64,
            size: (!m).wrapping_add(1) as u64,
        });
        return (bar, 1);
    }
    let prefetchable = lo & 8 != 0;
    match (lo >> 1) & 3 {
        0 if lo_mask & !0xf == 0 => (None, 1),
        0 => {
            let mask = lo_mask as u64 | !0xffff_ffff;
            (memory_bar(i, BarKind::Mem32, prefetchable, lo as u64, mask), 1)
        }
        2 if i + 1 < count => {
            let hi = cfg.read32(f, r + 4);
            let hi_mask = size_mask(cfg, f, r + 4, hi);
            let base = (hi as u64) << 32 | lo as u64;
            let mask = (hi_mask as u64) << 32 | lo_mask as u64;
            (memory_bar(i, BarKind::Mem64, prefetchable, base, mask), 2)
        }
        // A 64-bit BAR in the last slot, or the reserved types 1 and 3: unusable.
        _ => (None, 1),
    }
}

fn memory_bar(i: usize, kind: BarKind, prefetchable: bool, base: u64, mask: u64) -> Option<Bar> {
    let m = mask & !0xf;
    let size = (!m).wrapping_add(1);
    // Unimplemented (mask 0), or a mask that is not a run of ones from the top: not a BAR.
    if m == 0 || !size.is_power_of_two() {
        return None;
    }
    Some(Bar { index: i as u8, kind, prefetchable, base: base & !0xf, size })
}
