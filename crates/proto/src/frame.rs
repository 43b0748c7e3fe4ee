//! The frame header: `magic u16 | body_version u8 | kind u8 | msg_type u16 |
//! flags u16 | request_id u64 | body_len u32 | payload_len u32`, little-endian,
//! 24 bytes. One flag is defined ([`crate::FLAG_ENVELOPE`]); a header with
//! any other is refused.

pub const HEADER_LEN: usize = 24;
pub const MAGIC: u16 = 0x4846; // "HF"
/// Largest body accepted: bounds what a peer can make us allocate.
pub const MAX_BODY_LEN: u32 = 1 << 20;
/// Largest raw data payload accepted (client I/O is cut into pieces at most this big).
pub const MAX_PAYLOAD_LEN: u32 = 8 << 20;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum FrameKind {
    Request = 1,
    Response = 2,
    Hello = 3,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FrameHeader {
    pub body_version: u8,
    pub kind: FrameKind,
    pub msg_type: u16,
    pub flags: u16,
    pub request_id: u64,
    pub body_len: u32,
    pub payload_len: u32,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    #[error("bad frame magic {0:#06x} (not a HiveFS peer?)")]
    BadMagic(u16),
    #[error("unsupported body version {0}")]
    BadVersion(u8),
    #[error("unknown frame kind {0}")]
    BadKind(u8),
    #[error("frame body of {0} bytes exceeds the limit of {MAX_BODY_LEN}")]
    BodyTooLarge(u32),
    #[error("frame payload of {0} bytes exceeds the limit of {MAX_PAYLOAD_LEN}")]
    PayloadTooLarge(u32),
    #[error("unknown frame flags {0:#06x}")]
    BadFlags(u16),
    #[error("malformed message body: {0}")]
    Body(String),
}

impl FrameHeader {
    pub fn encode(&self) -> [u8; HEADER_LEN] {
        let mut b = [0u8; HEADER_LEN];
        b[0..2].copy_from_slice(&MAGIC.to_le_bytes());
        b[2] = self.body_version;
        b[3] = self.kind as u8;
        b[4..6].copy_from_slice(&self.msg_type.to_le_bytes());
        b[6..8].copy_from_slice(&self.flags.to_le_bytes());
        b[8..16].copy_from_slice(&self.request_id.to_le_bytes());
        b[16..20].copy_from_slice(&self.body_len.to_le_bytes());
        b[20..24].copy_from_slice(&self.payload_len.to_le_bytes());
        b
    }

    /// Decodes and validates a header; lengths are checked against the limits
    /// before anything is allocated for the body or payload.
    pub fn decode(b: &[u8; HEADER_LEN]) -> Result<FrameHeader, FrameError> {
        let magic = u16::from_le_bytes([b[0], b[1]]);
        if magic != MAGIC {
            return Err(FrameError::BadMagic(magic));
        }
        let body_version = b[2];
        if body_version != crate::BODY_VERSION {
            return Err(FrameError::BadVersion(body_version));
        }
        let kind = match b[3] {
            1 => FrameKind::Request,
            2 => FrameKind::Response,
            3 => FrameKind::Hello,
            k => return Err(FrameError::BadKind(k)),
        };
        let u32_at = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        let body_len = u32_at(16);
        let payload_len = u32_at(20);
        if body_len > MAX_BODY_LEN {
            return Err(FrameError::BodyTooLarge(body_len));
        }
        if payload_len > MAX_PAYLOAD_LEN {
            return Err(FrameError::PayloadTooLarge(payload_len));
        }
        let flags = u16::from_le_bytes([b[6], b[7]]);
        if flags & !crate::FLAGS_KNOWN != 0 {
            return Err(FrameError::BadFlags(flags));
        }
        Ok(FrameHeader {
            body_version,
            kind,
            msg_type: u16::from_le_bytes([b[4], b[5]]),
            flags,
            request_id: u64::from_le_bytes(b[8..16].try_into().expect("8 bytes")),
            body_len,
            payload_len,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn header_round_trips() {
        let h = FrameHeader {
            body_version: crate::BODY_VERSION,
            kind: FrameKind::Request,
            msg_type: 7,
            flags: crate::FLAG_ENVELOPE,
            request_id: 0xdead_beef,
            body_len: 100,
            payload_len: 4096,
        };
        assert_eq!(FrameHeader::decode(&h.encode()), Ok(h));
        let unknown = FrameHeader { flags: 2, ..h };
        assert_eq!(FrameHeader::decode(&unknown.encode()), Err(FrameError::BadFlags(2)));
    }

    #[test]
    fn oversized_lengths_are_refused_before_allocation() {
        let mut h = FrameHeader {
            body_version: crate::BODY_VERSION,
            kind: FrameKind::Request,
            msg_type: 0,
            flags: 0,
            request_id: 1,
            body_len: MAX_BODY_LEN + 1,
            payload_len: 0,
        };
        assert_eq!(FrameHeader::decode(&h.encode()), Err(FrameError::BodyTooLarge(MAX_BODY_LEN + 1)));
        h.body_len = 0;
        h.payload_len = u32::MAX;
        assert_eq!(FrameHeader::decode(&h.encode()), Err(FrameError::PayloadTooLarge(u32::MAX)));
    }

    proptest! {
        #[test]
        fn arbitrary_headers_never_panic(b in proptest::array::uniform24(any::<u8>())) {
            let _ = FrameHeader::decode(&b);
        }

        #[test]
        fn arbitrary_bodies_never_panic(b in proptest::collection::vec(any::<u8>(), 0..256)) {
            let _ = crate::decode_body::<crate::Request>(&b);
            let _ = crate::decode_body::<crate::Response>(&b);
            let _ = crate::decode_body::<crate::Hello>(&b);
        }
    }
}
