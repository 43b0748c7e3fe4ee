//! The records in memory over the checkpoint store: what every read and
//! every batch of the writer sees.
//!
//! Owns the layering of record versions and checkpoints. Three layers, newest
//! first: `live` (every change journaled since the last checkpoint began),
//! `frozen` (the changes a running checkpoint is writing into the store) and
//! the checkpoint store itself (`meta.redb`, the cold tier: every record as
//! of the last checkpoint, read through its page cache). A deleted record is
//! a tombstone (`None`) in a memory layer until the checkpoint removes it
//! from the store. A batch of the writer adds its own layer on top
//! ([`Tables`]), which becomes part of `live` only after the journal has it
//! ([`Mem::apply`]); a failed batch is simply dropped.
//!
//! It must not know the namespace's rules (`ops`) or the journal's file
//! format (`journal`): it speaks of tables, keys and values.
//!
//! Memory: a record changed since the last checkpoint costs its key and
//! value plus about 80 bytes (two boxed slices and its share of a B-tree
//! node); checkpoints start when the journal reaches `checkpoint_bytes`, so
//! `live` and `frozen` together stay near twice what that much journal
//! holds. Everything else lives on disk, so a namespace larger than memory
//! works, read through the store's bounded page cache and the kernel's.

use super::{
    LeaseKey, OpError, OpResult, DENTRIES, DIRX, DISPOSAL, INODES, INTENTS, LOCKED, PEER_DONE, REPLIES, SYSTEM, USAGE,
    XATTRS,
};
use redb::{ReadableDatabase, ReadableTable, TableDefinition};
use std::borrow::Cow;
use std::cell::OnceCell;
use std::collections::BTreeMap;
use std::ops::Bound;
use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};

/// The tables, by their number in journal records. `System` holds named
/// u64 counters (8 bytes little-endian in memory and in the journal; the
/// store's `system` table keeps them as redb u64 under a string key).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Tab {
    Dentries = 0,
    Inodes = 1,
    Xattrs = 2,
    Disposal = 3,
    Intents = 4,
    Locked = 5,
    Dirx = 6,
    PeerDone = 7,
    Replies = 8,
    System = 9,
    Usage = 10,
}

/// Number of tables.
pub const NT: usize = 11;

impl Tab {
    pub const ALL: [Tab; NT] = [
        Tab::Dentries,
        Tab::Inodes,
        Tab::Xattrs,
        Tab::Disposal,
        Tab::Intents,
        Tab::Locked,
        Tab::Dirx,
        Tab::PeerDone,
        Tab::Replies,
        Tab::System,
        Tab::Usage,
    ];

    pub fn from_u8(n: u8) -> Option<Tab> {
        Tab::ALL.get(usize::from(n)).copied()
    }

    /// The store's table of a byte-keyed table (`None` for `System`).
    fn def(self) -> Option<TableDefinition<'static, &'static [u8], &'static [u8]>> {
        Some(match self {
            Tab::Dentries => DENTRIES,
            Tab::Inodes => INODES,
            Tab::Xattrs => XATTRS,
            Tab::Disposal => DISPOSAL,
            Tab::Intents => INTENTS,
            Tab::Locked => LOCKED,
            Tab::Dirx => DIRX,
            Tab::PeerDone => PEER_DONE,
            Tab::Replies => REPLIES,
            Tab::Usage => USAGE,
            Tab::System => return None,
        })
    }
}

/// Changed records of one table: key → new value (`None`: deleted).
pub type Map = BTreeMap<Box<[u8]>, Option<Box<[u8]>>>;

/// Changed records of every table, and what they cost.
#[derive(Default, Debug)]
pub struct Maps {
    pub t: [Map; NT],
    /// Records held (tombstones included).
    pub records: usize,
}

impl Maps {
    fn is_empty(&self) -> bool {
        self.t.iter().all(Map::is_empty)
    }

    /// Moves `changes` in (newer versions replace older ones).
    pub fn absorb(&mut self, changes: [Map; NT]) {
        for (dst, src) in self.t.iter_mut().zip(changes) {
            for (k, v) in src {
                if dst.insert(k, v).is_none() {
                    self.records += 1;
                }
            }
        }
    }
}

/// The memory layers.
#[derive(Default)]
pub struct Hot {
    pub live: Maps,
    pub frozen: Option<Arc<Maps>>,
}

