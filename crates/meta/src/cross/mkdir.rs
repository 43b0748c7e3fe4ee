//! Cross-node mkdir: the transactions of a directory created on another
//! metadata node: the intent (dentry and parent link count written here), the
//! new inode on the owner, and the commit or undo.

use super::*;
use crate::ops::acl_create;
use crate::store::Xattrs;
use hivefs_types::acl;

/// Coordinator: writes the dentry `parent/name` naming a new directory on `owner`, raises the
/// parent's link count and records the intent.
#[derive(Clone, Debug)]
pub struct MkdirIntent {
    pub intent: EntryId,
    pub parent: EntryId,
    pub name: Vec<u8>,
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    /// See `Caller::umask`.
    pub umask: Option<u32>,
    pub owner: NodeId,
    pub op: Option<OpId>,
}

/// Coordinator: the owner created the directory (`attr`): the intent goes, the client's answer is
/// `attr`.
#[derive(Clone, Debug)]
pub struct MkdirCommit {
    pub intent: EntryId,
    pub attr: EntryAttr,
}

/// Coordinator: the owner refused: the dentry and the parent's link go again, the answer is `err`.
#[derive(Clone, Debug)]
pub struct MkdirAbort {
    pub intent: EntryId,
    pub err: FsError,
}

/// Owner: creates directory `id` with `inode` and `xattrs` (its inherited
/// ACLs) (idempotent: an existing one is kept).
#[derive(Clone, Debug)]
pub struct PeerCreateDir {
    pub id: EntryId,
    pub inode: Inode,
    pub parent_owner: NodeId,
    pub chooser: Option<MetaChooser>,
    pub xattrs: Xattrs,
}

impl MkdirIntent {
    pub(super) fn apply(self, t: &mut Tables<'_>, ctx: &mut Ctx<'_>) -> OpResult<Reply> {
        let MkdirIntent { intent, parent, name, mode, uid, gid, umask, owner, op } = self;
        check_name(&name)?;
        let mut pdir = dir_inode(&t.inodes, parent)?;
        if load_dentry(&t.dentries, parent, &name)?.is_some() {
            return Err(fs_err!(Exists, "entry {} already exists in directory {parent}", q(&name)).into());
        }
        let chooser = load_dirx(&t.dirx, parent)?.and_then(|x| x.chooser);
        // The parent's default ACL is here: the inheritance is decided in
        // the intent and travels to the owner with the inode.
        let acls = acl_create(&t.xattrs, parent, FileKind::Dir, mode & 0o7777, umask)?;
        let (mut mode, mut gid) = (acls.mode, gid);
        inherit_group(&pdir, FileKind::Dir, &mut mode, &mut gid);
        ctx.quota.admit(&t.usage, uid, gid, None)?;
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
        let xattrs: Xattrs = [(acl::XATTR_ACCESS, acls.access), (acl::XATTR_DEFAULT, acls.default)]
            .into_iter()
            .filter_map(|(n, v)| Some((n.to_vec(), v?)))
            .collect();
        let step = if xattrs.is_empty() {
            IntentStep::Mkdir { parent, name, id, owner, inode: i, chooser }
        } else {
            IntentStep::MkdirXattrs { parent, name, id, owner, inode: i, chooser, xattrs }
        };
        put_intent(t, intent, &Intent { op, step })?;
        Ok(Reply::Entry(attr))
    }
}

impl MkdirCommit {
    pub(super) fn apply(self, t: &mut Tables<'_>, _ctx: &mut Ctx<'_>) -> OpResult<Reply> {
        let MkdirCommit { intent, attr } = self;
        clear_intent(t, intent)?;
        Ok(Reply::Entry(attr))
    }
}

impl MkdirAbort {
    pub(super) fn apply(self, t: &mut Tables<'_>, ctx: &mut Ctx<'_>) -> OpResult<Reply> {
        let MkdirAbort { intent, err } = self;
        if let Some(Intent {
            step: IntentStep::Mkdir { parent, name, id, .. } | IntentStep::MkdirXattrs { parent, name, id, .. },
            ..
        }) = clear_intent(t, intent)?
        {
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
}

impl PeerCreateDir {
    pub(super) fn apply(self, t: &mut Tables<'_>, ctx: &mut Ctx<'_>) -> OpResult<Reply> {
        let PeerCreateDir { id, inode: i, parent_owner, chooser, xattrs } = self;
        let node = ctx.node;
        if let Some(existing) = load_inode(&t.inodes, id)? {
            return Ok(Reply::Entry(to_attr(id, &existing, node)));
        }
        t.put_inode(id, &i)?;
        for (n, v) in &xattrs {
            t.xattrs.insert(child_key(id, n).as_slice(), v.as_slice())?;
        }
        put_dirx(t, id, &DirExtra { parent_owner: Some(parent_owner).filter(|o| *o != node), chooser })?;
        ctx.dirs_delta += 1;
        Ok(Reply::Entry(to_attr(id, &i, node)))
    }
}
