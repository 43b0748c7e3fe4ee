//! Outcomes of retryable operations (an operation id in the request's
//! [`hivefs_proto::Envelope`]).
//!
//! Owns the `replies` table: for each `(client, seq)` still needed, the time
//! it was applied and the answer given. The writer consults it before it
//! applies an operation that carries an [`OpId`] and records the outcome in
//! the same transaction as the change, so a client that retries after a lost
//! connection or a restart of this node gets the first answer and the change
//! is applied exactly once. It must not interpret the requests themselves.
//!
//! Size stays small without a background job: each operation tells which of
//! its client's earlier operations were answered (`done_below`), and those
//! records are dropped in the same transaction. Records of clients that
//! vanished are swept by age ([`KEEP_MS`]).
//!
//! # Record
//!
//! Key: `client u64 BE ++ seq u64 BE`. Value: `version u8 ++ applied_at_ms
//! u64 BE ++ postcard(Answer)`, version [`RECORD_VERSION`] = 2 (2: a directory pattern gained `mirror`). The version
//! byte and the time keep this place in every version, so the sweep ages
//! records of any version; only the answer's encoding may change, with a new
//! version (the store's format version is not involved).
//!
//! The answer is a disk record ([`Answer`], [`AttrRecord`]), not the wire
//! type `Response`: a change of `Reply`, `EntryAttr` or `ErrorCode` must not
//! silently change what is on disk. Error codes are stored as the explicit
//! numbers of [`code_number`]. `record_encodings_are_pinned` pins the bytes.
//! Conversion happens at this module's boundary: [`get`] and [`put`] speak
//! `Response`.
//!
//! What a mutation answers (`ops::apply`, `cross::apply`, `fsck::apply_fix`,
//! and the writer's own refusals): `Reply::Ok`, `Reply::Entry`,
//! `Reply::FsckFixed`, or an `FsError` of any code. Anything else cannot be
//! recorded; [`put`] then records an `Internal` error answer and logs a
//! warning (see [`answer_of`] for why).
//!
//! A record this build cannot read answers its operation with an `Io` error
//! naming the client and operation: the operation was applied once and must
//! not be applied again, so "not recorded" would be the unsafe reading; and
//! an answer rather than a store failure, which would fail every operation
//! of the write batch, again at each retry of this one. This covers records
//! of another version and records written before versions
//! existed (`applied_at_ms ++ postcard(Response)`, whose first byte, the top
//! byte of a millisecond time, is 0): such records are not converted, since
//! they are swept after minutes anyway. Only a record of this version that
//! fails to decode is a store failure (as any corrupt record).

use crate::store::mem::TableW;
use crate::store::Kv;
use hivefs_proto::{OpId, Reply, Response};
use hivefs_types::attr::{EntryAttr, FileKind, Timespec};
use hivefs_types::error::{ErrorCode, FsError};
use hivefs_types::ids::{EntryId, NodeId};
use hivefs_types::pattern::{DirPattern, Pattern};
use serde::{Deserialize, Serialize};
use tracing::warn;

/// Records older than this are swept even if their client never confirmed
/// them (a client retries for at most its I/O timeout, 30 s by default).
pub const KEEP_MS: u64 = 10 * 60 * 1000;
/// Most records looked at by one sweep (bounds the cost added to a batch).
const SWEEP_MAX: usize = 4096;

/// Version of the record written by this build (its first byte).
pub(crate) const RECORD_VERSION: u8 = 2;
/// Length of `version ++ applied_at_ms`.
const HEAD_LEN: usize = 9;

/// A recorded answer. Variant indexes are on disk. Any change needs a new
/// [`RECORD_VERSION`], even an appended variant: an older build must meet a
/// version it does not read (an error answer for that operation), not a
/// record it fails to decode (a store failure). Variants are only appended,
/// so that a newer build may go on reading older versions.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum Answer {
    /// `Ok(Reply::Ok)`.
    Ok,
    /// `Ok(Reply::Entry(..))`: the entry made or changed.
    Entry(AttrRecord),
    /// `Ok(Reply::FsckFixed(..))`: what a repair did.
    FsckFixed(String),
    /// `Err(FsError)`: the code as [`code_number`] and the message.
    Error { code: u16, message: String },
}

