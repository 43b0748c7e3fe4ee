//! Striped data path: a byte range is cut along the pattern's chunks into
//! pieces, and the pieces go to their targets concurrently.

use crate::local::Local;
use crate::{Client, Ent};
use bytes::Bytes;
use hivefs_chunk::io::{chunk_io_code, read_at_cached_into, read_at_full_into};
use hivefs_cluster::{concurrently, unit_err as target_err, Pending};
use hivefs_proto::{Reply, Request, FALLOC_KEEP_SIZE, FALLOC_PUNCH_HOLE};
use hivefs_types::attr::Timespec;
use hivefs_types::error::{ErrorCode, FsError, FsResult};
use hivefs_types::ids::{EntryId, TargetId};
use hivefs_types::pattern::{Pattern, Piece, StripeUnit};
use std::os::unix::fs::FileExt;
use tokio::task::JoinSet;

/// Waits for a set's blocking tasks (local chunk file I/O), failing at the first error.
async fn join_all(mut set: JoinSet<FsResult<()>>) -> FsResult<()> {
    while let Some(r) = set.join_next().await {
        r.map_err(|e| FsError::new(ErrorCode::Internal, e.to_string()))??;
    }
    Ok(())
}

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

/// Short-circuit pieces of at most this many bytes are read or written on
/// the calling task (a `pread` of cached pages, a `pwrite` into the page
/// cache); larger ones on a blocking thread.
const LOCAL_INLINE_MAX: usize = 64 << 10;

/// Copy pieces a server-side copy keeps in flight.
pub const COPY_IN_FLIGHT: usize = 16;

async fn join_one(set: &mut JoinSet<FsResult<()>>) -> FsResult<()> {
    match set.join_next().await {
        Some(r) => r.map_err(|e| FsError::new(ErrorCode::Internal, e.to_string()))?,
        None => Ok(()),
    }
}

fn local_err(t: TargetId, entry: EntryId, e: std::io::Error) -> FsError {
    FsError::new(chunk_io_code(&e), format!("storage target {t}, file {entry} (chunk file on this host): {e}"))
}

