//! The metadata journal: every committed batch of record changes, appended
//! to a segment file in `<data dir>/journal/` before the batch is answered.
//!
//! Owns the journal's file format, appending (one `write` per batch, one
//! `fdatasync` when `sync = true`), segment rotation and deletion, and
//! replay with torn-tail detection. It must not know what the records mean:
//! a batch is an ordered list of `(table, key, value or deletion)` changes
//! (see `mem`), the same list a metadata buddy would receive.
//!
//! # Format (journal version 1, all integers little-endian)
//!
//! A segment `<number as 16 hex digits>.jnl` starts with a 16-byte header:
//! `b"HIVEJNL\0"`, the journal version (u32), 4 zero bytes. Records follow:
//!
//! | bytes | field                                                    |
//! |-------|----------------------------------------------------------|
//! | 4     | `len`: length of the body                                |
//! | 4     | CRC-32 (IEEE) of `seq` and the body                      |
//! | 8     | `seq`: the batch's sequence number, one more than the last |
//! | len   | body: changes, each `table` (u8), `op` (1 put, 0 delete), key length (u32), key, and for a put value length (u32), value |
//!
//! A record that is cut short or whose checksum does not match ends its
//! segment (a torn tail: the process died, or the machine lost power, while
//! writing it): replay truncates the segment there and goes on with the next
//! one, whose first record then carries the same `seq` again. A gap in the
//! sequence is damage, and opening fails naming the segment.

use std::fs::{File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

/// Directory of the segments inside the data dir.
pub const JOURNAL_DIR: &str = "journal";
/// Version of the segment and record format above.
pub const JOURNAL_VERSION: u32 = 1;
const MAGIC: &[u8; 8] = b"HIVEJNL\0";
const SEG_HEADER: usize = 16;
const REC_HEADER: usize = 16;
/// Largest record body accepted by replay (a batch of [`crate::writer::BATCH_MAX`]
/// mutations is far below it): a larger length is a torn or damaged header.
const BODY_MAX: usize = 1 << 30;

/// One change of a batch: table number, key, new value (`None`: deleted).
pub type RecChange<'a> = (u8, &'a [u8], Option<&'a [u8]>);

/// Appends one change to a batch body.
pub fn put_change(out: &mut Vec<u8>, table: u8, key: &[u8], val: Option<&[u8]>) {
    out.push(table);
    out.push(u8::from(val.is_some()));
    out.extend_from_slice(&(key.len() as u32).to_le_bytes());
    out.extend_from_slice(key);
    if let Some(v) = val {
        out.extend_from_slice(&(v.len() as u32).to_le_bytes());
        out.extend_from_slice(v);
    }
}

/// Decodes a batch body into its changes, in order.
pub fn changes(body: &[u8]) -> Result<Vec<RecChange<'_>>, String> {
    fn take<'a>(b: &mut &'a [u8], n: usize) -> Result<&'a [u8], String> {
        if b.len() < n {
            return Err(format!("change cut short: {} bytes left, {n} needed", b.len()));
        }
        let (h, t) = b.split_at(n);
        *b = t;
        Ok(h)
    }
    fn len(b: &mut &[u8]) -> Result<usize, String> {
        Ok(u32::from_le_bytes(take(b, 4)?.try_into().expect("4 bytes")) as usize)
    }
    let mut b = body;
    let mut out = Vec::new();
    while !b.is_empty() {
        let head = take(&mut b, 2)?;
        let (table, op) = (head[0], head[1]);
        let klen = len(&mut b)?;
        let key = take(&mut b, klen)?;
        let val = match op {
            0 => None,
            1 => {
                let vlen = len(&mut b)?;
                Some(take(&mut b, vlen)?)
            }
            n => return Err(format!("unknown change op {n}")),
        };
        out.push((table, key, val));
    }
    Ok(out)
}

fn crc(seq: u64, body: &[u8]) -> u32 {
    let mut h = crc32fast::Hasher::new();
    h.update(&seq.to_le_bytes());
    h.update(body);
    h.finalize()
}

fn seg_name(n: u64) -> String {
    format!("{n:016x}.jnl")
}

/// The segment numbers in `dir`, ascending.
fn segments(dir: &Path) -> io::Result<Vec<u64>> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir)? {
        let name = e?.file_name();
        let Some(s) = name.to_str() else { continue };
        if let Some(hex) = s.strip_suffix(".jnl") {
            if let Ok(n) = u64::from_str_radix(hex, 16) {
                out.push(n);
            }
        }
    }
    out.sort_unstable();
    Ok(out)
}

fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

