//! kore-vsock: the Kore guest's virtio-vsock driver, for ring 3.
//!
//! * [`proto`]: the packet header and constants (virtio 1.2 §5.10).
//! * [`socket`]: stream sockets (listen, accept, read, write, close) with credit accounting,
//!   independent of any transport.
//! * [`mmio`]: the virtio-mmio (version 2) transport and the three virtqueues, driving a
//!   [`socket::Vsock`] from the device's rings.
//!
//! Everything builds and tests on the host: the tests run the driver against a fake device in
//! plain memory.
#![no_std]

extern crate alloc;

pub mod mmio;
pub mod proto;
pub mod socket;

pub use socket::{ConnId, Error, Vsock};

#[cfg(test)]
mod tests;
