//! Namespace rules: every metadata operation as a function over the tables
//! of one transaction.
//!
//! Owns the POSIX semantics (error codes, link counts, times, POSIX ACL
//! inheritance and the ACL/mode coupling) and the record changes each
//! operation makes. It must not do I/O besides the transaction
//! it is given, read clocks, or talk to the network: the writer passes the
//! time, the id counter, the pattern chooser and the open-file table in a
//! [`Ctx`], so every rule here is testable without a cluster.
//!
//! Mutations run inside a batch of many operations that commit together
//! (group commit). Invariant that makes this safe: **a mutation returns
//! [`OpError::Fs`] only before its first write**. All checks read first; the
//! writes follow. A store failure ([`OpError::Fatal`]) aborts the whole batch.

use crate::store::Kv;
use crate::store::{
    child_key, decode, get_record, id_key, load_dirx, put_dirx, q, scan_children, Dentry, DirExtra, Disposal,
    DisposalState, Inode, OpError, OpResult, ReadTables, Tables,
};
use hivefs_proto::{
    DirEntry, QuotaId, QuotaKind, Reply, RENAME_EXCHANGE, RENAME_NOREPLACE, XATTR_ACL_KILL_SGID, XATTR_CREATE,
    XATTR_REPLACE,
};
use hivefs_types::acl;
use hivefs_types::attr::{EntryAttr, FileKind, SetAttr, SetTime, Timespec};
use hivefs_types::error::{ErrorCode, FsError, FsResult};
use hivefs_types::fs_err;
use hivefs_types::ids::{EntryId, NodeId, PoolId};
use hivefs_types::pattern::{DirPattern, Pattern, StripeSet};
use hivefs_types::{NAME_MAX, PATH_MAX, XATTR_NAME_MAX, XATTR_SIZE_MAX};

/// Largest page `ReadDir` returns, whatever the client asks for.
pub const READDIR_MAX: u32 = 1024;
/// Most hard links of one inode (as ext4's EXT4_LINK_MAX).
pub const LINK_MAX: u32 = 65000;
/// Most levels walked up from a rename target looking for the source
/// directory; a deeper chain means the parent pointers are corrupt.
const MAX_DEPTH: usize = 1 << 20;
const S_ISGID: u32 = 0o2000;

/// A mutation, as queued for the writer.
#[derive(Clone, Debug)]
pub enum Mutation {
    /// Creates the root directory if it does not exist (idempotent).
    CreateRoot,
    Create {
        parent: EntryId,
        name: Vec<u8>,
        kind: FileKind,
        mode: u32,
        rdev: u32,
        excl: bool,
        uid: u32,
        gid: u32,
        /// See `Caller::umask`: `Some` inherits the parent's default ACL.
        umask: Option<u32>,
        /// The creating client opens the file (a handle is counted).
        open: bool,
    },
    /// A regular file a client made ahead of telling this node (write-back
    /// create, `Request::CreateMany`) under an id and pattern this node
    /// reserved for it: made open (its creator holds a handle). Found
    /// already made under that id (a repeat), it answers as made.
    CreateAs {
        parent: EntryId,
        name: Vec<u8>,
        id: EntryId,
        pattern: Pattern,
        mode: u32,
        uid: u32,
        gid: u32,
        umask: Option<u32>,
        at: Timespec,
    },
    /// Mints `count` ids and chooses as many stripe patterns for regular
    /// files of directory `parent` (`Request::ReserveCreates`); writes nothing.
    Reserve {
        parent: EntryId,
        count: u32,
    },
    Mkdir {
        parent: EntryId,
        name: Vec<u8>,
        mode: u32,
        uid: u32,
        gid: u32,
        umask: Option<u32>,
    },
    Symlink {
        parent: EntryId,
        name: Vec<u8>,
        target: Vec<u8>,
        uid: u32,
        gid: u32,
    },
    Link {
        id: EntryId,
        new_parent: EntryId,
        new_name: Vec<u8>,
    },
    Unlink {
        parent: EntryId,
        name: Vec<u8>,
    },
    Rmdir {
        parent: EntryId,
        name: Vec<u8>,
    },
    Rename {
        parent: EntryId,
        name: Vec<u8>,
        new_parent: EntryId,
        new_name: Vec<u8>,
        flags: u32,
    },
    /// Chunk files were already truncated when `attr.size` is set.
    SetAttr {
        id: EntryId,
        attr: SetAttr,
        /// Asked by root: a new owner's quota does not refuse it (as Linux,
        /// where CAP_SYS_RESOURCE ignores the limits of a quota transfer).
        privileged: bool,
    },
    UpdateSize {
        id: EntryId,
        size: u64,
        mtime: Option<Timespec>,
        /// `Request::UpdateSizeIf`: only if the inode's ctime is still this
        /// (else `Busy`, nothing changed).
        if_ctime: Option<Timespec>,
        /// A size its writer held until its release (`Request::ReleaseSized`):
        /// the change time becomes that of the last write (`mtime`), as the
        /// writer's mount showed it, not the time the size landed.
        held: bool,
    },
    /// See `Request::TouchAtime`.
    TouchAtime {
        id: EntryId,
        at: Timespec,
        strict: bool,
    },
    SetXattr {
        id: EntryId,
        name: Vec<u8>,
        value: Vec<u8>,
        flags: u32,
    },
    RemoveXattr {
        id: EntryId,
        name: Vec<u8>,
    },
    SetDirPattern {
        id: EntryId,
        pattern: DirPattern,
    },
    /// The last open handle of `id` is gone: if it was unlinked while open,
    /// drop its inode now and queue its chunk files for deletion.
    ReleaseOrphan {
        id: EntryId,
    },
    /// At start: nothing is open, so every open-unlinked inode goes.
    RecoverOrphans,
    /// The chunk files of these entries are deleted on every target.
    DropDisposal {
        ids: Vec<EntryId>,
    },
}

/// What the writer lends an operation.
pub struct Ctx<'a> {
    pub node: NodeId,
    pub epoch: u32,
    /// Last counter value minted in this boot.
    pub counter: &'a mut u64,
    pub now: Timespec,
    /// Chooses the stripe pattern of a new regular file.
    pub choose: &'a mut dyn FnMut(&DirPattern) -> FsResult<Pattern>,
    /// The node's open handles.
    pub handles: &'a dyn Handles,
    pub files_delta: i64,
    pub dirs_delta: i64,
    /// Set when chunk deletions were queued: wake the disposal task after commit.
    pub disposal_queued: bool,
    /// Quota limits: new inodes of a user or group without room are refused.
    pub quota: &'a crate::quota::QuotaGate,
}

/// The node's count of open handles, as the operations see it
/// (`namespace::Opens`; in memory, not in the store).
pub trait Handles: Send + Sync {
    /// Whether a client has the entry open.
    fn is_open(&self, id: EntryId) -> bool;
    /// Regular file `id` was made now (none of its chunk files exists);
    /// `open`: its creator holds a handle.
    fn created(&self, id: EntryId, open: bool);
    /// A create found regular file `id` and its caller holds a handle.
    fn opened(&self, id: EntryId);
    /// The stripe positions where `id` can have chunk files, if known (made
    /// since this node started, every write reported with its positions;
    /// empty: none); forgets it either way.
    fn take_known(&self, id: EntryId) -> Option<StripeSet>;
    /// What the removal of `id`'s last link leaves (one look at both
    /// counts): it is still open, or closed with what is known of its
    /// chunk files (forgotten then, as by [`Handles::take_known`]).
    fn last_link(&self, id: EntryId) -> LastLink;
    /// Whether a cross-node rename is moving file `id`'s inode away: a
    /// change to it is refused meanwhile ([`refuse_moving`]).
    fn moving(&self, id: EntryId) -> bool;
    /// Rename `intent` takes file `id`'s inode (as it is now) to node `to`.
    fn start_moving(&self, id: EntryId, intent: EntryId, to: NodeId);
}