/// What replay found.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Replayed {
    /// Records applied (their `seq` beyond the checkpoint).
    pub records: u64,
    /// Bytes of the segments kept (not yet in the checkpoint).
    pub bytes: u64,
    /// Torn tails cut off: (segment, offset).
    pub torn: Vec<(u64, u64)>,
}

/// The open journal: appends go to the newest segment.
pub struct Journal {
    dir: PathBuf,
    file: File,
    seg: u64,
    /// Length of the current segment.
    len: u64,
    /// Bytes in all segments since the last checkpoint's rotation.
    pending: u64,
    last_seq: u64,
    /// Checksum of the record `last_seq` when the journal has it.
    last_crc: Option<u32>,
    sync: bool,
    buf: Vec<u8>,
    /// Tests: the next append fails after this many of its bytes landed.
    #[cfg(test)]
    fail_after: Option<usize>,
}

impl Journal {
    /// Opens `dir` (created if missing), replays every record with a
    /// sequence number beyond `checkpoint_seq` through `apply` (in order),
    /// cuts torn tails off, and starts a new segment for appends.
    pub fn open(
        dir: &Path,
        sync: bool,
        (checkpoint_seq, checkpoint_crc): (u64, Option<u32>),
        mut apply: impl FnMut(u64, &[u8]) -> Result<(), String>,
    ) -> Result<(Journal, Replayed), String> {
        let err = |p: &Path, e: io::Error| format!("journal {}: {e}", p.display());
        std::fs::create_dir_all(dir).map_err(|e| err(dir, e))?;
        let mut last_seq = checkpoint_seq;
        let mut last_crc = checkpoint_crc;
        let mut rep = Replayed::default();
        let segs = segments(dir).map_err(|e| err(dir, e))?;
        for &n in &segs {
            let path = dir.join(seg_name(n));
            let mut data = Vec::new();
            File::open(&path).and_then(|mut f| f.read_to_end(&mut data)).map_err(|e| err(&path, e))?;
            if data.len() < SEG_HEADER {
                // Created, header not yet written: nothing in it.
                rep.torn.push((n, 0));
                std::fs::remove_file(&path).map_err(|e| err(&path, e))?;
                continue;
            }
            if &data[..8] != MAGIC {
                return Err(format!("journal segment {} is not a HiveFS journal (bad magic)", path.display()));
            }
            let version = u32::from_le_bytes(data[8..12].try_into().expect("4 bytes"));
            if version != JOURNAL_VERSION {
                return Err(format!(
                    "journal segment {} has journal version {version}, this build reads version {JOURNAL_VERSION}",
                    path.display()
                ));
            }
            let (recs, torn) = parse_records(&data);
            let mut kept_any = false;
            for &(seq, sum, start, end) in &recs {
                if seq == checkpoint_seq {
                    last_crc = Some(sum);
                }
                if seq > checkpoint_seq {
                    if seq != last_seq + 1 {
                        return Err(format!(
                            "journal segment {} holds batch {seq} where batch {} was expected: \
                             batches are missing (a segment was deleted or damaged)",
                            path.display(),
                            last_seq + 1
                        ));
                    }
                    let body = &data[start..end];
                    apply(seq, body).map_err(|m| format!("journal segment {}, batch {seq}: {m}", path.display()))?;
                    last_seq = seq;
                    last_crc = Some(sum);
                    rep.records += 1;
                    kept_any = true;
                }
            }
            if let Some(off) = torn {
                rep.torn.push((n, off as u64));
                let f = OpenOptions::new().write(true).open(&path).map_err(|e| err(&path, e))?;
                f.set_len(off as u64).and_then(|_| f.sync_all()).map_err(|e| err(&path, e))?;
                data.truncate(off);
            }
            if kept_any {
                rep.bytes += data.len() as u64;
            }
        }
        let seg = segs.last().map_or(1, |n| n + 1);
        let (file, len) = Self::create_segment(dir, seg)?;
        let j = Journal {
            dir: dir.to_path_buf(),
            file,
            seg,
            len,
            pending: rep.bytes + len,
            last_seq,
            last_crc,
            sync,
            buf: Vec::with_capacity(64 << 10),
            #[cfg(test)]
            fail_after: None,
        };
        Ok((j, rep))
    }

    fn create_segment(dir: &Path, n: u64) -> Result<(File, u64), String> {
        let path = dir.join(seg_name(n));
        let err = |e: io::Error| format!("journal {}: {e}", path.display());
        let mut f = OpenOptions::new().create_new(true).write(true).open(&path).map_err(err)?;
        let mut head = [0u8; SEG_HEADER];
        head[..8].copy_from_slice(MAGIC);
        head[8..12].copy_from_slice(&JOURNAL_VERSION.to_le_bytes());
        f.write_all(&head).and_then(|_| f.sync_all()).map_err(err)?;
        sync_dir(dir).map_err(err)?;
        Ok((f, SEG_HEADER as u64))
    }

