//! The PCI host bridge: bus 0 behind an ECAM window, the BAR windows on the
//! MMIO bus, and the BAR address allocator the VMM uses as firmware.
//!
//! [`PciRoot`] holds the functions (function 0 of each device slot).
//! [`Ecam`] decodes `dev << 15 | func << 12 | reg` config accesses;
//! [`BarWindow`] serves a memory window (the 32-bit one, the 64-bit one) by
//! looking up which function decodes the address now: the map is rebuilt
//! after every config write, so BAR moves and Memory Space changes take
//! effect at once. Addresses no function decodes read all-ones.

use std::sync::{Arc, Mutex, RwLock};

use super::config::access_ok;
use super::PciDevice;
use crate::devices::bus::BusDevice;

/// Device slots on bus 0.
pub const SLOTS: usize = 32;

/// Errors placing functions or BARs.
#[derive(Clone, Debug, thiserror::Error, PartialEq, Eq)]
pub enum HostError {
    /// Every slot is taken.
    #[error("the PCI bus is full ({SLOTS} devices)")]
    BusFull,
    /// A BAR does not fit its window.
    #[error("no room for a {size:#x}-byte BAR in the {window} PCI window")]
    NoRoom {
        /// The window's name.
        window: &'static str,
        /// The BAR size.
        size: u64,
    },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Decode {
    addr: u64,
    size: u64,
    slot: usize,
    bar: usize,
}

/// The functions on bus 0 and the BAR ranges they decode.
#[derive(Default)]
pub struct PciRoot {
    slots: Vec<Arc<Mutex<dyn PciDevice>>>,
    decode: RwLock<Vec<Decode>>,
}

fn lock<T: ?Sized>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl PciRoot {
    /// An empty bus.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds `dev` at the next free slot (slot 0 first); returns the slot.
    pub fn add(&mut self, dev: Arc<Mutex<dyn PciDevice>>) -> Result<usize, HostError> {
        if self.slots.len() >= SLOTS {
            return Err(HostError::BusFull);
        }
        self.slots.push(dev);
        let slot = self.slots.len() - 1;
        self.refresh(slot);
        Ok(slot)
    }

    /// Number of functions.
    pub fn len(&self) -> usize {
        self.slots.len()
    }

    /// Whether the bus has no function.
    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    fn refresh(&self, slot: usize) {
        let Some(dev) = self.slots.get(slot) else { return };
        let bars = lock(dev).decoded_bars();
        let mut map = self.decode.write().unwrap_or_else(|e| e.into_inner());
        map.retain(|d| d.slot != slot);
        map.extend(bars.into_iter().map(|(bar, addr, size)| Decode { addr, size, slot, bar }));
    }

    fn function(&self, offset: u64, len: usize) -> Option<(usize, u16)> {
        let (dev, func, reg) = ((offset >> 15) as usize, (offset >> 12) & 7, offset & 0xfff);
        let ok = offset < (SLOTS as u64) << 15 && func == 0 && access_ok(reg as u16, len);
        (ok && dev < self.slots.len()).then_some((dev, reg as u16))
    }

    /// A config read at ECAM `offset`; absent functions and bad accesses read all-ones.
    pub fn config_read(&self, offset: u64, data: &mut [u8]) {
        match self.function(offset, data.len()) {
            Some((dev, reg)) => lock(&self.slots[dev]).config_read(reg, data),
            None => data.fill(0xff),
        }
    }

    /// A config write at ECAM `offset`; bad accesses are ignored.
    pub fn config_write(&self, offset: u64, data: &[u8]) {
        if let Some((dev, reg)) = self.function(offset, data.len()) {
            lock(&self.slots[dev]).config_write(reg, data);
            self.refresh(dev);
        }
    }

    fn find(&self, addr: u64) -> Option<(Decode, u64)> {
        let map = self.decode.read().unwrap_or_else(|e| e.into_inner());
        let d = map.iter().find(|d| addr >= d.addr && addr - d.addr < d.size)?;
        Some((*d, addr - d.addr))
    }

    /// A memory read at guest-physical `addr`; undecoded addresses read all-ones.
    pub fn mem_read(&self, addr: u64, data: &mut [u8]) {
        match self.find(addr) {
            Some((d, off)) => lock(&self.slots[d.slot]).bar_read(d.bar, off, data),
            None => data.fill(0xff),
        }
    }

    /// A memory write at guest-physical `addr`; undecoded addresses drop it.
    pub fn mem_write(&self, addr: u64, data: &[u8]) {
        if let Some((d, off)) = self.find(addr) {
            lock(&self.slots[d.slot]).bar_write(d.bar, off, data);
        }
    }
}

/// The ECAM window as an MMIO bus device.
pub struct Ecam(pub Arc<PciRoot>);

impl BusDevice for Ecam {
    fn read(&mut self, offset: u64, data: &mut [u8]) {
        self.0.config_read(offset, data);
    }
    fn write(&mut self, offset: u64, data: &[u8]) {
        self.0.config_write(offset, data);
    }
}

/// A BAR window as an MMIO bus device placed at `base`.
pub struct BarWindow {
    /// The bus.
    pub root: Arc<PciRoot>,
    /// Guest-physical base of the window.
    pub base: u64,
}

impl BusDevice for BarWindow {
    fn read(&mut self, offset: u64, data: &mut [u8]) {
        self.root.mem_read(self.base + offset, data);
    }
    fn write(&mut self, offset: u64, data: &[u8]) {
        self.root.mem_write(self.base + offset, data);
    }
}

/// Hands out naturally aligned BAR addresses inside a window.
#[derive(Clone, Debug)]
pub struct BarAllocator {
    name: &'static str,
    next: u64,
    end: u64,
}

impl BarAllocator {
    /// Allocates from `[base, base + size)`.
    pub fn new(name: &'static str, base: u64, size: u64) -> Self {
        Self { name, next: base, end: base.saturating_add(size) }
    }

    /// The next `size`-byte (power of two) naturally aligned address.
    pub fn alloc(&mut self, size: u64) -> Result<u64, HostError> {
        let no_room = HostError::NoRoom { window: self.name, size };
        if !size.is_power_of_two() {
            return Err(no_room);
        }
        let addr = self.next.checked_next_multiple_of(size).ok_or(no_room.clone())?;
        let end = addr.checked_add(size).filter(|e| *e <= self.end).ok_or(no_room)?;
        self.next = end;
        Ok(addr)
    }
}

#[cfg(test)]
#[path = "host_tests.rs"]
mod tests;