/// The records of one metadata node: memory layers over the checkpoint store.
pub struct Mem {
    hot: RwLock<Hot>,
    pub cold: Arc<redb::Database>,
}

impl Mem {
    pub fn new(cold: Arc<redb::Database>) -> Mem {
        Mem { hot: RwLock::default(), cold }
    }

    fn hot(&self) -> RwLockReadGuard<'_, Hot> {
        // A panic while holding the lock leaves the maps as they were
        // (writes are single inserts): the data is still good.
        self.hot.read().unwrap_or_else(|e| e.into_inner())
    }

    fn hot_mut(&self) -> RwLockWriteGuard<'_, Hot> {
        self.hot.write().unwrap_or_else(|e| e.into_inner())
    }

    /// Runs `f` over a consistent view of every table.
    pub fn read<T>(&self, f: impl FnOnce(&ReadTables<'_>) -> OpResult<T>) -> OpResult<T> {
        let hot = self.hot();
        let below = Below::new(&hot, &self.cold);
        f(&ReadTables::new(&below))
    }

    /// Runs `f` (the writer's batch) over a layer of its own on top of the
    /// current view, and returns what it changed (not yet visible to anyone).
    pub fn batch<T>(&self, f: impl FnOnce(&mut Tables<'_>) -> OpResult<T>) -> OpResult<(T, [Map; NT])> {
        let hot = self.hot();
        let below = Below::new(&hot, &self.cold);
        let mut t = Tables::new(&below);
        let r = f(&mut t)?;
        Ok((r, t.into_changes()))
    }

    /// Makes a journaled batch's changes visible.
    pub fn apply(&self, changes: [Map; NT]) {
        self.hot_mut().live.absorb(changes);
    }

    /// Starts a checkpoint: `live` becomes `frozen` (`None` when one is
    /// still running or nothing changed).
    pub fn freeze(&self) -> Option<Arc<Maps>> {
        let mut hot = self.hot_mut();
        if hot.frozen.is_some() || hot.live.is_empty() {
            return None;
        }
        let f = Arc::new(std::mem::take(&mut hot.live));
        hot.frozen = Some(f.clone());
        Some(f)
    }

    /// Ends a checkpoint whose records the store now holds.
    pub fn unfreeze(&self) {
        self.hot_mut().frozen = None;
    }

    /// Every record of every table, as journal record bodies of about
    /// `piece` bytes each: a mirror's full copy. The memory layers stay
    /// read-locked meanwhile (commits wait), so the copy is one point in
    /// the sequence of batches.
    pub fn dump(&self, piece: usize) -> OpResult<Vec<Vec<u8>>> {
        let hot = self.hot();
        let below = Below::new(&hot, &self.cold);
        let mut out: Vec<Vec<u8>> = vec![Vec::new()];
        let mut push = |t: Tab, k: &[u8], v: &[u8]| {
            if out.last().is_some_and(|b| b.len() >= piece) {
                out.push(Vec::new());
            }
            let last = out.last_mut().expect("one piece at least");
            super::journal::put_change(last, t as u8, k, Some(v));
        };
        for tab in Tab::ALL {
            if tab == Tab::System {
                let mut sys: BTreeMap<Vec<u8>, Option<Vec<u8>>> = BTreeMap::new();
                let txn = below.txn()?;
                for r in txn.open_table(SYSTEM)?.iter()? {
                    let (k, v) = r?;
                    sys.insert(k.value().as_bytes().to_vec(), Some(v.value().to_le_bytes().to_vec()));
                }
                // Oldest layer first: newer versions replace older ones.
                for m in below.frozen.into_iter().chain(std::iter::once(below.live)) {
                    for (k, v) in &m.t[Tab::System as usize] {
                        sys.insert(k.to_vec(), v.as_ref().map(|v| v.to_vec()));
                    }
                }
                // The last checkpointed batch is the store's own bookkeeping.
                sys.remove(super::sys::JOURNAL_SEQ.as_bytes());
                sys.remove(super::sys::JOURNAL_CRC.as_bytes());
                for (k, v) in sys {
                    if let Some(v) = v {
                        push(tab, &k, &v);
                    }
                }
                continue;
            }
            for r in below.range(tab, None, Bound::Unbounded)? {
                let (k, v) = r?;
                push(tab, &k, &v);
            }
        }
        Ok(out)
    }

    /// Writes `frozen` into the store in one transaction, with `seq` as the
    /// last journal batch it contains, and commits (fsynced). `before_commit`
    /// runs just before the commit (a crash hook). Returns the bytes of the
    /// store's file in use afterwards.
    pub fn write_checkpoint(
        &self,
        frozen: &Maps,
        seq: u64,
        crc: Option<u32>,
        before_commit: &dyn Fn(),
    ) -> Result<u64, String> {
        let e = |x: &dyn std::fmt::Display| x.to_string();
        let txn = self.cold.begin_write().map_err(|x| e(&x))?;
        for tab in Tab::ALL {
            let m = &frozen.t[tab as usize];
            if m.is_empty() {
                continue;
            }
            match tab.def() {
                Some(def) => {
                    let mut t = txn.open_table(def).map_err(|x| e(&x))?;
                    for (k, v) in m {
                        match v {
                            Some(v) => t.insert(&**k, &**v).map(drop),
                            None => t.remove(&**k).map(drop),
                        }
                        .map_err(|x| e(&x))?;
                    }
                }
                None => {
                    let mut t = txn.open_table(SYSTEM).map_err(|x| e(&x))?;
                    for (k, v) in m {
                        let name = std::str::from_utf8(k).map_err(|x| e(&x))?;
                        match v {
                            Some(v) => t.insert(name, u64_of(v)).map(drop),
                            None => t.remove(name).map(drop),
                        }
                        .map_err(|x| e(&x))?;
                    }
                }
            }
        }
        {
            let mut sys_t = txn.open_table(SYSTEM).map_err(|x| e(&x))?;
            sys_t.insert(super::sys::JOURNAL_SEQ, seq).map_err(|x| e(&x))?;
            match crc {
                Some(c) => sys_t.insert(super::sys::JOURNAL_CRC, u64::from(c)).map(drop),
                None => sys_t.remove(super::sys::JOURNAL_CRC).map(drop),
            }
            .map_err(|x| e(&x))?;
        }
        let used = txn.stats().map_or(u64::MAX, |s| s.allocated_pages() * s.page_size() as u64);
        before_commit();
        txn.commit().map_err(|x| e(&x))?;
        Ok(used)
    }
}

pub(crate) fn u64_of(v: &[u8]) -> u64 {
    let mut b = [0u8; 8];
    let n = v.len().min(8);
    b[..n].copy_from_slice(&v[..n]);
    u64::from_le_bytes(b)
}

type RoTable = redb::ReadOnlyTable<&'static [u8], &'static [u8]>;

/// A value read through the layers, not copied: borrowed from a memory
/// layer, or the store's own guard of it.
pub enum Val<'a> {
    Mem(&'a [u8]),
    Cold(redb::AccessGuard<'static, &'static [u8]>),
    /// A `system` counter from the store (u64 LE).
    Word([u8; 8]),
}

impl std::ops::Deref for Val<'_> {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            Val::Mem(b) => b,
            Val::Cold(g) => g.value(),
            Val::Word(w) => w,
        }
    }
}

