//! MSI-X: the capability's Message Control, the vector table and the
//! pending-bit array (PBA), with entry and function masking.
//!
//! A function raises a vector with [`Msix::trigger`]. A vector that is
//! masked (its entry's mask bit or the Function Mask) sets its PBA bit
//! instead and fires when unmasked; with MSI-X disabled nothing is sent.
//! Delivery goes to an [`MsiSink`]: KVM GSI routing + irqfd in a VM
//! ([`super::irq`]), a recorder in tests. Table contents are guest data: a
//! message whose address is not the local APIC's window is never routed.

/// PCI capability ID of MSI-X.
pub const CAP_ID: u8 = 0x11;
/// Bytes per table entry.
pub const ENTRY_SIZE: u64 = 16;
/// Message Control: MSI-X Enable.
pub const CTL_ENABLE: u16 = 1 << 15;
/// Message Control: Function Mask.
pub const CTL_FUNCTION_MASK: u16 = 1 << 14;
/// Entry Vector Control: mask bit.
const ENTRY_MASKED: u32 = 1;
/// The local APIC's MSI address window (`0xFEEx_xxxx`, upper address 0).
const MSI_ADDR_MASK: u32 = 0xfff0_0000;
const MSI_ADDR_BASE: u32 = 0xfee0_0000;
/// Most vectors a function may have (table size field is 11 bits).
pub const MAX_VECTORS: u16 = 2048;

/// One MSI message: write `data` to `addr`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MsiMessage {
    /// Address (the local APIC window, destination APIC id in bits 12..19).
    pub addr: u64,
    /// Data (the vector in bits 0..7, delivery mode, trigger).
    pub data: u32,
}

/// Where MSI-X messages go.
pub trait MsiSink: Send {
    /// Vector `vector` now sends `msg` (`None`: it has no valid message).
    fn route(&mut self, vector: u16, msg: Option<MsiMessage>);
    /// Sends vector `vector` (its route is current and valid).
    fn fire(&mut self, vector: u16);
    /// Vector `vector` became masked (`true`) or unmasked. Emulated
    /// functions ignore it ([`Msix`] pends for them); passthrough functions,
    /// whose interrupts bypass [`Msix::trigger`], hold their irqfd here.
    fn mask(&mut self, _vector: u16, _masked: bool) {}
}

#[derive(Clone, Copy, Debug, Default)]
struct Entry {
    addr_lo: u32,
    addr_hi: u32,
    data: u32,
    ctrl: u32,
}

impl Entry {
    fn message(&self) -> Option<MsiMessage> {
        let ok = self.addr_hi == 0 && self.addr_lo & MSI_ADDR_MASK == MSI_ADDR_BASE;
        ok.then_some(MsiMessage { addr: u64::from(self.addr_lo), data: self.data })
    }
}

/// The MSI-X state of one function.
pub struct Msix {
    entries: Vec<Entry>,
    pba: Vec<u64>,
    control: u16,
    sink: Box<dyn MsiSink>,
}

impl std::fmt::Debug for Msix {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Msix").field("vectors", &self.entries.len()).finish()
    }
}

impl Msix {
    /// `vectors` vectors (1..=2048), every entry masked as after reset.
    pub fn new(vectors: u16, sink: Box<dyn MsiSink>) -> Self {
        debug_assert!((1..=MAX_VECTORS).contains(&vectors));
        let n = usize::from(vectors.clamp(1, MAX_VECTORS));
        let entries = vec![Entry { ctrl: ENTRY_MASKED, ..Entry::default() }; n];
        Self { entries, pba: vec![0; n.div_ceil(64)], control: 0, sink }
    }

    /// Number of vectors.
    pub fn vectors(&self) -> u16 {
        self.entries.len() as u16
    }

    /// The capability body (ID, next, Message Control, Table, PBA) and the
    /// per-byte write masks for [`super::config::ConfigSpace::add_capability`].
    pub fn capability(&self, table: (u8, u32), pba: (u8, u32)) -> ([u8; 12], [u8; 12]) {
        debug_assert!(
            table.0 < 6 && pba.0 < 6 && table.1.is_multiple_of(8) && pba.1.is_multiple_of(8)
        );
        let mut body = [0u8; 12];
        body[0] = CAP_ID;
        body[2..4].copy_from_slice(&(self.vectors() - 1).to_le_bytes());
        body[4..8].copy_from_slice(&(table.1 | u32::from(table.0)).to_le_bytes());
        body[8..12].copy_from_slice(&(pba.1 | u32::from(pba.0)).to_le_bytes());
        let mut writable = [0u8; 12];
        writable[3] = ((CTL_ENABLE | CTL_FUNCTION_MASK) >> 8) as u8;
        (body, writable)
    }

    /// Size in bytes of the table.
    pub fn table_size(&self) -> u64 {
        self.entries.len() as u64 * ENTRY_SIZE
    }

    /// Size in bytes of the PBA (whole qwords).
    pub fn pba_size(&self) -> u64 {
        self.pba.len() as u64 * 8
    }

    /// Message Control's Enable and Function Mask bits.
    pub fn control(&self) -> u16 {
        self.control
    }

    /// Whether MSI-X is enabled.
    pub fn enabled(&self) -> bool {
        self.control & CTL_ENABLE != 0
    }

