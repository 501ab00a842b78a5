//! Emulated PCI configuration space of a type-0 function: the header,
//! memory BARs (32- and 64-bit, with the all-ones sizing protocol) and a
//! capability list, as a register file with per-bit write masks.
//!
//! Accesses are 1, 2 or 4 bytes, naturally aligned, inside the 256-byte
//! legacy space; anything else reads as all-ones and is ignored on write (the
//! ECAM host already filters these, the checks here keep the type safe on
//! its own). The 4 KiB extended space reads as zero (no extended
//! capabilities).

/// Size of the legacy configuration space in bytes.
pub const CONFIG_SIZE: usize = 256;
const DWORDS: usize = CONFIG_SIZE / 4;

/// Header register offsets (type 0).
pub mod reg {
    /// Vendor ID (16 bits) | Device ID (16 bits).
    pub const ID: u16 = 0x00;
    /// Command (16 bits) | Status (16 bits).
    pub const COMMAND: u16 = 0x04;
    /// Revision | prog-if | subclass | class.
    pub const CLASS: u16 = 0x08;
    /// Cache line | latency | header type | BIST.
    pub const HEADER: u16 = 0x0c;
    /// BAR 0; BAR `i` is at `BAR0 + 4 * i`.
    pub const BAR0: u16 = 0x10;
    /// Subsystem vendor | subsystem ID.
    pub const SUBSYSTEM: u16 = 0x2c;
    /// Capabilities pointer (8 bits).
    pub const CAP_PTR: u16 = 0x34;
    /// Interrupt line | pin | min grant | max latency.
    pub const INTERRUPT: u16 = 0x3c;
}

/// Command register bits.
pub mod cmd {
    /// Memory Space Enable: the function decodes its memory BARs.
    pub const MEMORY: u16 = 1 << 1;
    /// Bus Master Enable: the function may issue DMA (and MSI writes).
    pub const BUS_MASTER: u16 = 1 << 2;
    /// INTx disable.
    pub const INTX_DISABLE: u16 = 1 << 10;
}

/// Status register bit: the function has a capability list.
const STATUS_CAP_LIST: u32 = 1 << 20;
/// Number of BAR registers in a type-0 header.
pub const BAR_COUNT: usize = 6;

/// Why a BAR or capability could not be added.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ConfigError {
    /// The BAR index, size or placement is invalid.
    #[error("BAR {index}: {reason}")]
    BadBar {
        /// BAR index.
        index: usize,
        /// What is wrong.
        reason: &'static str,
    },
    /// The capability does not fit the legacy config space.
    #[error("capability of {0} bytes does not fit the config space")]
    NoRoom(usize),
}

/// A memory BAR as the VMM placed it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BarSpec {
    /// Guest-physical address the VMM assigned (naturally aligned).
    pub addr: u64,
    /// Size in bytes (a power of two, at least 16).
    pub size: u64,
    /// 64-bit BAR (uses this register and the next).
    pub is_64: bool,
    /// Prefetchable.
    pub prefetchable: bool,
}

/// The configuration space of one function.
#[derive(Clone, Debug)]
pub struct ConfigSpace {
    regs: [u32; DWORDS],
    writable: [u32; DWORDS],
    bars: [Option<BarSpec>; BAR_COUNT],
    next_cap: u16,
    last_cap: Option<u16>,
}

impl ConfigSpace {
    /// A header for `vendor:device`, class code `class` (24 bits) and
    /// revision `revision`, with the command register 0 and no BARs.
    pub fn new(vendor: u16, device: u16, class: u32, revision: u8) -> Self {
        let mut c = Self {
            regs: [0; DWORDS],
            writable: [0; DWORDS],
            bars: [None; BAR_COUNT],
            next_cap: 0x40,
            last_cap: None,
        };
        c.regs[0] = u32::from(vendor) | u32::from(device) << 16;
        c.regs[2] = (class & 0xff_ffff) << 8 | u32::from(revision);
        c.writable[1] = u32::from(cmd::MEMORY | cmd::BUS_MASTER | cmd::INTX_DISABLE);
        c.writable[(reg::INTERRUPT / 4) as usize] = 0xff; // interrupt line: scratch
        c
    }

    /// The raw dword at `offset` (4-aligned, < 256), as the guest reads it.
    pub fn dword(&self, offset: u16) -> u32 {
        self.regs.get(offset as usize / 4).copied().unwrap_or(0)
    }

    /// Sets a dword and which of its bits the guest may write (VMM side).
    pub fn set_dword(&mut self, offset: u16, value: u32, writable: u32) {
        let i = offset as usize / 4;
        debug_assert!(i < DWORDS && offset.is_multiple_of(4));
        if let (Some(r), Some(w)) = (self.regs.get_mut(i), self.writable.get_mut(i)) {
            *r = value;
            *w = writable;
        }
    }

    /// The command register.
    pub fn command(&self) -> u16 {
        self.regs[1] as u16
    }

