//! Virtio devices on the virtio-mmio (version 2) transport: [`mmio`] is the
//! transport, [`vsock`] the vsock device with its Unix-socket backend.

pub mod mmio;
pub mod vsock;