/// Refuses a change to file `id`'s inode while a rename moves it away
/// (the handler waits for the move and sends it where the inode went).
pub(crate) fn refuse_moving(ctx: &Ctx<'_>, id: EntryId) -> OpResult<()> {
    match ctx.handles.moving(id) {
        true => Err(moving_away(id)),
        false => Ok(()),
    }
}

/// See [`Handles::last_link`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LastLink {
    Open,
    /// Where its chunk files can be, if known.
    Closed(Option<StripeSet>),
}

impl Ctx<'_> {
    /// A new entry id. Ids stay inside the space whose inode numbers are
    /// one-to-one ([`EntryId::ino`]): after the last counter of an epoch the
    /// node moves to the next epoch, which the writer persists in the same
    /// transaction (a restart then starts beyond it).
    pub(crate) fn mint(&mut self) -> FsResult<EntryId> {
        if *self.counter >= EntryId::MAX_COUNTER {
            if self.epoch >= EntryId::MAX_EPOCH {
                return Err(FsError::new(
                    ErrorCode::NoSpace,
                    format!("metadata node {}: entry ids exhausted (epoch {})", self.node, self.epoch),
                ));
            }
            self.epoch += 1;
            *self.counter = 0;
        }
        *self.counter += 1;
        Ok(EntryId { node: self.node.0, epoch: self.epoch, counter: *self.counter })
    }
}

// ---------------------------------------------------------------- helpers

/// A name that can be created, removed or renamed.
pub fn check_name(name: &[u8]) -> FsResult<()> {
    if name.is_empty() {
        return Err(fs_err!(Invalid, "empty file name"));
    }
    if name.len() > NAME_MAX {
        return Err(fs_err!(NameTooLong, "file name of {} bytes exceeds {NAME_MAX}: {}", name.len(), q(&name[..32])));
    }
    if name == b"." || name == b".." {
        return Err(fs_err!(Invalid, "{} cannot be created, removed or renamed", q(name)));
    }
    if name.iter().any(|&b| b == b'/' || b == 0) {
        return Err(fs_err!(Invalid, "file name {} contains '/' or NUL", q(name)));
    }
    Ok(())
}

fn check_xattr_name(name: &[u8]) -> FsResult<()> {
    if name.is_empty() {
        return Err(fs_err!(Invalid, "empty extended attribute name"));
    }
    if name.len() > XATTR_NAME_MAX {
        return Err(fs_err!(NameTooLong, "extended attribute name of {} bytes exceeds {XATTR_NAME_MAX}", name.len()));
    }
    if name.contains(&0) {
        return Err(fs_err!(Invalid, "extended attribute name {} contains NUL", q(name)));
    }
    Ok(())
}

pub fn load_inode<T: Kv>(t: &T, id: EntryId) -> OpResult<Option<Inode>> {
    get_record(t, "inode", id)
}

pub(crate) fn inode(t: &impl Kv, id: EntryId) -> OpResult<Inode> {
    load_inode(t, id)?.ok_or_else(|| OpError::Fs(fs_err!(NotFound, "entry {id} not found on this metadata node")))
}

/// The inode of a directory, or NotFound / NotDir.
pub(crate) fn dir_inode(t: &impl Kv, id: EntryId) -> OpResult<Inode> {
    match load_inode(t, id)? {
        None => Err(fs_err!(NotFound, "directory {id} not found on this metadata node").into()),
        Some(i) if i.kind != FileKind::Dir => Err(fs_err!(NotDir, "{id} is not a directory").into()),
        Some(i) => Ok(i),
    }
}

pub fn load_dentry<T: Kv>(t: &T, parent: EntryId, name: &[u8]) -> OpResult<Option<Dentry>> {
    match t.get(child_key(parent, name).as_slice())? {
        None => Ok(None),
        Some(v) => {
            let d = decode("dentry", format_args!("{parent}/{}", q(name)), &v).map_err(OpError::Fatal)?;
            Ok(Some(d))
        }
    }
}

pub(crate) fn dentry(t: &impl Kv, parent: EntryId, name: &[u8]) -> OpResult<Dentry> {
    load_dentry(t, parent, name)?
        .ok_or_else(|| OpError::Fs(fs_err!(NotFound, "no entry {} in directory {parent}", q(name))))
}

/// The inode a dentry names: a dentry without inode is corruption.
pub(crate) fn dentry_inode(t: &impl Kv, parent: EntryId, name: &[u8], d: &Dentry) -> OpResult<Inode> {
    load_inode(t, d.id)?
        .ok_or_else(|| OpError::Fatal(format!("dentry {parent}/{} names inode {} that does not exist", q(name), d.id)))
}

pub(crate) fn is_empty_dir(t: &impl Kv, id: EntryId) -> OpResult<bool> {
    Ok(scan_children(t, id, None)?.next().transpose()?.is_none())
}

pub fn to_attr(id: EntryId, i: &Inode, owner: NodeId) -> EntryAttr {
    EntryAttr {
        id,
        kind: i.kind,
        mode: i.mode,
        uid: i.uid,
        gid: i.gid,
        size: i.size,
        nlink: i.nlink,
        atime: i.atime,
        mtime: i.mtime,
        ctime: i.ctime,
        rdev: i.rdev,
        owner,
        pattern: i.pattern.clone(),
        dir_pattern: i.dir_pattern.clone(),
    }
}

pub(crate) fn new_inode(kind: FileKind, mode: u32, uid: u32, gid: u32, now: Timespec) -> Inode {
    Inode {
        kind,
        mode: mode & 0o7777,
        uid,
        gid,
        size: 0,
        nlink: 1,
        atime: now,
        mtime: now,
        ctime: now,
        rdev: 0,
        pattern: None,
        dir_pattern: None,
        symlink: None,
        parent: None,
    }
}

/// BSD group semantics of a setgid directory (the kernel leaves this to FUSE
/// file systems): new entries take the directory's group, new subdirectories
/// also keep the setgid bit.
pub(crate) fn inherit_group(parent: &Inode, kind: FileKind, mode: &mut u32, gid: &mut u32) {
    if parent.mode & S_ISGID != 0 {
        *gid = parent.gid;
        if kind == FileKind::Dir {
            *mode |= S_ISGID;
        }
    }
}

/// Who creates an entry: uid, gid and the umask of a client with POSIX ACLs
/// on (see `Caller::umask`).
pub(crate) type Creator = (u32, u32, Option<u32>);

/// The mode and ACLs of a new `kind` entry in `parent` asked for with
/// `mode` (POSIX ACL inheritance, see [`acl::create_mode`]): read here, in
/// the create's transaction, so a concurrent `setfacl -d` on the parent is
/// either wholly before or after the create. A creator without ACL
/// semantics (`umask: None`) gets `mode` as given. A default ACL that does
/// not parse (stored before HiveFS checked ACLs) is not inherited.
pub(crate) fn acl_create(
    t: &impl Kv,
    parent: EntryId,
    kind: FileKind,
    mode: u32,
    umask: Option<u32>,
) -> OpResult<acl::Inherited> {
    let Some(umask) = umask else {
        return Ok(acl::Inherited { mode, ..Default::default() });
    };
    let dflt = match t.get(child_key(parent, acl::XATTR_DEFAULT).as_slice())? {
        Some(v) => acl::Acl::decode(&v).ok(),
        None => None,
    };
    Ok(acl::create_mode(dflt.as_ref(), mode, umask, kind == FileKind::Dir))
}

