//! Emulated devices: the serial console, the debug-exit/marker/AP-release
//! ports, the virtio-mmio transport and the virtio-vsock device.

pub mod serial;
pub mod virtio;
