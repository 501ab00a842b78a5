//! kore-pci: PCI configuration space for Kore, `no_std` and allocation-free.
//!
//! * [`ConfigSpace`]: 1/2/4-byte configuration reads and writes of a [`Function`]; [`Ecam`]
//!   is the real one (memory-mapped, bus 0: offset `dev << 15 | func << 12 | reg`).
//! * [`enumerate`] walks bus 0 (functions 1-7 only behind a multi-function device) and
//!   [`Header`] reads the type-0 header fields a driver needs.
//! * [`bar`]: decodes and sizes the six BARs (write all-ones, read, restore; 32- and 64-bit)
//!   with decoding switched off meanwhile.
//! * [`cap`]: the capability list (bounded walk, so a malformed list cannot loop) and the
//!   MSI-X capability; [`msix`]: its table entries, function mask and enable.
//! * [`pages`]: a BAR's pages split at 2 MiB boundaries (what a kernel maps for a driver).
//!
//! Everything reads through the traits, so the host tests run it against a fake
//! configuration space and a fake MSI-X table.
#![no_std]

pub mod bar;
pub mod cap;
pub mod msix;
pub mod pages;

#[cfg(test)]
mod tests;

/// Configuration-space register offsets (type-0 header).
pub mod reg {
    /// Vendor id (16 bits).
    pub const VENDOR_ID: u16 = 0x00;
    /// Device id (16 bits).
    pub const DEVICE_ID: u16 = 0x02;
    /// Command (16 bits): see [`super::command`].
    pub const COMMAND: u16 = 0x04;
    /// Status (16 bits): bit 4 = capability list present.
    pub const STATUS: u16 = 0x06;
    /// Revision id (8 bits), then the 24-bit class code.
    pub const REVISION: u16 = 0x08;
    /// Header type (8 bits): bits 0-6 the layout, bit 7 multi-function.
    pub const HEADER_TYPE: u16 = 0x0e;
    /// BAR 0; BAR `i` is at `BAR0 + 4 * i`.
    pub const BAR0: u16 = 0x10;
    /// Subsystem vendor id (16 bits).
    pub const SUBSYSTEM_VENDOR_ID: u16 = 0x2c;
    /// Capabilities pointer (8 bits, low two bits reserved).
    pub const CAP_PTR: u16 = 0x34;
    /// Status bit: the function has a capability list.
    pub const STATUS_CAP_LIST: u16 = 1 << 4;
}

/// Command-register bits.
pub mod command {
    /// I/O space decoding.
    pub const IO: u16 = 1 << 0;
    /// Memory space decoding.
    pub const MEMORY: u16 = 1 << 1;
    /// Bus mastering (the device may DMA).
    pub const BUS_MASTER: u16 = 1 << 2;
    /// INTx disable.
    pub const INTX_DISABLE: u16 = 1 << 10;
}

/// Vendor id an absent function reads as.
pub const NO_VENDOR: u16 = 0xffff;
/// Size of one function's configuration space in the ECAM window.
pub const FUNCTION_SPACE: u64 = 4096;
/// Size of bus 0's ECAM window (32 devices x 8 functions x 4 KiB).
pub const BUS_SPACE: u64 = 32 * 8 * FUNCTION_SPACE;

/// A function on bus 0: device 0..32, function 0..8.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Function {
    dev: u8,
    func: u8,
}

impl Function {
    /// Device `dev` (< 32), function `func` (< 8); `None` if out of range.
    pub const fn new(dev: u8, func: u8) -> Option<Self> {
        if dev < 32 && func < 8 {
            Some(Self { dev, func })
        } else {
            None
        }
    }

    /// The device number.
    pub const fn dev(self) -> u8 {
        self.dev
    }

    /// The function number.
    pub const fn func(self) -> u8 {
        self.func
    }

    /// Byte offset of this function's configuration space in the bus-0 ECAM window.
    pub const fn ecam_offset(self) -> u64 {
        (self.dev as u64) << 15 | (self.func as u64) << 12
    }

    /// The function at ECAM offset `off` (4 KiB aligned, inside bus 0), if any.
    pub const fn from_ecam_offset(off: u64) -> Option<Self> {
        if !off.is_multiple_of(FUNCTION_SPACE) || off >= BUS_SPACE {
            return None;
        }
        Self::new((off >> 15) as u8, ((off >> 12) & 7) as u8)
    }
}

/// Access width of a configuration access.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Width {
    /// One byte.
    U8 = 1,
    /// Two bytes.
    U16 = 2,
    /// Four bytes.
    U32 = 4,
}

/// Configuration-space access for bus 0. `reg` is a byte offset < 4096 aligned to the width;
/// implementations may assume it (callers in this crate guarantee it).
pub trait ConfigSpace {
    /// Reads `width` bytes at `reg` (zero-extended).
    fn read(&self, f: Function, reg: u16, width: Width) -> u32;
    /// Writes the low `width` bytes of `value` at `reg`.
    fn write(&self, f: Function, reg: u16, width: Width, value: u32);

