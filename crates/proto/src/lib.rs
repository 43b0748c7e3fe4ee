//! The HiveFS wire protocol.
//!
//! Every message is a frame: a fixed 24-byte header ([`FrameHeader`]), a body
//! (a versioned, postcard-encoded [`Request`], [`Response`] or handshake
//! message) and an optional raw data payload (file bytes) that is never
//! re-encoded. This crate owns the byte formats and their limits; it must not
//! do I/O. Decoders never panic and never allocate more than the limits below,
//! whatever the input: they are fuzzed (`fuzz/`).
//!
//! Message variants are append-only: a variant's index is its wire type id,
//! so existing variants are never reordered or removed.

#![forbid(unsafe_code)]

pub mod frame;
pub mod msg;

pub use frame::{FrameError, FrameHeader, FrameKind, HEADER_LEN, MAX_BODY_LEN, MAX_PAYLOAD_LEN};
pub use msg::*;

/// Version of the frame layout and handshake. Peers with another version are refused.
pub const PROTOCOL_VERSION: u16 = 1;
/// Version of the message body encoding carried in every header.
pub const BODY_VERSION: u8 = 2;

/// Encodes a body with postcard.
pub fn encode_body<T: serde::Serialize>(v: &T) -> Vec<u8> {
    // Serialising plain data into a Vec cannot fail.
    postcard::to_allocvec(v).expect("postcard encoding into a Vec")
}

/// Decodes a body; trailing bytes are an error (a frame is one message).
pub fn decode_body<'a, T: serde::Deserialize<'a>>(b: &'a [u8]) -> Result<T, FrameError> {
    let (v, rest) = postcard::take_from_bytes(b).map_err(|e| FrameError::Body(e.to_string()))?;
    if !rest.is_empty() {
        return Err(FrameError::Body(format!("{} trailing bytes after message", rest.len())));
    }
    Ok(v)
}

/// Frame flag of a request: its body starts with an [`Envelope`].
pub const FLAG_ENVELOPE: u16 = 1;
/// Every flag a frame may carry; others are refused.
pub const FLAGS_KNOWN: u16 = FLAG_ENVELOPE;

/// Encodes a request and its envelope: the frame flags and body. An empty
/// envelope is left out.
pub fn encode_request(env: &Envelope, req: &Request) -> (u16, Vec<u8>) {
    if *env == Envelope::default() {
        return (0, encode_body(req));
    }
    // One buffer: the request is encoded behind the envelope, not apart and copied.
    let body = postcard::to_extend(req, encode_body(env)).expect("postcard encoding into a Vec");
    (FLAG_ENVELOPE, body)
}

/// Decodes a request body with the frame's flags: its envelope (empty when
/// the flag is not set) and the request.
pub fn decode_request(flags: u16, body: &[u8]) -> Result<(Envelope, Request), FrameError> {
    if flags & FLAG_ENVELOPE == 0 {
        return Ok((Envelope::default(), decode_body(body)?));
    }
    let (env, rest) = postcard::take_from_bytes(body).map_err(|e| FrameError::Body(format!("envelope: {e}")))?;
    Ok((env, decode_body(rest)?))
}

/// The wire type id of a frame body: the message's leading varint (the enum
/// variant index), after the envelope when `flags` say there is one.
pub fn frame_type_id(flags: u16, body: &[u8]) -> u16 {
    if flags & FLAG_ENVELOPE != 0 {
        if let Ok((_, rest)) = postcard::take_from_bytes::<Envelope>(body) {
            return body_type_id(rest);
        }
    }
    body_type_id(body)
}

/// The wire type id of an encoded body: its leading varint (the enum variant index).
pub fn body_type_id(body: &[u8]) -> u16 {
    let mut v: u32 = 0;
    for (i, b) in body.iter().take(3).enumerate() {
        v |= u32::from(b & 0x7f) << (7 * i);
        if b & 0x80 == 0 {
            break;
        }
    }
    v.min(u32::from(u16::MAX)) as u16
}