/// Stores the ACLs a new entry inherited.
pub(crate) fn put_acls(t: &mut Tables<'_>, id: EntryId, i: &acl::Inherited) -> OpResult<()> {
    for (name, v) in [(acl::XATTR_ACCESS, &i.access), (acl::XATTR_DEFAULT, &i.default)] {
        if let Some(v) = v {
            t.xattrs.insert(child_key(id, name).as_slice(), v.as_slice())?;
        }
    }
    Ok(())
}

pub(crate) fn touch_dir(dir: &mut Inode, now: Timespec) {
    dir.mtime = now;
    dir.ctime = now;
}

fn resolve(t: Option<SetTime>, now: Timespec) -> Option<Timespec> {
    t.map(|t| match t {
        SetTime::Now => now,
        SetTime::At(ts) => ts,
    })
}

/// Refuses to change a dentry that a pending cross-node operation holds.
pub(crate) fn check_unlocked(t: &Tables<'_>, parent: EntryId, name: &[u8]) -> OpResult<()> {
    if t.locked.get(child_key(parent, name).as_slice())?.is_some() {
        return Err(
            fs_err!(Busy, "{} in directory {parent} is being changed by a cross-node operation", q(name)).into()
        );
    }
    Ok(())
}

const NEEDS: &str = "needs the cross-node protocol: ";

/// The refusal of a local rule that met a part stored on another node.
pub(crate) fn needs_protocol(why: String) -> OpError {
    OpError::Fs(FsError::new(ErrorCode::CrossDevice, format!("{NEEDS}{why}")))
}

pub(crate) fn is_needs_protocol(e: &FsError) -> bool {
    e.code == ErrorCode::CrossDevice && e.message.starts_with(NEEDS)
}

const MOVING: &str = "is moving to another metadata node: ";

/// The refusal of a change to file `id`'s inode while a cross-node rename
/// moves it (`namespace::moving`).
pub(crate) fn moving_away(id: EntryId) -> OpError {
    OpError::Fs(FsError::new(ErrorCode::Busy, format!("file {id} {MOVING}try again once it has moved")))
}

/// Whether `e` is [`moving_away`]'s refusal (an internal signal: never
/// answered to a client, never recorded as an operation's outcome).
pub(crate) fn is_moving(e: &FsError) -> bool {
    e.code == ErrorCode::Busy && e.message.contains(MOVING)
}

// ------------------------------------------------------------- mutations

impl Mutation {
    /// Operations that make the store grow (new names, inodes, attributes):
    /// refused when the metadata target runs low on space, while removals
    /// and updates in place still run so that space can be freed.
    pub fn adds_to_namespace(&self) -> bool {
        matches!(
            self,
            Mutation::Create { .. }
                | Mutation::CreateAs { .. }
                // Ids for creates to come: none while the target runs low.
                | Mutation::Reserve { .. }
                | Mutation::Mkdir { .. }
                | Mutation::Symlink { .. }
                | Mutation::Link { .. }
                | Mutation::SetXattr { .. }
        )
    }
}

/// Applies one mutation. See the module doc for the error invariant.
pub fn apply(t: &mut Tables<'_>, ctx: &mut Ctx<'_>, m: Mutation) -> OpResult<Reply> {
    match m {
        Mutation::CreateRoot => create_root(t, ctx),
        Mutation::Create { parent, name, kind, mode, rdev, excl, uid, gid, umask, open } => {
            create(t, ctx, parent, &name, kind, mode, rdev, (excl, open), (uid, gid, umask), None)
        }
        Mutation::CreateAs { parent, name, id, pattern, mode, uid, gid, umask, at } => {
            let made = Made { id, pattern, at };
            create(t, ctx, parent, &name, FileKind::File, mode, 0, (true, true), (uid, gid, umask), Some(made))
        }
        Mutation::Reserve { parent, count } => reserve(t, ctx, parent, count),
        Mutation::Mkdir { parent, name, mode, uid, gid, umask } => {
            mkdir(t, ctx, parent, &name, mode, (uid, gid, umask))
        }
        Mutation::Symlink { parent, name, target, uid, gid } => symlink(t, ctx, parent, &name, target, uid, gid),
        Mutation::Link { id, new_parent, new_name } => link(t, ctx, id, new_parent, &new_name),
        Mutation::Unlink { parent, name } => unlink(t, ctx, parent, &name),
        Mutation::Rmdir { parent, name } => rmdir(t, ctx, parent, &name),
        Mutation::Rename { parent, name, new_parent, new_name, flags } => {
            rename(t, ctx, parent, &name, new_parent, &new_name, flags)
        }
        Mutation::SetAttr { id, attr, privileged } => set_attr(t, ctx, id, &attr, privileged),
        Mutation::UpdateSize { id, size, mtime, if_ctime, held } => {
            update_size(t, ctx, id, size, mtime, if_ctime, held)
        }
        Mutation::TouchAtime { id, at, strict } => {
            refuse_moving(ctx, id)?;
            let mut i = inode(&t.inodes, id)?;
            if atime_due(&i, at, strict) {
                i.atime = at;
                t.put_inode(id, &i)?;
            }
            Ok(Reply::Entry(to_attr(id, &i, ctx.node)))
        }
        Mutation::SetXattr { id, name, value, flags } => set_xattr(t, ctx, id, &name, &value, flags),
        Mutation::RemoveXattr { id, name } => remove_xattr(t, ctx, id, &name),
        Mutation::SetDirPattern { id, pattern } => set_dir_pattern(t, ctx, id, pattern),
        Mutation::ReleaseOrphan { id } => release_orphan(t, ctx, id),
        Mutation::RecoverOrphans => recover_orphans(t, ctx),
        Mutation::DropDisposal { ids } => drop_disposal(t, &ids),
    }
}

fn create_root(t: &mut Tables<'_>, ctx: &mut Ctx<'_>) -> OpResult<Reply> {
    let id = EntryId::ROOT;
    if let Some(i) = load_inode(&t.inodes, id)? {
        return Ok(Reply::Entry(to_attr(id, &i, ctx.node)));
    }
    let mut root = new_inode(FileKind::Dir, 0o755, 0, 0, ctx.now);
    root.nlink = 2;
    root.dir_pattern = Some(DirPattern::default());
    root.parent = Some(id);
    t.put_inode(id, &root)?;
    ctx.dirs_delta += 1;
    Ok(Reply::Entry(to_attr(id, &root, ctx.node)))
}

/// About the most bytes of ids and patterns one reservation answers with.
const RESERVED_BYTES_MAX: usize = 256 << 10;

/// What a client chose for a file it made ahead (`Mutation::CreateAs`).
struct Made {
    id: EntryId,
    pattern: Pattern,
    at: Timespec,
}

