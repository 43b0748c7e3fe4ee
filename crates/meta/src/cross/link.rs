//! Cross-node link: the transactions of a hard link named in a directory of
//! another metadata node: the intent (link count raised here), the dentry on
//! the peer, and the commit or undo.

use super::*;

/// Raises the link count of file `id` and records the intent to name
/// it as `new_parent/new_name` on `new_owner`.
#[derive(Clone, Debug)]
pub struct LinkIntent {
    pub intent: EntryId,
    pub id: EntryId,
    pub new_parent: EntryId,
    pub new_owner: NodeId,
    pub new_name: Vec<u8>,
    pub op: Option<OpId>,
}

/// Coordinator: the peer wrote the dentry: the intent goes.
#[derive(Clone, Debug)]
pub struct LinkCommit {
    pub intent: EntryId,
}

/// The dentry was refused: the raised link is dropped again.
#[derive(Clone, Debug)]
pub struct LinkAbort {
    pub intent: EntryId,
    pub err: FsError,
}

/// Peer: writes `new_parent/new_name` naming `dentry`, recorded under `intent`.
#[derive(Clone, Debug)]
pub struct PeerLinkIn {
    pub intent: EntryId,
    pub new_parent: EntryId,
    pub new_name: Vec<u8>,
    pub dentry: Dentry,
}

impl LinkIntent {
    pub(super) fn apply(self, t: &mut Tables<'_>, ctx: &mut Ctx<'_>) -> OpResult<Reply> {
        let LinkIntent { intent, id, new_parent, new_owner, new_name, op } = self;
        let node = ctx.node;
        check_name(&new_name)?;
        refuse_moving(ctx, id)?;
        let mut i = inode(&t.inodes, id)?;
        if i.kind == FileKind::Dir {
            return Err(fs_err!(NotPermitted, "cannot hard-link directory {id}").into());
        }
        if i.nlink == 0 {
            return Err(fs_err!(NotFound, "entry {id} was unlinked; it cannot get a new name").into());
        }
        if i.nlink >= LINK_MAX {
            return Err(fs_err!(TooManyLinks, "entry {id} already has {} links", i.nlink).into());
        }
        i.nlink += 1;
        i.ctime = ctx.now;
        t.put_inode(id, &i)?;
        let step = IntentStep::Link { new_parent, new_owner, new_name, id, kind: i.kind };
        put_intent(t, intent, &Intent { op, step })?;
        Ok(Reply::Entry(to_attr(id, &i, node)))
    }
}

impl LinkCommit {
    pub(super) fn apply(self, t: &mut Tables<'_>, ctx: &mut Ctx<'_>) -> OpResult<Reply> {
        let LinkCommit { intent } = self;
        let node = ctx.node;
        let id = match clear_intent(t, intent)? {
            Some(Intent { step: IntentStep::Link { id, .. }, .. }) => id,
            _ => return Err(fs_err!(Busy, "cross-node link {intent} already finished").into()),
        };
        let i = inode(&t.inodes, id)?;
        Ok(Reply::Entry(to_attr(id, &i, node)))
    }
}

impl LinkAbort {
    pub(super) fn apply(self, t: &mut Tables<'_>, ctx: &mut Ctx<'_>) -> OpResult<Reply> {
        let LinkAbort { intent, err } = self;
        if let Some(Intent { step: IntentStep::Link { id, .. }, .. }) = clear_intent(t, intent)? {
            if let Some(i) = load_inode(&t.inodes, id)? {
                drop_link(t, ctx, id, i)?;
            }
        }
        Err(err.into())
    }
}

impl PeerLinkIn {
    pub(super) fn apply(self, t: &mut Tables<'_>, ctx: &mut Ctx<'_>) -> OpResult<Reply> {
        let PeerLinkIn { intent, new_parent, new_name, dentry: d } = self;
        if t.peer_done.get(id_key(intent).as_slice())?.is_some() {
            return Ok(Reply::Ok);
        }
        check_name(&new_name)?;
        let mut pdir = dir_inode(&t.inodes, new_parent)?;
        if load_dentry(&t.dentries, new_parent, &new_name)?.is_some() {
            return Err(fs_err!(Exists, "entry {} already exists in directory {new_parent}", q(&new_name)).into());
        }
        t.put_dentry(new_parent, &new_name, &d)?;
        touch_dir(&mut pdir, ctx.now);
        t.put_inode(new_parent, &pdir)?;
        t.peer_done.insert(id_key(intent).as_slice(), [].as_slice())?;
        Ok(Reply::Ok)
    }
}