    /// Applies a new Message Control value (after a config write).
    pub fn set_control(&mut self, control: u16) {
        let control = control & (CTL_ENABLE | CTL_FUNCTION_MASK);
        if control == self.control {
            return;
        }
        let was_enabled = self.enabled();
        let before: Vec<bool> = (0..self.vectors()).map(|v| self.masked(v)).collect();
        self.control = control;
        for (v, was) in (0..self.vectors()).zip(before) {
            if self.masked(v) != was {
                self.sink.mask(v, !was);
            }
        }
        if self.enabled() && !was_enabled {
            for v in 0..self.vectors() {
                let msg = self.entries[usize::from(v)].message();
                self.sink.route(v, msg);
            }
        }
        self.deliver_unmasked();
    }

    /// Applies the Message Control of the capability at `cap` in `config`
    /// (call after every accepted config write).
    pub fn sync_control(&mut self, config: &super::config::ConfigSpace, cap: u16) {
        self.set_control((config.dword(cap) >> 16) as u16);
    }

    fn masked(&self, v: u16) -> bool {
        self.control & CTL_FUNCTION_MASK != 0
            || self.entries[usize::from(v)].ctrl & ENTRY_MASKED != 0
    }

    /// Whether vector `v`'s PBA bit is set.
    pub fn pending(&self, v: u16) -> bool {
        self.pba.get(usize::from(v) / 64).is_some_and(|w| w >> (v % 64) & 1 == 1)
    }

    fn set_pending(&mut self, v: u16, on: bool) {
        if let Some(w) = self.pba.get_mut(usize::from(v) / 64) {
            let bit = 1u64 << (v % 64);
            *w = if on { *w | bit } else { *w & !bit };
        }
    }

    /// The function raises vector `v`: sent, or left pending while masked.
    pub fn trigger(&mut self, v: u16) {
        if usize::from(v) >= self.entries.len() || !self.enabled() {
            return;
        }
        if self.masked(v) {
            self.set_pending(v, true);
            return;
        }
        self.send(v);
    }

    fn send(&mut self, v: u16) {
        if self.entries[usize::from(v)].message().is_some() {
            self.sink.fire(v);
        } else {
            tracing::debug!("MSI-X vector {v} has no valid message address: dropped");
        }
    }

    fn deliver_unmasked(&mut self) {
        if !self.enabled() {
            return;
        }
        for v in 0..self.vectors() {
            if self.pending(v) && !self.masked(v) {
                self.set_pending(v, false);
                self.send(v);
            }
        }
    }

    /// A read of 4 or 8 aligned bytes at `offset` in the table (else zeros).
    pub fn table_read(&self, offset: u64, data: &mut [u8]) {
        data.fill(0);
        let Some((i, dw)) = self.table_index(offset, data.len()) else { return };
        let e = &self.entries[i];
        let words = [e.addr_lo, e.addr_hi, e.data, e.ctrl];
        for (k, chunk) in data.chunks_mut(4).enumerate() {
            chunk.copy_from_slice(&words[dw + k].to_le_bytes());
        }
    }

    /// A write of 4 or 8 aligned bytes at `offset` in the table (else ignored).
    pub fn table_write(&mut self, offset: u64, data: &[u8]) {
        let Some((i, dw)) = self.table_index(offset, data.len()) else { return };
        let before = self.entries[i];
        for (k, chunk) in data.chunks(4).enumerate() {
            let v = u32::from_le_bytes([chunk[0], chunk[1], chunk[2], chunk[3]]);
            let e = &mut self.entries[i];
            match dw + k {
                0 => e.addr_lo = v,
                1 => e.addr_hi = v,
                2 => e.data = v,
                _ => e.ctrl = v & ENTRY_MASKED,
            }
        }
        let after = self.entries[i];
        let v = i as u16;
        if (before.ctrl ^ after.ctrl) & ENTRY_MASKED != 0 && self.control & CTL_FUNCTION_MASK == 0 {
            self.sink.mask(v, after.ctrl & ENTRY_MASKED != 0);
        }
        if (after.addr_lo, after.addr_hi, after.data)
            != (before.addr_lo, before.addr_hi, before.data)
            && self.enabled()
        {
            self.sink.route(v, after.message());
        }
        if before.ctrl & ENTRY_MASKED != 0 && after.ctrl & ENTRY_MASKED == 0 {
            self.deliver_unmasked();
        }
    }

    /// Entry index and dword within it for an access, if valid.
    fn table_index(&self, offset: u64, len: usize) -> Option<(usize, usize)> {
        let ok =
            matches!(len, 4 | 8) && offset.is_multiple_of(len as u64) && offset < self.table_size();
        ok.then_some(((offset / ENTRY_SIZE) as usize, (offset % ENTRY_SIZE / 4) as usize))
    }

    /// A read of 4 or 8 aligned bytes at `offset` in the PBA (read-only).
    pub fn pba_read(&self, offset: u64, data: &mut [u8]) {
        data.fill(0);
        if !matches!(data.len(), 4 | 8) || !offset.is_multiple_of(data.len() as u64) {
            return;
        }
        let Some(w) = self.pba.get((offset / 8) as usize) else { return };
        let bytes = w.to_le_bytes();
        let at = (offset % 8) as usize;
        data.copy_from_slice(&bytes[at..at + data.len()]);
    }
}

#[cfg(test)]
#[path = "msix_tests.rs"]
mod tests;
