//! The virtio-mmio transport, version 2 (virtio 1.2 §4.2.2): register
//! offsets in the device window, device status bits and fixed values.

/// Register offsets (virtio 1.2 §4.2.2, "MMIO Device Register Layout").
pub mod reg {
    /// Magic value [`super::MAGIC_VALUE`].
    pub const MAGIC: u64 = 0x000;
    /// Transport version ([`super::VERSION`]).
    pub const VERSION: u64 = 0x004;
    /// Virtio device id.
    pub const DEVICE_ID: u64 = 0x008;
    /// Vendor id.
    pub const VENDOR_ID: u64 = 0x00c;
    /// Device features, the 32 bits selected by [`DEVICE_FEATURES_SEL`].
    pub const DEVICE_FEATURES: u64 = 0x010;
    /// Device feature word selector.
    pub const DEVICE_FEATURES_SEL: u64 = 0x014;
    /// Driver features, the 32 bits selected by [`DRIVER_FEATURES_SEL`].
    pub const DRIVER_FEATURES: u64 = 0x020;
    /// Driver feature word selector.
    pub const DRIVER_FEATURES_SEL: u64 = 0x024;
    /// Selects the queue the queue registers address.
    pub const QUEUE_SEL: u64 = 0x030;
    /// Largest size of the selected queue (0: no such queue).
    pub const QUEUE_NUM_MAX: u64 = 0x034;
    /// Size of the selected queue, chosen by the driver.
    pub const QUEUE_NUM: u64 = 0x038;
    /// 1 once the selected queue is configured.
    pub const QUEUE_READY: u64 = 0x044;
    /// Doorbell: the driver writes a queue index.
    pub const QUEUE_NOTIFY: u64 = 0x050;
    /// Pending interrupt causes ([`super::INT_USED_RING`], bit 1: configuration change).
    pub const INTERRUPT_STATUS: u64 = 0x060;
    /// Acknowledges interrupt causes.
    pub const INTERRUPT_ACK: u64 = 0x064;
    /// Device status ([`super::status`]).
    pub const STATUS: u64 = 0x070;
    /// Descriptor table address, low 32 bits.
    pub const QUEUE_DESC_LOW: u64 = 0x080;
    /// Descriptor table address, high 32 bits.
    pub const QUEUE_DESC_HIGH: u64 = 0x084;
    /// Available (driver) ring address, low 32 bits.
    pub const QUEUE_DRIVER_LOW: u64 = 0x090;
    /// Available (driver) ring address, high 32 bits.
    pub const QUEUE_DRIVER_HIGH: u64 = 0x094;
    /// Used (device) ring address, low 32 bits.
    pub const QUEUE_DEVICE_LOW: u64 = 0x0a0;
    /// Used (device) ring address, high 32 bits.
    pub const QUEUE_DEVICE_HIGH: u64 = 0x0a4;
    /// Configuration atomicity value.
    pub const CONFIG_GENERATION: u64 = 0x0fc;
    /// Start of the device-specific configuration space (vsock: `guest_cid`, u64).
    pub const CONFIG: u64 = 0x100;
}

/// Device status bits (virtio 1.2 §2.1).
pub mod status {
    /// The guest found the device.
    pub const ACKNOWLEDGE: u32 = 1;
    /// The guest has a driver for it.
    pub const DRIVER: u32 = 2;
    /// The driver is set up and the device may be used.
    pub const DRIVER_OK: u32 = 4;
    /// Feature negotiation is complete.
    pub const FEATURES_OK: u32 = 8;
    /// The device hit an error the driver must reset it from.
    pub const DEVICE_NEEDS_RESET: u32 = 64;
    /// The driver gave up on the device.
    pub const FAILED: u32 = 128;
}

/// `"virt"` as a little-endian `u32`.
pub const MAGIC_VALUE: u32 = 0x7472_6976;
/// The transport version this layout describes.
pub const VERSION: u32 = 2;
/// `VIRTIO_F_VERSION_1` (feature bit 32): mandatory for version 2.
pub const F_VERSION_1: u64 = 1 << 32;
/// Interrupt status bit: the device used a buffer.
pub const INT_USED_RING: u32 = 1;