/// Ids and patterns for files a client will make in `parent` ahead of
/// telling this node. A reserved id is never minted again (ids of a boot
/// run up in sequence, and each boot mints in a new epoch).
fn reserve(t: &mut Tables<'_>, ctx: &mut Ctx<'_>, parent: EntryId, count: u32) -> OpResult<Reply> {
    let pdir = dir_inode(&t.inodes, parent)?;
    let dp = pdir.dir_pattern.clone().unwrap_or_default();
    let mut slots = Vec::with_capacity(count as usize);
    // The answer stays well inside a frame, however wide the patterns.
    let mut bytes = 0;
    for _ in 0..count {
        let pattern = (ctx.choose)(&dp)?;
        bytes += 32 + 5 * pattern.stripe_count();
        slots.push((ctx.mint()?, pattern));
        if bytes > RESERVED_BYTES_MAX {
            break;
        }
    }
    Ok(Reply::Reserved { slots, lease_ms: 0 })
}

/// Refuses a file made ahead whose id this node did not mint (a later id
/// than any minted, another node's) or that is taken, or whose pattern the
/// directory's stripe settings could not have chosen.
fn check_made(t: &Tables<'_>, ctx: &Ctx<'_>, dp: &DirPattern, m: &Made) -> OpResult<()> {
    let minted = m.id.node == ctx.node.0
        && (m.id.epoch < ctx.epoch || (m.id.epoch == ctx.epoch && m.id.counter <= *ctx.counter));
    if !minted || m.id == EntryId::ROOT {
        return Err(fs_err!(Invalid, "entry id {} was not reserved by metadata node {}", m.id, ctx.node).into());
    }
    if load_inode(&t.inodes, m.id)?.is_some() {
        return Err(fs_err!(Exists, "entry id {} is taken on metadata node {}", m.id, ctx.node).into());
    }
    let p = &m.pattern;
    let mirrored = p.kind() == hivefs_types::pattern::PatternKind::BuddyMirror;
    let most = if dp.stripe_count == 0 { usize::MAX } else { dp.stripe_count as usize };
    if p.chunk_size() != dp.chunk_size || mirrored != dp.mirror || p.stripe_count() > most {
        return Err(fs_err!(
            Invalid,
            "stripe pattern of file {} does not fit its directory's settings (chunk size {}, {} targets)",
            m.id,
            dp.chunk_size,
            dp.stripe_count
        )
        .into());
    }
    Ok(())
}

#[allow(clippy::too_many_arguments)] // mirrors the request's fields
fn create(
    t: &mut Tables<'_>,
    ctx: &mut Ctx<'_>,
    parent: EntryId,
    name: &[u8],
    kind: FileKind,
    mode: u32,
    rdev: u32,
    (excl, open): (bool, bool),
    (uid, gid, umask): Creator,
    made: Option<Made>,
) -> OpResult<Reply> {
    check_name(name)?;
    if matches!(kind, FileKind::Dir | FileKind::Symlink) {
        return Err(
            fs_err!(Invalid, "Create cannot make a {kind:?} ({} in {parent}): use Mkdir or Symlink", q(name)).into()
        );
    }
    let mut pdir = dir_inode(&t.inodes, parent)?;
    if let Some(d) = load_dentry(&t.dentries, parent, name)? {
        if let Some(m) = made.as_ref().filter(|m| m.id == d.id) {
            // Made by an earlier attempt of the same request.
            let i = dentry_inode(&t.inodes, parent, name, &d)?;
            return Ok(Reply::Entry(to_attr(m.id, &i, ctx.node)));
        }
        // open(O_CREAT) without O_EXCL opens an existing regular file.
        if !excl && kind == FileKind::File && d.kind == FileKind::File {
            let i = dentry_inode(&t.inodes, parent, name, &d)?;
            if open {
                ctx.handles.opened(d.id);
            }
            return Ok(Reply::Entry(to_attr(d.id, &i, ctx.node)));
        }
        if !excl && d.kind == FileKind::Dir {
            return Err(fs_err!(IsDir, "{} in directory {parent} is a directory", q(name)).into());
        }
        return Err(fs_err!(Exists, "entry {} already exists in directory {parent}", q(name)).into());
    }
    let acls = acl_create(&t.xattrs, parent, kind, mode & 0o7777, umask)?;
    let (mut mode, mut gid) = (acls.mode, gid);
    inherit_group(&pdir, kind, &mut mode, &mut gid);
    let pool = (kind == FileKind::File).then(|| pdir.dir_pattern.as_ref().map_or(PoolId::DEFAULT, |p| p.pool));
    ctx.quota.admit(&t.usage, uid, gid, pool)?;
    let dp = || pdir.dir_pattern.clone().unwrap_or_default();
    let (pattern, fixed) = match made {
        Some(m) => {
            check_made(t, ctx, &dp(), &m)?;
            // The client's clock stamps the file unless it is far off this node's.
            let at = if m.at.sec.abs_diff(ctx.now.sec) <= 60 { m.at } else { ctx.now };
            (Some(m.pattern), Some((m.id, at)))
        }
        None if kind == FileKind::File => (Some((ctx.choose)(&dp())?), None),
        None => (None, None),
    };
    // ---- writes only below this line
    let mut i = new_inode(kind, mode, uid, gid, fixed.map_or(ctx.now, |(_, at)| at));
    i.rdev = rdev;
    i.pattern = pattern;
    let id = match fixed {
        Some((id, _)) => id,
        None => ctx.mint()?,
    };
    t.put_inode(id, &i)?;
    if kind == FileKind::File {
        ctx.handles.created(id, open);
    }
    put_acls(t, id, &acls)?;
    t.put_dentry(parent, name, &Dentry { id, kind, owner: ctx.node })?;
    touch_dir(&mut pdir, ctx.now);
    t.put_inode(parent, &pdir)?;
    ctx.files_delta += 1;
    Ok(Reply::Entry(to_attr(id, &i, ctx.node)))
}

fn mkdir(
    t: &mut Tables<'_>,
    ctx: &mut Ctx<'_>,
    parent: EntryId,
    name: &[u8],
    mode: u32,
    (uid, gid, umask): Creator,
) -> OpResult<Reply> {
    check_name(name)?;
    let mut pdir = dir_inode(&t.inodes, parent)?;
    if load_dentry(&t.dentries, parent, name)?.is_some() {
        return Err(fs_err!(Exists, "entry {} already exists in directory {parent}", q(name)).into());
    }
    let acls = acl_create(&t.xattrs, parent, FileKind::Dir, mode & 0o7777, umask)?;
    let (mut mode, mut gid) = (acls.mode, gid);
    inherit_group(&pdir, FileKind::Dir, &mut mode, &mut gid);
    ctx.quota.admit(&t.usage, uid, gid, None)?;
    let mut i = new_inode(FileKind::Dir, mode, uid, gid, ctx.now);
    i.nlink = 2;
    i.dir_pattern = Some(pdir.dir_pattern.clone().unwrap_or_default());
    i.parent = Some(parent);
    let chooser = load_dirx(&t.dirx, parent)?.and_then(|x| x.chooser);
    let id = ctx.mint()?;
    t.put_inode(id, &i)?;
    put_acls(t, id, &acls)?;
    if chooser.is_some() {
        put_dirx(t, id, &DirExtra { parent_owner: None, chooser })?;
    }
    // Owner: this node (the namespace chose it; other owners go through `multi`).
    t.put_dentry(parent, name, &Dentry { id, kind: FileKind::Dir, owner: ctx.node })?;
    pdir.nlink += 1;
    touch_dir(&mut pdir, ctx.now);
    t.put_inode(parent, &pdir)?;
    ctx.dirs_delta += 1;
    Ok(Reply::Entry(to_attr(id, &i, ctx.node)))
}

