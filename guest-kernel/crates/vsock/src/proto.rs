//! The virtio-vsock packet header and constants (virtio 1.2 §5.10.6).

/// Size of [`Header`] on the wire.
pub const HDR_LEN: usize = 44;
/// The host's CID.
pub const HOST_CID: u64 = 2;
/// `type` of a stream socket (the only type this driver speaks).
pub const TYPE_STREAM: u16 = 1;
/// Shutdown flag: the sender will receive no more.
pub const SHUTDOWN_RCV: u32 = 1;
/// Shutdown flag: the sender will send no more.
pub const SHUTDOWN_SEND: u32 = 2;
/// Event-queue event id: the transport was reset (e.g. migration); all connections are gone.
pub const EVENT_TRANSPORT_RESET: u32 = 0;

/// Packet operations.
pub mod op {
    /// Invalid.
    pub const INVALID: u16 = 0;
    /// Connect request.
    pub const REQUEST: u16 = 1;
    /// Connect accepted.
    pub const RESPONSE: u16 = 2;
    /// Connection reset / refused.
    pub const RST: u16 = 3;
    /// Half or full shutdown (`flags`).
    pub const SHUTDOWN: u16 = 4;
    /// Data.
    pub const RW: u16 = 5;
    /// Credit information (sent unasked).
    pub const CREDIT_UPDATE: u16 = 6;
    /// Asks the peer for a credit update.
    pub const CREDIT_REQUEST: u16 = 7;
}

/// A packet header (little-endian on the wire).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Header {
    /// Source CID.
    pub src_cid: u64,
    /// Destination CID.
    pub dst_cid: u64,
    /// Source port.
    pub src_port: u32,
    /// Destination port.
    pub dst_port: u32,
    /// Payload length.
    pub len: u32,
    /// Socket type ([`TYPE_STREAM`]).
    pub type_: u16,
    /// Operation ([`op`]).
    pub op: u16,
    /// Operation flags (shutdown flags).
    pub flags: u32,
    /// The sender's receive buffer size for this connection.
    pub buf_alloc: u32,
    /// Bytes the sender's application has consumed from this connection, modulo 2^32.
    pub fwd_cnt: u32,
}

impl Header {
    /// Wire bytes.
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

    /// Parses the first [`HDR_LEN`] bytes; `None` if `b` is shorter.
    pub fn decode(b: &[u8]) -> Option<Self> {
        let b: &[u8; HDR_LEN] = b.get(..HDR_LEN)?.try_into().ok()?;
        let u64_at = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().unwrap_or([0; 8]));
        let u32_at = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().unwrap_or([0; 4]));
        let u16_at = |i: usize| u16::from_le_bytes(b[i..i + 2].try_into().unwrap_or([0; 2]));
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
}
