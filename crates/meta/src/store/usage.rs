//! Quota usage: what the inodes of this metadata node hold per user and per
//! group, as records of the `quota_usage` table.
//!
//! Every write or removal of an inode record goes through
//! [`Tables::put_inode`] / [`Tables::remove_inode`], which move the
//! inode's weight (one inode; its length if it is a regular file) from its
//! old owner and group to its new ones in the same batch. So the counters
//! are exactly as durable and as replicated as the inodes they count: the
//! same journal record carries both, a mirror's copy receives both, and
//! chown, rename to another node (the inode record moves), hard links (one
//! inode record), truncation, size reports, unlink and a restart need no
//! rule of their own. [`recount`] derives them from the inodes again
//! (`hivefs fsck`, and the first start of a store written before usage
//! was kept).
//!
//! Key: kind (0 user, 1 group) ++ id (u32 big-endian): all inodes of the
//! user or group. Key ++ unit kind (0 target, 1 buddy group) ++ unit id (u32
//! big-endian): its regular files whose pattern starts on that unit (mgmtd
//! sums these per storage pool; a file's units are all in one pool when it
//! is made). Value: inodes (files) ++ bytes (u64 little-endian each). A
//! record that would hold nothing is absent.

use super::mem::{Kv, TableW, Tables};
use super::{decode, Inode, OpError, OpResult};
use hivefs_proto::{QuotaId, QuotaKind, QuotaUse};
use hivefs_types::attr::FileKind;
use hivefs_types::ids::{BuddyGroupId, TargetId};
use hivefs_types::pattern::StripeUnit;
use std::collections::BTreeMap;

const KEY_LEN: usize = 5;
const UNIT_KEY_LEN: usize = 10;

pub(crate) fn key(who: QuotaId) -> [u8; KEY_LEN] {
    let mut k = [0u8; KEY_LEN];
    k[0] = match who.kind {
        QuotaKind::User => 0,
        QuotaKind::Group => 1,
    };
    k[1..].copy_from_slice(&who.id.to_be_bytes());
    k
}

fn unit_key(who: QuotaId, unit: StripeUnit) -> [u8; UNIT_KEY_LEN] {
    let mut k = [0u8; UNIT_KEY_LEN];
    k[..KEY_LEN].copy_from_slice(&key(who));
    let (kind, id) = match unit {
        StripeUnit::Target(t) => (0, t.0),
        StripeUnit::Group(g) => (1, g.0),
    };
    k[KEY_LEN] = kind;
    k[KEY_LEN + 1..].copy_from_slice(&id.to_be_bytes());
    k
}

fn unit_of(k: &[u8]) -> OpResult<StripeUnit> {
    let bad = || OpError::Fatal(format!("corrupt quota usage key {k:02x?}"));
    let id: [u8; 4] = k.get(KEY_LEN + 1..UNIT_KEY_LEN).and_then(|b| b.try_into().ok()).ok_or_else(bad)?;
    let id = u32::from_be_bytes(id);
    match k.get(KEY_LEN) {
        Some(0) if k.len() == UNIT_KEY_LEN => Ok(StripeUnit::Target(TargetId(id))),
        Some(1) if k.len() == UNIT_KEY_LEN => Ok(StripeUnit::Group(BuddyGroupId(id))),
        _ => Err(bad()),
    }
}

fn who_of(k: &[u8]) -> OpResult<QuotaId> {
    let bad = || OpError::Fatal(format!("corrupt quota usage key {k:02x?}"));
    let id: [u8; 4] = k.get(1..KEY_LEN).and_then(|b| b.try_into().ok()).ok_or_else(bad)?;
    let kind = match k.first() {
        Some(0) if k.len() == KEY_LEN || k.len() == UNIT_KEY_LEN => QuotaKind::User,
        Some(1) if k.len() == KEY_LEN || k.len() == UNIT_KEY_LEN => QuotaKind::Group,
        _ => return Err(bad()),
    };
    Ok(QuotaId { kind, id: u32::from_be_bytes(id) })
}

