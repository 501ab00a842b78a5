//! Vsock packet headers and constants (virtio 1.2 §5.10.6).
//!
//! [`Header`] is a plain copy of the wire header. The device reads it once
//! from guest memory (through [`virtio_vsock::packet::VsockPacket`], which
//! validates the descriptor chain) and works on this copy only, so the guest
//! cannot change a field after it was checked.

use virtio_vsock::packet::VsockPacket;
use vm_memory::bitmap::BitmapSlice;

/// Size of the packet header on the wire.
pub const HDR_LEN: usize = 44;
/// The host's context id.
pub const HOST_CID: u64 = 2;
/// Stream socket type (the only type this device carries).
pub const TYPE_STREAM: u16 = 1;
/// Shutdown flag: the sender will receive no more data.
pub const SHUTDOWN_RCV: u32 = 1;
/// Shutdown flag: the sender will send no more data.
pub const SHUTDOWN_SEND: u32 = 2;
/// Largest payload accepted in or put into one packet (as Firecracker's 64 KiB).
pub const MAX_PKT_PAYLOAD: u32 = 64 * 1024;

/// Packet operations.
pub mod op {
    /// Connection request.
    pub const REQUEST: u16 = 1;
    /// Connection accepted.
    pub const RESPONSE: u16 = 2;
    /// Reset / refused.
    pub const RST: u16 = 3;
    /// Shutdown (flags say which direction).
    pub const SHUTDOWN: u16 = 4;
    /// Data.
    pub const RW: u16 = 5;
    /// Credit information.
    pub const CREDIT_UPDATE: u16 = 6;
    /// Asks the peer for a credit update.
    pub const CREDIT_REQUEST: u16 = 7;
}

/// A vsock packet header.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Header {
    /// Source context id.
    pub src_cid: u64,
    /// Destination context id.
    pub dst_cid: u64,
    /// Source port.
    pub src_port: u32,
    /// Destination port.
    pub dst_port: u32,
    /// Payload length.
    pub len: u32,
    /// Socket type.
    pub type_: u16,
    /// Operation ([`op`]).
    pub op: u16,
    /// Operation flags.
    pub flags: u32,
    /// The sender's receive buffer for this connection.
    pub buf_alloc: u32,
    /// Bytes the sender has consumed, modulo 2^32.
    pub fwd_cnt: u32,
}

impl Header {
    /// Wire bytes (little-endian).
    pub fn encode(&self) -> [u8; HDR_LEN] {
        let mut b = [0u8; HDR_LEN];
        b[0..8].copy_from_slice(&self.src_cid.to_le_bytes());
        b[8..16].copy_from_slice(&self.dst_cid.to_le_bytes());
        b[16..20].copy_from_slice(&self.src_port.to_le_bytes());
        b[20..24].copy_from_slice(&self.dst_port.to_le_bytes());
        b[24..28].copy_from_slice(&self.len.to_le_bytes());
        b[28..30].copy_from_slice(&self.type_.to_le_bytes());
        b[30..32].copy_from_slice(&self.op.to_le_bytes());
        b[32..36].copy_from_slice(&self.flags.to_le_bytes());
        b[36..40].copy_from_slice(&self.buf_alloc.to_le_bytes());
        b[40..44].copy_from_slice(&self.fwd_cnt.to_le_bytes());
        b
    }

    /// Parses wire bytes (`None` if shorter than [`HDR_LEN`]).
    pub fn decode(b: &[u8]) -> Option<Self> {
        let b = b.get(..HDR_LEN)?;
        let u64_at = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().unwrap_or_default());
        let u32_at = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().unwrap_or_default());
        let u16_at = |i: usize| u16::from_le_bytes(b[i..i + 2].try_into().unwrap_or_default());
        Some(Self {
            src_cid: u64_at(0),
            dst_cid: u64_at(8),
            src_port: u32_at(16),
            dst_port: u32_at(20),
            len: u32_at(24),
            type_: u16_at(28),
            op: u16_at(30),
            flags: u32_at(32),
            buf_alloc: u32_at(36),
            fwd_cnt: u32_at(40),
        })
    }

    /// The header of a parsed packet (the copy `VsockPacket` read once).
    pub fn of<B: BitmapSlice>(p: &VsockPacket<'_, B>) -> Self {
        Self {
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
}