/// The attributes of an `Entry` answer, fields in this order on disk. The
/// field types are those of the store's own records (`store::Inode`,
/// `store::Dentry`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct AttrRecord {
    pub id: EntryId,
    pub kind: FileKind,
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub size: u64,
    pub nlink: u32,
    pub atime: Timespec,
    pub mtime: Timespec,
    pub ctime: Timespec,
    pub rdev: u32,
    pub owner: NodeId,
    pub pattern: Option<Pattern>,
    pub dir_pattern: Option<DirPattern>,
}

impl From<&EntryAttr> for AttrRecord {
    fn from(a: &EntryAttr) -> AttrRecord {
        // Destructured in full: a new field of `EntryAttr` fails to compile
        // here instead of being dropped from the record.
        let EntryAttr { id, kind, mode, uid, gid, size, nlink, atime, mtime, ctime, rdev, owner, pattern, dir_pattern } =
            a.clone();
        AttrRecord { id, kind, mode, uid, gid, size, nlink, atime, mtime, ctime, rdev, owner, pattern, dir_pattern }
    }
}

impl From<AttrRecord> for EntryAttr {
    fn from(a: AttrRecord) -> EntryAttr {
        let AttrRecord {
            id,
            kind,
            mode,
            uid,
            gid,
            size,
            nlink,
            atime,
            mtime,
            ctime,
            rdev,
            owner,
            pattern,
            dir_pattern,
        } = a;
        EntryAttr { id, kind, mode, uid, gid, size, nlink, atime, mtime, ctime, rdev, owner, pattern, dir_pattern }
    }
}

/// The number an error code is recorded as. Written out, never derived from
/// the enum's order: these numbers are on disk and never change or get
/// reused. `None` for a code added to `ErrorCode` but not yet here (the
/// enum is `#[non_exhaustive]`; `every_error_code_has_a_number` catches it).
pub(crate) fn code_number(c: ErrorCode) -> Option<u16> {
    Some(match c {
        ErrorCode::NotFound => 1,
        ErrorCode::Exists => 2,
        ErrorCode::NotDir => 3,
        ErrorCode::IsDir => 4,
        ErrorCode::NotEmpty => 5,
        ErrorCode::Invalid => 6,
        ErrorCode::NameTooLong => 7,
        ErrorCode::NotPermitted => 8,
        ErrorCode::AccessDenied => 9,
        ErrorCode::NoSpace => 10,
        ErrorCode::NoData => 11,
        ErrorCode::Range => 12,
        ErrorCode::CrossDevice => 13,
        ErrorCode::Io => 14,
        ErrorCode::TimedOut => 15,
        ErrorCode::Unavailable => 16,
        ErrorCode::Busy => 17,
        ErrorCode::NotSupported => 18,
        ErrorCode::TooManyLinks => 19,
        ErrorCode::Loop => 20,
        ErrorCode::Protocol => 21,
        ErrorCode::Auth => 22,
        ErrorCode::Internal => 23,
        ErrorCode::Quota => 24,
        _ => return None,
    })
}

/// The inverse of [`code_number`].
pub(crate) fn code_of(n: u16) -> Option<ErrorCode> {
    Some(match n {
        1 => ErrorCode::NotFound,
        2 => ErrorCode::Exists,
        3 => ErrorCode::NotDir,
        4 => ErrorCode::IsDir,
        5 => ErrorCode::NotEmpty,
        6 => ErrorCode::Invalid,
        7 => ErrorCode::NameTooLong,
        8 => ErrorCode::NotPermitted,
        9 => ErrorCode::AccessDenied,
        10 => ErrorCode::NoSpace,
        11 => ErrorCode::NoData,
        12 => ErrorCode::Range,
        13 => ErrorCode::CrossDevice,
        14 => ErrorCode::Io,
        15 => ErrorCode::TimedOut,
        16 => ErrorCode::Unavailable,
        17 => ErrorCode::Busy,
        18 => ErrorCode::NotSupported,
        19 => ErrorCode::TooManyLinks,
        20 => ErrorCode::Loop,
        21 => ErrorCode::Protocol,
        22 => ErrorCode::Auth,
        23 => ErrorCode::Internal,
        24 => ErrorCode::Quota,
        _ => return None,
    })
}

