//! MSI-X table entries (x86: fixed delivery, edge, physical destination).
//!
//! Entry `i` is 16 bytes at `table + 16 * i`: message address low, high, data, vector
//! control (bit 0 = masked). On x86 the address is `0xFEE0_0000 | apic_id << 12` and the
//! data is the vector. The table lives in a BAR, reached through [`Mmio`].

/// Register access to a memory BAR (naturally aligned offsets).
pub trait Mmio {
    /// Reads a 32-bit register at byte offset `off`.
    fn read32(&self, off: u64) -> u32;
    /// Writes a 32-bit register at byte offset `off`.
    fn write32(&self, off: u64, v: u32);
    /// Reads a 64-bit register (by default two 32-bit reads, low half first).
    fn read64(&self, off: u64) -> u64 {
        self.read32(off) as u64 | (self.read32(off + 4) as u64) << 32
    }
    /// Writes a 64-bit register (by default two 32-bit writes, low half first).
    fn write64(&self, off: u64, v: u64) {
        self.write32(off, v as u32);
        self.write32(off + 4, (v >> 32) as u32);
    }
}

/// Base of the x86 MSI address range.
pub const MSI_ADDRESS_BASE: u32 = 0xfee0_0000;
/// Bytes per table entry.
pub const ENTRY_SIZE: u64 = 16;
/// Vector-control bit: the entry is masked.
pub const VECTOR_MASKED: u32 = 1;

/// The message (address, data) that delivers `vector` to the CPU with `apic_id` (< 256):
/// fixed delivery mode, edge triggered, physical destination mode.
pub const fn message(apic_id: u8, vector: u8) -> (u32, u32) {
    (MSI_ADDRESS_BASE | (apic_id as u32) << 12, vector as u32)
}

/// Why an entry could not be programmed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MsixError {
    /// The entry index is past the table size.
    NoSuchEntry,
    /// Vectors 0..32 are exceptions and cannot be MSI targets.
    BadVector,
}

/// An MSI-X table at `table_offset` in a BAR.
pub struct Table<M: Mmio> {
    bar: M,
    offset: u64,
    size: u16,
}

impl<M: Mmio> Table<M> {
    /// The table of `size` entries at `offset` in `bar` (from [`crate::cap::MsixCap`]).
    pub fn new(bar: M, offset: u32, size: u16) -> Self {
        Self { bar, offset: offset as u64, size }
    }

    /// Number of entries.
    pub fn len(&self) -> u16 {
        self.size
    }

    /// Whether the table has no entries.
    pub fn is_empty(&self) -> bool {
        self.size == 0
    }

    fn entry(&self, i: u16) -> Result<u64, MsixError> {
        if i >= self.size {
            return Err(MsixError::NoSuchEntry);
        }
        Ok(self.offset + i as u64 * ENTRY_SIZE)
    }

    /// Programs entry `i` to deliver `vector` to `apic_id`, masked first and left as `masked`
    /// says (the mask is set before address and data change, so no half-written message fires).
    pub fn program(&self, i: u16, apic_id: u8, vector: u8, masked: bool) -> Result<(), MsixError> {
        if vector < 32 {
            return Err(MsixError::BadVector);
        }
        let e = self.entry(i)?;
        let (addr, data) = message(apic_id, vector);
        self.bar.write32(e + 12, VECTOR_MASKED);
        self.bar.write32(e, addr);
        self.bar.write32(e + 4, 0);
        self.bar.write32(e + 8, data);
        self.bar.write32(e + 12, if masked { VECTOR_MASKED } else { 0 });
        Ok(())
    }

    /// Masks or unmasks entry `i`.
    pub fn set_masked(&self, i: u16, masked: bool) -> Result<(), MsixError> {
        let e = self.entry(i)?;
        self.bar.write32(e + 12, if masked { VECTOR_MASKED } else { 0 });
        Ok(())
    }

    /// Entry `i` as (address, data, vector control).
    pub fn read(&self, i: u16) -> Result<(u64, u32, u32), MsixError> {
        let e = self.entry(i)?;
        let addr = (self.bar.read32(e + 4) as u64) << 32 | self.bar.read32(e) as u64;
        Ok((addr, self.bar.read32(e + 8), self.bar.read32(e + 12)))
    }

    /// The BAR the table lives in.
    pub fn bar(&self) -> &M {
        &self.bar
    }
}

/// Whether entry `i`'s pending bit is set in the PBA at `pba_offset` of `bar`.
pub fn pending(bar: &impl Mmio, pba_offset: u32, i: u16) -> bool {
    let word = pba_offset as u64 + (i as u64 / 32) * 4;
    bar.read32(word) & (1 << (i % 32)) != 0
}
