//! The device buses: the port-I/O bus (serial console) and the MMIO bus
//! (virtio-mmio windows), in Firecracker's shape.
//!
//! A [`Bus`] maps address ranges to devices implementing [`BusDevice`]; a
//! vCPU exit is dispatched to the device whose range holds the address, with
//! the offset into that range. Ranges never overlap ([`Bus::insert`] refuses).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

/// A device on a bus: register reads and writes at an offset in its window.
pub trait BusDevice: Send {
    /// A read of `data.len()` bytes at `offset` in the device window.
    fn read(&mut self, offset: u64, data: &mut [u8]);
    /// A write at `offset` in the device window.
    fn write(&mut self, offset: u64, data: &[u8]);
}

/// Why a device could not be placed on a bus.
#[derive(Debug, thiserror::Error)]
pub enum BusError {
    /// The range is empty or wraps around the address space.
    #[error("invalid bus range {base:#x}+{len:#x}")]
    InvalidRange {
        /// First address.
        base: u64,
        /// Length.
        len: u64,
    },
    /// The range overlaps a device already on the bus.
    #[error("bus range {base:#x}+{len:#x} overlaps another device")]
    Overlap {
        /// First address.
        base: u64,
        /// Length.
        len: u64,
    },
}

struct Slot {
    len: u64,
    device: Arc<Mutex<dyn BusDevice>>,
}

/// Address ranges and the devices behind them.
#[derive(Default)]
pub struct Bus {
    slots: BTreeMap<u64, Slot>,
}

impl Bus {
    /// An empty bus.
    pub fn new() -> Self {
        Self::default()
    }

    /// Places `device` at `base..base + len`.
    pub fn insert(
        &mut self,
        device: Arc<Mutex<dyn BusDevice>>,
        base: u64,
        len: u64,
    ) -> Result<(), BusError> {
        let end = base.checked_add(len).filter(|_| len > 0);
        let Some(end) = end else { return Err(BusError::InvalidRange { base, len }) };
        let below = self.slots.range(..end).next_back();
        if below.is_some_and(|(b, s)| b + s.len > base) {
            return Err(BusError::Overlap { base, len });
        }
        self.slots.insert(base, Slot { len, device });
        Ok(())
    }

    fn find(&self, addr: u64) -> Option<(&Slot, u64)> {
        let (base, slot) = self.slots.range(..=addr).next_back()?;
        let offset = addr - base;
        (offset < slot.len).then_some((slot, offset))
    }

    /// Reads from the device at `addr`; `false` (and `data` untouched) if none is there.
    pub fn read(&self, addr: u64, data: &mut [u8]) -> bool {
        let Some((slot, offset)) = self.find(addr) else { return false };
        slot.device.lock().unwrap_or_else(|e| e.into_inner()).read(offset, data);
        true
    }

    /// Writes to the device at `addr`; `false` if none is there.
    pub fn write(&self, addr: u64, data: &[u8]) -> bool {
        let Some((slot, offset)) = self.find(addr) else { return false };
        slot.device.lock().unwrap_or_else(|e| e.into_inner()).write(offset, data);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Remembers the last access.
    #[derive(Default)]
    struct Probe(Vec<(u64, Vec<u8>)>);

    impl BusDevice for Probe {
        fn read(&mut self, offset: u64, data: &mut [u8]) {
            data.fill(offset as u8);
        }
        fn write(&mut self, offset: u64, data: &[u8]) {
            self.0.push((offset, data.to_vec()));
        }
    }

    #[test]
    fn dispatches_by_range_with_offsets() {
        let a = Arc::new(Mutex::new(Probe::default()));
        let b = Arc::new(Mutex::new(Probe::default()));
        let mut bus = Bus::new();
        bus.insert(a.clone(), 0x1000, 0x100).unwrap();
        bus.insert(b.clone(), 0x2000, 0x10).unwrap();
        let mut d = [0u8; 2];
        assert!(bus.read(0x1005, &mut d));
        assert_eq!(d, [5, 5]);
        assert!(bus.write(0x200f, &[7]));
        assert_eq!(b.lock().unwrap().0, vec![(0xf, vec![7])]);
        assert!(!bus.write(0x2010, &[1]), "one past the end is unclaimed");
        assert!(!bus.read(0xfff, &mut d), "below the first device is unclaimed");
        assert!(a.lock().unwrap().0.is_empty());
    }

    #[test]
    fn refuses_overlaps_and_bad_ranges() {
        let dev = || -> Arc<Mutex<dyn BusDevice>> { Arc::new(Mutex::new(Probe::default())) };
        let mut bus = Bus::new();
        bus.insert(dev(), 0x1000, 0x100).unwrap();
        assert!(matches!(bus.insert(dev(), 0x10ff, 1), Err(BusError::Overlap { .. })));
        assert!(matches!(bus.insert(dev(), 0xf00, 0x101), Err(BusError::Overlap { .. })));
        assert!(matches!(bus.insert(dev(), 0x0, 0), Err(BusError::InvalidRange { .. })));
        assert!(matches!(bus.insert(dev(), u64::MAX, 2), Err(BusError::InvalidRange { .. })));
        bus.insert(dev(), 0x1100, 0x10).unwrap();
        bus.insert(dev(), 0xf00, 0x100).unwrap();
    }
}
