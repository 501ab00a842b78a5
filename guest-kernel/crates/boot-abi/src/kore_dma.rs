//! kore-dma, the VMM's emulated PCI DMA copy engine (a test device, built only with
//! kore-vmm's `test-devices` feature): its ids and register map, shared by the device
//! (`kore_vmm::pci::kore_dma`) and Kore's driver (`kore-kdma`).
//!
//! BAR0 (32-bit memory, [`BAR_SIZE`]) holds the registers ([`reg`], little endian, 4- or
//! 8-byte accesses); BAR2 holds the MSI-X table (1 vector) and, at [`PBA_OFFSET`], the
//! pending bits. Writing 1 to `DOORBELL` copies `LEN` bytes from `SRC` to `DST` (guest
//! physical, like memmove); every finished copy, done or refused, raises vector 0.

/// PCI vendor id.
pub const VENDOR: u16 = 0x1234;
/// PCI device id ("KD").
pub const DEVICE: u16 = 0x4b44;
/// The `MAGIC` register's value ("KDMA").
pub const MAGIC: u32 = 0x414d_444b;
/// The `VERSION` register's value.
pub const VERSION: u32 = 1;
/// Largest copy the device accepts.
pub const MAX_LEN: u64 = 64 << 20;
/// The BAR holding the registers.
pub const REGS_BAR: u8 = 0;
/// The BAR holding the MSI-X table and pending bits.
pub const MSIX_BAR: u8 = 2;
/// Size of each of the two BARs.
pub const BAR_SIZE: u64 = 0x1000;
/// Offset of the pending-bit array in the MSI-X BAR.
pub const PBA_OFFSET: u64 = 0x800;

/// Register offsets in BAR0.
pub mod reg {
    /// u32, read-only: [`super::MAGIC`].
    pub const MAGIC: u64 = 0x00;
    /// u32, read-only: [`super::VERSION`].
    pub const VERSION: u64 = 0x04;
    /// u64: source address.
    pub const SRC: u64 = 0x08;
    /// u64: destination address.
    pub const DST: u64 = 0x10;
    /// u64: length in bytes (1..=[`super::MAX_LEN`]).
    pub const LEN: u64 = 0x18;
    /// u32, write-only: 1 starts a copy.
    pub const DOORBELL: u64 = 0x20;
    /// u32, read-only: a [`super::status`] value.
    pub const STATUS: u64 = 0x24;
    /// u32, read-only: an [`super::error`] value.
    pub const ERROR: u64 = 0x28;
    /// u64, read-only: copies finished (done or refused).
    pub const COMPLETED: u64 = 0x30;
}

/// Values of the `STATUS` register.
pub mod status {
    /// No copy has run yet.
    pub const IDLE: u32 = 0;
    /// A copy is running.
    pub const BUSY: u32 = 1;
    /// The last copy finished.
    pub const DONE: u32 = 2;
    /// The last copy was refused (see `ERROR`).
    pub const ERROR: u32 = 3;
}

/// Values of the `ERROR` register.
pub mod error {
    /// No error.
    pub const NONE: u32 = 0;
    /// The source range is not guest RAM.
    pub const SOURCE_NOT_RAM: u32 = 1;
    /// The destination range is not writable guest RAM.
    pub const DESTINATION_NOT_RAM: u32 = 2;
    /// `LEN` is 0 or above [`super::MAX_LEN`].
    pub const BAD_LENGTH: u32 = 3;
    /// Bus Master Enable is off in the command register.
    pub const BUS_MASTER_DISABLED: u32 = 4;
    /// The doorbell rang while a copy was running.
    pub const BUSY: u32 = 5;
}