fn use_of(who: QuotaId, v: &[u8]) -> OpResult<QuotaUse> {
    let word = |i: usize| v.get(i * 8..i * 8 + 8).and_then(|b| b.try_into().ok()).map(u64::from_le_bytes);
    match (v.len(), word(0), word(1)) {
        (16, Some(inodes), Some(bytes)) => Ok(QuotaUse { inodes, bytes }),
        _ => Err(OpError::Fatal(format!("corrupt quota usage record of {} {}", who.kind.name(), who.id))),
    }
}

pub(crate) fn put(t: &mut TableW<'_>, who: QuotaId, u: QuotaUse) -> OpResult<()> {
    put_key(t, &key(who), u)
}

fn put_key(t: &mut TableW<'_>, k: &[u8], u: QuotaUse) -> OpResult<()> {
    if u == QuotaUse::default() {
        return t.remove(k);
    }
    let mut v = [0u8; 16];
    v[..8].copy_from_slice(&u.inodes.to_le_bytes());
    v[8..].copy_from_slice(&u.bytes.to_le_bytes());
    t.insert(k, &v)
}

fn get_key(t: &impl Kv, who: QuotaId, k: &[u8]) -> OpResult<QuotaUse> {
    t.get(k)?.map_or(Ok(QuotaUse::default()), |v| use_of(who, &v))
}

/// What `who`'s inodes on this node hold.
pub fn get(t: &impl Kv, who: QuotaId) -> OpResult<QuotaUse> {
    get_key(t, who, &key(who))
}

/// Every user and group holding anything, in key order (users first).
pub fn all(t: &impl Kv) -> OpResult<Vec<(QuotaId, QuotaUse)>> {
    let mut out = Vec::new();
    for r in t.iter()? {
        let (k, v) = r?;
        if k.len() == KEY_LEN {
            let who = who_of(&k)?;
            out.push((who, use_of(who, &v)?));
        }
    }
    Ok(out)
}

/// `who`'s regular files by the first unit of their pattern.
pub fn by_unit(t: &impl Kv, who: QuotaId) -> OpResult<Vec<(StripeUnit, QuotaUse)>> {
    let prefix = key(who);
    let mut out = Vec::new();
    for r in t.range_from(std::ops::Bound::Excluded(&prefix[..]))? {
        let (k, v) = r?;
        if !k.starts_with(&prefix) {
            break;
        }
        out.push((unit_of(&k)?, use_of(who, &v)?));
    }
    Ok(out)
}

/// Every record (totals and per-unit rows), by key: what a recount compares.
fn records(t: &impl Kv) -> OpResult<BTreeMap<Vec<u8>, QuotaUse>> {
    let mut out = BTreeMap::new();
    for r in t.iter()? {
        let (k, v) = r?;
        let who = who_of(&k)?;
        if k.len() == UNIT_KEY_LEN {
            unit_of(&k)?;
        }
        out.insert(k, use_of(who, &v)?);
    }
    Ok(out)
}

/// The records an inode counts in (its user's and group's totals, and for
/// a regular file their rows of its first stripe unit), and its bytes.
fn weight(i: &Inode) -> (Vec<(QuotaId, Vec<u8>)>, u64) {
    let bytes = counted(i.kind, i.size);
    let unit = i.pattern.as_ref().filter(|p| p.stripe_count() > 0).map(|p| p.unit(0));
    let mut keys = Vec::with_capacity(4);
    for who in [QuotaId { kind: QuotaKind::User, id: i.uid }, QuotaId { kind: QuotaKind::Group, id: i.gid }] {
        keys.push((who, key(who).to_vec()));
        if let Some(u) = unit {
            keys.push((who, unit_key(who, u).to_vec()));
        }
    }
    (keys, bytes)
}

/// The leading fields of an encoded [`Inode`] (postcard keeps declaration
/// order): all that says whether a new version moves usage.
#[derive(serde::Deserialize)]
struct Head {
    kind: FileKind,
    _mode: u32,
    uid: u32,
    gid: u32,
    size: u64,
}

