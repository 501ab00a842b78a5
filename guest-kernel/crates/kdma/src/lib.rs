//! kore-kdma: the driver for kore-dma, the VMM's emulated PCI DMA copy engine (test device).
//!
//! The device (vendor 0x1234, device 0x4b44) has its registers in BAR0 ([`reg`]) and one
//! MSI-X vector (table in BAR2) that fires when a copy finishes, done or failed. A copy is
//! SRC, DST, LEN, then a doorbell write; addresses are guest-physical (Kore identity-maps
//! RAM, so a buffer's address is its pointer). [`KoreDma::copy`] waits for the interrupt
//! through a caller-supplied `wait` (ring 3 passes `kcall::wait`), so every completion it
//! returns was signalled by an interrupt. Generic over [`Mmio`], so host tests drive it
//! against a fake device.
#![no_std]

use kore_pci::msix::Mmio;

#[cfg(test)]
mod tests;

use kore_boot_abi::kore_dma::{error, status};
pub use kore_boot_abi::kore_dma::{reg, MAGIC, MAX_LEN, REGS_BAR, VERSION};

/// PCI vendor id.
pub const VENDOR_ID: u16 = kore_boot_abi::kore_dma::VENDOR;
/// PCI device id.
pub const DEVICE_ID: u16 = kore_boot_abi::kore_dma::DEVICE;

/// The STATUS register.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Status {
    /// No copy has run yet.
    Idle,
    /// A copy is running.
    Busy,
    /// The last copy finished.
    Done,
    /// The last copy failed: see ERROR.
    Error,
    /// A value the contract does not define.
    Unknown(u32),
}

impl Status {
    fn from_u32(v: u32) -> Self {
        match v {
            status::IDLE => Self::Idle,
            status::BUSY => Self::Busy,
            status::DONE => Self::Done,
            status::ERROR => Self::Error,
            v => Self::Unknown(v),
        }
    }
}

/// The ERROR register.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeviceError {
    /// No error.
    None,
    /// The source range is not guest RAM.
    SourceNotRam,
    /// The destination range is not guest RAM.
    DestinationNotRam,
    /// LEN is 0 or above 64 MiB.
    BadLength,
    /// Bus mastering is off in the command register.
    BusMasterDisabled,
    /// The doorbell rang while a copy was running.
    Busy,
    /// A value the contract does not define.
    Unknown(u32),
}

impl DeviceError {
    /// Decodes the ERROR register.
    pub fn from_u32(v: u32) -> Self {
        match v {
            error::NONE => Self::None,
            error::SOURCE_NOT_RAM => Self::SourceNotRam,
            error::DESTINATION_NOT_RAM => Self::DestinationNotRam,
            error::BAD_LENGTH => Self::BadLength,
            error::BUS_MASTER_DISABLED => Self::BusMasterDisabled,
            error::BUSY => Self::Busy,
            v => Self::Unknown(v),
        }
    }
}

/// Why the driver failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Error {
    /// BAR0 does not hold kore-dma's MAGIC.
    NotKoreDma {
        /// What MAGIC read.
        magic: u32,
    },
    /// The device speaks another VERSION.
    Version(u32),
    /// The device finished the copy with an error.
    Device(DeviceError),
    /// The copy finished but STATUS says neither done nor error.
    Unexpected(Status),
}

impl core::fmt::Display for Error {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            Self::NotKoreDma { magic } => write!(f, "BAR0 magic {magic:#x} is not kore-dma's"),
            Self::Version(v) => write!(f, "kore-dma version {v}, driver speaks {VERSION}"),
            Self::Device(e) => write!(f, "kore-dma reported {e:?}"),
            Self::Unexpected(s) => write!(f, "kore-dma finished a copy with status {s:?}"),
        }
    }
}

/// A finished copy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Completion {
    /// How many times `wait` returned before COMPLETED moved (1 when the interrupt was the
    /// only one: each return of `kcall::wait` needs an interrupt).
    pub waits: u32,
}

/// kore-dma's registers (BAR0).
pub struct KoreDma<M: Mmio> {
    regs: M,
}

impl<M: Mmio> KoreDma<M> {
    /// Checks MAGIC and VERSION.
    pub fn new(regs: M) -> Result<Self, Error> {
        let magic = regs.read32(reg::MAGIC);
        if magic != MAGIC {
            return Err(Error::NotKoreDma { magic });
        }
        match regs.read32(reg::VERSION) {
            VERSION => Ok(Self { regs }),
            v => Err(Error::Version(v)),
        }
    }

    /// The register window.
    pub fn regs(&self) -> &M {
        &self.regs
    }

    /// Programs a copy and rings the doorbell (no checks: the device validates).
    pub fn start(&self, src: u64, dst: u64, len: u64) {
        self.regs.write64(reg::SRC, src);
        self.regs.write64(reg::DST, dst);
        self.regs.write64(reg::LEN, len);
        self.regs.write32(reg::DOORBELL, 1);
    }

    /// STATUS.
    pub fn status(&self) -> Status {
        Status::from_u32(self.regs.read32(reg::STATUS))
    }

    /// ERROR.
    pub fn error(&self) -> DeviceError {
        DeviceError::from_u32(self.regs.read32(reg::ERROR))
    }

    /// COMPLETED: copies finished so far.
    pub fn completed(&self) -> u64 {
        self.regs.read64(reg::COMPLETED)
    }

    /// Copies `len` bytes from guest-physical `src` to `dst` and waits for the completion
    /// interrupt: `wait` is called until COMPLETED moves (at least once, so the interrupt
    /// of this copy is consumed). The outcome is the device's STATUS and ERROR.
    pub fn copy(
        &self,
        src: u64,
        dst: u64,
        len: u64,
        mut wait: impl FnMut(),
    ) -> Result<Completion, Error> {
        let before = self.completed();
        self.start(src, dst, len);
        let mut waits = 0;
        loop {
            wait();
            waits += 1;
            if self.completed() != before {
                break;
            }
        }
        match self.status() {
            Status::Done => Ok(Completion { waits }),
            Status::Error => Err(Error::Device(self.error())),
            s => Err(Error::Unexpected(s)),
        }
    }
}
