//! Typed writes of the records of [`super`] through a batch's
//! [`Tables`], and the error of work over them. Writes note which leased
//! records they changed ([`LeaseKey`]). No namespace rule lives here (those
//! are in `ops`).

use super::mem::{Kv, Tables};
use super::{child_key, decode, encode, id_key, scan_children, Dentry, Disposal, Inode};
use hivefs_types::attr::FileKind;
use hivefs_types::error::FsError;
use hivefs_types::ids::EntryId;

/// A record whose cached copies a change makes stale (see `leases`).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum LeaseKey {
    /// The attributes of a non-directory inode.
    Attr(EntryId),
    /// The name `name` in directory `parent` (which entry it names).
    Name(EntryId, Box<[u8]>),
    /// The set of names in a directory (a name added).
    Names(EntryId),
}

/// Why an operation failed.
#[derive(Debug)]
pub enum OpError {
    /// A POSIX-level refusal (before any write): answered to this caller only.
    Fs(FsError),
    /// The store failed or holds a corrupt record: the batch is aborted.
    Fatal(String),
}

/// The refusal's message, or the store failure's.
impl std::fmt::Display for OpError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            OpError::Fs(e) => e.fmt(f),
            OpError::Fatal(m) => f.write_str(m),
        }
    }
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

impl Tables<'_> {
    /// Writes an inode record, and moves its quota usage (`usage`).
    pub(crate) fn put_inode(&mut self, id: EntryId, inode: &Inode) -> OpResult<()> {
        if inode.kind != FileKind::Dir {
            self.touched.push(LeaseKey::Attr(id));
        }
        // Most writes (times, a parent's link count) move no usage: told
        // from the old record's first fields, without decoding all of it.
        let unchanged = self.inodes.get(id_key(id).as_slice())?.is_some_and(|v| super::usage::moves_nothing(&v, inode));
        if !unchanged {
            let old = self.old_inode(id)?;
            super::usage::account(&mut self.usage, old.as_ref(), Some(inode))?;
        }
        self.inodes.insert(id_key(id).as_slice(), encode(inode).as_slice())?;
        Ok(())
    }

    fn old_inode(&self, id: EntryId) -> OpResult<Option<Inode>> {
        match self.inodes.get(id_key(id).as_slice())? {
            Some(v) => Ok(Some(decode("inode", id, &v).map_err(OpError::Fatal)?)),
            None => Ok(None),
        }
    }

    pub(crate) fn put_dentry(&mut self, parent: EntryId, name: &[u8], d: &Dentry) -> OpResult<()> {
        self.touched.push(LeaseKey::Name(parent, name.into()));
        self.touched.push(LeaseKey::Names(parent));
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
        let old = self.old_inode(id)?;
        super::usage::account(&mut self.usage, old.as_ref(), None)?;
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