fn symlink(
    t: &mut Tables<'_>,
    ctx: &mut Ctx<'_>,
    parent: EntryId,
    name: &[u8],
    target: Vec<u8>,
    uid: u32,
    gid: u32,
) -> OpResult<Reply> {
    check_name(name)?;
    if target.is_empty() {
        // As Linux: symlink("") fails with ENOENT.
        return Err(fs_err!(NotFound, "empty symlink target for {} in {parent}", q(name)).into());
    }
    if target.len() > PATH_MAX {
        return Err(fs_err!(NameTooLong, "symlink target of {} bytes exceeds {PATH_MAX}", target.len()).into());
    }
    if target.contains(&0) {
        return Err(fs_err!(Invalid, "symlink target for {} contains NUL", q(name)).into());
    }
    let mut pdir = dir_inode(&t.inodes, parent)?;
    if load_dentry(&t.dentries, parent, name)?.is_some() {
        return Err(fs_err!(Exists, "entry {} already exists in directory {parent}", q(name)).into());
    }
    let mut gid = gid;
    let mut mode = 0o777;
    inherit_group(&pdir, FileKind::Symlink, &mut mode, &mut gid);
    ctx.quota.admit(&t.usage, uid, gid, None)?;
    let mut i = new_inode(FileKind::Symlink, mode, uid, gid, ctx.now);
    i.size = target.len() as u64;
    i.symlink = Some(target);
    let id = ctx.mint()?;
    t.put_inode(id, &i)?;
    t.put_dentry(parent, name, &Dentry { id, kind: FileKind::Symlink, owner: ctx.node })?;
    touch_dir(&mut pdir, ctx.now);
    t.put_inode(parent, &pdir)?;
    ctx.files_delta += 1;
    Ok(Reply::Entry(to_attr(id, &i, ctx.node)))
}

fn link(t: &mut Tables<'_>, ctx: &mut Ctx<'_>, id: EntryId, new_parent: EntryId, new_name: &[u8]) -> OpResult<Reply> {
    check_name(new_name)?;
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
    let mut pdir = dir_inode(&t.inodes, new_parent)?;
    if load_dentry(&t.dentries, new_parent, new_name)?.is_some() {
        return Err(fs_err!(Exists, "entry {} already exists in directory {new_parent}", q(new_name)).into());
    }
    // The inode stays where it is (same node, keyed by id): a new dentry is all a link needs.
    i.nlink += 1;
    i.ctime = ctx.now;
    t.put_inode(id, &i)?;
    t.put_dentry(new_parent, new_name, &Dentry { id, kind: i.kind, owner: ctx.node })?;
    touch_dir(&mut pdir, ctx.now);
    t.put_inode(new_parent, &pdir)?;
    Ok(Reply::Entry(to_attr(id, &i, ctx.node)))
}

/// Drops one link of a non-directory inode whose dentry was just removed.
/// The last link removes the inode (or parks it while open) and queues its
/// chunk files for deletion.
pub(crate) fn drop_link(t: &mut Tables<'_>, ctx: &mut Ctx<'_>, id: EntryId, mut i: Inode) -> OpResult<()> {
    i.nlink = i.nlink.saturating_sub(1);
    i.ctime = ctx.now;
    if i.nlink > 0 {
        return t.put_inode(id, &i);
    }
    ctx.files_delta -= 1;
    // Only regular files are counted open or known by their chunk files.
    let known = match i.kind {
        FileKind::File => match ctx.handles.last_link(id) {
            LastLink::Open => {
                t.put_inode(id, &i)?;
                // Wake the disposal task too: should the last release come before
                // this commit, it finds the record and finishes the orphan.
                ctx.disposal_queued = true;
                return t.put_disposal(id, &Disposal::of(DisposalState::OpenUnlinked, i.pattern.as_ref(), None));
            }
            LastLink::Closed(known) => known,
        },
        _ => None,
    };
    t.remove_inode(id)?;
    let d = Disposal::of(DisposalState::DeleteChunks, i.pattern.as_ref(), known);
    if !d.targets.is_empty() {
        t.put_disposal(id, &d)?;
        ctx.disposal_queued = true;
    }
    Ok(())
}

fn unlink(t: &mut Tables<'_>, ctx: &mut Ctx<'_>, parent: EntryId, name: &[u8]) -> OpResult<Reply> {
    check_name(name)?;
    let mut pdir = dir_inode(&t.inodes, parent)?;
    let d = dentry(&t.dentries, parent, name)?;
    if d.kind == FileKind::Dir {
        return Err(fs_err!(IsDir, "{} in directory {parent} is a directory (use rmdir)", q(name)).into());
    }
    check_unlocked(t, parent, name)?;
    if d.owner != ctx.node {
        return Err(needs_protocol(format!("{} is owned by metadata node {}", d.id, d.owner)));
    }
    let i = dentry_inode(&t.inodes, parent, name, &d)?;
    t.remove_dentry(parent, name)?;
    drop_link(t, ctx, d.id, i)?;
    touch_dir(&mut pdir, ctx.now);
    t.put_inode(parent, &pdir)?;
    Ok(Reply::Ok)
}

fn rmdir(t: &mut Tables<'_>, ctx: &mut Ctx<'_>, parent: EntryId, name: &[u8]) -> OpResult<Reply> {
    check_name(name)?;
    let mut pdir = dir_inode(&t.inodes, parent)?;
    let d = dentry(&t.dentries, parent, name)?;
    if d.kind != FileKind::Dir {
        return Err(fs_err!(NotDir, "{} in directory {parent} is not a directory", q(name)).into());
    }
    check_unlocked(t, parent, name)?;
    if d.owner != ctx.node {
        return Err(needs_protocol(format!("directory {} is owned by metadata node {}", d.id, d.owner)));
    }
    if !is_empty_dir(&t.dentries, d.id)? {
        return Err(fs_err!(NotEmpty, "directory {} ({}) in {parent} is not empty", q(name), d.id).into());
    }
    t.remove_dentry(parent, name)?;
    t.remove_inode(d.id)?;
    pdir.nlink = pdir.nlink.saturating_sub(1);
    touch_dir(&mut pdir, ctx.now);
    t.put_inode(parent, &pdir)?;
    ctx.dirs_delta -= 1;
    Ok(Reply::Ok)
}

/// True if `dir` is `ancestor` or lies below it (walks `parent` pointers up
/// to the root). A parent on another metadata node needs the cross-node walk.
fn is_within(t: &Tables<'_>, node: NodeId, dir: EntryId, ancestor: EntryId) -> OpResult<bool> {
    let t_dirx = &t.dirx;
    let t = &t.inodes;
    let mut cur = dir;
    for _ in 0..MAX_DEPTH {
        if cur == ancestor {
            return Ok(true);
        }
        if cur.is_root() {
            return Ok(false);
        }
        let i = load_inode(t, cur)?
            .ok_or_else(|| OpError::Fatal(format!("directory {cur} on the path to the root has no inode")))?;
        if let Some(o) = load_dirx(t_dirx, cur)?.and_then(|x| x.parent_owner).filter(|o| *o != node) {
            return Err(needs_protocol(format!("the parent of {cur} is on metadata node {o}")));
        }
        match i.parent {
            Some(p) => cur = p,
            None => return Err(OpError::Fatal(format!("directory {cur} has no parent pointer"))),
        }
    }
    Err(OpError::Fatal(format!("parent chain of {dir} is longer than {MAX_DEPTH}: corrupt parent pointers")))
}

