//! Cross-node rename: the transactions of a rename whose destination directory
//! is on another metadata node: the intent (source held; a file's inode and
//! xattrs travel with it), the destination half on the peer, and the commit;
//! also a directory's parent pointer on its owner.

use super::*;

/// Coordinator: holds the source dentry of a rename into a directory on `new_owner` (a file's inode
/// and xattrs are taken along) and records the intent.
#[derive(Clone, Debug)]
pub struct RenameIntent {
    pub intent: EntryId,
    pub parent: EntryId,
    pub name: Vec<u8>,
    pub new_parent: EntryId,
    pub new_owner: NodeId,
    pub new_name: Vec<u8>,
    pub flags: u32,
    pub op: Option<OpId>,
}

/// Coordinator: the destination half is done: the source dentry (and a moved file's inode) go here.
#[derive(Clone, Debug)]
pub struct RenameCommit {
    pub intent: EntryId,
}

/// Owner of a moved directory: its parent pointer (and the parent's owner) change.
#[derive(Clone, Debug)]
pub struct PeerSetParent {
    pub id: EntryId,
    pub parent: EntryId,
    pub parent_owner: NodeId,
}

/// Destination node: writes `new_parent/new_name` naming `dentry` (replacing what it named, as
/// rename does), with a moved file's inode and xattrs; recorded under `intent` so a repeat does
/// nothing.
#[derive(Clone, Debug)]
pub struct PeerRenameIn {
    pub intent: EntryId,
    pub src_parent: EntryId,
    pub new_parent: EntryId,
    pub new_name: Vec<u8>,
    pub flags: u32,
    pub dentry: Dentry,
    pub inode: Option<Inode>,
    pub xattrs: Vec<(Vec<u8>, Vec<u8>)>,
}

impl RenameIntent {
    pub(super) fn apply(self, t: &mut Tables<'_>, ctx: &mut Ctx<'_>) -> OpResult<Reply> {
        let RenameIntent { intent, parent, name, new_parent, new_owner, new_name, flags, op } = self;
        let node = ctx.node;
        if flags & !RENAME_NOREPLACE != 0 {
            return Err(fs_err!(Invalid, "rename flags {flags:#x} not supported (only RENAME_NOREPLACE)").into());
        }
        check_name(&name)?;
        check_name(&new_name)?;
        dir_inode(&t.inodes, parent)?;
        let src = dentry(&t.dentries, parent, &name)?;
        check_unlocked(t, parent, &name)?;
        // A file's inode moves with its only dentry; one with other links
        // (or kept on another node) stays, and the new dentry names it.
        let local = if src.kind != FileKind::Dir && src.owner == node && new_owner != node {
            Some(inode(&t.inodes, src.id)?).filter(|i| i.nlink <= 1)
        } else {
            None
        };
        let moved = match local {
            Some(i) => {
                let xattrs = scan_children(&t.xattrs, src.id, None)?.collect::<Result<Vec<_>, _>>()?;
                // Taken as it is now: changes wait until the move ends.
                ctx.handles.start_moving(src.id, intent, new_owner);
                Some((i, xattrs))
            }
            None => None,
        };
        let step = IntentStep::Rename {
            parent,
            name,
            new_parent,
            new_owner,
            new_name,
            flags,
            id: src.id,
            kind: src.kind,
            owner: src.owner,
            moved,
        };
        put_intent(t, intent, &Intent { op, step })?;
        Ok(Reply::Ok)
    }
}

impl RenameCommit {
    pub(super) fn apply(self, t: &mut Tables<'_>, ctx: &mut Ctx<'_>) -> OpResult<Reply> {
        let RenameCommit { intent } = self;
        let Some(Intent { step: IntentStep::Rename { parent, name, new_parent, id, kind, moved, .. }, .. }) =
            clear_intent(t, intent)?
        else {
            return Ok(Reply::Ok);
        };
        t.peer_done.remove(id_key(intent).as_slice())?;
        if load_dentry(&t.dentries, parent, &name)?.is_some_and(|d| d.id == id) {
            t.remove_dentry(parent, &name)?;
        }
        if moved.is_some() && load_inode(&t.inodes, id)?.is_some() {
            t.remove_inode(id)?;
            ctx.files_delta -= 1;
            // Its new owner hears of its writes now; should it come back,
            // this node must not take it for a file without chunk files.
            ctx.handles.take_known(id);
        }
        if let Some(mut p) = load_inode(&t.inodes, parent)? {
            if kind == FileKind::Dir && parent != new_parent {
                p.nlink = p.nlink.saturating_sub(1);
            }
            touch_dir(&mut p, ctx.now);
            t.put_inode(parent, &p)?;
        }
        Ok(Reply::Ok)
    }
}

