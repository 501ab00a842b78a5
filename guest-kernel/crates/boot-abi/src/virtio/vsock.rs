//! The virtio-vsock device (virtio 1.2 §5.10): its id, feature bit, queue
//! indices and the 44-byte little-endian packet header.

/// Virtio device id of vsock.
pub const DEVICE_ID: u32 = 19;
/// `VIRTIO_VSOCK_F_STREAM`.
pub const F_STREAM: u64 = 1;
/// Receive queue index (device to driver).
pub const RX_QUEUE: u32 = 0;
/// Transmit queue index (driver to device).
pub const TX_QUEUE: u32 = 1;
/// Event queue index.
pub const EVENT_QUEUE: u32 = 2;
/// Size of [`Header`] on the wire.
pub const HDR_LEN: usize = 44;
/// The host's context id.
pub const HOST_CID: u64 = 2;
/// `type` of a stream socket (the only type Kore carries).
pub const TYPE_STREAM: u16 = 1;
/// Shutdown flag: the sender will receive no more data.
pub const SHUTDOWN_RCV: u32 = 1;
/// Shutdown flag: the sender will send no more data.
pub const SHUTDOWN_SEND: u32 = 2;
/// Event id `VIRTIO_VSOCK_EVENT_TRANSPORT_RESET`: every connection is gone
/// and the driver re-reads the guest CID.
pub const EVENT_TRANSPORT_RESET: u32 = 0;

/// Packet operations.
pub mod op {
    /// Invalid.
    pub const INVALID: u16 = 0;
    /// Connection request.
    pub const REQUEST: u16 = 1;
    /// Connection accepted.
    pub const RESPONSE: u16 = 2;
    /// Reset or refused.
    pub const RST: u16 = 3;
    /// Shutdown of one or both directions (`flags`).
    pub const SHUTDOWN: u16 = 4;
    /// Data.
    pub const RW: u16 = 5;
    /// Credit information, sent unasked.
    pub const CREDIT_UPDATE: u16 = 6;
    /// Asks the peer for a credit update.
    pub const CREDIT_REQUEST: u16 = 7;
}

/// A vsock packet header (a plain copy; little-endian on the wire).
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
    /// Socket type ([`TYPE_STREAM`]).
    pub type_: u16,
    /// Operation ([`op`]).
    pub op: u16,
    /// Operation flags (shutdown flags).
    pub flags: u32,
    /// The sender's receive buffer for this connection.
    pub buf_alloc: u32,
    /// Bytes the sender's application consumed from this connection, modulo 2^32.
    pub fwd_cnt: u32,
}

fn le<const N: usize>(b: &[u8; HDR_LEN], at: usize) -> [u8; N] {
    let mut out = [0u8; N];
    out.copy_from_slice(&b[at..at + N]);
    out
}

impl Header {
    /// The `RST` that answers this packet, sent from `src_cid`.
    pub fn rst_reply(&self, src_cid: u64) -> Self {
        Self {
            src_cid,
            dst_cid: self.src_cid,
            src_port: self.dst_port,
            dst_port: self.src_port,
            type_: TYPE_STREAM,
            op: op::RST,
            ..Self::default()
        }
    }

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
        Some(Self {
            src_cid: u64::from_le_bytes(le(b, 0)),
            dst_cid: u64::from_le_bytes(le(b, 8)),
            src_port: u32::from_le_bytes(le(b, 16)),
            dst_port: u32::from_le_bytes(le(b, 20)),
            len: u32::from_le_bytes(le(b, 24)),
            type_: u16::from_le_bytes(le(b, 28)),
            op: u16::from_le_bytes(le(b, 30)),
            flags: u32::from_le_bytes(le(b, 32)),
            buf_alloc: u32::from_le_bytes(le(b, 36)),
            fwd_cnt: u32::from_le_bytes(le(b, 40)),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_round_trips_at_its_offsets() {
        let h = Header {
            src_cid: 3,
            dst_cid: HOST_CID,
            src_port: 0x0102_0304,
            dst_port: 1025,
            len: 7,
            type_: TYPE_STREAM,
            op: op::RW,
            flags: SHUTDOWN_SEND,
            buf_alloc: 1 << 20,
            fwd_cnt: u32::MAX,
        };
        let b = h.encode();
        assert_eq!(&b[16..20], &[4, 3, 2, 1]);
        assert_eq!(&b[30..32], &op::RW.to_le_bytes());
        assert_eq!(Header::decode(&b), Some(h));
        assert_eq!(Header::decode(&b[..HDR_LEN - 1]), None);
        let r = h.rst_reply(HOST_CID);
        assert_eq!(
            (r.src_cid, r.dst_cid, r.src_port, r.dst_port),
            (HOST_CID, 3, 1025, 0x0102_0304)
        );
        assert_eq!((r.op, r.type_, r.len, r.flags), (op::RST, TYPE_STREAM, 0, 0));
    }
}