    /// Sequence number of the last batch appended (or replayed).
    pub fn last_seq(&self) -> u64 {
        self.last_seq
    }

    /// Checksum of the last batch, when it is still in the journal (not
    /// only in the checkpoint): a mirror's check that two journals agree.
    pub fn last_crc(&self) -> Option<u32> {
        self.last_crc
    }

    /// Bytes appended since the last [`Journal::rotate`] before a checkpoint.
    pub fn pending_bytes(&self) -> u64 {
        self.pending
    }

    /// Whether each append is made durable (`fdatasync`) before it returns.
    pub fn syncs(&self) -> bool {
        self.sync
    }

    pub fn segment(&self) -> u64 {
        self.seg
    }

    /// Appends one batch body, written into the record by `body`, as the
    /// next record (`fdatasync` with `sync`) and returns its sequence
    /// number. On failure the segment is cut back to where it was, so no
    /// partial record stays in front of later ones; if even that fails the
    /// error says so and the journal must not be written again (the caller
    /// stops the service).
    pub fn append(&mut self, body: impl FnOnce(&mut Vec<u8>)) -> Result<u64, AppendError> {
        let seq = self.last_seq + 1;
        self.buf.clear();
        self.buf.resize(REC_HEADER, 0);
        body(&mut self.buf);
        let len = self.buf.len() - REC_HEADER;
        let sum = crc(seq, &self.buf[REC_HEADER..]);
        self.buf[..4].copy_from_slice(&(len as u32).to_le_bytes());
        self.buf[4..8].copy_from_slice(&sum.to_le_bytes());
        self.buf[8..16].copy_from_slice(&seq.to_le_bytes());
        // At the segment's length, not the file's cursor: after a failed
        // append the cursor is past the cut-back end, and a write there
        // would leave a gap that replay takes for a torn tail, dropping
        // every later (acknowledged) record with it.
        #[cfg(test)]
        if let Some(part) = self.fail_after.take() {
            let full = io::Error::new(io::ErrorKind::StorageFull, "no space left (test)");
            let e = self.file.write_all_at(&self.buf[..part], self.len).err().unwrap_or(full);
            return Err(self.cut_back(e));
        }
        let r = self.file.write_all_at(&self.buf, self.len);
        let r = r.and_then(|_| if self.sync { self.file.sync_data() } else { Ok(()) });
        if let Err(e) = r {
            return Err(self.cut_back(e));
        }
        self.len += self.buf.len() as u64;
        self.pending += self.buf.len() as u64;
        self.last_seq = seq;
        self.last_crc = Some(sum);
        Ok(seq)
    }

    /// After a failed append: the segment cut back to its length before it.
    fn cut_back(&self, e: io::Error) -> AppendError {
        match self.file.set_len(self.len) {
            Ok(()) => AppendError::Refused(e),
            Err(t) => AppendError::Broken(format!("{e}; cutting the segment back failed too: {t}")),
        }
    }

