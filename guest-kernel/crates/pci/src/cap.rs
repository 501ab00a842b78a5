//! The capability list and the MSI-X capability.
//!
//! The walk is bounded (at most 48 entries, pointers below 0x40 end it), so a device whose
//! list loops or points into the header cannot hang the driver.

use crate::{reg, ConfigSpace, Function};

/// Capability id of MSI.
pub const ID_MSI: u8 = 0x05;
/// Capability id of MSI-X.
pub const ID_MSIX: u8 = 0x11;
/// At most this many capabilities fit in the 192 bytes after the header.
const MAX_CAPS: usize = 48;

/// One capability: its id and configuration-space offset.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Capability {
    /// Capability id (e.g. [`ID_MSIX`]).
    pub id: u8,
    /// Offset of the capability header in configuration space.
    pub offset: u16,
}

/// The function's capabilities in list order (none if the status register has no list).
pub fn capabilities(cfg: &impl ConfigSpace, f: Function) -> impl Iterator<Item = Capability> + '_ {
    let has_list = cfg.read16(f, reg::STATUS) & reg::STATUS_CAP_LIST != 0;
    let mut ptr = if has_list { (cfg.read8(f, reg::CAP_PTR) & 0xfc) as u16 } else { 0 };
    let mut left = MAX_CAPS;
    core::iter::from_fn(move || {
        if ptr < 0x40 || left == 0 {
            return None;
        }
        left -= 1;
        let hdr = cfg.read16(f, ptr);
        let cap = Capability { id: hdr as u8, offset: ptr };
        ptr = (hdr >> 8) & 0xfc;
        Some(cap)
    })
}

/// The first capability with `id`.
pub fn find(cfg: &impl ConfigSpace, f: Function, id: u8) -> Option<Capability> {
    capabilities(cfg, f).find(|c| c.id == id)
}

/// Message-control bits of the MSI-X capability.
pub mod msix_control {
    /// Table size minus one (bits 10:0).
    pub const TABLE_SIZE_MASK: u16 = 0x7ff;
    /// Function mask: every vector masked (pending bits still set).
    pub const FUNCTION_MASK: u16 = 1 << 14;
    /// MSI-X enable.
    pub const ENABLE: u16 = 1 << 15;
}

/// A function's MSI-X capability, decoded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MsixCap {
    /// The function.
    pub function: Function,
    /// Offset of the capability in configuration space.
    pub offset: u16,
    /// Number of table entries (1..=2048).
    pub table_size: u16,
    /// BAR slot holding the table.
    pub table_bar: u8,
    /// Offset of the table in that BAR (8-byte aligned).
    pub table_offset: u32,
    /// BAR slot holding the pending-bit array.
    pub pba_bar: u8,
    /// Offset of the PBA in that BAR (8-byte aligned).
    pub pba_offset: u32,
}

impl MsixCap {
    /// Finds and decodes the MSI-X capability of `f`, if it has one.
    pub fn find(cfg: &impl ConfigSpace, f: Function) -> Option<Self> {
        let c = find(cfg, f, ID_MSIX)?;
        let control = cfg.read16(f, c.offset + 2);
        let table = cfg.read32(f, c.offset + 4);
        let pba = cfg.read32(f, c.offset + 8);
        Some(Self {
            function: f,
            offset: c.offset,
            table_size: (control & msix_control::TABLE_SIZE_MASK) + 1,
            table_bar: (table & 7) as u8,
            table_offset: table & !7,
            pba_bar: (pba & 7) as u8,
            pba_offset: pba & !7,
        })
    }

    /// The message-control register.
    pub fn control(&self, cfg: &impl ConfigSpace) -> u16 {
        cfg.read16(self.function, self.offset + 2)
    }

    /// Sets and clears message-control bits (only [`msix_control::ENABLE`] and
    /// [`msix_control::FUNCTION_MASK`] are writable).
    pub fn update_control(&self, cfg: &impl ConfigSpace, set: u16, clear: u16) {
        let c = self.control(cfg);
        cfg.write16(self.function, self.offset + 2, (c | set) & !clear);
    }

    /// Enables MSI-X with every vector masked by the function mask: program the table, then
    /// [`MsixCap::unmask_function`].
    pub fn enable_masked(&self, cfg: &impl ConfigSpace) {
        use msix_control::{ENABLE, FUNCTION_MASK};
        self.update_control(cfg, ENABLE | FUNCTION_MASK, 0);
    }

    /// Clears the function mask (vectors then follow their own mask bits).
    pub fn unmask_function(&self, cfg: &impl ConfigSpace) {
        self.update_control(cfg, 0, msix_control::FUNCTION_MASK);
    }

    /// Turns MSI-X off.
    pub fn disable(&self, cfg: &impl ConfigSpace) {
        self.update_control(cfg, 0, msix_control::ENABLE);
    }
}
