//! virtio-vsock wire format (virtio 1.2 §5.10.6): the 44-byte packet header and the
//! constants of the stream protocol.

/// `VMADDR_CID_HOST`: the CID the guest uses to reach us.
pub const HOST_CID: u64 = 2;

pub const HEADER_LEN: usize = 44;
/// Largest payload of one packet we accept from or send to the guest (Linux's
/// VIRTIO_VSOCK_MAX_PKT_BUF_SIZE).
pub const MAX_PKT_DATA: usize = 64 * 1024;

pub const TYPE_STREAM: u16 = 1;

pub const OP_REQUEST: u16 = 1;
pub const OP_RESPONSE: u16 = 2;
pub const OP_RST: u16 = 3;
pub const OP_SHUTDOWN: u16 = 4;
pub const OP_RW: u16 = 5;
pub const OP_CREDIT_UPDATE: u16 = 6;
pub const OP_CREDIT_REQUEST: u16 = 7;

/// SHUTDOWN flags: the sender will receive no more / send no more.
pub const SHUTDOWN_RCV: u32 = 1;
pub const SHUTDOWN_SEND: u32 = 2;
pub const SHUTDOWN_BOTH: u32 = SHUTDOWN_RCV | SHUTDOWN_SEND;

/// Event queue: `struct virtio_vsock_event { le32 id; }`.
pub const EVENT_TRANSPORT_RESET: u32 = 0;
pub const EVENT_LEN: usize = 4;

/// A packet header (`struct virtio_vsock_hdr`), decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Header {
    pub src_cid: u64,
    pub dst_cid: u64,
    pub src_port: u32,
    pub dst_port: u32,
    pub len: u32,
    pub type_: u16,
    pub op: u16,
    pub flags: u32,
    pub buf_alloc: u32,
    pub fwd_cnt: u32,
}

impl Header {
    pub fn decode(b: &[u8; HEADER_LEN]) -> Header {
        let u16_at = |o: usize| u16::from_le_bytes([b[o], b[o + 1]]);
        let u32_at = |o: usize| u32::from_le_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]]);
        let u64_at = |o: usize| {
            let mut a = [0u8; 8];
            a.copy_from_slice(&b[o..o + 8]);
            u64::from_le_bytes(a)
        };
        Header {
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
        }
    }

    pub fn encode(&self) -> [u8; HEADER_LEN] {
        let mut b = [0u8; HEADER_LEN];
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

    /// A header from the host side of (`local_port`) to the guest's `peer_port`.
    pub fn to_guest(guest_cid: u64, local_port: u32, peer_port: u32, op: u16) -> Header {
        Header {
            src_cid: HOST_CID,
            dst_cid: guest_cid,
            src_port: local_port,
            dst_port: peer_port,
            type_: TYPE_STREAM,
            op,
            ..Header::default()
        }
    }

    /// The RST answering this (guest-sent) header.
    pub fn rst_reply(&self) -> Header {
        Header {
            src_cid: self.dst_cid,
            dst_cid: self.src_cid,
            src_port: self.dst_port,
            dst_port: self.src_port,
            type_: TYPE_STREAM,
            op: OP_RST,
            ..Header::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_round_trips_little_endian() {
        let h = Header {
            src_cid: 3,
            dst_cid: 2,
            src_port: 0x1234_5678,
            dst_port: 52,
            len: 7,
            type_: TYPE_STREAM,
            op: OP_RW,
            flags: 3,
            buf_alloc: 0x0004_0000,
            fwd_cnt: 99,
        };
        let b = h.encode();
        assert_eq!(&b[16..20], &[0x78, 0x56, 0x34, 0x12]);
        assert_eq!(Header::decode(&b), h);
    }
}