fn counted(kind: FileKind, size: u64) -> u64 {
    if kind == FileKind::File {
        size
    } else {
        0
    }
}

/// Whether replacing the encoded inode `old` by `new` leaves every usage
/// record as it is (same owner, group and counted length). No allocation;
/// an undecodable `old` answers false (the full decode then reports it).
pub(crate) fn moves_nothing(old: &[u8], new: &Inode) -> bool {
    postcard::take_from_bytes::<Head>(old).is_ok_and(|(h, _)| {
        h.uid == new.uid && h.gid == new.gid && counted(h.kind, h.size) == counted(new.kind, new.size)
    })
}

/// Moves an inode's weight from its `old` record to its `new` one (either
/// absent: created or removed).
pub(crate) fn account(t: &mut TableW<'_>, old: Option<&Inode>, new: Option<&Inode>) -> OpResult<()> {
    if let (Some(a), Some(b)) = (old, new) {
        if a.uid == b.uid && a.gid == b.gid && counted(a.kind, a.size) == counted(b.kind, b.size) {
            return Ok(());
        }
    }
    // (inodes, bytes) change per record; at most eight of them.
    let mut delta: BTreeMap<Vec<u8>, (QuotaId, i128, i128)> = BTreeMap::new();
    for (sign, i) in [(-1i128, old), (1, new)] {
        let Some((keys, b)) = i.map(weight) else { continue };
        for (who, k) in keys {
            let d = delta.entry(k).or_insert((who, 0, 0));
            d.1 += sign;
            d.2 += sign * i128::from(b);
        }
    }
    for (k, (who, dn, db)) in delta {
        if (dn, db) == (0, 0) {
            continue;
        }
        let u = get_key(t, who, &k)?;
        let add = |v: u64, d: i128| u64::try_from((i128::from(v) + d).max(0)).unwrap_or(u64::MAX);
        put_key(t, &k, QuotaUse { inodes: add(u.inodes, dn), bytes: add(u.bytes, db) })?;
    }
    Ok(())
}

