//! The tables of one transaction and the error of work over them.
//!
//! [`Tables`] (a write transaction, opened once per batch) and
//! [`ReadTables`] (a read transaction, tables opened on first use) give
//! typed access to the records of [`super`]; writes through [`Tables`] note
//! which leased records they changed ([`LeaseKey`]). No namespace rule lives
//! here (those are in `ops`).

use super::{child_key, encode, id_key, scan_children, Dentry, Disposal, Inode};
use hivefs_types::attr::FileKind;
use hivefs_types::error::FsError;
use hivefs_types::ids::EntryId;
use redb::{Table, WriteTransaction};

/// A record whose cached copies a change makes stale (see `leases`).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum LeaseKey {
    /// The attributes of a non-directory inode.
    Attr(EntryId),
    /// The name `name` in directory `parent` (which entry it names).
    Name(EntryId, Box<[u8]>),
}

/// Why an operation failed.
#[derive(Debug)]
pub enum OpError {
    /// A POSIX-level refusal (before any write): answered to this caller only.
    Fs(FsError),
    /// The store failed or holds a corrupt record: the batch is aborted.
    Fatal(String),
}

impl From<FsError> for OpError {
    fn from(e: FsError) -> Self {
        OpError::Fs(e)
    }
}

macro_rules! fatal_from {
    ($($t:ty),*) => {$(
        impl From<$t> for OpError {
            fn from(e: $t) -> Self {
                OpError::Fatal(e.to_string())
            }
        }
    )*};
}
fatal_from!(redb::StorageError, redb::TableError, redb::Error);

pub type OpResult<T> = Result<T, OpError>;

/// The tables of one write transaction, opened once per batch.
pub struct Tables<'txn> {
    pub dentries: Table<'txn, &'static [u8], &'static [u8]>,
    pub inodes: Table<'txn, &'static [u8], &'static [u8]>,
    pub xattrs: Table<'txn, &'static [u8], &'static [u8]>,
    pub disposal: Table<'txn, &'static [u8], &'static [u8]>,
    pub intents: Table<'txn, &'static [u8], &'static [u8]>,
    pub locked: Table<'txn, &'static [u8], &'static [u8]>,
    pub dirx: Table<'txn, &'static [u8], &'static [u8]>,
    pub peer_done: Table<'txn, &'static [u8], &'static [u8]>,
    /// Non-directory inodes and names written or removed since the writer
    /// last took the list: what cached copies they change (see `leases`).
    pub touched: Vec<LeaseKey>,
}

impl<'txn> Tables<'txn> {
    pub fn open(txn: &'txn WriteTransaction) -> OpResult<Tables<'txn>> {
        Ok(Tables {
            dentries: txn.open_table(super::DENTRIES)?,
            inodes: txn.open_table(super::INODES)?,
            xattrs: txn.open_table(super::XATTRS)?,
            disposal: txn.open_table(super::DISPOSAL)?,
            intents: txn.open_table(super::INTENTS)?,
            locked: txn.open_table(super::LOCKED)?,
            dirx: txn.open_table(super::DIRX)?,
            peer_done: txn.open_table(super::PEER_DONE)?,
            touched: Vec::new(),
        })
    }

    pub(crate) fn put_inode(&mut self, id: EntryId, inode: &Inode) -> OpResult<()> {
        if inode.kind != FileKind::Dir {
            self.touched.push(LeaseKey::Attr(id));
        }
        self.inodes.insert(id_key(id).as_slice(), encode(inode).as_slice())?;
        Ok(())
    }

    pub(crate) fn put_dentry(&mut self, parent: EntryId, name: &[u8], d: &Dentry) -> OpResult<()> {
        self.touched.push(LeaseKey::Name(parent, name.into()));
        self.dentries.insert(child_key(parent, name).as_slice(), encode(d).as_slice())?;
        Ok(())
    }

    pub(crate) fn remove_dentry(&mut self, parent: EntryId, name: &[u8]) -> OpResult<()> {
        self.touched.push(LeaseKey::Name(parent, name.into()));
        self.dentries.remove(child_key(parent, name).as_slice())?;
        Ok(())
    }

    pub(crate) fn put_disposal(&mut self, id: EntryId, d: &Disposal) -> OpResult<()> {
        self.disposal.insert(id_key(id).as_slice(), encode(d).as_slice())?;
        Ok(())
    }

    /// Removes an inode and all its extended attributes.
    pub(crate) fn remove_inode(&mut self, id: EntryId) -> OpResult<()> {
        self.touched.push(LeaseKey::Attr(id));
        self.inodes.remove(id_key(id).as_slice())?;
        self.dirx.remove(id_key(id).as_slice())?;
        let names: Vec<Vec<u8>> =
            scan_children(&self.xattrs, id, None)?.map(|r| r.map(|(n, _)| n)).collect::<Result<_, _>>()?;
        for n in names {
            self.xattrs.remove(child_key(id, &n).as_slice())?;
        }
        Ok(())
    }
}

type Rt = redb::ReadOnlyTable<&'static [u8], &'static [u8]>;

/// The tables of one read transaction. Names and inodes, which nearly every
/// read needs, are opened at once; the others on first use (opening a table
/// looks it up in the store's table tree, a cost every request paid for all
/// seven).
pub struct ReadTables<'txn> {
    txn: &'txn redb::ReadTransaction,
    pub dentries: Rt,
    pub inodes: Rt,
    xattrs: std::cell::OnceCell<Rt>,
    disposal: std::cell::OnceCell<Rt>,
    intents: std::cell::OnceCell<Rt>,
    dirx: std::cell::OnceCell<Rt>,
    peer_done: std::cell::OnceCell<Rt>,
}

impl<'txn> ReadTables<'txn> {
    pub fn open(txn: &'txn redb::ReadTransaction) -> OpResult<ReadTables<'txn>> {
        Ok(ReadTables {
            txn,
            dentries: txn.open_table(super::DENTRIES)?,
            inodes: txn.open_table(super::INODES)?,
            xattrs: Default::default(),
            disposal: Default::default(),
            intents: Default::default(),
            dirx: Default::default(),
            peer_done: Default::default(),
        })
    }

    fn lazy<'a>(
        &self,
        cell: &'a std::cell::OnceCell<Rt>,
        def: redb::TableDefinition<'static, &'static [u8], &'static [u8]>,
    ) -> OpResult<&'a Rt> {
        if let Some(t) = cell.get() {
            return Ok(t);
        }
        let t = self.txn.open_table(def)?;
        Ok(cell.get_or_init(|| t))
    }

    pub fn xattr_table(&self) -> OpResult<&Rt> {
        self.lazy(&self.xattrs, super::XATTRS)
    }

    pub fn disposal_table(&self) -> OpResult<&Rt> {
        self.lazy(&self.disposal, super::DISPOSAL)
    }

    pub fn intent_table(&self) -> OpResult<&Rt> {
        self.lazy(&self.intents, super::INTENTS)
    }

    pub fn dirx_table(&self) -> OpResult<&Rt> {
        self.lazy(&self.dirx, super::DIRX)
    }

    pub fn peer_done_table(&self) -> OpResult<&Rt> {
        self.lazy(&self.peer_done, super::PEER_DONE)
    }
}