    /// Closes the current segment (synced) and starts the next one. Every
    /// record so far is in segments below the returned number.
    pub fn rotate(&mut self) -> Result<u64, String> {
        self.file.sync_all().map_err(|e| format!("journal segment {}: {e}", seg_name(self.seg)))?;
        let n = self.seg + 1;
        let (file, len) = Self::create_segment(&self.dir, n)?;
        self.file = file;
        self.seg = n;
        self.len = len;
        self.pending = len;
        Ok(n)
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

/// Where one record is in a segment's bytes: `(seq, crc, body start, body end)`.
type RecAt = (u64, u32, usize, usize);

/// The records of a segment's bytes in order, and the offset of a torn
/// tail if there is one.
fn parse_records(data: &[u8]) -> (Vec<RecAt>, Option<usize>) {
    let mut out = Vec::new();
    let mut off = SEG_HEADER;
    while off < data.len() {
        let rest = &data[off..];
        if rest.len() < REC_HEADER {
            return (out, Some(off));
        }
        let len = u32::from_le_bytes(rest[..4].try_into().expect("4 bytes")) as usize;
        if len > BODY_MAX || rest.len() < REC_HEADER + len {
            return (out, Some(off));
        }
        let sum = u32::from_le_bytes(rest[4..8].try_into().expect("4 bytes"));
        let seq = u64::from_le_bytes(rest[8..16].try_into().expect("8 bytes"));
        let (start, end) = (off + REC_HEADER, off + REC_HEADER + len);
        if crc(seq, &data[start..end]) != sum {
            return (out, Some(off));
        }
        out.push((seq, sum, start, end));
        off = end;
    }
    (out, None)
}

/// One batch read back: its sequence number and body.
pub type Batch = (u64, Vec<u8>);

/// The checksum a record of `seq` with `body` carries.
pub fn record_crc(seq: u64, body: &[u8]) -> u32 {
    crc(seq, body)
}

/// Records still in the journal (not deleted by a checkpoint), read without
/// changing anything (while the writer appends): the checksum of batch
/// `after` and every batch after it, in order, up to the last whole one.
/// `None` when batch `after` or one after it is not there any more (a
/// checkpoint deleted it): a mirror must then copy the whole store.
pub fn read_after(dir: &Path, after: u64) -> io::Result<Option<(u32, Vec<Batch>)>> {
    let mut at = None;
    let mut out: Vec<Batch> = Vec::new();
    for n in segments(dir)? {
        let data = match std::fs::read(dir.join(seg_name(n))) {
            Ok(d) => d,
            // Deleted by a checkpoint meanwhile: the records are gone from here.
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e),
        };
        if data.len() < SEG_HEADER || &data[..8] != MAGIC {
            continue;
        }
        for (seq, sum, start, end) in parse_records(&data).0 {
            if seq == after {
                at = Some(sum);
                out.clear();
            } else if seq > after && at.is_some() {
                let next = out.last().map_or(after + 1, |r| r.0 + 1);
                if seq < next {
                    // A torn tail's batch written again at the start of the next segment.
                    out.truncate(out.len() - (next - seq) as usize);
                } else if seq > next {
                    return Ok(None);
                }
                out.push((seq, data[start..end].to_vec()));
            }
        }
    }
    Ok(at.map(|c| (c, out)))
}

/// Every segment with its size in bytes (for what a mirror keeps).
pub fn segment_sizes(dir: &Path) -> Vec<(u64, u64)> {
    segments(dir)
        .unwrap_or_default()
        .into_iter()
        .map(|n| (n, std::fs::metadata(dir.join(seg_name(n))).map_or(0, |m| m.len())))
        .collect()
}

/// Deletes the segments below `seg` (their records are in a checkpoint).
pub fn remove_before(dir: &Path, seg: u64) -> io::Result<()> {
    for n in segments(dir)? {
        if n < seg {
            std::fs::remove_file(dir.join(seg_name(n)))?;
        }
    }
    sync_dir(dir)
}

/// Why a batch could not be appended.
#[derive(Debug)]
pub enum AppendError {
    /// Not written (the segment is as before): answer the batch with the error.
    Refused(io::Error),
    /// A partial record may remain: nothing may be appended any more.
    Broken(String),
    /// A mirrored namespace's secondary did not take it and the group could
    /// not be degraded (mgmtd unreachable, or this node is no longer the
    /// primary): nothing was written; the client retries elsewhere.
    Unavailable(String),
}

impl std::fmt::Display for AppendError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AppendError::Refused(e) => write!(f, "{e}"),
            AppendError::Broken(m) | AppendError::Unavailable(m) => f.write_str(m),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body(i: u8) -> Vec<u8> {
        let mut b = Vec::new();
        put_change(&mut b, 1, &[i; 3], Some(&[i, i]));
        put_change(&mut b, 0, b"k", None);
        b
    }

    fn replay(dir: &Path, after: u64) -> (Journal, Replayed, Vec<(u64, Vec<u8>)>) {
        let mut got = Vec::new();
        let (j, r) = Journal::open(dir, false, (after, None), |s, b| {
            got.push((s, b.to_vec()));
            Ok(())
        })
        .unwrap();
        (j, r, got)
    }

    #[test]
    fn changes_round_trip() {
        let b = body(7);
        let c = changes(&b).unwrap();
        assert_eq!(c, vec![(1, &[7u8, 7, 7][..], Some(&[7u8, 7][..])), (0, &b"k"[..], None)]);
        assert!(changes(&b[..b.len() - 1]).is_err());
        assert!(changes(&[1, 9, 0, 0, 0, 0]).is_err());
    }