impl Client {
    /// A future that sends chunk request `req` to stripe unit `unit` (a
    /// target, or a buddy group's primary, retried across a failover:
    /// `Cluster::call_unit`), to run [`concurrently`] with others.
    fn unit_task(
        &self,
        unit: StripeUnit,
        req: Request,
        payload: Bytes,
    ) -> impl std::future::Future<Output = FsResult<(Reply, Vec<u8>)>> + Send + 'static {
        let (cluster, budget) = (self.cluster.clone(), self.mirror_retry);
        async move { cluster.call_unit(unit, req, payload, budget).await }
    }

    /// The chunk file held here for stripe `idx` (short-circuit), or
    /// `Network`. A mirrored file's only to read (`create` false), from its
    /// group's primary: writes must pass the primary, which forwards them
    /// to the secondary.
    async fn local_file(&self, pattern: &Pattern, idx: usize, entry: EntryId, create: bool) -> Local {
        match pattern.unit(idx) {
            StripeUnit::Target(t) => self.local.file(&self.cluster, t, entry, create).await,
            StripeUnit::Group(g) if !create => self.local.group_file(&self.cluster, g, entry).await,
            StripeUnit::Group(_) => Local::Network,
        }
    }

    /// Writes `data` at `offset`; all pieces go out at once. Returns once every
    /// target acknowledged its piece.
    pub async fn write(&self, pattern: &Pattern, entry: EntryId, offset: u64, data: &[u8]) -> FsResult<usize> {
        self.write_bytes(pattern, entry, offset, Bytes::copy_from_slice(data)).await
    }

    /// [`Client::write`] of a buffer the caller gives away: the pieces sent to
    /// the targets are slices of it, not copies.
    pub async fn write_bytes(&self, pattern: &Pattern, entry: EntryId, offset: u64, data: Bytes) -> FsResult<usize> {
        let r = self.write_pieces(pattern, entry, offset, data).await;
        if let Ok(n) = &r {
            hivefs_metrics::client_io("write", *n as u64);
        }
        r
    }

    async fn write_pieces(&self, pattern: &Pattern, entry: EntryId, offset: u64, data: Bytes) -> FsResult<usize> {
        if pattern.targets().is_empty() {
            return Err(FsError::new(ErrorCode::Invalid, format!("file {entry} has an empty stripe pattern")));
        }
        self.note_written(entry, pattern.stripes_in(offset, data.len() as u64));
        let mut set = JoinSet::new();
        let mut sends: Vec<Pending<()>> = Vec::new();
        for p in split_large(pattern.pieces(offset, data.len())) {
            let target = pattern.targets()[p.stripe_index];
            let unit = pattern.unit(p.stripe_index);
            let payload = data.slice(p.buf_offset..p.buf_offset + p.len);
            if let Local::File(f) = self.local_file(pattern, p.stripe_index, entry, true).await {
                let write = move || {
                    f.write_all_at(&payload, p.local_offset).map_err(|e| local_err(target, entry, e))?;
                    hivefs_metrics::target_io(target.0, "write", p.len as u64);
                    Ok(())
                };
                if p.len <= LOCAL_INLINE_MAX {
                    write()?;
                } else {
                    set.spawn_blocking(write);
                }
                continue;
            }
            let call = self.unit_task(unit, Request::WriteChunk { target, entry, offset: p.local_offset }, payload);
            sends.push(Box::pin(async move {
                match call.await {
                    Ok((Reply::Written(n), _)) if n as usize == p.len => Ok(()),
                    Ok((r, _)) => Err(FsError::new(ErrorCode::Io, format!("short or odd write reply {r:?}"))),
                    Err(e) => Err(e),
                }
                .map_err(|e| target_err(unit, entry, e))
            }));
        }
        let (sent, written) = tokio::join!(concurrently(sends), join_all(set));
        sent?;
        written?;
        Ok(data.len())
    }

    /// Writes `data` at `offset` on the calling thread, without the async
    /// runtime: only when the chunk file of every piece is held here
    /// (short-circuit) and the write is small; `None` otherwise, having
    /// written nothing (the caller takes [`Client::write_bytes`]).
    pub fn write_now(&self, pattern: &Pattern, entry: EntryId, offset: u64, data: &[u8]) -> Option<FsResult<usize>> {
        if pattern.targets().is_empty() || data.len() > LOCAL_INLINE_MAX || pattern.is_mirrored() {
            return None;
        }
        let pieces = pattern.pieces(offset, data.len());
        let mut files = Vec::with_capacity(pieces.len());
        let units = pieces.iter().map(|p| pattern.unit(p.stripe_index));
        if !self.local.held_files(&self.cluster, entry, units, &mut files) {
            return None;
        }
        self.note_written(entry, pattern.stripes_in(offset, data.len() as u64));
        for (p, f) in pieces.iter().zip(files) {
            let target = pattern.targets()[p.stripe_index];
            if let Err(e) = f.write_all_at(&data[p.buf_offset..p.buf_offset + p.len], p.local_offset) {
                return Some(Err(local_err(target, entry, e)));
            }
            hivefs_metrics::target_io(target.0, "write", p.len as u64);
        }
        hivefs_metrics::client_io("write", data.len() as u64);
        Some(Ok(data.len()))
    }

    /// Reads `len` bytes at `offset` on the calling thread, without the
    /// async runtime: only when the chunk file of every piece is held here
    /// (a mirrored file's: its primaries', still within their lease) and
    /// the page cache holds the whole range; `None` otherwise (also where
    /// the range is not all there: a hole or the end of the file), and the
    /// caller takes [`Client::read`].
    pub fn read_now(&self, pattern: &Pattern, entry: EntryId, offset: u64, len: usize) -> Option<Vec<u8>> {
        if pattern.targets().is_empty() || len == 0 {
            return None;
        }
        let pieces = pattern.pieces(offset, len);
        let mut files = Vec::with_capacity(pieces.len());
        let units = pieces.iter().map(|p| pattern.unit(p.stripe_index));
        if !self.local.held_files(&self.cluster, entry, units, &mut files) {
            return None;
        }
        let mut buf = vec![0u8; len];
        for (p, f) in pieces.iter().zip(&files) {
            let dst = &mut buf[p.buf_offset..p.buf_offset + p.len];
            if !read_at_cached_into(f, p.local_offset, dst).ok()? {
                return None;
            }
        }
        for p in &pieces {
            hivefs_metrics::target_io(pattern.targets()[p.stripe_index].0, "read", p.len as u64);
        }
        hivefs_metrics::client_io("read", len as u64);
        Some(buf)
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
        let r = self.read_pieces(pattern, entry, offset, len, size_hint).await;
        if let Ok(b) = &r {
            hivefs_metrics::client_io("read", b.len() as u64);
        }
        r
    }

    async fn read_pieces(
        &self,
        pattern: &Pattern,
        entry: EntryId,
        offset: u64,
        len: usize,
        size_hint: u64,
    ) -> FsResult<Vec<u8>> {
        if pattern.targets().is_empty() || len == 0 {
            return Ok(Vec::new());
        }
        let mut reads: Vec<Pending<(Piece, Vec<u8>)>> = Vec::new();
        let mut buf = vec![0u8; len];
        let mut short = false;
        // Pieces of chunk files held here that the page cache does not hold
        // (or large ones): read by one blocking task straight into `buf`.
        let mut from_disk = Vec::new();
        for p in split_large(pattern.pieces(offset, len)) {
            let target = pattern.targets()[p.stripe_index];
            let unit = pattern.unit(p.stripe_index);
            match self.local_file(pattern, p.stripe_index, entry, false).await {
                Local::File(f) => {
                    let dst = &mut buf[p.buf_offset..p.buf_offset + p.len];
                    if p.len > LOCAL_INLINE_MAX
                        || !read_at_cached_into(&f, p.local_offset, dst).map_err(|e| local_err(target, entry, e))?
                    {
                        from_disk.push((p, target, f));
                    } else {
                        hivefs_metrics::target_io(target.0, "read", p.len as u64);
                    }
                    continue;
                }
                Local::NoChunk => {
                    short = true;
                    continue;
                }
                Local::Network => {}
            }
            let req = Request::ReadChunk { target, entry, offset: p.local_offset, len: p.len as u32 };
            let call = self.unit_task(unit, req, Bytes::new());
            reads.push(Box::pin(async move {
                match call.await {
                    Ok((Reply::Data, bytes)) if bytes.len() <= p.len => Ok((p, bytes)),
                    Ok((r, _)) => Err(FsError::new(ErrorCode::Io, format!("odd read reply {r:?}"))),
                    Err(e) => Err(e),
                }
                .map_err(|e| target_err(unit, entry, e))
            }));
        }
        let disk = async move {
            if from_disk.is_empty() {
                return Ok((buf, false));
            }
            let read = move || {
                let mut short = false;
                for (p, target, f) in from_disk {
                    let n = read_at_full_into(&f, p.local_offset, &mut buf[p.buf_offset..p.buf_offset + p.len])
                        .map_err(|e| local_err(target, entry, e))?;
                    hivefs_metrics::target_io(target.0, "read", n as u64);
                    short |= n < p.len;
                }
                Ok((buf, short))
            };
            tokio::task::spawn_blocking(read).await.map_err(|e| FsError::new(ErrorCode::Internal, e.to_string()))?
        };
        let (got, disk) = tokio::join!(concurrently(reads), disk);
        let (b, s) = disk?;
        buf = b;
        short |= s;
        for (p, bytes) in got? {
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
    /// Chunk files held here are asked directly; the others with one
    /// `StatChunks` per storage node (each stripe unit alone for a
    /// mirrored file, whose groups answer through their primaries).
    pub async fn size_from_targets(&self, pattern: &Pattern, entry: EntryId) -> FsResult<u64> {
        let mut lens = vec![0u64; pattern.targets().len()];
        let mut remote: Vec<(usize, StripeUnit)> = Vec::new();
        for (i, &target) in pattern.targets().iter().enumerate() {
            match self.local_file(pattern, i, entry, false).await {
                Local::File(f) => lens[i] = f.metadata().map_err(|e| local_err(target, entry, e))?.len(),
                Local::NoChunk => {}
                Local::Network => remote.push((i, pattern.unit(i))),
            }
        }
        if !remote.is_empty() {
            let units: Vec<StripeUnit> = remote.iter().map(|&(_, u)| u).collect();
            let got = self.cluster.chunk_lens(&units, entry, self.mirror_retry).await?;
            remote.iter().zip(got).for_each(|(&(i, _), l)| lens[i] = l);
        }
        Ok(pattern.size_from_chunk_lens(&lens))
    }

    /// Tells the metadata node file `e`'s size after this client's writes:
    /// `own_end`, where they ended (the size the file had when opened
    /// counts), in one request while `seen` is the ctime this client last
    /// saw and the file has not changed since (`Client::update_size_if`);
    /// otherwise the size computed from the chunk files. Returns the size
    /// reported and what `seen` is from now on: the new ctime after the
    /// first kind of report, `None` after the second (this client's writes
    /// may no longer be all that the size reflects).
    pub async fn report_size(
        &self,
        e: Ent,
        pattern: &Pattern,
        own_end: u64,
        seen: Option<Timespec>,
        mtime: Timespec,
    ) -> FsResult<(u64, Option<Timespec>)> {
        if let Some(ctime) = seen {
            if let Some(a) = self.update_size_if(e, own_end, Some(mtime), ctime).await? {
                return Ok((own_end, Some(a.ctime)));
            }
        }
        let size = self.size_from_targets(pattern, e.id).await?;
        self.update_size(e, size, Some(mtime)).await?;
        Ok((size, None))
    }

    /// Sends `req(stripe index, target)` to every target of the stripe that
    /// `req` gives a request for, concurrently; the answers in stripe order.
    async fn on_targets(
        &self,
        pattern: &Pattern,
        entry: EntryId,
        req: impl Fn(usize, TargetId) -> Option<Request>,
    ) -> FsResult<Vec<(usize, Reply)>> {
        let mut calls: Vec<Pending<(usize, Reply)>> = Vec::new();
        for (i, &target) in pattern.targets().iter().enumerate() {
            let Some(r) = req(i, target) else { continue };
            let unit = pattern.unit(i);
            let call = self.unit_task(unit, r, Bytes::new());
            calls
                .push(Box::pin(async move { call.await.map(|(a, _)| (i, a)).map_err(|e| target_err(unit, entry, e)) }));
        }
        let mut out = concurrently(calls).await?;
        out.sort_by_key(|(i, _)| *i);
        Ok(out)
    }

    /// fallocate(2) of the file's `[offset, offset+len)`: each target's part
    /// of the range (one local range per target). Allocations run with
    /// KEEP_SIZE on every target first, so a target out of space fails the
    /// call with no size changed anywhere; only then does the target holding
    /// the range's last byte grow its chunk file (the file's size follows
    /// from the chunk files).
    pub async fn fallocate(&self, pattern: &Pattern, entry: EntryId, mode: u32, offset: u64, len: u64) -> FsResult<()> {
        if pattern.targets().is_empty() {
            return Err(FsError::new(ErrorCode::Invalid, format!("file {entry} has an empty stripe pattern")));
        }
        let end = offset.checked_add(len).filter(|_| len > 0).ok_or_else(|| {
            FsError::new(ErrorCode::Invalid, format!("file {entry}: fallocate of {len} bytes at {offset}"))
        })?;
        self.note_written(entry, pattern.stripes_in(offset, len));
        let keep = mode & FALLOC_KEEP_SIZE != 0;
        let grows = !keep && mode & FALLOC_PUNCH_HOLE == 0;
        let first = if grows { mode | FALLOC_KEEP_SIZE } else { mode };
        self.on_targets(pattern, entry, |i, target| {
            let (lo, hi) = pattern.local_range(i, offset, end)?;
            Some(Request::FallocateChunk { target, entry, mode: first, offset: lo, len: hi - lo })
        })
        .await?;
        if grows {
            let (last, _) = pattern.locate(end - 1);
            self.on_targets(pattern, entry, |i, target| {
                let (lo, hi) = pattern.local_range(i, offset, end).filter(|_| i == last)?;
                Some(Request::FallocateChunk { target, entry, mode: 0, offset: lo, len: hi - lo })
            })
            .await?;
        }
        Ok(())
    }

    /// lseek(2) SEEK_DATA (`hole: false`) or SEEK_HOLE (`hole: true`) from
    /// `offset` of a file of `size` bytes: `None` for ENXIO. Each target is
    /// asked once, from the first byte at or after `offset` it stores: the
    /// next data is the earliest any target has; the next hole is where
    /// the first target's run of data ends (the end of a chunk file, or a
    /// missing one, is a hole up to the file's size), or the end of the file.
    pub async fn seek(
        &self,
        pattern: &Pattern,
        entry: EntryId,
        offset: u64,
        size: u64,
        hole: bool,
    ) -> FsResult<Option<u64>> {
        if offset >= size || pattern.targets().is_empty() {
            return Ok(None);
        }
        let from = |i: usize| pattern.local_at_or_after(i, offset);
        let answers = self
            .on_targets(pattern, entry, |i, target| Some(Request::SeekChunk { target, entry, offset: from(i), hole }))
            .await?;
        let mut best: Option<u64> = None;
        for (i, a) in answers {
            let found = match a {
                Reply::Seek(found) => found,
                r => return Err(FsError::new(ErrorCode::Protocol, format!("odd seek reply {r:?}"))),
            };
            let local = match (found, hole) {
                (Some(l), _) => l,
                // Past the end of this chunk file: a hole right there.
                (None, true) => from(i),
                (None, false) => continue,
            };
            let at = pattern.file_offset(i, local);
            best = Some(best.map_or(at, |b| b.min(at)));
        }
        Ok(match (best, hole) {
            (Some(at), _) if at < size => Some(at),
            (_, true) => Some(size),
            _ => None,
        })
    }

    /// Server-side copy of `len` bytes from `src_off` of file `src` to
    /// `dst_off` of file `dst` (copy_file_range): cut where either file's
    /// chunks end, each piece is one `CopyChunk` to the destination piece's
    /// target, at most [`COPY_IN_FLIGHT`] at a time. The caller limits `len`
    /// to the source's size.
    pub async fn copy_range(
        &self,
        (src_pat, src): (&Pattern, EntryId),
        src_off: u64,
        (dst_pat, dst): (&Pattern, EntryId),
        dst_off: u64,
        len: u64,
    ) -> FsResult<u64> {
        if src_pat.targets().is_empty() || dst_pat.targets().is_empty() {
            return Err(FsError::new(ErrorCode::Invalid, format!("file {src} or {dst} has an empty stripe pattern")));
        }
        self.note_written(dst, dst_pat.stripes_in(dst_off, len));
        if src_pat.is_mirrored() || dst_pat.is_mirrored() {
            return self.copy_through(src_pat, src, src_off, dst_pat, dst, dst_off, len).await;
        }
        let (src_cs, dst_cs) = (u64::from(src_pat.chunk_size()), u64::from(dst_pat.chunk_size()));
        let mut set = JoinSet::new();
        let mut done = 0u64;
        while done < len {
            let (i, o) = (src_off + done, dst_off + done);
            let take = (len - done).min(src_cs - i % src_cs).min(dst_cs - o % dst_cs).min(MAX_PIECE as u64);
            let (si, sl) = src_pat.locate(i);
            let (di, dl) = dst_pat.locate(o);
            let (src_target, target) = (src_pat.targets()[si], dst_pat.targets()[di]);
            let req = Request::CopyChunk(hivefs_proto::ChunkCopy {
                target,
                entry: dst,
                offset: dl,
                src_target,
                src_entry: src,
                src_offset: sl,
                len: take as u32,
            });
            if set.len() >= COPY_IN_FLIGHT {
                join_one(&mut set).await?;
            }
            // Routed like every chunk request: a node that moved to another
            // address is followed there.
            let unit = StripeUnit::Target(target);
            let call = self.unit_task(unit, req, Bytes::new());
            set.spawn(async move {
                match call.await {
                    Ok((Reply::Written(n), _)) if u64::from(n) == take => Ok(()),
                    Ok((r, _)) => Err(FsError::new(ErrorCode::Io, format!("short or odd copy reply {r:?}"))),
                    Err(e) => Err(e),
                }
                .map_err(|e| target_err(unit, dst, e))
            });
            done += take;
        }
        while !set.is_empty() {
            join_one(&mut set).await?;
        }
        Ok(len)
    }

    /// A copy where either file is mirrored: read here and written back,
    /// so each write passes its group's primary (a storage node's
    /// `CopyChunk` would write around the forward to the secondary).
    #[allow(clippy::too_many_arguments)]
    async fn copy_through(
        &self,
        src_pat: &Pattern,
        src: EntryId,
        src_off: u64,
        dst_pat: &Pattern,
        dst: EntryId,
        dst_off: u64,
        len: u64,
    ) -> FsResult<u64> {
        let mut done = 0u64;
        while done < len {
            let take = (len - done).min(MAX_PIECE as u64) as usize;
            let mut data = self.read(src_pat, src, src_off + done, take, 0).await?;
            // Past the source's end: zeroes (the caller limits `len` to its size).
            data.resize(take, 0);
            self.write_bytes(dst_pat, dst, dst_off + done, Bytes::from(data)).await?;
            done += take as u64;
        }
        Ok(len)
    }

    /// Flushes the file's chunk files to disk on every target.
    pub async fn fsync(&self, pattern: &Pattern, entry: EntryId) -> FsResult<()> {
        let mut syncs: Vec<Pending<()>> = Vec::new();
        for (i, &target) in pattern.targets().iter().enumerate() {
            let unit = pattern.unit(i);
            let call = self.unit_task(unit, Request::FsyncChunk { target, entry }, Bytes::new());
            syncs.push(Box::pin(async move { call.await.map(|_| ()).map_err(|e| target_err(unit, entry, e)) }));
        }
        concurrently(syncs).await.map(|_| ())
    }
}