impl PeerSetParent {
    pub(super) fn apply(self, t: &mut Tables<'_>, ctx: &mut Ctx<'_>) -> OpResult<Reply> {
        let PeerSetParent { id, parent, parent_owner } = self;
        let node = ctx.node;
        let mut i = dir_inode(&t.inodes, id)?;
        set_parent(t, node, id, &mut i, parent, parent_owner)?;
        i.ctime = ctx.now;
        t.put_inode(id, &i)?;
        Ok(Reply::Ok)
    }
}

impl PeerRenameIn {
    pub(super) fn apply(self, t: &mut Tables<'_>, ctx: &mut Ctx<'_>) -> OpResult<Reply> {
        let PeerRenameIn { intent, src_parent, new_parent, new_name, flags, dentry: src, inode: moved, xattrs } = self;
        let node = ctx.node;
        if t.peer_done.get(id_key(intent).as_slice())?.is_some() {
            return Ok(Reply::Ok);
        }
        check_name(&new_name)?;
        let mut pdir = dir_inode(&t.inodes, new_parent)?;
        let is_dir = src.kind == FileKind::Dir;
        let dst = load_dentry(&t.dentries, new_parent, &new_name)?;
        let mut replaced = None;
        if let Some(d) = &dst {
            if d.id == src.id {
                // Another name of the same file: the coordinator looked before
                // its intent and found none, so it came since (a link racing).
                return Err(fs_err!(Busy, "{} in {new_parent} changed during a rename; try again", q(&new_name)).into());
            }
            {
                if flags & RENAME_NOREPLACE != 0 {
                    return Err(
                        fs_err!(Exists, "entry {} already exists in directory {new_parent}", q(&new_name)).into()
                    );
                }
                check_unlocked(t, new_parent, &new_name)?;
                match (is_dir, d.kind == FileKind::Dir) {
                    (true, false) => {
                        return Err(fs_err!(
                            NotDir,
                            "cannot replace non-directory {} in {new_parent} by a directory",
                            q(&new_name)
                        )
                        .into())
                    }
                    (false, true) => {
                        return Err(fs_err!(
                            IsDir,
                            "cannot replace directory {} in {new_parent} by a non-directory",
                            q(&new_name)
                        )
                        .into())
                    }
                    _ => {}
                }
                // A directory owned elsewhere was removed there before this step.
                let local = load_inode(&t.inodes, d.id)?.filter(|_| d.owner == node);
                if let Some(di) = &local {
                    if di.kind == FileKind::Dir && !is_empty_dir(&t.dentries, d.id)? {
                        return Err(fs_err!(
                            NotEmpty,
                            "directory {} ({}) in {new_parent} is not empty",
                            q(&new_name),
                            d.id
                        )
                        .into());
                    }
                }
                replaced = Some((d.clone(), local));
            }
        }
        // ---- writes only below this line
        if let Some((d, local)) = replaced {
            t.remove_dentry(new_parent, &new_name)?;
            if d.kind == FileKind::Dir {
                if local.is_some() {
                    t.remove_inode(d.id)?;
                    ctx.dirs_delta -= 1;
                }
                pdir.nlink = pdir.nlink.saturating_sub(1);
            } else if let Some(di) = local {
                drop_link(t, ctx, d.id, di)?;
            }
        }
        let mut dentry = src.clone();
        if let Some(mut i) = moved {
            i.ctime = ctx.now;
            t.put_inode(src.id, &i)?;
            for (n, v) in &xattrs {
                t.xattrs.insert(child_key(src.id, n).as_slice(), v.as_slice())?;
            }
            dentry.owner = node;
            ctx.files_delta += 1;
        }
        t.put_dentry(new_parent, &new_name, &dentry)?;
        if is_dir && src_parent != new_parent {
            pdir.nlink += 1;
        }
        touch_dir(&mut pdir, ctx.now);
        t.put_inode(new_parent, &pdir)?;
        t.peer_done.insert(id_key(intent).as_slice(), [].as_slice())?;
        Ok(Reply::Ok)
    }
}
