//! Cross-node mkdir: the transactions of a directory created on another
//! metadata node: the intent (dentry and parent link count written here), the
//! new inode on the owner, and the commit or undo.

use super::*;

#[allow(clippy::too_many_arguments)]
pub(super) fn mkdir_intent(
    t: &mut Tables<'_>,
    ctx: &mut Ctx<'_>,
    intent: EntryId,
    parent: EntryId,
    name: Vec<u8>,
    mode: u32,
    uid: u32,
    gid: u32,
    owner: NodeId,
    op: Option<OpId>,
) -> OpResult<Reply> {
    check_name(&name)?;
    let mut pdir = dir_inode(&t.inodes, parent)?;
    if load_dentry(&t.dentries, parent, &name)?.is_some() {
        return Err(fs_err!(Exists, "entry {} already exists in directory {parent}", q(&name)).into());
    }
    let chooser = load_dirx(&t.dirx, parent)?.and_then(|x| x.chooser);
    let (mut mode, mut gid) = (mode & 0o7777, gid);
    inherit_group(&pdir, FileKind::Dir, &mut mode, &mut gid);
    let mut i = new_inode(FileKind::Dir, mode, uid, gid, ctx.now);
    i.nlink = 2;
    i.dir_pattern = Some(pdir.dir_pattern.clone().unwrap_or_default());
    i.parent = Some(parent);
    let id = ctx.mint()?;
    t.put_dentry(parent, &name, &Dentry { id, kind: FileKind::Dir, owner })?;
    pdir.nlink += 1;
    touch_dir(&mut pdir, ctx.now);
    t.put_inode(parent, &pdir)?;
    let attr = to_attr(id, &i, owner);
    put_intent(t, intent, &Intent { op, step: IntentStep::Mkdir { parent, name, id, owner, inode: i, chooser } })?;
    Ok(Reply::Entry(attr))
}

pub(super) fn mkdir_commit(
    t: &mut Tables<'_>,
    _ctx: &mut Ctx<'_>,
    intent: EntryId,
    attr: EntryAttr,
) -> OpResult<Reply> {
    clear_intent(t, intent)?;
    Ok(Reply::Entry(attr))
}

pub(super) fn mkdir_abort(t: &mut Tables<'_>, ctx: &mut Ctx<'_>, intent: EntryId, err: FsError) -> OpResult<Reply> {
    if let Some(Intent { step: IntentStep::Mkdir { parent, name, id, .. }, .. }) = clear_intent(t, intent)? {
        if load_dentry(&t.dentries, parent, &name)?.is_some_and(|d| d.id == id) {
            t.remove_dentry(parent, &name)?;
            if let Some(mut p) = load_inode(&t.inodes, parent)? {
                p.nlink = p.nlink.saturating_sub(1);
                touch_dir(&mut p, ctx.now);
                t.put_inode(parent, &p)?;
            }
        }
    }
    Err(err.into())
}

pub(super) fn peer_create_dir(
    t: &mut Tables<'_>,
    ctx: &mut Ctx<'_>,
    id: EntryId,
    i: Inode,
    parent_owner: NodeId,
    chooser: Option<MetaChooser>,
) -> OpResult<Reply> {
    let node = ctx.node;
    if let Some(existing) = load_inode(&t.inodes, id)? {
        return Ok(Reply::Entry(to_attr(id, &existing, node)));
    }
    t.put_inode(id, &i)?;
    put_dirx(t, id, &DirExtra { parent_owner: Some(parent_owner).filter(|o| *o != node), chooser })?;
    ctx.dirs_delta += 1;
    Ok(Reply::Entry(to_attr(id, &i, node)))
}