/// The record of an answer, or why it has none.
///
/// The mapping covers every answer a mutation gives (module doc). For any
/// other answer (a new `Reply` variant or `ErrorCode` not mapped here) the
/// choices are: fail the write batch (every operation in it fails, again at
/// each retry), record nothing (a retry would apply the change a second
/// time), or record an `Internal` error. [`put`] takes the last: the change
/// stays applied once and the client's first answer is still the true one
/// (the writer answers with the `Response`, not with the record); only a
/// retry after a lost answer gets the error, which says what happened.
pub(crate) fn answer_of(r: &Response) -> Result<Answer, String> {
    match r {
        Ok(Reply::Ok) => Ok(Answer::Ok),
        Ok(Reply::Entry(a)) => Ok(Answer::Entry(a.into())),
        Ok(Reply::FsckFixed(s)) => Ok(Answer::FsckFixed(s.clone())),
        Err(e) => match code_number(e.code) {
            Some(code) => Ok(Answer::Error { code, message: e.message.clone() }),
            None => Err(format!("error code {:?} has no record number", e.code)),
        },
        Ok(other) => {
            // The variant's name only: a reply may be large.
            let d = format!("{other:?}");
            let name = d.split(['(', '{', ' ']).next().unwrap_or_default();
            Err(format!("a {name} reply has no record form"))
        }
    }
}

impl Answer {
    fn into_response(self) -> Response {
        match self {
            Answer::Ok => Ok(Reply::Ok),
            Answer::Entry(a) => Ok(Reply::Entry(a.into())),
            Answer::FsckFixed(s) => Ok(Reply::FsckFixed(s)),
            Answer::Error { code, message } => Err(match code_of(code) {
                Some(c) => FsError::new(c, message),
                None => {
                    FsError::new(ErrorCode::Internal, format!("error code {code} (unknown to this build): {message}"))
                }
            }),
        }
    }
}

fn key(client: u64, seq: u64) -> [u8; 16] {
    let mut k = [0u8; 16];
    k[..8].copy_from_slice(&client.to_be_bytes());
    k[8..].copy_from_slice(&seq.to_be_bytes());
    k
}

/// The value recorded for `answer`, applied at `now_ms`.
fn encode_value(now_ms: u64, answer: &Answer) -> Vec<u8> {
    let mut v = Vec::with_capacity(HEAD_LEN + 16);
    v.push(RECORD_VERSION);
    v.extend_from_slice(&now_ms.to_be_bytes());
    v.extend_from_slice(&crate::store::encode(answer));
    v
}

/// The answer in a recorded value (module doc: a record of another version
/// reads as an `Io` error answer; `Err` only for a corrupt record).
fn decode_value(op: &OpId, v: &[u8]) -> Result<Response, String> {
    decode_value_of(format_args!("client {:x} op {}", op.client, op.seq), v)
}

fn decode_value_of(who: impl std::fmt::Display, v: &[u8]) -> Result<Response, String> {
    match v.first() {
        Some(&RECORD_VERSION) if v.len() >= HEAD_LEN => {
            let (answer, rest) = postcard::take_from_bytes::<Answer>(&v[HEAD_LEN..])
                .map_err(|e| format!("reply record of {who}: {e}"))?;
            if !rest.is_empty() {
                return Err(format!("reply record of {who}: {} trailing bytes", rest.len()));
            }
            Ok(answer.into_response())
        }
        Some(&RECORD_VERSION) | None => Err(format!("reply record of {who} is truncated")),
        Some(&version) => {
            let by = match version {
                0 => "an older build without record versions".to_string(),
                n => format!("record version {n}"),
            };
            Ok(Err(FsError::new(
                ErrorCode::Io,
                format!(
                    "the answer of {who} was recorded by {by}, which this build (record version {RECORD_VERSION}) \
                     cannot read; the operation was carried out once and is not repeated"
                ),
            )))
        }
    }
}

/// `r` as a record of this module's format, applied at `now_ms`: for
/// answers kept under other keys (a peer's steps, `cross::step`). `who`
/// names what it answered, in a warning (formatted only then).
pub(crate) fn record(now_ms: u64, r: &Response, who: impl std::fmt::Display) -> Vec<u8> {
    let answer = answer_of(r).unwrap_or_else(|why| {
        warn!("{who}: {why}; a repeat of it will be answered with an internal error");
        Answer::Error {
            code: code_number(ErrorCode::Internal).expect("Internal has a number"),
            message: format!("the first answer to this operation could not be recorded: {why}"),
        }
    });
    encode_value(now_ms, &answer)
}