fn rename(
    t: &mut Tables<'_>,
    ctx: &mut Ctx<'_>,
    parent: EntryId,
    name: &[u8],
    new_parent: EntryId,
    new_name: &[u8],
    flags: u32,
) -> OpResult<Reply> {
    if flags == RENAME_EXCHANGE {
        return rename_exchange(t, ctx, parent, name, new_parent, new_name);
    }
    if flags & !RENAME_NOREPLACE != 0 {
        return Err(fs_err!(Invalid, "rename flags {flags:#x} are not supported").into());
    }
    check_name(name)?;
    check_name(new_name)?;
    let mut src_dir = dir_inode(&t.inodes, parent)?;
    let mut dst_dir = if new_parent == parent { None } else { Some(dir_inode(&t.inodes, new_parent)?) };
    let src = dentry(&t.dentries, parent, name)?;
    let dst = load_dentry(&t.dentries, new_parent, new_name)?;
    if let Some(d) = &dst {
        if d.id == src.id {
            // Same inode (same name, or two links of one file): POSIX says do nothing.
            return Ok(Reply::Ok);
        }
        if flags & RENAME_NOREPLACE != 0 {
            return Err(fs_err!(Exists, "entry {} already exists in directory {new_parent}", q(new_name)).into());
        }
        check_unlocked(t, new_parent, new_name)?;
        if d.owner != ctx.node {
            return Err(needs_protocol(format!("{} is owned by metadata node {}", d.id, d.owner)));
        }
    }
    check_unlocked(t, parent, name)?;
    let src_is_dir = src.kind == FileKind::Dir;
    if src.owner != ctx.node && (new_parent != parent || !src_is_dir) {
        return Err(needs_protocol(format!("{} is owned by metadata node {}", src.id, src.owner)));
    }
    if src_is_dir && new_parent != parent && is_within(t, ctx.node, new_parent, src.id)? {
        return Err(fs_err!(
            Invalid,
            "cannot move directory {} ({}) into its own subtree ({new_parent})",
            q(name),
            src.id
        )
        .into());
    }
    // A directory owned elsewhere that stays in its parent: only the dentry changes.
    let mut src_inode = if src.owner == ctx.node { Some(dentry_inode(&t.inodes, parent, name, &src)?) } else { None };
    let dst_inode = match &dst {
        None => None,
        Some(d) => {
            let di = dentry_inode(&t.inodes, new_parent, new_name, d)?;
            match (src_is_dir, d.kind == FileKind::Dir) {
                (true, false) => {
                    return Err(fs_err!(
                        NotDir,
                        "cannot replace non-directory {} in {new_parent} by a directory",
                        q(new_name)
                    )
                    .into())
                }
                (false, true) => {
                    return Err(fs_err!(
                        IsDir,
                        "cannot replace directory {} in {new_parent} by a non-directory",
                        q(new_name)
                    )
                    .into())
                }
                (true, true) if !is_empty_dir(&t.dentries, d.id)? => {
                    return Err(
                        fs_err!(NotEmpty, "directory {} ({}) in {new_parent} is not empty", q(new_name), d.id).into()
                    )
                }
                _ => {}
            }
            Some((d.id, di))
        }
    };
    // ---- writes only below this line
    if let Some((did, di)) = dst_inode {
        t.remove_dentry(new_parent, new_name)?;
        if di.kind == FileKind::Dir {
            t.remove_inode(did)?;
            ctx.dirs_delta -= 1;
            let d = dst_dir.as_mut().unwrap_or(&mut src_dir);
            d.nlink = d.nlink.saturating_sub(1);
        } else {
            drop_link(t, ctx, did, di)?;
        }
    }
    t.remove_dentry(parent, name)?;
    t.put_dentry(new_parent, new_name, &src)?;
    if let Some(src_inode) = src_inode.as_mut() {
        src_inode.ctime = ctx.now;
        if src_is_dir {
            if let Some(dd) = dst_dir.as_mut() {
                src_inode.parent = Some(new_parent);
                src_dir.nlink = src_dir.nlink.saturating_sub(1);
                dd.nlink += 1;
            }
        }
        t.put_inode(src.id, src_inode)?;
    }
    touch_dir(&mut src_dir, ctx.now);
    t.put_inode(parent, &src_dir)?;
    if let Some(mut dd) = dst_dir {
        touch_dir(&mut dd, ctx.now);
        t.put_inode(new_parent, &dd)?;
    }
    Ok(Reply::Ok)
}

/// `renameat2(RENAME_EXCHANGE)`: both names must exist and swap their
/// entries atomically. A directory that changes parent gets its `parent`
/// pointer, and the link counts of both parents follow the directories.
fn rename_exchange(
    t: &mut Tables<'_>,
    ctx: &mut Ctx<'_>,
    parent: EntryId,
    name: &[u8],
    new_parent: EntryId,
    new_name: &[u8],
) -> OpResult<Reply> {
    check_name(name)?;
    check_name(new_name)?;
    let mut src_dir = dir_inode(&t.inodes, parent)?;
    let mut dst_dir = if new_parent == parent { None } else { Some(dir_inode(&t.inodes, new_parent)?) };
    let a = dentry(&t.dentries, parent, name)?;
    let b = dentry(&t.dentries, new_parent, new_name)?;
    if a.id == b.id {
        return Ok(Reply::Ok);
    }
    check_unlocked(t, parent, name)?;
    check_unlocked(t, new_parent, new_name)?;
    for d in [&a, &b] {
        if d.owner != ctx.node {
            return Err(needs_protocol(format!("{} is owned by metadata node {}", d.id, d.owner)));
        }
    }
    let moves = new_parent != parent;
    for (d, n, to) in [(&a, name, new_parent), (&b, new_name, parent)] {
        if moves && d.kind == FileKind::Dir && is_within(t, ctx.node, to, d.id)? {
            return Err(fs_err!(
                Invalid,
                "cannot exchange directory {} ({}) with an entry inside its own subtree ({to})",
                q(n),
                d.id
            )
            .into());
        }
    }
    let mut ai = dentry_inode(&t.inodes, parent, name, &a)?;
    let mut bi = dentry_inode(&t.inodes, new_parent, new_name, &b)?;
    // ---- writes only below this line
    t.put_dentry(parent, name, &b)?;
    t.put_dentry(new_parent, new_name, &a)?;
    ai.ctime = ctx.now;
    bi.ctime = ctx.now;
    if let Some(dd) = dst_dir.as_mut() {
        if ai.kind == FileKind::Dir {
            ai.parent = Some(new_parent);
            src_dir.nlink = src_dir.nlink.saturating_sub(1);
            dd.nlink += 1;
        }
        if bi.kind == FileKind::Dir {
            bi.parent = Some(parent);
            dd.nlink = dd.nlink.saturating_sub(1);
            src_dir.nlink += 1;
        }
    }
    t.put_inode(a.id, &ai)?;
    t.put_inode(b.id, &bi)?;
    touch_dir(&mut src_dir, ctx.now);
    t.put_inode(parent, &src_dir)?;
    if let Some(mut dd) = dst_dir {
        touch_dir(&mut dd, ctx.now);
        t.put_inode(new_parent, &dd)?;
    }
    Ok(Reply::Ok)
}

