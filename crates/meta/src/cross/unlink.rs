//! Cross-node unlink: the transactions of a name whose file lives on another
//! metadata node: the intent (dentry held), the dropped link on the owner, and
//! the commit.

use super::*;

/// Coordinator: holds the dentry `parent/name` of a file stored elsewhere and records the intent.
#[derive(Clone, Debug)]
pub struct UnlinkIntent {
    pub intent: EntryId,
    pub parent: EntryId,
    pub name: Vec<u8>,
    pub op: Option<OpId>,
}

/// Coordinator: the owner dropped the link: the dentry goes.
#[derive(Clone, Debug)]
pub struct UnlinkCommit {
    pub intent: EntryId,
}

/// Owner: drops one link of file `id` (the file goes with its last), recorded under `intent`.
#[derive(Clone, Debug)]
pub struct PeerDropLink {
    pub intent: EntryId,
    pub id: EntryId,
}

impl UnlinkIntent {
    pub(super) fn apply(self, t: &mut Tables<'_>, ctx: &mut Ctx<'_>) -> OpResult<Reply> {
        let UnlinkIntent { intent, parent, name, op } = self;
        let node = ctx.node;
        check_name(&name)?;
        dir_inode(&t.inodes, parent)?;
        let d = dentry(&t.dentries, parent, &name)?;
        if d.kind == FileKind::Dir {
            return Err(fs_err!(IsDir, "{} in directory {parent} is a directory (use rmdir)", q(&name)).into());
        }
        check_unlocked(t, parent, &name)?;
        if d.owner == node {
            return Err(fs_err!(Busy, "{} in {parent} changed during unlink; try again", q(&name)).into());
        }
        put_intent(t, intent, &Intent { op, step: IntentStep::Unlink { parent, name, id: d.id, owner: d.owner } })?;
        Ok(Reply::Ok)
    }
}

impl UnlinkCommit {
    pub(super) fn apply(self, t: &mut Tables<'_>, ctx: &mut Ctx<'_>) -> OpResult<Reply> {
        let UnlinkCommit { intent } = self;
        if let Some(Intent { step: IntentStep::Unlink { parent, name, id, .. }, .. }) = clear_intent(t, intent)? {
            remove_held(t, ctx.now, parent, &name, id, 0)?;
        }
        Ok(Reply::Ok)
    }
}

impl PeerDropLink {
    pub(super) fn apply(self, t: &mut Tables<'_>, ctx: &mut Ctx<'_>) -> OpResult<Reply> {
        let PeerDropLink { intent, id } = self;
        let node = ctx.node;
        if t.peer_done.get(id_key(intent).as_slice())?.is_some() {
            return Ok(Reply::Ok);
        }
        if let Some(i) = load_inode(&t.inodes, id)? {
            if i.kind == FileKind::Dir {
                return Err(fs_err!(IsDir, "{id} on metadata node {node} is a directory (use rmdir)").into());
            }
            drop_link(t, ctx, id, i)?;
        }
        t.peer_done.insert(id_key(intent).as_slice(), [].as_slice())?;
        Ok(Reply::Ok)
    }
}