/// The answer in a value [`record`] wrote (`who`: what it answered, for errors).
pub(crate) fn recorded(v: &[u8], who: impl std::fmt::Display) -> Result<Response, String> {
    decode_value_of(who, v)
}

/// The recorded answer of `op`, if it was applied before.
pub(crate) fn get(t: &impl Kv, op: &OpId) -> Result<Option<Response>, String> {
    let Some(v) = t.get(key(op.client, op.seq).as_slice()).map_err(|e| e.to_string())? else {
        return Ok(None);
    };
    decode_value(op, &v).map(Some)
}

/// Clients whose removal floor is remembered before the map starts over.
const FLOORS_MAX: usize = 100_000;
/// Confirmed records removed one key at a time rather than by a range scan.
const POINT_REMOVES_MAX: u64 = 64;

/// Records the answer of `op` and forgets the client's confirmed ones
/// (from `floors`' entry for the client on: below it they are gone).
pub(crate) fn put(
    t: &mut TableW<'_>,
    op: &OpId,
    now_ms: u64,
    r: &Response,
    floors: &mut std::collections::HashMap<u64, u64>,
) -> Result<(), String> {
    let value = record(now_ms, r, format_args!("client {:x} op {}", op.client, op.seq));
    t.insert(key(op.client, op.seq).as_slice(), value.as_slice()).map_err(|e| e.to_string())?;
    let done = op.done_below.min(op.seq);
    let floor = floors.get(&op.client).copied().unwrap_or(0);
    if done > floor {
        if done - floor <= POINT_REMOVES_MAX {
            // The usual case (one op confirmed since the last): deletions
            // by key, no scan (a key that is not there costs a tombstone).
            for seq in floor..done {
                t.remove(key(op.client, seq).as_slice()).map_err(|e| e.to_string())?;
            }
        } else {
            let (lo, hi) = (key(op.client, floor), key(op.client, done));
            t.remove_range(lo.as_slice(), hi.as_slice()).map_err(|e| e.to_string())?;
        }
        if floors.len() >= FLOORS_MAX {
            floors.clear();
        }
        floors.insert(op.client, done);
    }
    Ok(())
}

/// When a record was applied: bytes 1..9 in every version, 0..8 in records
/// written before versions (their first byte is the time's top byte, 0).
fn applied_at(v: &[u8]) -> u64 {
    let at = if v.first() == Some(&0) { v.get(..8) } else { v.get(1..HEAD_LEN) };
    at.map_or(0, |b| u64::from_be_bytes(b.try_into().expect("8 bytes")))
}