/// Checks that `size` may be set on this inode (regular files only).
pub fn check_truncatable(id: EntryId, i: &Inode) -> FsResult<()> {
    match i.kind {
        FileKind::File => Ok(()),
        FileKind::Dir => Err(fs_err!(IsDir, "cannot set the size of directory {id}")),
        k => Err(fs_err!(Invalid, "cannot set the size of {k:?} {id}")),
    }
}

fn set_attr(t: &mut Tables<'_>, ctx: &mut Ctx<'_>, id: EntryId, a: &SetAttr, privileged: bool) -> OpResult<Reply> {
    refuse_moving(ctx, id)?;
    let mut i = inode(&t.inodes, id)?;
    if a.size.is_some() {
        check_truncatable(id, &i)?;
    }
    // A new owner needs room for the inode and its bytes (EDQUOT otherwise),
    // unless root asks.
    let to: Vec<QuotaId> = [
        a.uid.filter(|&u| u != i.uid).map(|id| QuotaId { kind: QuotaKind::User, id }),
        a.gid.filter(|&g| g != i.gid).map(|id| QuotaId { kind: QuotaKind::Group, id }),
    ]
    .into_iter()
    .flatten()
    .collect();
    if !to.is_empty() && !privileged {
        ctx.quota.admit_transfer(&t.usage, &to, a.size.unwrap_or(i.size))?;
    }
    let now = ctx.now;
    // chmod of an inode with an access ACL rewrites the ACL's owner, mask
    // (or owning group) and other entries in the same batch (as the
    // kernel's posix_acl_chmod): the ACL and the mode never disagree.
    let acl_key = child_key(id, acl::XATTR_ACCESS);
    let chmod_acl = match (a.mode, t.xattrs.get(acl_key.as_slice())?) {
        (Some(m), Some(v)) => acl::Acl::decode(&v).ok().map(|mut acl| {
            acl.chmod(m);
            acl.encode()
        }),
        _ => None,
    };
    if let Some(m) = a.mode {
        i.mode = m & 0o7777;
    }
    if let Some(v) = chmod_acl {
        t.xattrs.insert(acl_key.as_slice(), v.as_slice())?;
    }
    if let Some(u) = a.uid {
        i.uid = u;
    }
    if let Some(g) = a.gid {
        i.gid = g;
    }
    if let Some(s) = a.size {
        i.size = s;
        i.mtime = now;
    }
    if let Some(at) = resolve(a.atime, now) {
        i.atime = at;
    }
    if let Some(mt) = resolve(a.mtime, now) {
        i.mtime = mt;
    }
    i.ctime = now;
    t.put_inode(id, &i)?;
    Ok(Reply::Entry(to_attr(id, &i, ctx.node)))
}

/// relatime's "a day old" (Linux).
const RELATIME_SECS: i64 = 24 * 3600;

/// Whether a read at `at` moves `i`'s access time (`Request::TouchAtime`).
pub(crate) fn atime_due(i: &Inode, at: Timespec, strict: bool) -> bool {
    at > i.atime && (strict || i.atime <= i.mtime || i.atime <= i.ctime || at.sec - i.atime.sec >= RELATIME_SECS)
}

fn update_size(
    t: &mut Tables<'_>,
    ctx: &mut Ctx<'_>,
    id: EntryId,
    size: u64,
    mtime: Option<Timespec>,
    if_ctime: Option<Timespec>,
    held: bool,
) -> OpResult<Reply> {
    refuse_moving(ctx, id)?;
    let mut i = inode(&t.inodes, id)?;
    check_truncatable(id, &i)?;
    // A lower bound from the client's own writes holds only if nothing
    // (a truncation above all) changed the file since the client looked.
    if if_ctime.is_some_and(|c| c != i.ctime) {
        return Err(fs_err!(
            Busy,
            "file {id} changed since the writer saw it: its size must come from the chunk files"
        )
        .into());
    }
    // Writes only grow a file (truncation is `SetAttr`), and two writers'
    // reports may arrive in either order: the later computed size must not
    // be replaced by an earlier, smaller one.
    i.size = i.size.max(size);
    if let Some(m) = mtime {
        i.mtime = m;
        i.ctime = if held { i.ctime.max(m) } else { ctx.now };
    }
    t.put_inode(id, &i)?;
    Ok(Reply::Entry(to_attr(id, &i, ctx.node)))
}

fn set_xattr(
    t: &mut Tables<'_>,
    ctx: &mut Ctx<'_>,
    id: EntryId,
    name: &[u8],
    value: &[u8],
    flags: u32,
) -> OpResult<Reply> {
    check_xattr_name(name)?;
    refuse_moving(ctx, id)?;
    if value.len() > XATTR_SIZE_MAX {
        return Err(fs_err!(Range, "extended attribute value of {} bytes exceeds {XATTR_SIZE_MAX}", value.len()).into());
    }
    let kill_sgid = flags & XATTR_ACL_KILL_SGID != 0;
    let flags = flags & !XATTR_ACL_KILL_SGID;
    if flags & !(XATTR_CREATE | XATTR_REPLACE) != 0 || flags == XATTR_CREATE | XATTR_REPLACE {
        return Err(fs_err!(Invalid, "setxattr flags {flags:#x} are invalid").into());
    }
    if kill_sgid && name != acl::XATTR_ACCESS {
        return Err(fs_err!(Invalid, "setxattr flag XATTR_ACL_KILL_SGID is only for {}", q(acl::XATTR_ACCESS)).into());
    }
    let mut i = inode(&t.inodes, id)?;
    let key = child_key(id, name);
    let exists = t.xattrs.get(key.as_slice())?.is_some();
    if flags & XATTR_CREATE != 0 && exists {
        return Err(fs_err!(Exists, "extended attribute {} of {id} already exists", q(name)).into());
    }
    if flags & XATTR_REPLACE != 0 && !exists {
        return Err(fs_err!(NoData, "extended attribute {} of {id} does not exist", q(name)).into());
    }
    let acl = if name == acl::XATTR_ACCESS || name == acl::XATTR_DEFAULT {
        if name == acl::XATTR_DEFAULT && i.kind != FileKind::Dir {
            // As ext4: only directories have default ACLs.
            return Err(fs_err!(AccessDenied, "{id} is not a directory: it cannot have a default ACL").into());
        }
        let a = acl::Acl::decode(value).map_err(|e| fs_err!(Invalid, "{} of {id}: {e}", q(name)))?;
        Some(a)
    } else {
        None
    };
    // ---- writes only below this line
    match acl {
        // The access ACL sets the mode bits; one the mode says all of is not
        // stored (as Linux file systems).
        Some(a) if name == acl::XATTR_ACCESS => {
            i.mode = (i.mode & !0o777) | a.mode();
            if kill_sgid {
                i.mode &= !S_ISGID;
            }
            if a.is_minimal() {
                if exists {
                    t.xattrs.remove(key.as_slice())?;
                }
            } else {
                t.xattrs.insert(key.as_slice(), a.encode().as_slice())?;
            }
        }
        // Stored as encoded here: ids the format ignores are normalised.
        Some(a) => t.xattrs.insert(key.as_slice(), a.encode().as_slice())?,
        None => t.xattrs.insert(key.as_slice(), value)?,
    }
    i.ctime = ctx.now;
    t.put_inode(id, &i)?;
    Ok(Reply::Ok)
}

