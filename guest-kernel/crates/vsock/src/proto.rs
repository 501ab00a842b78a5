//! The virtio-vsock packet header and constants (virtio 1.2 §5.10.6): the
//! one definition in [`kore_boot_abi::virtio::vsock`], shared with the VMM.

pub use kore_boot_abi::virtio::vsock::{
    op, Header, EVENT_TRANSPORT_RESET, HDR_LEN, HOST_CID, SHUTDOWN_RCV, SHUTDOWN_SEND, TYPE_STREAM,
};