/// The layers below a batch: memory, then the store (its read transaction
/// and tables opened on first use).
pub struct Below<'a> {
    live: &'a Maps,
    frozen: Option<&'a Maps>,
    cold: &'a redb::Database,
    txn: OnceCell<redb::ReadTransaction>,
    tables: [OnceCell<RoTable>; NT],
    system: OnceCell<redb::ReadOnlyTable<&'static str, u64>>,
}

impl<'a> Below<'a> {
    fn new(hot: &'a Hot, cold: &'a redb::Database) -> Below<'a> {
        Below {
            live: &hot.live,
            frozen: hot.frozen.as_deref(),
            cold,
            txn: OnceCell::new(),
            tables: Default::default(),
            system: OnceCell::new(),
        }
    }

    fn txn(&self) -> OpResult<&redb::ReadTransaction> {
        if let Some(t) = self.txn.get() {
            return Ok(t);
        }
        let t = self.cold.begin_read().map_err(|e| OpError::Fatal(e.to_string()))?;
        Ok(self.txn.get_or_init(|| t))
    }

    fn cold_table(&self, tab: Tab) -> OpResult<&RoTable> {
        let cell = &self.tables[tab as usize];
        if let Some(t) = cell.get() {
            return Ok(t);
        }
        let def = tab.def().ok_or_else(|| OpError::Fatal("the system table has no byte keys".into()))?;
        let t = self.txn()?.open_table(def)?;
        Ok(cell.get_or_init(|| t))
    }

    fn memory(&self) -> impl Iterator<Item = &'a Maps> {
        std::iter::once(self.live).chain(self.frozen)
    }

    fn get(&self, tab: Tab, key: &[u8]) -> OpResult<Option<Val<'_>>> {
        for m in self.memory() {
            if let Some(v) = m.t[tab as usize].get(key) {
                return Ok(v.as_deref().map(Val::Mem));
            }
        }
        if tab == Tab::System {
            let t = match self.system.get() {
                Some(t) => t,
                None => {
                    let t = self.txn()?.open_table(SYSTEM)?;
                    self.system.get_or_init(|| t)
                }
            };
            let name = std::str::from_utf8(key).map_err(|e| OpError::Fatal(e.to_string()))?;
            return Ok(t.get(name)?.map(|v| Val::Word(v.value().to_le_bytes())));
        }
        Ok(self.cold_table(tab)?.get(key)?.map(Val::Cold))
    }

    /// Every layer's records of `tab` from `from` on, newest layer first
    /// (`top`: a batch's own layer).
    fn range<'s>(&'s self, tab: Tab, top: Option<&'s Map>, from: Bound<&[u8]>) -> OpResult<Merge<'s>> {
        let mut its: Vec<Layer<'s>> = Vec::with_capacity(4);
        let lo: Bound<Box<[u8]>> = from.map(Box::from);
        let bounds = || (lo.as_ref().map(|b| &**b), Bound::Unbounded::<&[u8]>);
        for m in top.into_iter().chain(self.memory().map(|m| &m.t[tab as usize])) {
            its.push(Box::new(
                m.range::<[u8], _>(bounds()).map(|(k, v)| Ok((Cow::Borrowed(&**k), v.as_deref().map(Cow::Borrowed)))),
            ));
        }
        let cold = self.cold_table(tab)?.range::<&[u8]>(bounds())?;
        its.push(Box::new(cold.map(|r| {
            let (k, v) = r?;
            Ok((Cow::Owned(k.value().to_vec()), Some(Cow::Owned(v.value().to_vec()))))
        })));
        Ok(Merge::new(its))
    }
}

