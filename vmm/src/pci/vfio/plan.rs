//! Passthrough planning, pure functions over what the device reports: the
//! DMA map list, the MSI-X capability, BAR placement and which BAR pages are
//! mapped straight to the device or trapped by the VMM.

use std::ops::Range;

use super::{RegionInfo, VfioError, VfioLayer, CONFIG_REGION};
use crate::pci::config::reg;
use crate::pci::host::BarAllocator;
use crate::pci::msix::{self, ENTRY_SIZE};

/// Granularity of direct BAR mappings.
pub const PAGE: u64 = 4096;

/// One DMA mapping: guest-physical `iova` -> host `host`, `size` bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DmaMapping {
    /// Guest-physical (= I/O virtual) address.
    pub iova: u64,
    /// Length.
    pub size: u64,
    /// Host virtual address of the guest RAM behind it.
    pub host: u64,
}

/// Every guest RAM range (`(gpa, size, host)`) and nothing else, identity
/// IOVA = guest-physical, refusing empty or overlapping ranges.
pub fn dma_plan(ram: &[(u64, u64, u64)]) -> Result<Vec<DmaMapping>, String> {
    let mut v: Vec<DmaMapping> =
        ram.iter().map(|&(iova, size, host)| DmaMapping { iova, size, host }).collect();
    v.sort_by_key(|m| m.iova);
    for w in v.windows(2) {
        if w[0].iova + w[0].size > w[1].iova {
            return Err(format!("guest RAM ranges overlap at {:#x}", w[1].iova));
        }
    }
    if v.iter().any(|m| m.size == 0 || m.iova.checked_add(m.size).is_none()) {
        return Err("an empty or wrapping guest RAM range".into());
    }
    Ok(v)
}

/// Where the device's MSI-X capability and structures are.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MsixLayout {
    /// Offset of the capability in config space.
    pub cap: u16,
    /// Number of vectors.
    pub vectors: u16,
    /// (BAR, offset) of the table.
    pub table: (usize, u64),
    /// (BAR, offset) of the PBA.
    pub pba: (usize, u64),
}

impl MsixLayout {
    /// Table byte range in its BAR.
    pub fn table_range(&self) -> Range<u64> {
        self.table.1..self.table.1 + u64::from(self.vectors) * ENTRY_SIZE
    }
    /// PBA byte range in its BAR.
    pub fn pba_range(&self) -> Range<u64> {
        self.pba.1..self.pba.1 + u64::from(self.vectors).div_ceil(64) * 8
    }
}

fn cfg32(layer: &dyn VfioLayer, offset: u16) -> u32 {
    let mut d = [0u8; 4];
    layer.read(CONFIG_REGION, offset.into(), &mut d);
    u32::from_le_bytes(d)
}

/// Walks the device's capability list for MSI-X (at most 48 hops: the list
/// is device data and may loop).
pub fn find_msix(layer: &dyn VfioLayer) -> Option<MsixLayout> {
    if cfg32(layer, reg::COMMAND) & (1 << 20) == 0 {
        return None;
    }
    let mut at = (cfg32(layer, reg::CAP_PTR) & 0xfc) as u16;
    for _ in 0..48 {
        if at < 0x40 {
            return None;
        }
        let head = cfg32(layer, at);
        if head as u8 == msix::CAP_ID {
            let (t, p) = (cfg32(layer, at + 4), cfg32(layer, at + 8));
            return Some(MsixLayout {
                cap: at,
                vectors: ((head >> 16) & 0x7ff) as u16 + 1,
                table: ((t & 7) as usize, u64::from(t & !7)),
                pba: ((p & 7) as usize, u64::from(p & !7)),
            });
        }
        at = ((head >> 8) & 0xfc) as u16;
    }
    None
}

/// A device BAR as placed in guest-physical space.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlacedBar {
    /// BAR index.
    pub index: usize,
    /// Guest-physical address.
    pub addr: u64,
    /// Size (power of two, at least a page).
    pub size: u64,
    /// 64-bit BAR.
    pub is_64: bool,
    /// Prefetchable.
    pub prefetchable: bool,
    /// Byte ranges of the BAR mapped straight to the device (KVM slots).
    pub direct: Vec<Range<u64>>,
}

/// Page-aligned ranges the VMM must trap in BAR `index` (MSI-X table, PBA).
fn trapped(index: usize, msix: Option<&MsixLayout>) -> Vec<Range<u64>> {
    let page = |r: Range<u64>| (r.start & !(PAGE - 1))..r.end.next_multiple_of(PAGE);
    let mut v = Vec::new();
    if let Some(m) = msix {
        if m.table.0 == index {
            v.push(page(m.table_range()));
        }
        if m.pba.0 == index {
            v.push(page(m.pba_range()));
        }
    }
    v.sort_by_key(|r| r.start);
    v
}

/// `0..size` minus `holes` (sorted).
fn subtract(size: u64, holes: &[Range<u64>]) -> Vec<Range<u64>> {
    let mut out = Vec::new();
    let mut cur = 0;
    for h in holes {
        if h.start > cur {
            out.push(cur..h.start.min(size));
        }
        cur = cur.max(h.end);
    }
    if cur < size {
        out.push(cur..size);
    }
    out.retain(|r| !r.is_empty());
    out
}

/// Reads the device's memory BARs and places them: 32-bit BARs in
/// `bars32`, 64-bit ones in `bars64`. I/O BARs are skipped (logged).
pub fn place_bars(
    layer: &dyn VfioLayer,
    msix: Option<&MsixLayout>,
    bars32: &mut BarAllocator,
    bars64: &mut BarAllocator,
) -> Result<Vec<PlacedBar>, String> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < 6 {
        let Some(RegionInfo { size, mmap }) = layer.region(i as u32).filter(|r| r.size > 0) else {
            i += 1;
            continue;
        };
        let raw = cfg32(layer, reg::BAR0 + 4 * i as u16);
        let is_64 = raw & 0b111 == 0b100;
        if raw & 1 == 1 {
            tracing::warn!("VF BAR {i} is an I/O BAR: not passed through");
            i += 1;
            continue;
        }
        if !size.is_power_of_two() {
            return Err(format!("BAR {i} size {size:#x} is not a power of two"));
        }
        // A BAR smaller than a page is placed as a page and trapped whole
        // (its region cannot be mmapped a page long).
        let direct_ok = mmap && size >= PAGE;
        let size = size.max(PAGE);
        let alloc = if is_64 { &mut *bars64 } else { &mut *bars32 };
        let addr = alloc.alloc(size).map_err(|e| e.to_string())?;
        let direct = if direct_ok { subtract(size, &trapped(i, msix)) } else { Vec::new() };
        out.push(PlacedBar { index: i, addr, size, is_64, prefetchable: raw & 8 != 0, direct });
        i += 1 + usize::from(is_64);
    }
    if let Some(m) = msix {
        for b in [m.table.0, m.pba.0] {
            if !out.iter().any(|p| p.index == b) {
                return Err(format!("the MSI-X structures are in BAR {b}, which is absent"));
            }
        }
    }
    Ok(out)
}

/// Wraps a plan error for `addr`.
pub fn unsupported(addr: &str) -> impl FnOnce(String) -> VfioError + '_ {
    move |reason| VfioError::Unsupported { addr: addr.to_string(), reason }
}
