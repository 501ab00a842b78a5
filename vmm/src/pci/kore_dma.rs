//! "kore-dma": an emulated PCI DMA copy engine that exists to test the PCI
//! path end to end (bus, BARs, bus mastering, MSI-X, the guest driver). Built
//! only with the `test-devices` feature.
//!
//! BAR0 (4 KiB) holds the registers (see the #21 contract in docs/vmm.md);
//! BAR2 (4 KiB) the MSI-X table (offset 0) and PBA (0x800), one vector. A
//! doorbell copies `LEN` bytes from `SRC` to `DST` (memmove) synchronously,
//! then raises vector 0, whether the copy was done or refused. Every address
//! is checked against guest RAM first, so a guest cannot make the VMM touch
//! anything else: errors are reported in `ERROR`, never by crashing.

use std::ops::Range;

use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

use super::config::{cmd, BarSpec, ConfigSpace};
use super::msix::{MsiSink, Msix};
use super::PciDevice;

use kore_boot_abi::kore_dma::error;
pub use kore_boot_abi::kore_dma::{
    reg as regs, status, BAR_SIZE, DEVICE, MAGIC, MAX_LEN, PBA_OFFSET, VENDOR, VERSION,
};

/// `ERROR` values.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub enum DmaError {
    /// The source range is not inside guest RAM.
    Source = error::SOURCE_NOT_RAM,
    /// The destination range is not inside writable guest RAM.
    Destination = error::DESTINATION_NOT_RAM,
    /// `LEN` is 0 or above 64 MiB.
    Length = error::BAD_LENGTH,
    /// Bus Master Enable is off.
    BusMaster = error::BUS_MASTER_DISABLED,
}

/// What DMA may touch: guest RAM, with ranges readable and writable.
#[derive(Clone, Debug)]
pub struct DmaMemory {
    mem: GuestMemoryMmap,
    readable: Vec<Range<u64>>,
    writable: Vec<Range<u64>>,
}

impl DmaMemory {
    /// `mem` with the guest-physical ranges DMA may read and write.
    pub fn new(mem: GuestMemoryMmap, readable: Vec<Range<u64>>, writable: Vec<Range<u64>>) -> Self {
        Self { mem, readable, writable }
    }

    fn inside(ranges: &[Range<u64>], addr: u64, len: u64) -> bool {
        let Some(end) = addr.checked_add(len) else { return false };
        ranges.iter().any(|r| addr >= r.start && end <= r.end)
    }

    /// Copies `len` bytes from `src` to `dst` (overlap-safe), or says why not.
    pub fn copy(&self, src: u64, dst: u64, len: u64) -> Result<(), DmaError> {
        if len == 0 || len > MAX_LEN {
            return Err(DmaError::Length);
        }
        if !Self::inside(&self.readable, src, len) {
            return Err(DmaError::Source);
        }
        if !Self::inside(&self.writable, dst, len) {
            return Err(DmaError::Destination);
        }
        let mut buf = vec![0u8; len as usize];
        self.mem.read_slice(&mut buf, GuestAddress(src)).map_err(|_| DmaError::Source)?;
        self.mem.write_slice(&buf, GuestAddress(dst)).map_err(|_| DmaError::Destination)
    }
}

/// The kore-dma function.
pub struct KoreDma {
    config: ConfigSpace,
    msix_cap: u16,
    msix: Msix,
    mem: DmaMemory,
    src: u64,
    dst: u64,
    len: u64,
    status: u32,
    error: u32,
    completed: u64,
}