type Item<'a> = (Cow<'a, [u8]>, Option<Cow<'a, [u8]>>);
type Layer<'a> = Box<dyn Iterator<Item = OpResult<Item<'a>>> + 'a>;
/// The `(key, value)` pairs of a range, in key order.
pub type Pairs<'a> = Box<dyn Iterator<Item = OpResult<(Vec<u8>, Vec<u8>)>> + 'a>;

/// Merges sorted layers: for a key in several, the newest layer's version
/// counts; tombstones hide the key.
struct Merge<'a> {
    its: Vec<Layer<'a>>,
    heads: Vec<Option<Item<'a>>>,
    started: bool,
}

impl<'a> Merge<'a> {
    fn new(its: Vec<Layer<'a>>) -> Merge<'a> {
        let heads = its.iter().map(|_| None).collect();
        Merge { its, heads, started: false }
    }

    fn fill(&mut self, i: usize) -> OpResult<()> {
        self.heads[i] = self.its[i].next().transpose()?;
        Ok(())
    }
}

impl Iterator for Merge<'_> {
    type Item = OpResult<(Vec<u8>, Vec<u8>)>;

    fn next(&mut self) -> Option<Self::Item> {
        if !self.started {
            self.started = true;
            for i in 0..self.its.len() {
                if let Err(e) = self.fill(i) {
                    return Some(Err(e));
                }
            }
        }
        loop {
            let mut min: Option<usize> = None;
            for (i, h) in self.heads.iter().enumerate() {
                if let Some((k, _)) = h {
                    // Strictly less: on a tie the newer (lower index) layer stays.
                    if min.is_none_or(|m| k.as_ref() < self.heads[m].as_ref().expect("a head").0.as_ref()) {
                        min = Some(i);
                    }
                }
            }
            let m = min?;
            let (k, v) = self.heads[m].take().expect("a head");
            if let Err(e) = self.fill(m) {
                return Some(Err(e));
            }
            for j in m + 1..self.its.len() {
                if self.heads[j].as_ref().is_some_and(|(k2, _)| *k2 == k) {
                    if let Err(e) = self.fill(j) {
                        return Some(Err(e));
                    }
                }
            }
            if let Some(v) = v {
                return Some(Ok((k.into_owned(), v.into_owned())));
            }
        }
    }
}

