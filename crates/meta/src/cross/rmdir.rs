//! Cross-node rmdir: the transactions of a directory removed from another
//! metadata node: the intent (dentry held), the removal on the owner (emptiness
//! checked there), and the commit.

use super::*;

pub(super) fn rmdir_intent(
    t: &mut Tables<'_>,
    ctx: &mut Ctx<'_>,
    intent: EntryId,
    parent: EntryId,
    name: Vec<u8>,
    op: Option<OpId>,
) -> OpResult<Reply> {
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

pub(super) fn rmdir_commit(t: &mut Tables<'_>, ctx: &mut Ctx<'_>, intent: EntryId) -> OpResult<Reply> {
    if let Some(Intent { step: IntentStep::Rmdir { parent, name, id, .. }, .. }) = clear_intent(t, intent)? {
        remove_held(t, ctx.now, parent, &name, id, 1)?;
    }
    Ok(Reply::Ok)
}

pub(super) fn peer_remove_dir(t: &mut Tables<'_>, ctx: &mut Ctx<'_>, id: EntryId) -> OpResult<Reply> {
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