    #[test]
    fn replay_returns_what_was_appended_after_the_checkpoint() {
        let d = tempfile::tempdir().unwrap();
        let (mut j, r, got) = replay(d.path(), 0);
        assert_eq!((r.records, got.len()), (0, 0));
        for i in 1..=3 {
            assert_eq!(j.append(|b| b.extend(body(i))).unwrap(), u64::from(i));
        }
        let next = j.rotate().unwrap();
        j.append(|b| b.extend(body(4))).unwrap();
        drop(j);
        let (j, r, got) = replay(d.path(), 0);
        assert_eq!(got, (1..=4).map(|i| (u64::from(i), body(i))).collect::<Vec<_>>());
        assert_eq!((r.records, r.torn.len(), j.last_seq()), (4, 0, 4));
        drop(j);
        // After a checkpoint of batches 1-3, only 4 is replayed.
        remove_before(d.path(), next).unwrap();
        let (mut j, _, got) = replay(d.path(), 3);
        assert_eq!(got, vec![(4, body(4))]);
        assert_eq!(j.append(|b| b.extend(body(5))).unwrap(), 5);
    }

    #[test]
    fn a_torn_last_record_is_cut_off_and_later_segments_continue() {
        let d = tempfile::tempdir().unwrap();
        let (mut j, _, _) = replay(d.path(), 0);
        j.append(|b| b.extend(body(1))).unwrap();
        j.append(|b| b.extend(body(2))).unwrap();
        let seg = d.path().join(seg_name(j.segment()));
        drop(j);
        // Every cut inside the second record, and a flipped byte in it.
        let whole = std::fs::read(&seg).unwrap();
        let second = SEG_HEADER + REC_HEADER + body(1).len();
        for cut in [second + 1, second + REC_HEADER, whole.len() - 1] {
            std::fs::write(&seg, &whole[..cut]).unwrap();
            let (j, r, got) = replay(d.path(), 0);
            assert_eq!(got, vec![(1, body(1))], "cut at {cut}");
            assert_eq!(r.torn.len(), 1);
            assert_eq!(std::fs::metadata(&seg).unwrap().len(), second as u64, "torn tail removed");
            // The new segment continues with batch 2 again.
            let newest = j.segment();
            drop(j);
            std::fs::remove_file(d.path().join(seg_name(newest))).unwrap();
        }
        let mut bad = whole.clone();
        *bad.last_mut().unwrap() ^= 1;
        std::fs::write(&seg, &bad).unwrap();
        let (mut j, r, got) = replay(d.path(), 0);
        assert_eq!((got.len(), r.torn.len()), (1, 1));
        assert_eq!(j.append(|b| b.extend(body(9))).unwrap(), 2);
        drop(j);
        let (_, _, got) = replay(d.path(), 0);
        assert_eq!(got, vec![(1, body(1)), (2, body(9))]);
    }

    #[test]
    fn a_failed_append_leaves_no_gap_before_the_next_record() {
        let d = tempfile::tempdir().unwrap();
        let (mut j, _, _) = replay(d.path(), 0);
        j.append(|b| b.extend(body(1))).unwrap();
        // A full disk in the middle of the second record, then the disk
        // has space again.
        j.fail_after = Some(REC_HEADER + 2);
        assert!(matches!(j.append(|b| b.extend(body(2))), Err(AppendError::Refused(_))));
        assert_eq!(j.append(|b| b.extend(body(3))).unwrap(), 2, "the failed batch took no number");
        j.append(|b| b.extend(body(4))).unwrap();
        drop(j);
        let (_, r, got) = replay(d.path(), 0);
        assert_eq!(got, vec![(1, body(1)), (2, body(3)), (3, body(4))], "acknowledged records lost");
        assert!(r.torn.is_empty(), "{:?}", r.torn);
    }

    #[test]
    fn a_missing_batch_or_a_foreign_file_is_an_error() {
        let d = tempfile::tempdir().unwrap();
        let (mut j, _, _) = replay(d.path(), 0);
        j.append(|b| b.extend(body(1))).unwrap();
        let first = j.segment();
        j.rotate().unwrap();
        j.append(|b| b.extend(body(2))).unwrap();
        drop(j);
        std::fs::remove_file(d.path().join(seg_name(first))).unwrap();
        let e = Journal::open(d.path(), false, (0, None), |_, _| Ok(())).err().unwrap();
        assert!(e.contains("batch 2 where batch 1 was expected"), "{e}");
        // Past the checkpoint, the missing segment does not matter.
        assert!(Journal::open(d.path(), false, (1, None), |_, _| Ok(())).is_ok());

        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join(seg_name(1)), b"something else entirely").unwrap();
        let e = Journal::open(d.path(), false, (0, None), |_, _| Ok(())).err().unwrap();
        assert!(e.contains("not a HiveFS journal"), "{e}");
    }
}