/// Drops records older than [`KEEP_MS`], looking at most at a bounded
/// number of records per call, from where the last sweep stopped.
pub(crate) fn sweep(t: &mut TableW<'_>, now_ms: u64, cursor: &mut Vec<u8>) -> Result<(), String> {
    let mut old = Vec::new();
    let mut next = None;
    for (seen, item) in
        t.range_from(std::ops::Bound::Included(cursor.as_slice())).map_err(|e| e.to_string())?.enumerate()
    {
        let (k, v) = item.map_err(|e| e.to_string())?;
        if seen == SWEEP_MAX {
            next = Some(k);
            break;
        }
        if now_ms.saturating_sub(applied_at(&v)) > KEEP_MS {
            old.push(k);
        }
    }
    for k in old {
        t.remove(k.as_slice()).map_err(|e| e.to_string())?;
    }
    *cursor = next.unwrap_or_default();
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use hivefs_types::ids::{PoolId, TargetId};
    use hivefs_types::pattern::{Chooser, PatternKind};

    /// Runs `f` over the replies table of a fresh store's batch.
    fn with_table<T>(f: impl FnOnce(&mut TableW<'_>) -> T) -> T {
        let (_d, m) = crate::store::mem::test_mem();
        m.batch(|t| Ok(f(&mut t.replies))).unwrap().0
    }

    fn floors() -> std::collections::HashMap<u64, u64> {
        Default::default()
    }

    fn hex(b: &[u8]) -> String {
        b.iter().map(|x| format!("{x:02x}")).collect()
    }

    /// An entry with every field set (a real one has a pattern or a
    /// directory pattern, not both).
    fn entry() -> EntryAttr {
        let t = |sec| Timespec { sec, nsec: 7 };
        EntryAttr {
            id: EntryId { node: 1, epoch: 2, counter: 3 },
            kind: FileKind::File,
            mode: 0o644,
            uid: 1000,
            gid: 100,
            size: 70_000,
            nlink: 1,
            atime: t(1),
            mtime: t(2),
            ctime: t(3),
            rdev: 5,
            owner: NodeId(2),
            pattern: Some(Pattern::new(PatternKind::Raid0, 65_536, vec![TargetId(4), TargetId(9)]).unwrap()),
            dir_pattern: Some(DirPattern {
                chunk_size: 524_288,
                stripe_count: 4,
                pool: PoolId(1),
                chooser: Chooser::Balanced,
                mirror: true,
            }),
        }
    }

    /// The recorded answers as they are on disk (record version 1): a
    /// change shows here first, and needs a new `RECORD_VERSION`.
    #[test]
    fn record_encodings_are_pinned() {
        let err = |code, m: &str| Answer::Error { code: code_number(code).unwrap(), message: m.into() };
        let cases: [(&str, Vec<u8>, &str); 6] = [
            ("ok", crate::store::encode(&Answer::Ok), "00"),
            (
                "entry",
                crate::store::encode(&Answer::Entry((&entry()).into())),
                "0101020300a403e80764f0a20401020704070607050201008080040204090180802004010301",
            ),
            ("fsck fixed", crate::store::encode(&Answer::FsckFixed("fixed".into())), "02056669786564"),
            ("not found", crate::store::encode(&err(ErrorCode::NotFound, "x")), "03010178"),
            ("internal", crate::store::encode(&err(ErrorCode::Internal, "")), "031700"),
            ("whole value", encode_value(0x0102_0304_0506, &Answer::Ok), "02000001020304050600"),
        ];
        for (what, got, want) in cases {
            assert_eq!(hex(&got), want, "{what}");
        }
    }

    /// Every `ErrorCode` (found by decoding its wire index, so a new code
    /// shows up here) has a distinct number that reads back as itself.
    #[test]
    fn every_error_code_has_a_number() {
        let all: Vec<ErrorCode> = (0u8..=127).map_while(|i| postcard::from_bytes::<ErrorCode>(&[i]).ok()).collect();
        assert!(all.len() >= 23, "{all:?}");
        let mut seen = std::collections::HashSet::new();
        for c in all {
            let n = code_number(c).unwrap_or_else(|| panic!("{c:?} has no record number"));
            assert!(seen.insert(n), "{c:?}: number {n} used twice");
            assert_eq!(code_of(n), Some(c));
        }
        assert_eq!(code_of(0), None);
    }

    fn round_trip(r: &Response) -> Response {
        with_table(|t| {
            let op = OpId { client: 0xab, seq: 4, done_below: 0 };
            put(t, &op, 1_000, r, &mut floors()).unwrap();
            get(t, &op).unwrap().expect("recorded")
        })
    }

    #[test]
    fn answers_read_back_as_given() {
        let mut dir = entry();
        (dir.kind, dir.pattern, dir.size) = (FileKind::Dir, None, 0);
        let mut answers: Vec<Response> = vec![
            Ok(Reply::Ok),
            Ok(Reply::Entry(entry())),
            Ok(Reply::Entry(dir)),
            Ok(Reply::FsckFixed("set size of 1-2-3 from 0 to 9".into())),
        ];
        let codes = (0u8..=127).map_while(|i| postcard::from_bytes::<ErrorCode>(&[i]).ok());
        answers.extend(codes.map(|c| Err(FsError::new(c, format!("{c:?} happened")))));
        for r in answers {
            assert_eq!(round_trip(&r), r);
        }
    }

    #[test]
    fn an_answer_without_a_record_form_reads_as_an_internal_error() {
        let r: Response = Ok(Reply::Written(3));
        let Err(e) = round_trip(&r) else { panic!("recorded as a success") };
        assert_eq!(e.code, ErrorCode::Internal);
        assert!(e.message.contains("Written reply has no record form"), "{}", e.message);
        // An error code this build does not know (from a newer one).
        let a = Answer::Error { code: 999, message: "m".into() };
        let Err(e) = a.into_response() else { panic!() };
        assert_eq!((e.code, e.message.as_str()), (ErrorCode::Internal, "error code 999 (unknown to this build): m"));
    }

    #[test]
    fn records_of_another_version_answer_an_error_and_are_swept() {
        with_table(|t| {
            let op = |seq| OpId { client: 0xc1, seq, done_below: 0 };
            // Before versions: applied_at_ms BE ++ postcard(Response).
            let mut old = 1_000u64.to_be_bytes().to_vec();
            old.extend_from_slice(&hivefs_proto::encode_body(&Ok::<Reply, FsError>(Reply::Ok)));
            t.insert(key(0xc1, 1).as_slice(), old.as_slice()).unwrap();
            let mut newer = encode_value(1_000, &Answer::Ok);
            newer[0] = 1;
            t.insert(key(0xc1, 2).as_slice(), newer.as_slice()).unwrap();
            for (seq, by) in [(1, "an older build without record versions"), (2, "record version 1")] {
                let Some(Err(e)) = get(t, &op(seq)).unwrap() else { panic!("op {seq} not an error answer") };
                assert_eq!(e.code, ErrorCode::Io);
                assert!(e.message.contains(&format!("client c1 op {seq} was recorded by {by}")), "{}", e.message);
            }
            // A record of this version that does not decode is a store failure.
            t.insert(key(0xc1, 3).as_slice(), [RECORD_VERSION, 0, 0].as_slice()).unwrap();
            assert!(get(t, &op(3)).unwrap_err().contains("client c1 op 3 is truncated"));
            t.insert(key(0xc1, 3).as_slice(), encode_value(1_000, &Answer::Ok)[..HEAD_LEN].to_vec().as_slice())
                .unwrap();
            assert!(get(t, &op(3)).unwrap_err().contains("reply record of client c1 op 3"));
            // All are aged by their time.
            let mut cursor = Vec::new();
            sweep(t, 1_000 + KEEP_MS, &mut cursor).unwrap();
            assert!(get(t, &op(1)).unwrap().is_some() && get(t, &op(2)).unwrap().is_some());
            sweep(t, 1_001 + KEEP_MS, &mut cursor).unwrap();
            assert_eq!(t.iter().unwrap().count(), 0);
        })
    }

    #[test]
    fn records_are_found_confirmed_ones_dropped_and_old_ones_swept() {
        with_table(|t| {
            let mut f = floors();
            let op = |seq, done_below| OpId { client: 7, seq, done_below };
            put(t, &op(1, 0), 1_000, &Ok(Reply::Ok), &mut f).unwrap();
            let err: Response = Err(FsError::new(ErrorCode::Exists, "x"));
            put(t, &op(2, 1), 1_000, &err, &mut f).unwrap();
            assert_eq!(get(t, &op(1, 0)).unwrap(), Some(Ok(Reply::Ok)));
            assert_eq!(get(t, &op(2, 0)).unwrap(), Some(err));
            // Op 3 confirms 1 and 2: they go; another client's records stay.
            put(t, &OpId { client: 8, seq: 1, done_below: 0 }, 1_000, &Ok(Reply::Ok), &mut f).unwrap();
            put(t, &op(3, 3), 2_000, &Ok(Reply::Ok), &mut f).unwrap();
            assert_eq!(get(t, &op(1, 0)).unwrap(), None);
            assert_eq!(get(t, &op(2, 0)).unwrap(), None);
            assert!(get(t, &op(3, 0)).unwrap().is_some());
            assert!(get(t, &OpId { client: 8, seq: 1, done_below: 0 }).unwrap().is_some());
            // A sweep long after drops what is older than KEEP_MS only.
            let mut cursor = Vec::new();
            sweep(t, 1_500 + KEEP_MS, &mut cursor).unwrap();
            assert!(get(t, &OpId { client: 8, seq: 1, done_below: 0 }).unwrap().is_none());
            assert!(get(t, &op(3, 0)).unwrap().is_some());
            assert!(cursor.is_empty(), "a sweep over a small table wraps around");
        })
    }
}