    /// Reads a byte.
    fn read8(&self, f: Function, reg: u16) -> u8 {
        self.read(f, reg, Width::U8) as u8
    }
    /// Reads a 16-bit register.
    fn read16(&self, f: Function, reg: u16) -> u16 {
        self.read(f, reg, Width::U16) as u16
    }
    /// Reads a 32-bit register.
    fn read32(&self, f: Function, reg: u16) -> u32 {
        self.read(f, reg, Width::U32)
    }
    /// Writes a 16-bit register.
    fn write16(&self, f: Function, reg: u16, v: u16) {
        self.write(f, reg, Width::U16, v as u32)
    }
    /// Writes a 32-bit register.
    fn write32(&self, f: Function, reg: u16, v: u32) {
        self.write(f, reg, Width::U32, v)
    }
}

/// Bus 0's memory-mapped configuration window (ECAM) at a fixed, identity-mapped address.
pub struct Ecam {
    base: usize,
}

impl Ecam {
    /// The window at `base`.
    ///
    /// # Safety
    /// `[base, base + BUS_SPACE)` must be mapped, uncached, as a PCI ECAM window for bus 0
    /// for the object's lifetime.
    pub const unsafe fn new(base: usize) -> Self {
        Self { base }
    }

    fn addr(&self, f: Function, reg: u16, width: Width) -> usize {
        debug_assert!(reg < 4096 && reg.is_multiple_of(width as u16), "config reg {reg:#x}");
        self.base + f.ecam_offset() as usize + (reg & 0xfff) as usize
    }
}

impl ConfigSpace for Ecam {
    fn read(&self, f: Function, reg: u16, width: Width) -> u32 {
        let a = self.addr(f, reg, width);
        // SAFETY: `new`'s contract: the window is mapped; `a` is inside it and aligned.
        unsafe {
            match width {
                Width::U8 => (a as *const u8).read_volatile() as u32,
                Width::U16 => (a as *const u16).read_volatile() as u32,
                Width::U32 => (a as *const u32).read_volatile(),
            }
        }
    }

    fn write(&self, f: Function, reg: u16, width: Width, v: u32) {
        let a = self.addr(f, reg, width);
        // SAFETY: as for `read`.
        unsafe {
            match width {
                Width::U8 => (a as *mut u8).write_volatile(v as u8),
                Width::U16 => (a as *mut u16).write_volatile(v as u16),
                Width::U32 => (a as *mut u32).write_volatile(v),
            }
        }
    }
}

/// The identifying fields of a function's header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    /// Where the function is.
    pub function: Function,
    /// Vendor id.
    pub vendor: u16,
    /// Device id.
    pub device: u16,
    /// Revision id.
    pub revision: u8,
    /// Class code (base class, subclass, programming interface), 24 bits.
    pub class: u32,
    /// Header layout (bit 7 cleared): 0 = endpoint, 1 = PCI-to-PCI bridge.
    pub header_type: u8,
    /// Whether function 0 of this device has more functions.
    pub multi_function: bool,
}

impl Header {
    /// Reads the header of `f`, or `None` if no function is there (vendor 0xffff or 0).
    pub fn read(cfg: &impl ConfigSpace, f: Function) -> Option<Self> {
        let id = cfg.read32(f, reg::VENDOR_ID);
        let vendor = id as u16;
        if vendor == NO_VENDOR || vendor == 0 {
            return None;
        }
        let rev_class = cfg.read32(f, reg::REVISION);
        let ht = cfg.read8(f, reg::HEADER_TYPE);
        Some(Self {
            function: f,
            vendor,
            device: (id >> 16) as u16,
            revision: rev_class as u8,
            class: rev_class >> 8,
            header_type: ht & 0x7f,
            multi_function: ht & 0x80 != 0,
        })
    }

    /// Number of BARs this header layout has (6 for endpoints, 2 for bridges, else 0).
    pub fn bar_count(&self) -> usize {
        match self.header_type {
            0 => 6,
            1 => 2,
            _ => 0,
        }
    }
}

/// Every function present on bus 0, in (device, function) order. Functions 1-7 of a device
/// are probed only when function 0 says it is multi-function.
pub fn enumerate(cfg: &impl ConfigSpace) -> impl Iterator<Item = Header> + '_ {
    (0..32u8).flat_map(move |dev| {
        let f0 = Header::read(cfg, Function { dev, func: 0 });
        let more = f0.is_some_and(|h| h.multi_function);
        let rest = (1..8u8)
            .filter(move |_| more)
            .filter_map(move |func| Header::read(cfg, Function { dev, func }));
        f0.into_iter().chain(rest)
    })
}

/// The first function with this vendor and device id.
pub fn find(cfg: &impl ConfigSpace, vendor: u16, device: u16) -> Option<Header> {
    enumerate(cfg).find(|h| h.vendor == vendor && h.device == device)
}

/// Sets `bits` in the command register (read-modify-write of the 16-bit register alone, so
/// the status register's write-1-to-clear bits are left alone).
pub fn enable(cfg: &impl ConfigSpace, f: Function, bits: u16) {
    let cmd = cfg.read16(f, reg::COMMAND);
    cfg.write16(f, reg::COMMAND, cmd | bits);
}

/// Clears `bits` in the command register.
pub fn disable(cfg: &impl ConfigSpace, f: Function, bits: u16) {
    let cmd = cfg.read16(f, reg::COMMAND);
    cfg.write16(f, reg::COMMAND, cmd & !bits);
}
