//! Outcomes of retryable operations ([`hivefs_proto::Request::Retryable`]).
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
//! Key: `client u64 BE ++ seq u64 BE`; value: `applied_at_ms u64 BE ++
//! postcard(Response)`. Adding this table changes no existing record, so the
//! store's format version stays.

use hivefs_proto::{decode_body, encode_body, OpId, Response};
use redb::{ReadableTable, Table, TableDefinition};

pub(crate) const REPLIES: TableDefinition<&[u8], &[u8]> = TableDefinition::new("replies");

/// Records older than this are swept even if their client never confirmed
/// them (a client retries for at most its I/O timeout, 30 s by default).
pub const KEEP_MS: u64 = 10 * 60 * 1000;
/// Most records looked at by one sweep (bounds the cost added to a batch).
const SWEEP_MAX: usize = 4096;

fn key(client: u64, seq: u64) -> [u8; 16] {
    let mut k = [0u8; 16];
    k[..8].copy_from_slice(&client.to_be_bytes());
    k[8..].copy_from_slice(&seq.to_be_bytes());
    k
}

/// The recorded answer of `op`, if it was applied before.
pub(crate) fn get(t: &impl ReadableTable<&'static [u8], &'static [u8]>, op: &OpId) -> Result<Option<Response>, String> {
    let Some(v) = t.get(key(op.client, op.seq).as_slice()).map_err(|e| e.to_string())? else {
        return Ok(None);
    };
    let v = v.value();
    if v.len() < 8 {
        return Err(format!("reply record of client {:x} op {} is truncated", op.client, op.seq));
    }
    decode_body::<Response>(&v[8..])
        .map(Some)
        .map_err(|e| format!("reply record of client {:x} op {}: {e}", op.client, op.seq))
}

/// Records the answer of `op` and forgets the client's confirmed ones.
pub(crate) fn put(t: &mut Table<&[u8], &[u8]>, op: &OpId, now_ms: u64, r: &Response) -> Result<(), String> {
    let mut v = now_ms.to_be_bytes().to_vec();
    v.extend_from_slice(&encode_body(r));
    t.insert(key(op.client, op.seq).as_slice(), v.as_slice()).map_err(|e| e.to_string())?;
    let done = op.done_below.min(op.seq);
    if done > 0 {
        let (lo, hi) = (key(op.client, 0), key(op.client, done));
        t.retain_in(lo.as_slice()..hi.as_slice(), |_, _| false).map_err(|e| e.to_string())?;
    }
    Ok(())
}

/// Drops records older than [`KEEP_MS`], looking at most at a bounded
/// number of records per call, from where the last sweep stopped.
pub(crate) fn sweep(t: &mut Table<&[u8], &[u8]>, now_ms: u64, cursor: &mut Vec<u8>) -> Result<(), String> {
    let mut old = Vec::new();
    let mut next = None;
    for (seen, item) in t.range(cursor.as_slice()..).map_err(|e| e.to_string())?.enumerate() {
        let (k, v) = item.map_err(|e| e.to_string())?;
        if seen == SWEEP_MAX {
            next = Some(k.value().to_vec());
            break;
        }
        let v = v.value();
        let at = v.get(..8).map_or(0, |b| u64::from_be_bytes(b.try_into().expect("8 bytes")));
        if now_ms.saturating_sub(at) > KEEP_MS {
            old.push(k.value().to_vec());
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
    use hivefs_proto::Reply;
    use hivefs_types::error::FsError;

    fn db() -> (tempfile::TempDir, redb::Database) {
        let d = tempfile::tempdir().unwrap();
        let db = redb::Database::create(d.path().join("r.redb")).unwrap();
        (d, db)
    }

    #[test]
    fn records_are_found_confirmed_ones_dropped_and_old_ones_swept() {
        let (_d, db) = db();
        let txn = db.begin_write().unwrap();
        {
            let mut t = txn.open_table(REPLIES).unwrap();
            let op = |seq, done_below| OpId { client: 7, seq, done_below };
            put(&mut t, &op(1, 0), 1_000, &Ok(Reply::Ok)).unwrap();
            let err: Response = Err(FsError::new(hivefs_types::ErrorCode::Exists, "x"));
            put(&mut t, &op(2, 1), 1_000, &err).unwrap();
            assert_eq!(get(&t, &op(1, 0)).unwrap(), Some(Ok(Reply::Ok)));
            assert_eq!(get(&t, &op(2, 0)).unwrap(), Some(err));
            // Op 3 confirms 1 and 2: they go; another client's records stay.
            put(&mut t, &OpId { client: 8, seq: 1, done_below: 0 }, 1_000, &Ok(Reply::Ok)).unwrap();
            put(&mut t, &op(3, 3), 2_000, &Ok(Reply::Ok)).unwrap();
            assert_eq!(get(&t, &op(1, 0)).unwrap(), None);
            assert_eq!(get(&t, &op(2, 0)).unwrap(), None);
            assert!(get(&t, &op(3, 0)).unwrap().is_some());
            assert!(get(&t, &OpId { client: 8, seq: 1, done_below: 0 }).unwrap().is_some());
            // A sweep long after drops what is older than KEEP_MS only.
            let mut cursor = Vec::new();
            sweep(&mut t, 1_500 + KEEP_MS, &mut cursor).unwrap();
            assert!(get(&t, &OpId { client: 8, seq: 1, done_below: 0 }).unwrap().is_none());
            assert!(get(&t, &op(3, 0)).unwrap().is_some());
            assert!(cursor.is_empty(), "a sweep over a small table wraps around");
        }
        txn.commit().unwrap();
    }
}
