//! The virtio wire both sides speak: the virtio-mmio (version 2) register
//! window ([`mmio`]) and the virtio-vsock packet header ([`vsock`]). The VMM
//! implements the device side, the guest's ring-3 driver the driver side;
//! neither keeps its own copy of these numbers.

pub mod mmio;
pub mod vsock;
