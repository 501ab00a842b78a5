//! Vsock packet headers and constants (virtio 1.2 §5.10.6).
//!
//! [`Header`] (shared with the guest, in [`kore_boot_abi::virtio::vsock`]) is a
//! plain copy of the wire header. The device reads it once
//! from guest memory (through [`virtio_vsock::packet::VsockPacket`], which
//! validates the descriptor chain) and works on this copy only, so the guest
//! cannot change a field after it was checked.

use virtio_vsock::packet::VsockPacket;
use vm_memory::bitmap::BitmapSlice;

pub use kore_boot_abi::virtio::vsock::{
    op, Header, HDR_LEN, HOST_CID, SHUTDOWN_RCV, SHUTDOWN_SEND, TYPE_STREAM,
};

/// Largest payload accepted in or put into one packet (as Firecracker's 64 KiB).
pub const MAX_PKT_PAYLOAD: u32 = 64 * 1024;

/// The header of a parsed packet (the copy `VsockPacket` read once).
pub fn header_of<B: BitmapSlice>(p: &VsockPacket<'_, B>) -> Header {
    Header {
        src_cid: p.src_cid(),
        dst_cid: p.dst_cid(),
        src_port: p.src_port(),
        dst_port: p.dst_port(),
        len: p.len(),
        type_: p.type_(),
        op: p.op(),
        flags: p.flags(),
        buf_alloc: p.buf_alloc(),
        fwd_cnt: p.fwd_cnt(),
    }
}