/// Counts every inode again and (with `apply`) replaces the wrong usage
/// records with the count. Returns the users and groups whose records were
/// wrong: (who, recorded, counted).
pub fn recount(t: &mut Tables<'_>, apply: bool) -> OpResult<Vec<(QuotaId, QuotaUse, QuotaUse)>> {
    let mut counted: BTreeMap<Vec<u8>, QuotaUse> = BTreeMap::new();
    for r in t.inodes.iter()? {
        let (k, v) = r?;
        let i: Inode = decode("inode", format_args!("{k:02x?}"), &v).map_err(OpError::Fatal)?;
        let (keys, b) = weight(&i);
        for (_, k) in keys {
            let u = counted.entry(k).or_default();
            u.inodes += 1;
            u.bytes = u.bytes.saturating_add(b);
        }
    }
    let recorded = records(&t.usage)?;
    let mut wrong: Vec<(QuotaId, QuotaUse, QuotaUse)> = Vec::new();
    let keys: std::collections::BTreeSet<Vec<u8>> = recorded.keys().chain(counted.keys()).cloned().collect();
    for k in keys {
        let (r, c) = (recorded.get(&k).copied().unwrap_or_default(), counted.get(&k).copied().unwrap_or_default());
        if r != c {
            // A wrong per-unit row is reported as its user's or group's.
            let who = who_of(&k)?;
            if wrong.last().is_none_or(|(w, ..)| *w != who) {
                let total = |m: &BTreeMap<Vec<u8>, QuotaUse>| m.get(&key(who)[..]).copied().unwrap_or_default();
                wrong.push((who, total(&recorded), total(&counted)));
            }
            if apply {
                put_key(&mut t.usage, &k, c)?;
            }
        }
    }
    Ok(wrong)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::mem::test_mem;
    use hivefs_types::attr::Timespec;
    use hivefs_types::ids::EntryId;

    fn inode(kind: FileKind, uid: u32, gid: u32, size: u64) -> Inode {
        let t = Timespec::default();
        let (pattern, dir_pattern, symlink, parent) = (None, None, None, None);
        Inode {
            kind,
            mode: 0o644,
            uid,
            gid,
            size,
            nlink: 1,
            atime: t,
            mtime: t,
            ctime: t,
            rdev: 0,
            pattern,
            dir_pattern,
            symlink,
            parent,
        }
    }

    fn user(id: u32) -> QuotaId {
        QuotaId { kind: QuotaKind::User, id }
    }

    fn group(id: u32) -> QuotaId {
        QuotaId { kind: QuotaKind::Group, id }
    }

    fn usage(m: &crate::store::Mem) -> Vec<(QuotaId, QuotaUse)> {
        m.read(|t| all(&t.usage)).unwrap()
    }

    fn u(inodes: u64, bytes: u64) -> QuotaUse {
        QuotaUse { inodes, bytes }
    }

    #[test]
    fn inode_writes_move_usage_and_a_recount_agrees() {
        let (_d, m) = test_mem();
        let (a, b) = (EntryId { node: 1, epoch: 1, counter: 1 }, EntryId { node: 1, epoch: 1, counter: 2 });
        let edit = |f: &dyn Fn(&mut Tables<'_>) -> OpResult<()>| {
            let ((), ch) = m.batch(|t| f(t)).unwrap();
            m.apply(ch);
        };
        edit(&|t| {
            t.put_inode(a, &inode(FileKind::File, 1000, 100, 10))?;
            t.put_inode(b, &inode(FileKind::Dir, 1000, 100, 4096))
        });
        assert_eq!(usage(&m), vec![(user(1000), u(2, 10)), (group(100), u(2, 10))]);
        // Growth, then a chown of the file to another user (same group).
        edit(&|t| t.put_inode(a, &inode(FileKind::File, 1000, 100, 50)));
        edit(&|t| t.put_inode(a, &inode(FileKind::File, 1001, 100, 50)));
        assert_eq!(usage(&m), vec![(user(1000), u(1, 0)), (user(1001), u(1, 50)), (group(100), u(2, 50))]);
        // The records agree with a count of the inodes: nothing to fix.
        let ((), ch) = m.batch(|t| recount(t, true).map(|w| assert!(w.is_empty(), "{w:?}"))).unwrap();
        m.apply(ch);
        // Removal: the user's record goes when it holds nothing.
        edit(&|t| t.remove_inode(a));
        assert_eq!(usage(&m), vec![(user(1000), u(1, 0)), (group(100), u(1, 0))]);
        // A wrong record is found and replaced by the count.
        edit(&|t| put(&mut t.usage, user(7), u(3, 3)));
        let ((), ch) = m
            .batch(|t| {
                assert_eq!(recount(t, false)?.len(), 1);
                let w = recount(t, true)?;
                assert_eq!(w, vec![(user(7), u(3, 3), u(0, 0))]);
                Ok(())
            })
            .unwrap();
        m.apply(ch);
        assert_eq!(usage(&m), vec![(user(1000), u(1, 0)), (group(100), u(1, 0))]);
    }

    #[test]
    fn the_first_fields_of_a_record_tell_whether_usage_moves() {
        let i = inode(FileKind::File, 1000, 100, 10);
        let old = crate::store::encode(&i);
        assert!(moves_nothing(&old, &Inode { nlink: 3, ..i.clone() }));
        assert!(!moves_nothing(&old, &Inode { size: 11, ..i.clone() }));
        assert!(!moves_nothing(&old, &Inode { gid: 101, ..i.clone() }));
        let dir = crate::store::encode(&inode(FileKind::Dir, 1000, 100, 4096));
        assert!(moves_nothing(&dir, &inode(FileKind::Dir, 1000, 100, 8192)));
        assert!(!moves_nothing(&old[..3], &i));
    }

    #[test]
    fn corrupt_records_are_errors_not_panics() {
        assert!(who_of(&[2, 0, 0, 0, 1]).is_err());
        assert!(who_of(&[0, 0]).is_err());
        assert!(use_of(user(1), &[0; 15]).is_err());
        assert_eq!(who_of(&key(group(9))).unwrap(), group(9));
    }
}