/// Reading one table.
pub trait Kv {
    fn get(&self, key: &[u8]) -> OpResult<Option<Val<'_>>>;
    /// The pairs with keys from `from` on, in key order.
    fn range_from(&self, from: Bound<&[u8]>) -> OpResult<Pairs<'_>>;
    fn iter(&self) -> OpResult<Pairs<'_>> {
        self.range_from(Bound::Unbounded)
    }
}

/// One table as a reader sees it.
pub struct TableR<'b> {
    tab: Tab,
    below: &'b Below<'b>,
}

impl Kv for TableR<'_> {
    fn get(&self, key: &[u8]) -> OpResult<Option<Val<'_>>> {
        self.below.get(self.tab, key)
    }
    fn range_from(&self, from: Bound<&[u8]>) -> OpResult<Pairs<'_>> {
        Ok(Box::new(self.below.range(self.tab, None, from)?))
    }
}

/// One table as a batch sees it: its own changes over the layers below.
pub struct TableW<'b> {
    tab: Tab,
    set: Map,
    below: &'b Below<'b>,
}

impl TableW<'_> {
    pub fn insert(&mut self, key: &[u8], val: &[u8]) -> OpResult<()> {
        self.set.insert(key.into(), Some(val.into()));
        Ok(())
    }

    pub fn remove(&mut self, key: &[u8]) -> OpResult<()> {
        self.set.insert(key.into(), None);
        Ok(())
    }

    /// Removes every record with a key in `lo..hi`.
    pub fn remove_range(&mut self, lo: &[u8], hi: &[u8]) -> OpResult<()> {
        let keys: Vec<Vec<u8>> = self
            .range_from(Bound::Included(lo))?
            .map(|r| r.map(|(k, _)| k))
            .take_while(|r| r.as_ref().map_or(true, |k| k.as_slice() < hi))
            .collect::<OpResult<_>>()?;
        for k in keys {
            self.remove(&k)?;
        }
        Ok(())
    }
}

impl Kv for TableW<'_> {
    fn get(&self, key: &[u8]) -> OpResult<Option<Val<'_>>> {
        match self.set.get(key) {
            Some(v) => Ok(v.as_deref().map(Val::Mem)),
            None => self.below.get(self.tab, key),
        }
    }
    fn range_from(&self, from: Bound<&[u8]>) -> OpResult<Pairs<'_>> {
        Ok(Box::new(self.below.range(self.tab, Some(&self.set), from)?))
    }
}

/// Reads a `system` counter (0 if absent).
pub(crate) fn sys_get(t: &impl Kv, key: &str) -> OpResult<u64> {
    Ok(t.get(key.as_bytes())?.map_or(0, |v| u64_of(&v)))
}

pub(crate) fn sys_put(t: &mut TableW<'_>, key: &str, v: u64) -> OpResult<()> {
    t.insert(key.as_bytes(), &v.to_le_bytes())
}

macro_rules! tables {
    ($($field:ident: $tab:ident),* $(,)?) => {
        /// Every table of one batch of the writer. Writes note which leased
        /// records they changed ([`LeaseKey`], see `leases`).
        pub struct Tables<'b> {
            $(pub $field: TableW<'b>,)*
            /// Non-directory inodes and names written or removed since the
            /// writer last took the list: what cached copies they change.
            pub touched: Vec<LeaseKey>,
        }

        impl<'b> Tables<'b> {
            fn new(below: &'b Below<'b>) -> Tables<'b> {
                Tables { $($field: TableW { tab: Tab::$tab, set: Map::new(), below },)* touched: Vec::new() }
            }

            /// The batch's changes, by table number.
            fn into_changes(self) -> [Map; NT] {
                let mut out: [Map; NT] = Default::default();
                $(out[Tab::$tab as usize] = self.$field.set;)*
                out
            }
        }

        /// Every table as a reader sees it.
        pub struct ReadTables<'b> {
            $(pub $field: TableR<'b>,)*
        }

        impl<'b> ReadTables<'b> {
            fn new(below: &'b Below<'b>) -> ReadTables<'b> {
                ReadTables { $($field: TableR { tab: Tab::$tab, below },)* }
            }
        }
    };
}