    /// Places memory BAR `index` at `spec.addr` (VMM side, before boot).
    pub fn add_bar(&mut self, index: usize, spec: BarSpec) -> Result<(), ConfigError> {
        let bad = |reason| Err(ConfigError::BadBar { index, reason });
        let last = index + usize::from(spec.is_64);
        if last >= BAR_COUNT {
            return bad("index out of range");
        }
        if self.bars[index].is_some() || (spec.is_64 && self.bars[index + 1].is_some()) {
            return bad("already in use");
        }
        if index > 0 && self.bars[index - 1].is_some_and(|b| b.is_64) {
            return bad("is the upper half of a 64-bit BAR");
        }
        if !spec.size.is_power_of_two() || spec.size < 16 {
            return bad("size must be a power of two of at least 16 bytes");
        }
        if !spec.addr.is_multiple_of(spec.size) {
            return bad("address not naturally aligned");
        }
        if !spec.is_64 && (spec.size > 1 << 31 || spec.addr + spec.size > 1 << 32) {
            return bad("a 32-bit BAR must lie below 4 GiB");
        }
        let flags = (u32::from(spec.is_64) << 2) | (u32::from(spec.prefetchable) << 3);
        let mask = !(spec.size - 1);
        let i = (reg::BAR0 / 4) as usize + index;
        self.regs[i] = (spec.addr as u32 & 0xffff_fff0) | flags;
        self.writable[i] = mask as u32 & 0xffff_fff0;
        if spec.is_64 {
            self.regs[i + 1] = (spec.addr >> 32) as u32;
            self.writable[i + 1] = (mask >> 32) as u32;
        }
        self.bars[index] = Some(spec);
        Ok(())
    }

    /// The BARs as placed by the VMM (index, spec).
    pub fn bar_specs(&self) -> impl Iterator<Item = (usize, BarSpec)> + '_ {
        self.bars.iter().enumerate().filter_map(|(i, b)| b.map(|b| (i, b)))
    }

    /// The address BAR `index` currently holds (what the guest programmed).
    pub fn bar_addr(&self, index: usize) -> Option<u64> {
        let spec = self.bars.get(index).copied().flatten()?;
        let i = (reg::BAR0 / 4) as usize + index;
        let lo = u64::from(self.regs[i] & 0xffff_fff0);
        let hi = if spec.is_64 { u64::from(self.regs[i + 1]) << 32 } else { 0 };
        Some(hi | lo)
    }

    /// The memory ranges the function decodes now: `(index, addr, size)` of
    /// every BAR, or none when Memory Space is off. A BAR in the middle of
    /// sizing (all-ones written) is skipped.
    pub fn decoded_bars(&self) -> Vec<(usize, u64, u64)> {
        if self.command() & cmd::MEMORY == 0 {
            return Vec::new();
        }
        self.bar_specs()
            .filter_map(|(i, s)| {
                let a = self.bar_addr(i)?;
                (a.checked_add(s.size).is_some() && a != sizing_pattern(s))
                    .then_some((i, a, s.size))
            })
            .collect()
    }

    /// Appends a capability (`body[0]` = its ID; the next-pointer byte is
    /// filled in) with `writable` masks per byte of `body`; returns its offset.
    pub fn add_capability(&mut self, body: &[u8], writable: &[u8]) -> Result<u16, ConfigError> {
        debug_assert_eq!(body.len(), writable.len());
        let len = body.len().max(2).next_multiple_of(4);
        let at = self.next_cap;
        if at as usize + len > CONFIG_SIZE {
            return Err(ConfigError::NoRoom(len));
        }
        for (k, (&b, &w)) in body.iter().zip(writable).enumerate() {
            let off = at as usize + k;
            let (i, shift) = (off / 4, (off % 4) * 8);
            let b = if k == 1 { 0 } else { b };
            self.regs[i] = self.regs[i] & !(0xff << shift) | u32::from(b) << shift;
            self.writable[i] = self.writable[i] & !(0xff << shift) | u32::from(w) << shift;
        }
        match self.last_cap {
            Some(prev) => self.write_byte_raw(prev + 1, at as u8),
            None => {
                self.write_byte_raw(reg::CAP_PTR, at as u8);
                self.regs[1] |= STATUS_CAP_LIST;
            }
        }
        self.last_cap = Some(at);
        self.next_cap = at + len as u16;
        Ok(at)
    }

    fn write_byte_raw(&mut self, offset: u16, v: u8) {
        let (i, shift) = (offset as usize / 4, (offset % 4) * 8);
        self.regs[i] = self.regs[i] & !(0xff << shift) | u32::from(v) << shift;
    }

    /// A guest read of `data.len()` bytes at `offset`.
    pub fn read(&self, offset: u16, data: &mut [u8]) {
        if !access_ok(offset, data.len()) {
            data.fill(0xff);
            return;
        }
        let v = self.dword(offset & !3) >> ((offset % 4) * 8);
        data.copy_from_slice(&v.to_le_bytes()[..data.len()]);
    }

    /// A guest write of `data` at `offset`; bits the guest may not write keep
    /// their value. Returns whether the access was accepted.
    pub fn write(&mut self, offset: u16, data: &[u8]) -> bool {
        if !access_ok(offset, data.len()) || offset as usize >= CONFIG_SIZE {
            return false;
        }
        let shift = (offset % 4) * 8;
        let mut v = [0u8; 4];
        v[..data.len()].copy_from_slice(data);
        let lanes =
            if data.len() == 4 { u32::MAX } else { ((1u32 << (data.len() * 8)) - 1) << shift };
        let i = offset as usize / 4;
        let mask = lanes & self.writable[i];
        self.regs[i] = self.regs[i] & !mask | (u32::from_le_bytes(v) << shift) & mask;
        true
    }
}

/// What a BAR reads as after the guest wrote all-ones to it (address bits only).
fn sizing_pattern(s: BarSpec) -> u64 {
    let mask = !(s.size - 1) & !0xf;
    if s.is_64 {
        mask
    } else {
        mask & 0xffff_ffff
    }
}

/// Whether a config access of `len` bytes at `offset` is 1/2/4 bytes and aligned.
pub fn access_ok(offset: u16, len: usize) -> bool {
    matches!(len, 1 | 2 | 4) && (offset as usize).is_multiple_of(len) && (offset as usize) < 4096
}

#[cfg(test)]
#[path = "config_tests.rs"]
mod tests;
