//! Cross-node rmdir: the transactions of a directory removed from another
//! metadata node: the intent (dentry held), the removal on the owner (emptiness
//! checked there), and the commit.

use super::*;

/// Coordinator: holds the dentry of directory `parent/name` (owned elsewhere) and records the
/// intent.
#[derive(Clone, Debug)]
pub struct RmdirIntent {
    pub intent: EntryId,
    pub parent: EntryId,
    pub name: Vec<u8>,
    pub op: Option<OpId>,
}

/// Coordinator: the owner removed the directory: the dentry goes and the parent loses a link.
#[derive(Clone, Debug)]
pub struct RmdirCommit {
    pub intent: EntryId,
}

/// Owner: removes empty directory `id` (idempotent: a missing one is fine).
#[derive(Clone, Debug)]
pub struct PeerRemoveDir {
    pub id: EntryId,
}

impl RmdirIntent {
    pub(super) fn apply(self, t: &mut Tables<'_>, ctx: &mut Ctx<'_>) -> OpResult<Reply> {
        let RmdirIntent { intent, parent, name, op } = self;
        let node = ctx.node;
        check_name(&name)?;
        dir_inode(&t.inodes, parent)?;
        let d = dentry(&t.dentries, parent, &name)?;
        if d.kind != FileKind::Dir {
            return Err(fs_err!(NotDir, "{} in directory {parent} is not a directory", q(&name)).into());
        }
        check_unlocked(t, parent, &name)?;
        if d.owner == node {
            return Err(fs_err!(Busy, "directory {} in {parent} changed during rmdir; try again", q(&name)).into());
        }
        put_intent(t, intent, &Intent { op, step: IntentStep::Rmdir { parent, name, id: d.id, owner: d.owner } })?;
        Ok(Reply::Ok)
    }
}

impl RmdirCommit {
    pub(super) fn apply(self, t: &mut Tables<'_>, ctx: &mut Ctx<'_>) -> OpResult<Reply> {
        let RmdirCommit { intent } = self;
        if let Some(Intent { step: IntentStep::Rmdir { parent, name, id, .. }, .. }) = clear_intent(t, intent)? {
            remove_held(t, ctx.now, parent, &name, id, 1)?;
        }
        Ok(Reply::Ok)
    }
}

impl PeerRemoveDir {
    pub(super) fn apply(self, t: &mut Tables<'_>, ctx: &mut Ctx<'_>) -> OpResult<Reply> {
        let PeerRemoveDir { id } = self;
        let node = ctx.node;
        let Some(i) = load_inode(&t.inodes, id)? else { return Ok(Reply::Ok) };
        if i.kind != FileKind::Dir {
            return Err(fs_err!(NotDir, "{id} on metadata node {node} is not a directory").into());
        }
        if !is_empty_dir(&t.dentries, id)? {
            return Err(fs_err!(NotEmpty, "directory {id} on metadata node {node} is not empty").into());
        }
        t.remove_inode(id)?;
        ctx.dirs_delta -= 1;
        Ok(Reply::Ok)
    }
}
