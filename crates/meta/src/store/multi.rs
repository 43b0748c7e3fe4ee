//! Records of several metadata nodes: directory settings kept beside the
//! inode (`dir_extra`) and the intents of cross-node operations (`intents`,
//! with the dentries they hold in `locked_dentries`). The protocol that
//! writes them is in `cross`.

use super::{child_key, encode, get_record, id_key, q, Dentry, Inode, OpResult, Tables};
use crate::store::Kv;
use hivefs_proto::{MetaChooser, OpId};
use hivefs_types::attr::FileKind;
use hivefs_types::ids::{EntryId, NodeId};
use serde::{Deserialize, Serialize};

/// Settings of a directory kept beside its inode (table `dir_extra`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DirExtra {
    /// Node owning the parent directory when it is not this node.
    pub parent_owner: Option<NodeId>,
    /// Metadata-node chooser for new subdirectories; `None`: balanced.
    pub chooser: Option<MetaChooser>,
}

/// Extended attributes as `(name, value)` pairs.
pub type Xattrs = Vec<(Vec<u8>, Vec<u8>)>;

/// A cross-node operation between its intent and its commit.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Intent {
    /// The client's operation, answered at the commit.
    pub op: Option<OpId>,
    pub step: IntentStep,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum IntentStep {
    /// The dentry `parent/name` (naming `id` on `owner`) is written; the
    /// inode on `owner` is to be created.
    Mkdir { parent: EntryId, name: Vec<u8>, id: EntryId, owner: NodeId, inode: Inode, chooser: Option<MetaChooser> },
    /// Directory `id` on `owner` is to be removed, then the dentry.
    Rmdir { parent: EntryId, name: Vec<u8>, id: EntryId, owner: NodeId },
    /// `parent/name` (naming `id` of `kind` on `owner`) moves to
    /// `new_parent/new_name` on `new_owner`; `moved` is a file's inode and
    /// xattrs when they move with it.
    Rename {
        parent: EntryId,
        name: Vec<u8>,
        new_parent: EntryId,
        new_owner: NodeId,
        new_name: Vec<u8>,
        flags: u32,
        id: EntryId,
        kind: FileKind,
        owner: NodeId,
        moved: Option<(Inode, Xattrs)>,
    },
    /// File `id` (here, its link count already raised) gets the dentry
    /// `new_parent/new_name` on `new_owner`.
    Link { new_parent: EntryId, new_owner: NodeId, new_name: Vec<u8>, id: EntryId, kind: FileKind },
    /// The dentry `parent/name` names file `id` on `owner`: one link is
    /// dropped there, then the dentry goes.
    Unlink { parent: EntryId, name: Vec<u8>, id: EntryId, owner: NodeId },
    /// `parent/name` (naming `a`) and `new_parent/new_name` on `new_owner`
    /// (naming `b`) swap what they name.
    Exchange {
        parent: EntryId,
        name: Vec<u8>,
        new_parent: EntryId,
        new_owner: NodeId,
        new_name: Vec<u8>,
        a: Dentry,
        b: Dentry,
    },
    /// A [`IntentStep::Mkdir`] whose new directory also gets `xattrs` (the
    /// ACLs it inherits from its parent's default ACL, which lives here). A
    /// variant of its own, so the intents recorded before ACL inheritance
    /// read as they are (no new store format).
    MkdirXattrs {
        parent: EntryId,
        name: Vec<u8>,
        id: EntryId,
        owner: NodeId,
        inode: Inode,
        chooser: Option<MetaChooser>,
        xattrs: Xattrs,
    },
}

impl IntentStep {
    /// The local dentry the intent holds.
    pub(crate) fn dentry_key(&self) -> Vec<u8> {
        match self {
            IntentStep::Mkdir { parent, name, .. }
            | IntentStep::MkdirXattrs { parent, name, .. }
            | IntentStep::Rmdir { parent, name, .. }
            | IntentStep::Unlink { parent, name, .. }
            | IntentStep::Exchange { parent, name, .. }
            | IntentStep::Rename { parent, name, .. } => child_key(*parent, name),
            // The name on the other node: no local dentry is held.
            IntentStep::Link { new_parent, new_name, .. } => child_key(*new_parent, new_name),
        }
    }

    pub(crate) fn op_name(&self) -> &'static str {
        match self {
            IntentStep::Mkdir { .. } | IntentStep::MkdirXattrs { .. } => "mkdir",
            IntentStep::Rmdir { .. } => "rmdir",
            IntentStep::Rename { .. } => "rename",
            IntentStep::Link { .. } => "link",
            IntentStep::Unlink { .. } => "unlink",
            IntentStep::Exchange { .. } => "exchange",
        }
    }
}

impl std::fmt::Display for Intent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.step {
            IntentStep::Mkdir { parent, name, id, owner, .. }
            | IntentStep::MkdirXattrs { parent, name, id, owner, .. } => {
                write!(f, "mkdir {parent}/{} ({id}) on metadata node {owner}", q(name))
            }
            IntentStep::Rmdir { parent, name, id, owner, .. } => {
                write!(f, "rmdir {parent}/{} ({id}) on metadata node {owner}", q(name))
            }
            IntentStep::Rename { parent, name, new_parent, new_owner, new_name, id, .. } => write!(
                f,
                "rename {parent}/{} ({id}) to {new_parent}/{} on metadata node {new_owner}",
                q(name),
                q(new_name)
            ),
            IntentStep::Link { new_parent, new_owner, new_name, id, .. } => {
                write!(f, "link {id} as {new_parent}/{} on metadata node {new_owner}", q(new_name))
            }
            IntentStep::Unlink { parent, name, id, owner } => {
                write!(f, "unlink {parent}/{} ({id}) on metadata node {owner}", q(name))
            }
            IntentStep::Exchange { parent, name, new_parent, new_owner, new_name, a, b } => write!(
                f,
                "exchange {parent}/{} ({}) with {new_parent}/{} ({}) on metadata node {new_owner}",
                q(name),
                a.id,
                q(new_name),
                b.id
            ),
        }
    }
}

pub(crate) fn load_dirx<T: Kv>(t: &T, id: EntryId) -> OpResult<Option<DirExtra>> {
    get_record(t, "dir_extra", id)
}

pub(crate) fn put_dirx(t: &mut Tables<'_>, id: EntryId, x: &DirExtra) -> OpResult<()> {
    if *x == DirExtra::default() {
        t.dirx.remove(id_key(id).as_slice())?;
    } else {
        t.dirx.insert(id_key(id).as_slice(), encode(x).as_slice())?;
    }
    Ok(())
}

pub(crate) fn load_intent<T: Kv>(t: &T, iid: EntryId) -> OpResult<Option<Intent>> {
    get_record(t, "intent", iid)
}

pub(crate) fn put_intent(t: &mut Tables<'_>, iid: EntryId, i: &Intent) -> OpResult<()> {
    t.intents.insert(id_key(iid).as_slice(), encode(i).as_slice())?;
    t.locked.insert(i.step.dentry_key().as_slice(), id_key(iid).as_slice())?;
    Ok(())
}

pub(crate) fn clear_intent(t: &mut Tables<'_>, iid: EntryId) -> OpResult<Option<Intent>> {
    let i = load_intent(&t.intents, iid)?;
    if let Some(i) = &i {
        t.intents.remove(id_key(iid).as_slice())?;
        t.locked.remove(i.step.dentry_key().as_slice())?;
    }
    Ok(i)
}