impl KoreDma {
    /// A device with BAR0 at `bar0` and BAR2 at `bar2` (4 KiB aligned,
    /// below 4 GiB), DMA limited to `mem`, interrupts to `sink`.
    pub fn new(
        bar0: u64,
        bar2: u64,
        mem: DmaMemory,
        sink: Box<dyn MsiSink>,
    ) -> Result<Self, super::config::ConfigError> {
        let mut config = ConfigSpace::new(VENDOR, DEVICE, 0xff_0000, 1);
        let bar = |addr| BarSpec { addr, size: BAR_SIZE, is_64: false, prefetchable: false };
        config.add_bar(0, bar(bar0))?;
        config.add_bar(2, bar(bar2))?;
        let msix = Msix::new(1, sink);
        let (body, writable) = msix.capability((2, 0), (2, PBA_OFFSET as u32));
        let msix_cap = config.add_capability(&body, &writable)?;
        let (src, dst, len, status, error, completed) = (0, 0, 0, status::IDLE, 0, 0);
        Ok(Self { config, msix_cap, msix, mem, src, dst, len, status, error, completed })
    }

    fn qword(&self, at: u64) -> u64 {
        match at {
            regs::MAGIC => u64::from(MAGIC) | u64::from(VERSION) << 32,
            regs::SRC => self.src,
            regs::DST => self.dst,
            regs::LEN => self.len,
            regs::DOORBELL => u64::from(self.status) << 32,
            regs::ERROR => u64::from(self.error),
            regs::COMPLETED => self.completed,
            _ => 0,
        }
    }

    fn doorbell(&mut self) {
        let bus_master = self.config.command() & cmd::BUS_MASTER != 0;
        let r = if bus_master {
            self.mem.copy(self.src, self.dst, self.len)
        } else {
            Err(DmaError::BusMaster)
        };
        match r {
            Ok(()) => (self.status, self.error) = (status::DONE, 0),
            Err(e) => (self.status, self.error) = (status::ERROR, e as u32),
        }
        self.completed += 1;
        self.msix.trigger(0);
    }

    fn reg_write(&mut self, offset: u64, data: &[u8]) {
        let at = offset & !7;
        let shift = (offset % 8) * 8;
        let mut v = [0u8; 8];
        v[..data.len()].copy_from_slice(data);
        let value = u64::from_le_bytes(v);
        let mask = if data.len() == 8 { u64::MAX } else { 0xffff_ffff << shift };
        let merge = |old: u64| old & !mask | (value << shift) & mask;
        match at {
            regs::SRC => self.src = merge(self.src),
            regs::DST => self.dst = merge(self.dst),
            regs::LEN => self.len = merge(self.len),
            regs::DOORBELL if shift == 0 && value as u32 == 1 => self.doorbell(),
            _ => {}
        }
    }
}

/// Whether a BAR access is 4 or 8 bytes, aligned, inside the 4 KiB BAR.
fn reg_access_ok(offset: u64, len: usize) -> bool {
    matches!(len, 4 | 8) && offset.is_multiple_of(len as u64) && offset < BAR_SIZE
}

impl PciDevice for KoreDma {
    fn config_read(&mut self, offset: u16, data: &mut [u8]) {
        self.config.read(offset, data);
    }

    fn config_write(&mut self, offset: u16, data: &[u8]) {
        if self.config.write(offset, data) {
            self.msix.sync_control(&self.config, self.msix_cap);
        }
    }

    fn decoded_bars(&self) -> Vec<(usize, u64, u64)> {
        self.config.decoded_bars()
    }

    fn bar_read(&mut self, bar: usize, offset: u64, data: &mut [u8]) {
        data.fill(0);
        match bar {
            0 if reg_access_ok(offset, data.len()) => {
                let bytes = self.qword(offset & !7).to_le_bytes();
                let at = (offset % 8) as usize;
                data.copy_from_slice(&bytes[at..at + data.len()]);
            }
            2 if offset < PBA_OFFSET => self.msix.table_read(offset, data),
            2 => self.msix.pba_read(offset - PBA_OFFSET, data),
            _ => {}
        }
    }

    fn bar_write(&mut self, bar: usize, offset: u64, data: &[u8]) {
        match bar {
            0 if reg_access_ok(offset, data.len()) => self.reg_write(offset, data),
            2 if offset < PBA_OFFSET => self.msix.table_write(offset, data),
            _ => {}
        }
    }
}

#[cfg(test)]
#[path = "kore_dma_tests.rs"]
mod tests;