tables! {
    dentries: Dentries,
    inodes: Inodes,
    xattrs: Xattrs,
    disposal: Disposal,
    intents: Intents,
    locked: Locked,
    dirx: Dirx,
    peer_done: PeerDone,
    replies: Replies,
    system: System,
    usage: Usage,
}

/// A batch's changes as one journal record body (table order, then key order).
pub fn encode_changes(changes: &[Map; NT], out: &mut Vec<u8>) {
    for (i, m) in changes.iter().enumerate() {
        for (k, v) in m {
            super::journal::put_change(out, i as u8, k, v.as_deref());
        }
    }
}

/// The changes of a journal record body.
pub fn decode_changes(body: &[u8]) -> Result<[Map; NT], String> {
    let mut out: [Map; NT] = Default::default();
    for (t, k, v) in super::journal::changes(body)? {
        let tab = Tab::from_u8(t).ok_or_else(|| format!("unknown table {t}"))?;
        out[tab as usize].insert(k.into(), v.map(Box::from));
    }
    Ok(out)
}

/// A store with every table and nothing in it (tests).
#[cfg(test)]
pub(crate) fn test_mem() -> (tempfile::TempDir, Mem) {
    let d = tempfile::tempdir().unwrap();
    let db = redb::Database::create(d.path().join("m.redb")).unwrap();
    let txn = db.begin_write().unwrap();
    for t in Tab::ALL {
        match t.def() {
            Some(def) => drop(txn.open_table(def).unwrap()),
            None => drop(txn.open_table(SYSTEM).unwrap()),
        }
    }
    txn.commit().unwrap();
    (d, Mem::new(Arc::new(db)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mem() -> (tempfile::TempDir, Mem) {
        test_mem()
    }

    fn put(m: &Mem, pairs: &[(&str, Option<&str>)]) {
        let ((), c) = m
            .batch(|t| {
                for (k, v) in pairs {
                    match v {
                        Some(v) => t.dentries.insert(k.as_bytes(), v.as_bytes())?,
                        None => t.dentries.remove(k.as_bytes())?,
                    }
                }
                Ok(())
            })
            .unwrap();
        let mut body = Vec::new();
        encode_changes(&c, &mut body);
        m.apply(decode_changes(&body).unwrap());
    }

    fn all(m: &Mem, from: Bound<&[u8]>) -> Vec<(String, String)> {
        m.read(|t| {
            t.dentries
                .range_from(from)?
                .map(|r| r.map(|(k, v)| (String::from_utf8(k).unwrap(), String::from_utf8(v).unwrap())))
                .collect()
        })
        .unwrap()
    }

    fn pairs(s: &[(&str, &str)]) -> Vec<(String, String)> {
        s.iter().map(|(a, b)| (a.to_string(), b.to_string())).collect()
    }

    #[test]
    fn layers_merge_newest_first_and_tombstones_hide() {
        let (_d, m) = mem();
        put(&m, &[("a", Some("1")), ("b", Some("1")), ("c", Some("1"))]);
        let f = m.freeze().unwrap();
        m.write_checkpoint(&f, 1, None, &|| ()).unwrap();
        m.unfreeze();
        // cold: a b c
        put(&m, &[("b", None), ("d", Some("2"))]);
        let f = m.freeze().unwrap();
        // frozen: -b d; live below:
        put(&m, &[("a", Some("3")), ("d", None), ("e", Some("3"))]);
        assert_eq!(all(&m, Bound::Unbounded), pairs(&[("a", "3"), ("c", "1"), ("e", "3")]));
        assert_eq!(all(&m, Bound::Excluded(b"a")), pairs(&[("c", "1"), ("e", "3")]));
        // A batch's own layer on top, read before it is applied.
        let (seen, _) = m
            .batch(|t| {
                t.dentries.insert(b"b", b"4")?;
                t.dentries.remove(b"c")?;
                let got = t.dentries.get(b"b")?.map(|v| v.to_vec());
                let range: Vec<_> = t.dentries.iter()?.map(|r| r.unwrap().0).collect();
                Ok((got, range))
            })
            .unwrap();
        assert_eq!(seen, (Some(b"4".to_vec()), vec![b"a".to_vec(), b"b".to_vec(), b"e".to_vec()]));
        // Not applied: nobody sees it.
        assert!(m.read(|t| Ok(t.dentries.get(b"b")?.is_none())).unwrap());
        m.write_checkpoint(&f, 2, None, &|| ()).unwrap();
        m.unfreeze();
        assert_eq!(all(&m, Bound::Unbounded), pairs(&[("a", "3"), ("c", "1"), ("e", "3")]));
        let f = m.freeze().unwrap();
        m.write_checkpoint(&f, 3, None, &|| ()).unwrap();
        m.unfreeze();
        assert_eq!(m.hot().live.records, 0);
        assert_eq!(all(&m, Bound::Unbounded), pairs(&[("a", "3"), ("c", "1"), ("e", "3")]));
        let seq = m.read(|t| Ok(t.system.get(super::super::sys::JOURNAL_SEQ.as_bytes())?.map(|v| u64_of(&v)))).unwrap();
        assert_eq!(seq, Some(3));
    }

    #[test]
    fn remove_range_and_system_counters() {
        let (_d, m) = mem();
        put(&m, &[("k1", Some("x")), ("k2", Some("x")), ("k3", Some("x"))]);
        let ((), c) = m
            .batch(|t| {
                t.dentries.remove_range(b"k1", b"k3")?;
                sys_put(&mut t.system, "files", 7)
            })
            .unwrap();
        m.apply(c);
        assert_eq!(all(&m, Bound::Unbounded), pairs(&[("k3", "x")]));
        let f = m.freeze().unwrap();
        m.write_checkpoint(&f, 1, None, &|| ()).unwrap();
        m.unfreeze();
        assert_eq!(m.read(|t| sys_get(&t.system, "files")).unwrap(), 7);
    }

    /// Random batches, frozen and checkpointed at random points, read the
    /// same as one plain map.
    #[test]
    fn random_histories_read_like_a_plain_map() {
        use rand::{Rng, SeedableRng};
        for seed in 0..20u64 {
            let (_d, m) = mem();
            let mut model = BTreeMap::<Vec<u8>, Vec<u8>>::new();
            let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
            let mut frozen: Option<Arc<Maps>> = None;
            for step in 0..300u64 {
                let n = rng.gen_range(1..5);
                let ops: Vec<(Vec<u8>, Option<Vec<u8>>)> = (0..n)
                    .map(|_| {
                        let k = vec![rng.gen_range(0..30u8)];
                        let v = rng.gen_bool(0.7).then(|| step.to_le_bytes().to_vec());
                        (k, v)
                    })
                    .collect();
                let ((), c) = m
                    .batch(|t| {
                        for (k, v) in &ops {
                            match v {
                                Some(v) => t.inodes.insert(k, v)?,
                                None => t.inodes.remove(k)?,
                            }
                        }
                        Ok(())
                    })
                    .unwrap();
                m.apply(c);
                for (k, v) in ops {
                    match v {
                        Some(v) => model.insert(k, v),
                        None => model.remove(&k),
                    };
                }
                match rng.gen_range(0..10) {
                    0 if frozen.is_none() => frozen = m.freeze(),
                    1 => {
                        if let Some(f) = frozen.take() {
                            m.write_checkpoint(&f, step, None, &|| ()).unwrap();
                            m.unfreeze();
                        }
                    }
                    _ => {}
                }
                let got: Vec<(Vec<u8>, Vec<u8>)> = m.read(|t| t.inodes.iter()?.collect()).unwrap();
                let want: Vec<(Vec<u8>, Vec<u8>)> = model.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
                assert_eq!(got, want, "seed {seed} step {step}");
                let k = [rng.gen_range(0..30u8)];
                let got = m.read(|t| Ok(t.inodes.get(&k)?.map(|v| v.to_vec()))).unwrap();
                assert_eq!(got, model.get(&k[..]).cloned(), "seed {seed}");
            }
        }
    }
}