fn remove_xattr(t: &mut Tables<'_>, ctx: &mut Ctx<'_>, id: EntryId, name: &[u8]) -> OpResult<Reply> {
    check_xattr_name(name)?;
    refuse_moving(ctx, id)?;
    let mut i = inode(&t.inodes, id)?;
    let key = child_key(id, name);
    if t.xattrs.get(key.as_slice())?.is_none() {
        return Err(fs_err!(NoData, "extended attribute {} of {id} does not exist", q(name)).into());
    }
    t.xattrs.remove(key.as_slice())?;
    i.ctime = ctx.now;
    t.put_inode(id, &i)?;
    Ok(Reply::Ok)
}

fn set_dir_pattern(t: &mut Tables<'_>, ctx: &mut Ctx<'_>, id: EntryId, p: DirPattern) -> OpResult<Reply> {
    let mut i = dir_inode(&t.inodes, id)?;
    p.validate().map_err(|m| fs_err!(Invalid, "{m} (directory {id})"))?;
    i.dir_pattern = Some(p);
    i.ctime = ctx.now;
    t.put_inode(id, &i)?;
    Ok(Reply::Entry(to_attr(id, &i, ctx.node)))
}

/// Turns an open-unlinked entry into a chunk deletion (inode removed),
/// or into nothing when it has no chunk files.
fn finish_orphan(t: &mut Tables<'_>, ctx: &mut Ctx<'_>, id: EntryId, d: Disposal) -> OpResult<()> {
    t.remove_inode(id)?;
    let d = Disposal { state: DisposalState::DeleteChunks, ..d }.only(ctx.handles.take_known(id));
    if d.targets.is_empty() {
        t.disposal.remove(id_key(id).as_slice())?;
    } else {
        t.put_disposal(id, &d)?;
        ctx.disposal_queued = true;
    }
    Ok(())
}

fn release_orphan(t: &mut Tables<'_>, ctx: &mut Ctx<'_>, id: EntryId) -> OpResult<Reply> {
    let d: Option<Disposal> = get_record(&t.disposal, "disposal", id)?;
    if let Some(d) = d {
        // Re-checked here: another open may have arrived since the release.
        if d.state == DisposalState::OpenUnlinked && !ctx.handles.is_open(id) {
            finish_orphan(t, ctx, id, d)?;
        }
    }
    Ok(Reply::Ok)
}

fn recover_orphans(t: &mut Tables<'_>, ctx: &mut Ctx<'_>) -> OpResult<Reply> {
    let mut orphans = Vec::new();
    for r in t.disposal.iter()? {
        let (k, v) = r?;
        let id = EntryId::from_bytes(k.as_slice())
            .ok_or_else(|| OpError::Fatal(format!("disposal key of {} bytes", k.as_slice().len())))?;
        let d: Disposal = decode("disposal", id, v.as_slice()).map_err(OpError::Fatal)?;
        match d.state {
            DisposalState::OpenUnlinked => orphans.push((id, d)),
            DisposalState::DeleteChunks => ctx.disposal_queued = true,
        }
    }
    for (id, d) in orphans {
        finish_orphan(t, ctx, id, d)?;
    }
    Ok(Reply::Ok)
}

fn drop_disposal(t: &mut Tables<'_>, ids: &[EntryId]) -> OpResult<Reply> {
    for &id in ids {
        let d: Option<Disposal> = get_record(&t.disposal, "disposal", id)?;
        if d.is_some_and(|d| d.state == DisposalState::DeleteChunks) {
            t.disposal.remove(id_key(id).as_slice())?;
        }
    }
    Ok(Reply::Ok)
}

// ----------------------------------------------------------------- reads

impl ReadTables<'_> {
    pub fn getattr(&self, id: EntryId, owner: NodeId) -> OpResult<EntryAttr> {
        Ok(to_attr(id, &inode(&self.inodes, id)?, owner))
    }

    pub fn lookup(&self, parent: EntryId, name: &[u8], owner: NodeId) -> OpResult<EntryAttr> {
        let pdir = dir_inode(&self.inodes, parent)?;
        match name {
            b"." => return Ok(to_attr(parent, &pdir, owner)),
            b".." => {
                let up = pdir.parent.unwrap_or(EntryId::ROOT);
                return self.getattr(up, owner);
            }
            _ => check_name(name)?,
        }
        let d = dentry(&self.dentries, parent, name)?;
        if d.owner != owner {
            return Err(fs_err!(
                Unavailable,
                "entry {} in {parent} is stored on metadata node {}, not on this node {owner}",
                q(name),
                d.owner
            )
            .into());
        }
        let i = dentry_inode(&self.inodes, parent, name, &d)?;
        Ok(to_attr(d.id, &i, owner))
    }

    /// Entries strictly after `after`, at most `max` (capped), plus whether more follow.
    pub fn readdir(&self, dir: EntryId, after: Option<&[u8]>, max: u32) -> OpResult<(Vec<DirEntry>, bool)> {
        dir_inode(&self.inodes, dir)?;
        let max = max.clamp(1, READDIR_MAX) as usize;
        let mut out = Vec::with_capacity(max.min(64));
        let mut more = false;
        for r in scan_children(&self.dentries, dir, after)? {
            let (name, v) = r?;
            if out.len() == max {
                more = true;
                break;
            }
            let d: Dentry = decode("dentry", format_args!("{dir}/{}", q(&name)), &v).map_err(OpError::Fatal)?;
            out.push(DirEntry { name, id: d.id, kind: d.kind });
        }
        Ok((out, more))
    }

    pub fn readlink(&self, id: EntryId) -> OpResult<Vec<u8>> {
        let i = inode(&self.inodes, id)?;
        match i.symlink {
            Some(t) if i.kind == FileKind::Symlink => Ok(t),
            _ => Err(fs_err!(Invalid, "{id} is not a symbolic link").into()),
        }
    }

    pub fn getxattr(&self, id: EntryId, name: &[u8]) -> OpResult<Vec<u8>> {
        check_xattr_name(name)?;
        inode(&self.inodes, id)?;
        match self.xattrs.get(child_key(id, name).as_slice())? {
            Some(v) => Ok(v.to_vec()),
            None => Err(fs_err!(NoData, "extended attribute {} of {id} does not exist", q(name)).into()),
        }
    }

    pub fn listxattr(&self, id: EntryId) -> OpResult<Vec<Vec<u8>>> {
        inode(&self.inodes, id)?;
        scan_children(&self.xattrs, id, None)?.map(|r| r.map(|(n, _)| n)).collect::<Result<_, _>>()
    }

    /// Disposal records in id order, starting after `after`; at most `max`.
    pub fn disposal_scan(&self, after: Option<EntryId>, max: usize) -> OpResult<Vec<(EntryId, Disposal)>> {
        let start = after.map(|a| a.to_bytes());
        let bounds: (std::ops::Bound<&[u8]>, std::ops::Bound<&[u8]>) = match &start {
            Some(s) => (std::ops::Bound::Excluded(s.as_slice()), std::ops::Bound::Unbounded),
            None => (std::ops::Bound::Unbounded, std::ops::Bound::Unbounded),
        };
        let mut out = Vec::new();
        for r in self.disposal.range_from(bounds.0)? {
            let (k, v) = r?;
            let id = EntryId::from_bytes(k.as_slice())
                .ok_or_else(|| OpError::Fatal(format!("disposal key of {} bytes", k.as_slice().len())))?;
            out.push((id, decode("disposal", id, v.as_slice()).map_err(OpError::Fatal)?));
            if out.len() >= max {
                break;
            }
        }
        Ok(out)
    }

    pub fn disposal(&self, id: EntryId) -> OpResult<Option<Disposal>> {
        get_record(&self.disposal, "disposal", id)
    }
}
