//! Striped data path: a byte range is cut along the pattern's chunks into
//! pieces, and the pieces go to their targets concurrently.

use crate::Client;
use bytes::Bytes;
use hivefs_proto::{Reply, Request};
use hivefs_types::error::{ErrorCode, FsError, FsResult};
use hivefs_types::ids::{EntryId, TargetId};
use hivefs_types::pattern::{Pattern, Piece};
use tokio::task::JoinSet;

/// Largest piece sent in one request (a piece never spans two chunks either).
pub const MAX_PIECE: usize = 4 << 20;

fn split_large(pieces: Vec<Piece>) -> Vec<Piece> {
    let mut out = Vec::with_capacity(pieces.len());
    for p in pieces {
        let mut done = 0;
        while done < p.len {
            let len = (p.len - done).min(MAX_PIECE);
            out.push(Piece {
                stripe_index: p.stripe_index,
                local_offset: p.local_offset + done as u64,
                buf_offset: p.buf_offset + done,
                len,
            });
            done += len;
        }
    }
    out
}

fn target_err(t: TargetId, entry: EntryId, e: FsError) -> FsError {
    if e.message.contains("target") {
        e
    } else {
        FsError::new(e.code, format!("storage target {t}, file {entry}: {}", e.message))
    }
}

impl Client {
    /// Writes `data` at `offset`; all pieces go out at once. Returns once every
    /// target acknowledged its piece.
    pub async fn write(&self, pattern: &Pattern, entry: EntryId, offset: u64, data: &[u8]) -> FsResult<usize> {
        self.write_bytes(pattern, entry, offset, Bytes::copy_from_slice(data)).await
    }

    /// [`Client::write`] of a buffer the caller gives away: the pieces sent to
    /// the targets are slices of it, not copies.
    pub async fn write_bytes(&self, pattern: &Pattern, entry: EntryId, offset: u64, data: Bytes) -> FsResult<usize> {
        if pattern.targets.is_empty() {
            return Err(FsError::new(ErrorCode::Invalid, format!("file {entry} has an empty stripe pattern")));
        }
        let mut set = JoinSet::new();
        for p in split_large(pattern.pieces(offset, data.len())) {
            let target = pattern.targets[p.stripe_index];
            let pool = self.cluster.target_pool(target).await?;
            let payload = data.slice(p.buf_offset..p.buf_offset + p.len);
            set.spawn(async move {
                let req = Request::WriteChunk { target, entry, offset: p.local_offset };
                match pool.call(&req, payload).await {
                    Ok((Reply::Written(n), _)) if n as usize == p.len => Ok(()),
                    Ok((r, _)) => Err(FsError::new(ErrorCode::Io, format!("short or odd write reply {r:?}"))),
                    Err(e) => Err(e),
                }
                .map_err(|e| target_err(target, entry, e))
            });
        }
        while let Some(r) = set.join_next().await {
            r.map_err(|e| FsError::new(ErrorCode::Internal, e.to_string()))??;
        }
        Ok(data.len())
    }

    /// Reads up to `len` bytes at `offset`. Holes read as zeros; the result is
    /// short only at the end of the file. `size_hint` is the size the caller
    /// knows (it may be stale); the targets are asked when a piece comes back short.
    pub async fn read(
        &self,
        pattern: &Pattern,
        entry: EntryId,
        offset: u64,
        len: usize,
        size_hint: u64,
    ) -> FsResult<Vec<u8>> {
        if pattern.targets.is_empty() || len == 0 {
            return Ok(Vec::new());
        }
        let mut set = JoinSet::new();
        for p in split_large(pattern.pieces(offset, len)) {
            let target = pattern.targets[p.stripe_index];
            let pool = self.cluster.target_pool(target).await?;
            set.spawn(async move {
                let req = Request::ReadChunk { target, entry, offset: p.local_offset, len: p.len as u32 };
                match pool.call(&req, Vec::new()).await {
                    Ok((Reply::Data, bytes)) if bytes.len() <= p.len => Ok((p, bytes)),
                    Ok((r, _)) => Err(FsError::new(ErrorCode::Io, format!("odd read reply {r:?}"))),
                    Err(e) => Err(e),
                }
                .map_err(|e| target_err(target, entry, e))
            });
        }
        let mut buf = vec![0u8; len];
        let mut short = false;
        while let Some(r) = set.join_next().await {
            let (p, bytes) = r.map_err(|e| FsError::new(ErrorCode::Internal, e.to_string()))??;
            short |= bytes.len() < p.len;
            buf[p.buf_offset..p.buf_offset + bytes.len()].copy_from_slice(&bytes);
        }
        if short {
            // Either a hole or the end of the file: the chunk files decide.
            let size = self.size_from_targets(pattern, entry).await?.max(size_hint);
            buf.truncate(size.saturating_sub(offset).min(len as u64) as usize);
        }
        Ok(buf)
    }

    /// The file size the chunk files imply (the truth, as the brief says).
    pub async fn size_from_targets(&self, pattern: &Pattern, entry: EntryId) -> FsResult<u64> {
        let mut set = JoinSet::new();
        for (i, &target) in pattern.targets.iter().enumerate() {
            let pool = self.cluster.target_pool(target).await?;
            set.spawn(async move {
                match pool.rpc(&Request::StatChunk { target, entry }).await {
                    Ok(Reply::ChunkLen(l)) => Ok((i, l)),
                    Ok(r) => Err(FsError::new(ErrorCode::Protocol, format!("odd stat reply {r:?}"))),
                    Err(e) => Err(target_err(target, entry, e)),
                }
            });
        }
        let mut lens = vec![0u64; pattern.targets.len()];
        while let Some(r) = set.join_next().await {
            let (i, l) = r.map_err(|e| FsError::new(ErrorCode::Internal, e.to_string()))??;
            lens[i] = l;
        }
        Ok(pattern.size_from_chunk_lens(&lens))
    }

    /// Flushes the file's chunk files to disk on every target.
    pub async fn fsync(&self, pattern: &Pattern, entry: EntryId) -> FsResult<()> {
        let mut set = JoinSet::new();
        for &target in &pattern.targets {
            let pool = self.cluster.target_pool(target).await?;
            set.spawn(async move {
                pool.rpc(&Request::FsyncChunk { target, entry }).await.map_err(|e| target_err(target, entry, e))
            });
        }
        while let Some(r) = set.join_next().await {
            r.map_err(|e| FsError::new(ErrorCode::Internal, e.to_string()))??;
        }
        Ok(())
    }
}
