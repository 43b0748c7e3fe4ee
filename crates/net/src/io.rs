//! Reading and writing whole frames on a byte stream.

use hivefs_proto::{FrameError, FrameHeader, FrameKind, HEADER_LEN};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// One received frame.
pub struct Frame {
    pub header: FrameHeader,
    pub body: Vec<u8>,
    pub payload: Vec<u8>,
}

#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error("connection closed")]
    Closed,
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("{0}")]
    Frame(#[from] FrameError),
}

/// Reads one frame. Lengths are validated by the header decoder before any
/// buffer is allocated, so a peer cannot make us allocate more than the limits.
pub async fn read_frame<R: AsyncRead + Unpin>(r: &mut R) -> Result<Frame, ReadError> {
    let header = read_header(r).await?;
    read_rest(r, header).await
}

/// Reads one frame whose body and payload must also fit `max_body` and
/// `max_payload` (e.g. handshake frames, which are small and carry no
/// payload); a header announcing more is refused before anything is allocated.
pub async fn read_frame_limited<R: AsyncRead + Unpin>(
    r: &mut R,
    max_body: u32,
    max_payload: u32,
) -> Result<Frame, ReadError> {
    let header = read_header(r).await?;
    if header.body_len > max_body {
        return Err(FrameError::Body(format!(
            "{:?} frame body of {} bytes exceeds the limit of {max_body} for this frame",
            header.kind, header.body_len
        ))
        .into());
    }
    if header.payload_len > max_payload {
        return Err(FrameError::Body(format!(
            "{:?} frame payload of {} bytes exceeds the limit of {max_payload} for this frame",
            header.kind, header.payload_len
        ))
        .into());
    }
    read_rest(r, header).await
}

/// Reads and validates a frame header only (24 bytes); a peer that closes
/// before the first byte gives [`ReadError::Closed`].
pub async fn read_header<R: AsyncRead + Unpin>(r: &mut R) -> Result<FrameHeader, ReadError> {
    let mut hb = [0u8; HEADER_LEN];
    match r.read_exact(&mut hb).await {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Err(ReadError::Closed),
        Err(e) => return Err(e.into()),
    }
    Ok(FrameHeader::decode(&hb)?)
}

/// Reads the body and payload announced by `header` (already validated
/// against the protocol limits by [`FrameHeader::decode`]).
pub async fn read_rest<R: AsyncRead + Unpin>(r: &mut R, header: FrameHeader) -> Result<Frame, ReadError> {
    let mut body = vec![0u8; header.body_len as usize];
    r.read_exact(&mut body).await?;
    let mut payload = vec![0u8; header.payload_len as usize];
    r.read_exact(&mut payload).await?;
    Ok(Frame { header, body, payload })
}

/// The header of a frame with this body and a payload of `payload_len` bytes.
pub fn frame_header(
    kind: FrameKind,
    request_id: u64,
    flags: u16,
    body: &[u8],
    payload_len: usize,
) -> std::io::Result<[u8; HEADER_LEN]> {
    let header = FrameHeader {
        body_version: hivefs_proto::BODY_VERSION,
        kind,
        msg_type: hivefs_proto::frame_type_id(flags, body),
        flags,
        request_id,
        body_len: u32::try_from(body.len()).map_err(std::io::Error::other)?,
        payload_len: u32::try_from(payload_len).map_err(std::io::Error::other)?,
    };
    Ok(header.encode())
}

/// Writes one frame (not flushed).
pub async fn write_frame<W: AsyncWrite + Unpin>(
    w: &mut W,
    kind: FrameKind,
    request_id: u64,
    flags: u16,
    body: &[u8],
    payload: &[u8],
) -> std::io::Result<()> {
    w.write_all(&frame_header(kind, request_id, flags, body, payload.len())?).await?;
    w.write_all(body).await?;
    if !payload.is_empty() {
        w.write_all(payload).await?;
    }
    Ok(())
}
