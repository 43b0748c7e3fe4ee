//! Several metadata nodes: directories owned by other nodes, and the
//! crash-safe protocol of operations that touch two owners.
//!
//! Owns the choice of a new directory's owner (metadata-node choosers), the
//! intent records of cross-node operations and their recovery, the steps a
//! node runs for a peer (`Request::MetaPeer`), lookups of entries whose inode
//! is elsewhere, and the crash hook for tests (`HIVEFS_CRASH_AT`). It must
//! not hold the single-node rules (those stay in `ops`): a local rule that
//! meets a remote part answers [`needs_protocol`], and the namespace runs the
//! operation here instead.
//!
//! Protocol (one coordinator, the node that received the client's request):
//! 1. *intent*: one transaction writes an intent record (with the client's
//!    operation id) and locks the dentries involved; for mkdir it also writes
//!    the new dentry (naming the remote owner) and the parent's link count.
//! 2. *remote step* on the peer, idempotent: keyed by the new directory's id
//!    (create, remove) or by the intent id (a rename's destination half is
//!    recorded in `peer_done`).
//! 3. *commit*: one transaction finishes the local part, removes the intent
//!    and records the client's answer under its operation id, so a client
//!    retry gets that answer. A refusal of the remote step undoes the intent
//!    instead (and is recorded as the answer).
//!
//! At start every intent is driven again from step 2 by a task that retries
//! until the peer answers; client retries of such an operation wait for it.
//! See `docs/design-meta.md` ("Several metadata nodes").

use crate::namespace::Namespace;
use crate::ops::{
    check_name, dentry, dir_inode, drop_link, inherit_group, inode, is_empty_dir, load_dentry, load_inode, new_inode,
    q, to_attr, touch_dir, Mutation, OpError, OpResult, Tables, LINK_MAX,
};
use crate::store::{child_key, decode, encode, get_record, id_key, scan_children, Dentry, Inode};
use crate::targets::BoxFut;
use hivefs_cluster::Cluster;
use hivefs_proto::{
    MetaChooser, OpId, PeerOp, Reachability, Reply, Request, Response, RENAME_EXCHANGE, RENAME_NOREPLACE,
};
use hivefs_types::attr::{EntryAttr, FileKind};
use hivefs_types::error::{ErrorCode, FsError, FsResult};
use hivefs_types::fs_err;
use hivefs_types::ids::{EntryId, NodeId, NodeType};
use redb::ReadableTable;
use serde::{Deserialize, Serialize};
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;
use tracing::{error, info, warn};

// ------------------------------------------------------------------ records

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
}

impl IntentStep {
    /// The local dentry the intent holds.
    fn dentry_key(&self) -> Vec<u8> {
        match self {
            IntentStep::Mkdir { parent, name, .. }
            | IntentStep::Rmdir { parent, name, .. }
            | IntentStep::Unlink { parent, name, .. }
            | IntentStep::Exchange { parent, name, .. }
            | IntentStep::Rename { parent, name, .. } => child_key(*parent, name),
            // The name on the other node: no local dentry is held.
            IntentStep::Link { new_parent, new_name, .. } => child_key(*new_parent, new_name),
        }
    }

    fn op_name(&self) -> &'static str {
        match self {
            IntentStep::Mkdir { .. } => "mkdir",
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
            IntentStep::Mkdir { parent, name, id, owner, .. } => {
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

pub(crate) fn load_dirx<T: ReadableTable<&'static [u8], &'static [u8]>>(
    t: &T,
    id: EntryId,
) -> OpResult<Option<DirExtra>> {
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

fn load_intent<T: ReadableTable<&'static [u8], &'static [u8]>>(t: &T, iid: EntryId) -> OpResult<Option<Intent>> {
    get_record(t, "intent", iid)
}

fn put_intent(t: &mut Tables<'_>, iid: EntryId, i: &Intent) -> OpResult<()> {
    t.intents.insert(id_key(iid).as_slice(), encode(i).as_slice())?;
    t.locked.insert(i.step.dentry_key().as_slice(), id_key(iid).as_slice())?;
    Ok(())
}

fn clear_intent(t: &mut Tables<'_>, iid: EntryId) -> OpResult<Option<Intent>> {
    let i = load_intent(&t.intents, iid)?;
    if let Some(i) = &i {
        t.intents.remove(id_key(iid).as_slice())?;
        t.locked.remove(i.step.dentry_key().as_slice())?;
    }
    Ok(i)
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

// ------------------------------------------------------------ crash hook

/// Test hook: `HIVEFS_CRASH_AT=<op>:<step>` makes the metadata service abort
/// (`std::process::abort`, as `kill -9`) at that step of a cross-node
/// protocol. `op` is `mkdir`, `rmdir`, `rename`, `link` or `unlink`; `step` is `intent` (the
/// intent is committed, nothing sent), `peer` (the peer committed its step
/// and has not answered), `remote` (the coordinator has the peer's answer,
/// nothing committed) or `commit` (committed, the client not answered).
pub const CRASH_ENV: &str = "HIVEFS_CRASH_AT";

#[derive(Clone, Debug, Default)]
pub enum CrashHook {
    #[default]
    Off,
    /// Abort the process at `op:step`.
    Abort(String),
    /// Unit tests: stop the operation at `op:step` with an error, leaving the
    /// store as an abort would; the flag tells that it fired.
    Stop(String, Arc<std::sync::atomic::AtomicBool>),
}

impl CrashHook {
    pub fn from_env() -> CrashHook {
        match std::env::var(CRASH_ENV) {
            Ok(s) if !s.is_empty() => {
                warn!("test hook {CRASH_ENV}={s}: this metadata service aborts at that protocol step");
                CrashHook::Abort(s)
            }
            _ => CrashHook::Off,
        }
    }

    fn at(&self, op: &str, step: &str) -> FsResult<()> {
        let hit = |s: &str| s.split_once(':') == Some((op, step));
        match self {
            CrashHook::Abort(s) if hit(s) => {
                error!("{CRASH_ENV}={s}: aborting at {op}:{step}");
                std::process::abort();
            }
            CrashHook::Stop(s, fired) if hit(s) => {
                fired.store(true, Ordering::SeqCst);
                Err(fs_err!(Unavailable, "crash injected at {op}:{step}"))
            }
            _ => Ok(()),
        }
    }
}

// ------------------------------------------------------------------ peers

/// The other metadata nodes, as this node reaches them.
pub trait Peers: Send + Sync + 'static {
    /// Metadata nodes that may own new directories (online ones).
    fn meta_nodes(&self) -> Vec<NodeId>;
    /// Sends a request to metadata node `node`.
    fn call(&self, node: NodeId, req: Request) -> BoxFut<FsResult<Reply>>;
}

/// [`Peers`] over the cluster view from mgmtd.
pub struct ClusterPeers {
    pub cluster: Arc<Cluster>,
}

impl Peers for ClusterPeers {
    fn meta_nodes(&self) -> Vec<NodeId> {
        let v = self.cluster.view();
        let mut n: Vec<NodeId> = v
            .nodes
            .values()
            .filter(|n| n.node_type == NodeType::Meta && n.reachability == Reachability::Online)
            .map(|n| n.id)
            .collect();
        n.sort();
        n
    }

    fn call(&self, node: NodeId, req: Request) -> BoxFut<FsResult<Reply>> {
        let cluster = self.cluster.clone();
        Box::pin(async move { cluster.node_pool(NodeType::Meta, node).await?.rpc(&req).await })
    }
}

/// What a namespace keeps for the multi-node part.
#[derive(Default)]
pub struct Multi {
    peers: RwLock<Option<Arc<dyn Peers>>>,
    pub(crate) crash: RwLock<CrashHook>,
    intent_seq: AtomicU64,
    /// Directories owned per metadata node (last report plus our choices since).
    counts: Mutex<HashMap<NodeId, u64>>,
    rr: AtomicU64,
    /// Client operations whose intent is pending: their retries wait.
    pending: Mutex<HashSet<(u64, u64)>>,
    finished: tokio::sync::Notify,
    /// Files whose inode a rename moved to another node while handles
    /// opened here were open: their requests are forwarded there (node, and
    /// handles not yet released).
    moved: Mutex<HashMap<EntryId, (NodeId, u32)>>,
}

fn op_key(op: &OpId) -> (u64, u64) {
    (op.client, op.seq)
}

/// Picks the owner of a new directory among `nodes` (sorted, non-empty).
pub fn choose_owner(
    chooser: MetaChooser,
    nodes: &[NodeId],
    counts: &HashMap<NodeId, u64>,
    rr: &AtomicU64,
    random: u64,
) -> NodeId {
    match chooser {
        MetaChooser::Random => nodes[(random % nodes.len() as u64) as usize],
        MetaChooser::RoundRobin => nodes[(rr.fetch_add(1, Ordering::Relaxed) % nodes.len() as u64) as usize],
        MetaChooser::Balanced => {
            let least = nodes.iter().map(|n| counts.get(n).copied().unwrap_or(0)).min().unwrap_or(0);
            let ties: Vec<NodeId> =
                nodes.iter().copied().filter(|n| counts.get(n).copied().unwrap_or(0) == least).collect();
            ties[(rr.fetch_add(1, Ordering::Relaxed) % ties.len() as u64) as usize]
        }
    }
}

// ------------------------------------------------------------- mutations

/// Writer mutations of the protocol (see the module doc).
#[derive(Clone, Debug)]
pub enum MultiMut {
    MkdirIntent {
        intent: EntryId,
        parent: EntryId,
        name: Vec<u8>,
        mode: u32,
        uid: u32,
        gid: u32,
        owner: NodeId,
        op: Option<OpId>,
    },
    MkdirCommit {
        intent: EntryId,
        attr: EntryAttr,
    },
    MkdirAbort {
        intent: EntryId,
        err: FsError,
    },
    RmdirIntent {
        intent: EntryId,
        parent: EntryId,
        name: Vec<u8>,
        op: Option<OpId>,
    },
    RmdirCommit {
        intent: EntryId,
    },
    RenameIntent {
        intent: EntryId,
        parent: EntryId,
        name: Vec<u8>,
        new_parent: EntryId,
        new_owner: NodeId,
        new_name: Vec<u8>,
        flags: u32,
        op: Option<OpId>,
    },
    RenameCommit {
        intent: EntryId,
    },
    /// Drops an intent whose remote step was refused; answers `err`.
    Abort {
        intent: EntryId,
        err: FsError,
    },
    PeerCreateDir {
        id: EntryId,
        inode: Inode,
        parent_owner: NodeId,
        chooser: Option<MetaChooser>,
    },
    PeerRemoveDir {
        id: EntryId,
    },
    PeerSetParent {
        id: EntryId,
        parent: EntryId,
        parent_owner: NodeId,
    },
    PeerRenameIn {
        intent: EntryId,
        src_parent: EntryId,
        new_parent: EntryId,
        new_name: Vec<u8>,
        flags: u32,
        dentry: Dentry,
        inode: Option<Inode>,
        xattrs: Vec<(Vec<u8>, Vec<u8>)>,
    },
    PeerForget {
        intent: EntryId,
    },
    SetChooser {
        id: EntryId,
        chooser: MetaChooser,
    },
    /// Raises the link count of file `id` and records the intent to name
    /// it as `new_parent/new_name` on `new_owner`.
    LinkIntent {
        intent: EntryId,
        id: EntryId,
        new_parent: EntryId,
        new_owner: NodeId,
        new_name: Vec<u8>,
        op: Option<OpId>,
    },
    LinkCommit {
        intent: EntryId,
    },
    /// The dentry was refused: the raised link is dropped again.
    LinkAbort {
        intent: EntryId,
        err: FsError,
    },
    UnlinkIntent {
        intent: EntryId,
        parent: EntryId,
        name: Vec<u8>,
        op: Option<OpId>,
    },
    UnlinkCommit {
        intent: EntryId,
    },
    PeerLinkIn {
        intent: EntryId,
        new_parent: EntryId,
        new_name: Vec<u8>,
        dentry: Dentry,
    },
    PeerDropLink {
        intent: EntryId,
        id: EntryId,
    },
    ExchangeIntent {
        intent: EntryId,
        parent: EntryId,
        name: Vec<u8>,
        new_parent: EntryId,
        new_owner: NodeId,
        new_name: Vec<u8>,
        b: Dentry,
        op: Option<OpId>,
    },
    ExchangeCommit {
        intent: EntryId,
    },
    PeerExchangeIn {
        intent: EntryId,
        new_parent: EntryId,
        new_name: Vec<u8>,
        expect: EntryId,
        put: Dentry,
    },
}

impl MultiMut {
    pub(crate) fn adds_to_namespace(&self) -> bool {
        matches!(
            self,
            MultiMut::MkdirIntent { .. }
                | MultiMut::PeerCreateDir { .. }
                | MultiMut::PeerRenameIn { .. }
                | MultiMut::LinkIntent { .. }
                | MultiMut::PeerLinkIn { .. }
        )
    }
}

pub(crate) fn apply(t: &mut Tables<'_>, ctx: &mut crate::ops::Ctx<'_>, m: MultiMut) -> OpResult<Reply> {
    let node = ctx.node;
    match m {
        MultiMut::MkdirIntent { intent, parent, name, mode, uid, gid, owner, op } => {
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
            put_intent(
                t,
                intent,
                &Intent { op, step: IntentStep::Mkdir { parent, name, id, owner, inode: i, chooser } },
            )?;
            Ok(Reply::Entry(attr))
        }
        MultiMut::MkdirCommit { intent, attr } => {
            clear_intent(t, intent)?;
            Ok(Reply::Entry(attr))
        }
        MultiMut::MkdirAbort { intent, err } => {
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
        MultiMut::RmdirIntent { intent, parent, name, op } => {
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
        MultiMut::RmdirCommit { intent } => {
            if let Some(Intent { step: IntentStep::Rmdir { parent, name, id, .. }, .. }) = clear_intent(t, intent)? {
                if load_dentry(&t.dentries, parent, &name)?.is_some_and(|d| d.id == id) {
                    t.remove_dentry(parent, &name)?;
                    if let Some(mut p) = load_inode(&t.inodes, parent)? {
                        p.nlink = p.nlink.saturating_sub(1);
                        touch_dir(&mut p, ctx.now);
                        t.put_inode(parent, &p)?;
                    }
                }
            }
            Ok(Reply::Ok)
        }
        MultiMut::RenameIntent { intent, parent, name, new_parent, new_owner, new_name, flags, op } => {
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
        MultiMut::RenameCommit { intent } => {
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
        MultiMut::Abort { intent, err } => {
            clear_intent(t, intent)?;
            Err(err.into())
        }
        MultiMut::PeerCreateDir { id, inode: i, parent_owner, chooser } => {
            if let Some(existing) = load_inode(&t.inodes, id)? {
                return Ok(Reply::Entry(to_attr(id, &existing, node)));
            }
            t.put_inode(id, &i)?;
            put_dirx(t, id, &DirExtra { parent_owner: Some(parent_owner).filter(|o| *o != node), chooser })?;
            ctx.dirs_delta += 1;
            Ok(Reply::Entry(to_attr(id, &i, node)))
        }
        MultiMut::PeerRemoveDir { id } => {
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
        MultiMut::PeerSetParent { id, parent, parent_owner } => {
            let mut i = dir_inode(&t.inodes, id)?;
            set_parent(t, node, id, &mut i, parent, parent_owner)?;
            i.ctime = ctx.now;
            t.put_inode(id, &i)?;
            Ok(Reply::Ok)
        }
        MultiMut::PeerRenameIn {
            intent,
            src_parent,
            new_parent,
            new_name,
            flags,
            dentry: src,
            inode: moved,
            xattrs,
        } => {
            if t.peer_done.get(id_key(intent).as_slice())?.is_some() {
                return Ok(Reply::Ok);
            }
            check_name(&new_name)?;
            let mut pdir = dir_inode(&t.inodes, new_parent)?;
            let is_dir = src.kind == FileKind::Dir;
            let dst = load_dentry(&t.dentries, new_parent, &new_name)?;
            let mut replaced = None;
            if let Some(d) = &dst {
                if d.id != src.id {
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
        MultiMut::PeerForget { intent } => {
            t.peer_done.remove(id_key(intent).as_slice())?;
            Ok(Reply::Ok)
        }
        MultiMut::LinkIntent { intent, id, new_parent, new_owner, new_name, op } => {
            check_name(&new_name)?;
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
        MultiMut::LinkCommit { intent } => {
            let id = match clear_intent(t, intent)? {
                Some(Intent { step: IntentStep::Link { id, .. }, .. }) => id,
                _ => return Err(fs_err!(Busy, "cross-node link {intent} already finished").into()),
            };
            let i = inode(&t.inodes, id)?;
            Ok(Reply::Entry(to_attr(id, &i, node)))
        }
        MultiMut::LinkAbort { intent, err } => {
            if let Some(Intent { step: IntentStep::Link { id, .. }, .. }) = clear_intent(t, intent)? {
                if let Some(i) = load_inode(&t.inodes, id)? {
                    drop_link(t, ctx, id, i)?;
                }
            }
            Err(err.into())
        }
        MultiMut::UnlinkIntent { intent, parent, name, op } => {
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
        MultiMut::UnlinkCommit { intent } => {
            if let Some(Intent { step: IntentStep::Unlink { parent, name, id, .. }, .. }) = clear_intent(t, intent)? {
                if load_dentry(&t.dentries, parent, &name)?.is_some_and(|d| d.id == id) {
                    t.remove_dentry(parent, &name)?;
                    if let Some(mut p) = load_inode(&t.inodes, parent)? {
                        touch_dir(&mut p, ctx.now);
                        t.put_inode(parent, &p)?;
                    }
                }
            }
            Ok(Reply::Ok)
        }
        MultiMut::PeerLinkIn { intent, new_parent, new_name, dentry: d } => {
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
        MultiMut::PeerDropLink { intent, id } => {
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
        MultiMut::ExchangeIntent { intent, parent, name, new_parent, new_owner, new_name, b, op } => {
            check_name(&name)?;
            check_name(&new_name)?;
            dir_inode(&t.inodes, parent)?;
            let a = dentry(&t.dentries, parent, &name)?;
            check_unlocked(t, parent, &name)?;
            let step = IntentStep::Exchange { parent, name, new_parent, new_owner, new_name, a, b };
            put_intent(t, intent, &Intent { op, step })?;
            Ok(Reply::Ok)
        }
        MultiMut::ExchangeCommit { intent } => {
            let Some(Intent { step: IntentStep::Exchange { parent, name, a, b, .. }, .. }) = clear_intent(t, intent)?
            else {
                return Ok(Reply::Ok);
            };
            t.peer_done.remove(id_key(intent).as_slice())?;
            if load_dentry(&t.dentries, parent, &name)?.is_some_and(|d| d.id == a.id) {
                t.put_dentry(parent, &name, &b)?;
                if let Some(mut p) = load_inode(&t.inodes, parent)? {
                    if a.kind == FileKind::Dir {
                        p.nlink = p.nlink.saturating_sub(1);
                    }
                    if b.kind == FileKind::Dir {
                        p.nlink += 1;
                    }
                    touch_dir(&mut p, ctx.now);
                    t.put_inode(parent, &p)?;
                }
            }
            Ok(Reply::Ok)
        }
        MultiMut::PeerExchangeIn { intent, new_parent, new_name, expect, put } => {
            if t.peer_done.get(id_key(intent).as_slice())?.is_some() {
                return Ok(Reply::Ok);
            }
            let mut pdir = dir_inode(&t.inodes, new_parent)?;
            let b = dentry(&t.dentries, new_parent, &new_name)?;
            if b.id != expect {
                return Err(
                    fs_err!(Busy, "{} in {new_parent} changed during an exchange; try again", q(&new_name)).into()
                );
            }
            check_unlocked(t, new_parent, &new_name)?;
            t.put_dentry(new_parent, &new_name, &put)?;
            if b.kind == FileKind::Dir {
                pdir.nlink = pdir.nlink.saturating_sub(1);
            }
            if put.kind == FileKind::Dir {
                pdir.nlink += 1;
            }
            touch_dir(&mut pdir, ctx.now);
            t.put_inode(new_parent, &pdir)?;
            t.peer_done.insert(id_key(intent).as_slice(), [].as_slice())?;
            Ok(Reply::Ok)
        }
        MultiMut::SetChooser { id, chooser } => {
            let mut i = dir_inode(&t.inodes, id)?;
            let mut x = load_dirx(&t.dirx, id)?.unwrap_or_default();
            x.chooser = Some(chooser);
            put_dirx(t, id, &x)?;
            i.ctime = ctx.now;
            t.put_inode(id, &i)?;
            Ok(Reply::Entry(to_attr(id, &i, node)))
        }
    }
}

fn set_parent(
    t: &mut Tables<'_>,
    node: NodeId,
    id: EntryId,
    i: &mut Inode,
    parent: EntryId,
    parent_owner: NodeId,
) -> OpResult<()> {
    i.parent = Some(parent);
    let mut x = load_dirx(&t.dirx, id)?.unwrap_or_default();
    x.parent_owner = Some(parent_owner).filter(|o| *o != node);
    put_dirx(t, id, &x)
}

// ------------------------------------------------------------ namespace

/// Transport failures, after which a step is sent again.
fn transient(e: &FsError) -> bool {
    matches!(e.code, ErrorCode::Unavailable | ErrorCode::TimedOut | ErrorCode::Io)
}

fn unexpected(r: Reply) -> FsError {
    fs_err!(Protocol, "unexpected reply {r:?} from a metadata peer")
}

impl Namespace {
    pub fn set_peers(&self, peers: Arc<dyn Peers>) {
        *self.multi.peers.write().expect("peers lock") = Some(peers);
    }

    /// Sets the crash hook (the service reads [`CRASH_ENV`]; unit tests use [`CrashHook::Stop`]).
    pub fn set_crash_hook(&self, hook: CrashHook) {
        *self.multi.crash.write().expect("crash lock") = hook;
    }

    fn crash(&self, op: &str, step: &str) -> FsResult<()> {
        self.multi.crash.read().expect("crash lock").at(op, step)
    }

    fn peers(&self) -> Option<Arc<dyn Peers>> {
        self.multi.peers.read().expect("peers lock").clone()
    }

    fn next_intent(&self) -> EntryId {
        let c = self.multi.intent_seq.fetch_add(1, Ordering::Relaxed) + 1;
        EntryId { node: self.node().0, epoch: self.epoch(), counter: c }
    }

    /// Sends a step to metadata node `node` (this node: answered here),
    /// again and again while the peer is unreachable.
    fn peer_call<'a>(
        &'a self,
        node: NodeId,
        op: PeerOp,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = FsResult<Reply>> + Send + 'a>> {
        Box::pin(async move {
            if node == self.node() {
                return self.peer(op).await;
            }
            let peers = self
                .peers()
                .ok_or_else(|| fs_err!(Unavailable, "metadata node {node} is not reachable: no peers configured"))?;
            let mut backoff = Duration::from_millis(100);
            loop {
                match peers.call(node, Request::MetaPeer { op: op.clone() }).await {
                    Err(e) if transient(&e) => {
                        warn!("metadata node {node} did not answer a cross-node step (trying again): {e}");
                        tokio::time::sleep(backoff).await;
                        backoff = (backoff * 2).min(Duration::from_secs(2));
                    }
                    r => return r,
                }
            }
        })
    }

    /// Records a directory count reported by (or chosen for) a node.
    pub fn set_dir_count(&self, node: NodeId, dirs: u64) {
        self.multi.counts.lock().expect("counts lock").insert(node, dirs);
    }

    /// Refreshes the directory counts of all metadata nodes (balanced chooser).
    pub async fn refresh_counts(&self) {
        let Some(peers) = self.peers() else { return };
        for n in peers.meta_nodes() {
            let dirs = if n == self.node() {
                self.counts().map(|(_, d)| d).ok()
            } else {
                match peers.call(n, Request::MetaStat).await {
                    Ok(Reply::MetaStat { dirs, .. }) => Some(dirs),
                    _ => None,
                }
            };
            if let Some(d) = dirs {
                self.set_dir_count(n, d);
            }
        }
    }

    fn choose_owner(&self, chooser: MetaChooser) -> NodeId {
        let me = self.node();
        let Some(peers) = self.peers() else { return me };
        let nodes = peers.meta_nodes();
        if nodes.len() <= 1 {
            return me;
        }
        let mut counts = self.multi.counts.lock().expect("counts lock");
        let n = choose_owner(chooser, &nodes, &counts, &self.multi.rr, rand::random());
        *counts.entry(n).or_insert(0) += 1;
        n
    }

    /// The recorded answer of a client operation that was applied, waiting
    /// first for its pending intent (after a restart, recovery finishes it).
    async fn recorded(&self, op: Option<OpId>) -> FsResult<Option<Response>> {
        let Some(op) = op else { return Ok(None) };
        loop {
            let notified = self.multi.finished.notified();
            if !self.multi.pending.lock().expect("pending lock").contains(&op_key(&op)) {
                break;
            }
            let _ = tokio::time::timeout(Duration::from_secs(1), notified).await;
        }
        self.recorded_reply(&op)
    }

    fn set_pending(&self, op: Option<OpId>, on: bool) {
        if let Some(op) = op {
            let mut p = self.multi.pending.lock().expect("pending lock");
            if on {
                p.insert(op_key(&op));
            } else {
                p.remove(&op_key(&op));
                self.multi.finished.notify_waiters();
            }
        }
    }

    async fn submit_multi(&self, op: Option<OpId>, m: MultiMut) -> FsResult<Reply> {
        self.submit_op(op, Mutation::Multi(m)).await
    }

    /// Mkdir, on the node chosen by the parent's metadata-node chooser.
    pub(crate) async fn mkdir_any(
        &self,
        parent: EntryId,
        name: Vec<u8>,
        mode: u32,
        uid: u32,
        gid: u32,
        op: Option<OpId>,
    ) -> Response {
        if let Some(r) = self.recorded(op).await? {
            return r;
        }
        let chooser = self.read(|t| load_dirx(t.dirx_table()?, parent))?.and_then(|x| x.chooser).unwrap_or_default();
        let owner = self.choose_owner(chooser);
        if owner == self.node() {
            return self.submit_op(op, Mutation::Mkdir { parent, name, mode, uid, gid }).await;
        }
        let intent = self.next_intent();
        // Pending before the intent exists: a retry of `op` waits for this attempt.
        self.start_protocol(
            "mkdir",
            intent,
            op,
            MultiMut::MkdirIntent { intent, parent, name, mode, uid, gid, owner, op },
        )
        .await
    }

    /// Rmdir; a directory owned elsewhere goes through the protocol.
    pub(crate) async fn rmdir_any(&self, parent: EntryId, name: Vec<u8>, op: Option<OpId>) -> Response {
        if let Some(r) = self.recorded(op).await? {
            return r;
        }
        match self.submit_op(op, Mutation::Rmdir { parent, name: name.clone() }).await {
            Err(e) if is_needs_protocol(&e) => {}
            r => return r,
        }
        let intent = self.next_intent();
        // Pending before the intent exists: a retry of `op` waits for this attempt.
        self.start_protocol("rmdir", intent, op, MultiMut::RmdirIntent { intent, parent, name, op }).await
    }

    /// Rename; `new_owner` is the node owning `new_parent` (`None`: this node).
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn rename_any(
        &self,
        parent: EntryId,
        name: Vec<u8>,
        new_parent: EntryId,
        new_owner: Option<NodeId>,
        new_name: Vec<u8>,
        flags: u32,
        op: Option<OpId>,
    ) -> Response {
        if let Some(r) = self.recorded(op).await? {
            return r;
        }
        let new_owner = new_owner.unwrap_or(self.node());
        if new_owner == self.node() {
            let m = Mutation::Rename { parent, name: name.clone(), new_parent, new_name: new_name.clone(), flags };
            match self.submit_op(op, m).await {
                Err(e) if is_needs_protocol(&e) => {}
                r => return r,
            }
        }
        check_name(&name)?;
        check_name(&new_name)?;
        if flags == RENAME_EXCHANGE {
            return self.exchange_any(parent, name, new_parent, new_owner, new_name, op).await;
        }
        let src = self
            .read(|t| load_dentry(&t.dentries, parent, &name))?
            .ok_or_else(|| fs_err!(NotFound, "no entry {} in directory {parent}", q(&name)))?;
        if src.kind == FileKind::Dir
            && new_parent != parent
            && self.is_within_any(new_parent, new_owner, src.id).await?
        {
            return Err(fs_err!(
                Invalid,
                "cannot move directory {} ({}) into its own subtree ({new_parent})",
                q(&name),
                src.id
            ));
        }
        let intent = self.next_intent();
        let m = MultiMut::RenameIntent { intent, parent, name, new_parent, new_owner, new_name, flags, op };
        self.start_protocol("rename", intent, op, m).await
    }

    /// Sets the ctime of inode `id` on metadata node `owner` to now.
    async fn touch_ctime(&self, owner: NodeId, id: EntryId) -> FsResult<()> {
        if owner == self.node() {
            self.submit_op(None, Mutation::SetAttr { id, attr: Default::default() }).await?;
            return Ok(());
        }
        let peers = self.peers().ok_or_else(|| fs_err!(Unavailable, "metadata node {owner}: no peers configured"))?;
        let req = Request::SetAttr { id, attr: Default::default(), caller: Default::default() };
        peers.call(owner, req).await.map(|_| ())
    }

    /// `RENAME_EXCHANGE` where a part is on another node: only the dentries
    /// swap (inodes stay with their owners, which the dentries name).
    async fn exchange_any(
        &self,
        parent: EntryId,
        name: Vec<u8>,
        new_parent: EntryId,
        new_owner: NodeId,
        new_name: Vec<u8>,
        op: Option<OpId>,
    ) -> Response {
        let a = self
            .read(|t| load_dentry(&t.dentries, parent, &name))?
            .ok_or_else(|| fs_err!(NotFound, "no entry {} in directory {parent}", q(&name)))?;
        let battr = if new_owner == self.node() {
            self.lookup_any(new_parent, &new_name).await?
        } else {
            let peers =
                self.peers().ok_or_else(|| fs_err!(Unavailable, "metadata node {new_owner}: no peers configured"))?;
            match peers.call(new_owner, Request::Lookup { parent: new_parent, name: new_name.clone() }).await? {
                Reply::Entry(e) => e,
                r => return Err(unexpected(r)),
            }
        };
        let b = Dentry { id: battr.id, kind: battr.kind, owner: battr.owner };
        if a.id == b.id {
            return Ok(Reply::Ok);
        }
        if parent != new_parent {
            let into = |d: &Dentry, to: EntryId, to_owner: NodeId| {
                let d = d.clone();
                async move {
                    if d.kind == FileKind::Dir && self.is_within_any(to, to_owner, d.id).await? {
                        return Err(fs_err!(
                            Invalid,
                            "cannot exchange directory {} with an entry inside its own subtree ({to})",
                            d.id
                        ));
                    }
                    Ok(())
                }
            };
            into(&a, new_parent, new_owner).await?;
            into(&b, parent, self.node()).await?;
        }
        let intent = self.next_intent();
        let m = MultiMut::ExchangeIntent { intent, parent, name, new_parent, new_owner, new_name, b, op };
        self.start_protocol("exchange", intent, op, m).await
    }

    /// After a rename moved file `id` to `new_owner`: its open handles count
    /// there, and their requests that reach this node are forwarded.
    async fn hand_over_opens(&self, id: EntryId, new_owner: NodeId) {
        let count = {
            let mut opens = self.opens.0.lock().expect("opens lock");
            let count = opens.remove(&id).unwrap_or(0);
            if count > 0 {
                self.multi.moved.lock().expect("moved lock").insert(id, (new_owner, count));
            }
            count
        };
        if count > 0 {
            info!("file {id} moved to metadata node {new_owner} with {count} open handles: they count there now");
            if let Err(e) = self.peer_call(new_owner, PeerOp::Opened { id, count }).await {
                warn!("file {id}: handing {count} open handles over to metadata node {new_owner}: {e}");
            }
        }
    }

    /// A request about a file that a rename moved to another node, sent to
    /// that node (the answer of the client's handle opened here).
    pub(crate) async fn forward_moved(&self, req: &Request) -> Option<Response> {
        let to = {
            let moved = self.multi.moved.lock().expect("moved lock");
            if moved.is_empty() {
                return None;
            }
            let id = |r: &Request| match r {
                Request::Open { id, .. }
                | Request::Release { id, .. }
                | Request::UpdateSize { id, .. }
                | Request::TouchAtime { id, .. }
                | Request::GetAttr { id }
                | Request::SetAttr { id, .. } => Some(*id),
                _ => None,
            };
            let id = match req {
                Request::Retryable { req: body, .. } => {
                    hivefs_proto::decode_body::<Request>(body).ok().and_then(|r| id(&r))
                }
                r => id(r),
            }?;
            let (node, _) = *moved.get(&id)?;
            drop(moved);
            // Only while the inode is not back here (a later rename may return it).
            if !matches!(self.read(|t| load_inode(&t.inodes, id)), Ok(None)) {
                self.multi.moved.lock().expect("moved lock").remove(&id);
                return None;
            }
            // Count handles opened or released through this node.
            let mut moved = self.multi.moved.lock().expect("moved lock");
            let inner = match req {
                Request::Retryable { .. } => None,
                r => Some(r),
            };
            match (inner, moved.get_mut(&id)) {
                (Some(Request::Open { .. }), Some((_, n))) => *n += 1,
                (Some(Request::Release { .. }), Some((_, n))) => {
                    *n = n.saturating_sub(1);
                    if *n == 0 {
                        moved.remove(&id);
                    }
                }
                _ => {}
            }
            node
        };
        let peers = self.peers()?;
        Some(peers.call(to, req.clone()).await)
    }

    /// Hard link of file `id` (on this node) as `new_parent/new_name` on
    /// `new_owner`: this node keeps the inode and its link count.
    pub(crate) async fn link_any(
        &self,
        id: EntryId,
        new_parent: EntryId,
        new_owner: NodeId,
        new_name: Vec<u8>,
        op: Option<OpId>,
    ) -> Response {
        if let Some(r) = self.recorded(op).await? {
            return r;
        }
        if new_owner == self.node() {
            return self.submit_op(op, Mutation::Link { id, new_parent, new_name }).await;
        }
        let intent = self.next_intent();
        let m = MultiMut::LinkIntent { intent, id, new_parent, new_owner, new_name, op };
        self.start_protocol("link", intent, op, m).await
    }

    /// Unlink; a dentry naming a file on another node goes through the protocol.
    pub(crate) async fn unlink_any(&self, parent: EntryId, name: Vec<u8>, op: Option<OpId>) -> Response {
        if let Some(r) = self.recorded(op).await? {
            return r;
        }
        match self.submit_op(op, Mutation::Unlink { parent, name: name.clone() }).await {
            Err(e) if is_needs_protocol(&e) => {}
            r => return r,
        }
        let intent = self.next_intent();
        self.start_protocol("unlink", intent, op, MultiMut::UnlinkIntent { intent, parent, name, op }).await
    }

    /// True if `dir` (owned by `owner`) is `ancestor` or below it, walking
    /// `parent` pointers across nodes.
    async fn is_within_any(&self, dir: EntryId, owner: NodeId, ancestor: EntryId) -> FsResult<bool> {
        let (mut cur, mut owner) = (dir, owner);
        for _ in 0..(1 << 16) {
            if cur == ancestor {
                return Ok(true);
            }
            if cur.is_root() {
                return Ok(false);
            }
            match self.peer_call(owner, PeerOp::GetParent { id: cur }).await? {
                Reply::DirParent { parent, owner: o } => (cur, owner) = (parent, o),
                r => return Err(unexpected(r)),
            }
        }
        Err(fs_err!(Io, "parent chain of {dir} is longer than 65536 directories: corrupt parent pointers"))
    }

    /// Starts a cross-node operation: records its intent (from then on a retry
    /// of `op` waits for this attempt instead of starting another), then drives
    /// it. `what` names the operation for the crash hook.
    async fn start_protocol(&self, what: &str, intent: EntryId, op: Option<OpId>, m: MultiMut) -> Response {
        self.set_pending(op, true);
        let r = match self.submit_multi(None, m).await {
            Err(e) => Err(e),
            Ok(_) => match self.crash(what, "intent") {
                Ok(()) => self.drive(intent).await,
                Err(e) => Err(e),
            },
        };
        self.set_pending(op, false);
        r
    }

    /// Carries an intent from its remote step to its commit (or undo).
    pub(crate) async fn drive(&self, intent: EntryId) -> Response {
        let Some(rec) = self.read(|t| load_intent(t.intent_table()?, intent))? else {
            return Err(fs_err!(Busy, "cross-node operation {intent} already finished"));
        };
        let op = rec.op;
        match rec.step {
            IntentStep::Mkdir { id, owner, inode, chooser, .. } => {
                let req = PeerOp::CreateDir { id, inode: encode(&inode), parent_owner: self.node(), chooser };
                match self.peer_call(owner, req).await {
                    Ok(Reply::Entry(attr)) => {
                        self.crash("mkdir", "remote")?;
                        let r = self.submit_multi(op, MultiMut::MkdirCommit { intent, attr }).await;
                        self.crash("mkdir", "commit")?;
                        r
                    }
                    Ok(r) => Err(unexpected(r)),
                    Err(err) => self.submit_multi(op, MultiMut::MkdirAbort { intent, err }).await,
                }
            }
            IntentStep::Rmdir { id, owner, .. } => match self.peer_call(owner, PeerOp::RemoveDir { id }).await {
                Ok(_) => {
                    self.crash("rmdir", "remote")?;
                    let r = self.submit_multi(op, MultiMut::RmdirCommit { intent }).await;
                    self.crash("rmdir", "commit")?;
                    r
                }
                Err(err) => self.submit_multi(op, MultiMut::Abort { intent, err }).await,
            },
            IntentStep::Rename { parent, new_parent, new_owner, new_name, flags, id, kind, owner, moved, .. } => {
                let moved_file = moved.is_some();
                let (inode, xattrs) = match moved {
                    Some((i, x)) => (Some(encode(&i)), x),
                    None => (None, Vec::new()),
                };
                let req = PeerOp::RenameIn {
                    intent,
                    src_parent: parent,
                    new_parent,
                    new_name,
                    flags,
                    id,
                    kind,
                    owner,
                    inode,
                    xattrs,
                };
                if let Err(err) = self.peer_call(new_owner, req).await {
                    return self.submit_multi(op, MultiMut::Abort { intent, err }).await;
                }
                if kind == FileKind::Dir && parent != new_parent {
                    let set = PeerOp::SetParent { id, parent: new_parent, parent_owner: new_owner };
                    if let Err(e) = self.peer_call(owner, set).await {
                        warn!("rename of directory {id}: its parent pointer on metadata node {owner}: {e}");
                    }
                } else if kind != FileKind::Dir && !moved_file {
                    // The inode stays on its owner: a rename changes its ctime (as Linux).
                    if let Err(e) = self.touch_ctime(owner, id).await {
                        warn!("rename of {id}: its ctime on metadata node {owner}: {e}");
                    }
                }
                self.crash("rename", "remote")?;
                let r = self.submit_multi(op, MultiMut::RenameCommit { intent }).await;
                self.crash("rename", "commit")?;
                if r.is_ok() && moved_file && new_owner != self.node() {
                    self.hand_over_opens(id, new_owner).await;
                }
                if new_owner != self.node() {
                    let _ = self.peer_call(new_owner, PeerOp::Forget { intent }).await;
                }
                r
            }
            IntentStep::Link { new_parent, new_owner, new_name, id, kind } => {
                let req = PeerOp::LinkIn { intent, new_parent, new_name, id, kind, owner: self.node() };
                if let Err(err) = self.peer_call(new_owner, req).await {
                    return self.submit_multi(op, MultiMut::LinkAbort { intent, err }).await;
                }
                self.crash("link", "remote")?;
                let r = self.submit_multi(op, MultiMut::LinkCommit { intent }).await;
                self.crash("link", "commit")?;
                let _ = self.peer_call(new_owner, PeerOp::Forget { intent }).await;
                r
            }
            IntentStep::Exchange { parent, new_parent, new_owner, new_name, a, b, .. } => {
                let req = PeerOp::ExchangeIn {
                    intent,
                    new_parent,
                    new_name,
                    expect: b.id,
                    id: a.id,
                    kind: a.kind,
                    owner: a.owner,
                };
                if let Err(err) = self.peer_call(new_owner, req).await {
                    return self.submit_multi(op, MultiMut::Abort { intent, err }).await;
                }
                self.crash("exchange", "remote")?;
                for (d, to, to_owner) in [(&a, new_parent, new_owner), (&b, parent, self.node())] {
                    let r = if d.kind == FileKind::Dir && parent != new_parent {
                        self.peer_call(d.owner, PeerOp::SetParent { id: d.id, parent: to, parent_owner: to_owner })
                            .await
                            .map(|_| ())
                    } else if d.kind == FileKind::Dir {
                        Ok(())
                    } else {
                        self.touch_ctime(d.owner, d.id).await
                    };
                    if let Err(e) = r {
                        warn!("exchange of {}: its parent or ctime on metadata node {}: {e}", d.id, d.owner);
                    }
                }
                let r = self.submit_multi(op, MultiMut::ExchangeCommit { intent }).await;
                self.crash("exchange", "commit")?;
                if new_owner != self.node() {
                    let _ = self.peer_call(new_owner, PeerOp::Forget { intent }).await;
                }
                r
            }
            IntentStep::Unlink { id, owner, .. } => {
                if let Err(err) = self.peer_call(owner, PeerOp::DropLink { intent, id }).await {
                    return self.submit_multi(op, MultiMut::Abort { intent, err }).await;
                }
                self.crash("unlink", "remote")?;
                let r = self.submit_multi(op, MultiMut::UnlinkCommit { intent }).await;
                self.crash("unlink", "commit")?;
                let _ = self.peer_call(owner, PeerOp::Forget { intent }).await;
                r
            }
        }
    }

    /// Intents left by an earlier run, and the client operations waiting on them.
    pub fn load_pending(&self) -> FsResult<Vec<(EntryId, Intent)>> {
        let list = self.read(|t| {
            let mut out = Vec::new();
            for r in t.intent_table()?.iter()? {
                let (k, v) = r?;
                let id = EntryId::from_bytes(k.value())
                    .ok_or_else(|| OpError::Fatal(format!("intent key of {} bytes", k.value().len())))?;
                out.push((id, decode::<Intent>("intent", id, v.value()).map_err(OpError::Fatal)?));
            }
            Ok(out)
        })?;
        for (_, i) in &list {
            self.set_pending(i.op, true);
        }
        Ok(list)
    }

    /// Finishes (or undoes) the intents an earlier run left (from
    /// [`Namespace::load_pending`], called before serving), retrying until
    /// the peers answer.
    pub async fn recover_intents(self: Arc<Self>, list: Vec<(EntryId, Intent)>) {
        for (intent, rec) in list {
            info!("finishing pending cross-node operation: {rec}");
            let r = self.drive(intent).await;
            if let Err(e) = &r {
                info!("pending {} {intent} ended with: {e}", rec.step.op_name());
            }
            self.set_pending(rec.op, false);
        }
    }

    /// Pending intents as text (for `hivefs fsck`).
    pub fn intents_text(&self) -> FsResult<Vec<String>> {
        let list = self.read(|t| {
            let mut out = Vec::new();
            for r in t.intent_table()?.iter()? {
                let (k, v) = r?;
                let s = match decode::<Intent>("intent", format_args!("{:?}", k.value()), v.value()) {
                    Ok(i) => i.to_string(),
                    Err(e) => e,
                };
                out.push(s);
            }
            Ok(out)
        })?;
        Ok(list)
    }

    /// Lookup of a name whose inode may be on another node (asked there).
    pub(crate) async fn lookup_any(&self, parent: EntryId, name: &[u8]) -> FsResult<EntryAttr> {
        let node = self.node();
        let remote = self.read(|t| {
            if name == b".." {
                let p = dir_inode(&t.inodes, parent)?;
                let owner = load_dirx(t.dirx_table()?, parent)?.and_then(|x| x.parent_owner).filter(|o| *o != node);
                return Ok(owner.map(|o| (p.parent.unwrap_or(EntryId::ROOT), o)));
            }
            if name == b"." {
                return Ok(None);
            }
            Ok(load_dentry(&t.dentries, parent, name)?.filter(|d| d.owner != node).map(|d| (d.id, d.owner)))
        })?;
        match remote {
            None => self.lookup(parent, name),
            Some((id, owner)) => {
                let peers =
                    self.peers().ok_or_else(|| fs_err!(Unavailable, "entry {id} is on metadata node {owner}"))?;
                match peers.call(owner, Request::GetAttr { id }).await? {
                    Reply::Entry(a) => Ok(a),
                    r => Err(unexpected(r)),
                }
            }
        }
    }

    /// Answers a step sent by the coordinating node.
    pub(crate) async fn peer(&self, op: PeerOp) -> Response {
        match op {
            PeerOp::CreateDir { id, inode, parent_owner, chooser } => {
                let inode: Inode = decode("inode", id, &inode).map_err(|m| fs_err!(Protocol, "{m}"))?;
                let r = self.submit_multi(None, MultiMut::PeerCreateDir { id, inode, parent_owner, chooser }).await;
                self.crash("mkdir", "peer")?;
                r
            }
            PeerOp::RemoveDir { id } => {
                let r = self.submit_multi(None, MultiMut::PeerRemoveDir { id }).await;
                self.crash("rmdir", "peer")?;
                r
            }
            PeerOp::SetParent { id, parent, parent_owner } => {
                self.submit_multi(None, MultiMut::PeerSetParent { id, parent, parent_owner }).await
            }
            PeerOp::GetParent { id } => {
                let node = self.node();
                self.read(|t| {
                    let i = dir_inode(&t.inodes, id)?;
                    let owner = load_dirx(t.dirx_table()?, id)?.and_then(|x| x.parent_owner).unwrap_or(node);
                    Ok(Reply::DirParent { parent: i.parent.unwrap_or(EntryId::ROOT), owner })
                })
            }
            PeerOp::RenameIn { intent, src_parent, new_parent, new_name, flags, id, kind, owner, inode, xattrs } => {
                let node = self.node();
                // A directory being replaced that lives on another node goes
                // first (emptiness checked there, atomically with its removal).
                let victim = self.read(|t| {
                    if t.peer_done_table()?.get(id_key(intent).as_slice())?.is_some() {
                        return Ok(None);
                    }
                    Ok(load_dentry(&t.dentries, new_parent, &new_name)?.filter(|d| d.id != id && d.owner != node))
                })?;
                let mut dropped = None;
                if let Some(d) = victim {
                    let is_dir = d.kind == FileKind::Dir;
                    if flags & RENAME_NOREPLACE == 0 && is_dir == (kind == FileKind::Dir) {
                        if is_dir {
                            self.peer_call(d.owner, PeerOp::RemoveDir { id: d.id }).await?;
                        } else {
                            self.peer_call(d.owner, PeerOp::DropLink { intent, id: d.id }).await?;
                            dropped = Some(d.owner);
                        }
                    }
                }
                let inode = match inode {
                    Some(b) => Some(decode::<Inode>("inode", id, &b).map_err(|m| fs_err!(Protocol, "{m}"))?),
                    None => None,
                };
                let m = MultiMut::PeerRenameIn {
                    intent,
                    src_parent,
                    new_parent,
                    new_name,
                    flags,
                    dentry: Dentry { id, kind, owner },
                    inode,
                    xattrs,
                };
                let r = self.submit_multi(None, m).await;
                if let (Ok(_), Some(o)) = (&r, dropped) {
                    let _ = self.peer_call(o, PeerOp::Forget { intent }).await;
                }
                self.crash("rename", "peer")?;
                r
            }
            PeerOp::Forget { intent } => self.submit_multi(None, MultiMut::PeerForget { intent }).await,
            PeerOp::LinkIn { intent, new_parent, new_name, id, kind, owner } => {
                let dentry = Dentry { id, kind, owner };
                let r = self.submit_multi(None, MultiMut::PeerLinkIn { intent, new_parent, new_name, dentry }).await;
                self.crash("link", "peer")?;
                r
            }
            PeerOp::DropLink { intent, id } => {
                let r = self.submit_multi(None, MultiMut::PeerDropLink { intent, id }).await;
                self.crash("unlink", "peer")?;
                r
            }
            PeerOp::ExchangeIn { intent, new_parent, new_name, expect, id, kind, owner } => {
                let put = Dentry { id, kind, owner };
                let m = MultiMut::PeerExchangeIn { intent, new_parent, new_name, expect, put };
                let r = self.submit_multi(None, m).await;
                self.crash("exchange", "peer")?;
                r
            }
            PeerOp::Opened { id, count } => {
                if count > 0 {
                    *self.opens.0.lock().expect("opens lock").entry(id).or_insert(0) += count;
                }
                Ok(Reply::Ok)
            }
        }
    }

    pub(crate) fn meta_chooser(&self, id: EntryId) -> FsResult<MetaChooser> {
        self.read(|t| {
            dir_inode(&t.inodes, id)?;
            Ok(load_dirx(t.dirx_table()?, id)?.and_then(|x| x.chooser).unwrap_or_default())
        })
    }

    pub(crate) async fn set_meta_chooser(&self, id: EntryId, chooser: MetaChooser, op: Option<OpId>) -> Response {
        self.submit_multi(op, MultiMut::SetChooser { id, chooser }).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::namespace::NamespaceOptions;
    use crate::targets::DataTargets;
    use hivefs_proto::Caller;
    use hivefs_types::ids::{PoolId, TargetId};
    use std::sync::atomic::AtomicBool;
    use std::sync::Weak;

    struct OneTarget;
    impl DataTargets for OneTarget {
        fn candidates(&self, _pool: PoolId) -> Vec<(TargetId, NodeId, u64)> {
            vec![(TargetId(1), NodeId(9), 1 << 30)]
        }
        fn truncate_chunk(&self, _t: TargetId, _e: EntryId, _l: u64) -> BoxFut<FsResult<()>> {
            Box::pin(async { Ok(()) })
        }
        fn unlink_chunk(&self, _t: TargetId, _e: EntryId) -> BoxFut<FsResult<()>> {
            Box::pin(async { Ok(()) })
        }
    }

    /// In-process metadata nodes that reach each other through `handle`.
    #[derive(Default)]
    struct Net(Mutex<HashMap<NodeId, Weak<Namespace>>>);

    impl Peers for Net {
        fn meta_nodes(&self) -> Vec<NodeId> {
            let mut v: Vec<NodeId> = self.0.lock().unwrap().keys().copied().collect();
            v.sort();
            v
        }
        fn call(&self, node: NodeId, req: Request) -> BoxFut<FsResult<Reply>> {
            let ns = self.0.lock().unwrap().get(&node).and_then(|w| w.upgrade());
            Box::pin(async move {
                match ns {
                    Some(ns) => ns.handle(req).await,
                    None => Err(fs_err!(Unavailable, "metadata node {node} is down")),
                }
            })
        }
    }

    struct Cluster {
        net: Arc<Net>,
        dirs: Vec<tempfile::TempDir>,
        nodes: Vec<Option<Arc<Namespace>>>,
    }

    impl Cluster {
        fn new(n: usize) -> Cluster {
            let mut c = Cluster { net: Arc::new(Net::default()), dirs: Vec::new(), nodes: Vec::new() };
            for _ in 0..n {
                c.dirs.push(tempfile::tempdir().unwrap());
                c.nodes.push(None);
            }
            for i in 0..n {
                c.start(i);
            }
            c
        }

        fn start(&mut self, i: usize) -> Vec<(EntryId, Intent)> {
            let opts = NamespaceOptions {
                dir: self.dirs[i].path().to_path_buf(),
                sync: false,
                node: NodeId(i as u32 + 1),
                seed: Some(7),
                clock: None,
                min_free_bytes: 0,
            };
            let ns = Arc::new(Namespace::open(opts, Arc::new(OneTarget)).unwrap());
            ns.set_peers(self.net.clone());
            let pending = ns.load_pending().unwrap();
            self.net.0.lock().unwrap().insert(ns.node(), Arc::downgrade(&ns));
            self.nodes[i] = Some(ns);
            pending
        }

        fn ns(&self, i: usize) -> Arc<Namespace> {
            self.nodes[i].clone().expect("node running")
        }

        /// Stops node `i` as a crash would (nothing after the last commit)
        /// and starts it again, finishing its pending intents.
        async fn restart(&mut self, i: usize) {
            let ns = self.nodes[i].take().unwrap();
            self.net.0.lock().unwrap().remove(&ns.node());
            let mut ns = ns;
            let ns = loop {
                match Arc::try_unwrap(ns) {
                    Ok(n) => break n,
                    Err(still) => {
                        ns = still;
                        tokio::time::sleep(Duration::from_millis(5)).await;
                    }
                }
            };
            ns.close();
            let pending = self.start(i);
            self.ns(i).recover_intents(pending).await;
        }
    }

    fn mkdir_req(parent: EntryId, name: &str) -> Request {
        Request::Mkdir { parent, name: name.into(), mode: 0o755, caller: Caller::default() }
    }

    fn retryable(seq: u64, req: &Request) -> Request {
        Request::Retryable { op: OpId { client: 5, seq, done_below: 0 }, req: hivefs_proto::encode_body(req) }
    }

    fn attr(r: Response) -> EntryAttr {
        match r.unwrap() {
            Reply::Entry(a) => a,
            r => panic!("{r:?}"),
        }
    }

    fn intents(ns: &Namespace) -> Vec<String> {
        ns.intents_text().unwrap()
    }

    async fn setup() -> Cluster {
        let c = Cluster::new(2);
        c.ns(0).ensure_root().await.unwrap();
        // Node 2 owns fewer directories: balanced puts new ones there.
        c.ns(0).set_dir_count(NodeId(1), 100);
        c
    }

    #[tokio::test]
    async fn mkdir_lookup_rename_rmdir_across_two_nodes() {
        let c = setup().await;
        let (n1, n2) = (c.ns(0), c.ns(1));
        let d = attr(n1.handle(mkdir_req(EntryId::ROOT, "d")).await);
        assert_eq!(d.owner, NodeId(2));
        assert_eq!(n2.getattr(d.id).unwrap().kind, FileKind::Dir);
        assert_eq!(
            attr(n1.handle(Request::Lookup { parent: EntryId::ROOT, name: b"d".to_vec() }).await).owner,
            NodeId(2)
        );
        assert_eq!(n1.getattr(EntryId::ROOT).unwrap().nlink, 3);
        // `..` of d is the root on node 1.
        let up = attr(n2.handle(Request::Lookup { parent: d.id, name: b"..".to_vec() }).await);
        assert_eq!((up.id, up.owner), (EntryId::ROOT, NodeId(1)));
        // A file moves from the root (node 1) into d (node 2) with its xattr.
        let create = Request::Create {
            parent: EntryId::ROOT,
            name: b"f".to_vec(),
            kind: FileKind::File,
            mode: 0o644,
            rdev: 0,
            excl: true,
            caller: Caller::default(),
        };
        let f = attr(n1.handle(create).await);
        let sx = Request::SetXattr { id: f.id, name: b"user.a".to_vec(), value: b"1".to_vec(), flags: 0 };
        n1.handle(sx).await.unwrap();
        let mv = Request::RenameTo {
            parent: EntryId::ROOT,
            name: b"f".to_vec(),
            new_parent: d.id,
            new_parent_owner: NodeId(2),
            new_name: b"g".to_vec(),
            flags: 0,
        };
        n1.handle(retryable(1, &mv)).await.unwrap();
        assert!(n1.getattr(f.id).is_err(), "the inode left node 1");
        assert_eq!(n2.lookup(d.id, b"g").unwrap().pattern, f.pattern);
        assert_eq!(n2.getxattr(f.id, b"user.a").unwrap(), b"1");
        // A repeat of the same operation gets the first answer.
        n1.handle(retryable(1, &mv)).await.unwrap();
        // Non-empty, then empty rmdir of the remote directory.
        let rm = Request::Rmdir { parent: EntryId::ROOT, name: b"d".to_vec() };
        assert_eq!(n1.handle(rm.clone()).await.unwrap_err().code, ErrorCode::NotEmpty);
        n2.handle(Request::Unlink { parent: d.id, name: b"g".to_vec() }).await.unwrap();
        n1.handle(rm).await.unwrap();
        assert!(n2.getattr(d.id).is_err());
        assert_eq!(n1.getattr(EntryId::ROOT).unwrap().nlink, 2);
        assert!(intents(&n1).is_empty());
    }

    #[tokio::test]
    async fn renaming_a_directory_into_its_subtree_across_nodes_is_invalid() {
        let c = setup().await;
        let (n1, n2) = (c.ns(0), c.ns(1));
        let d = attr(n1.handle(mkdir_req(EntryId::ROOT, "d")).await);
        let e = attr(n2.handle(mkdir_req(d.id, "e")).await);
        let mv = Request::RenameTo {
            parent: EntryId::ROOT,
            name: b"d".to_vec(),
            new_parent: e.id,
            new_parent_owner: e.owner,
            new_name: b"x".to_vec(),
            flags: 0,
        };
        assert_eq!(n1.handle(mv).await.unwrap_err().code, ErrorCode::Invalid);
    }

    /// Every step of mkdir and of a file rename, stopped as by a crash of
    /// the node that runs it; after a restart of that node, the operation is
    /// complete and a retry of the client's operation gets its answer.
    #[tokio::test]
    async fn a_crash_at_each_step_is_recovered_after_restart() {
        for op in ["mkdir", "rename", "rmdir"] {
            for step in ["intent", "peer", "remote", "commit"] {
                let mut c = setup().await;
                let d = attr(c.ns(0).handle(mkdir_req(EntryId::ROOT, "d")).await);
                let create = Request::Create {
                    parent: EntryId::ROOT,
                    name: b"f".to_vec(),
                    kind: FileKind::File,
                    mode: 0o644,
                    rdev: 0,
                    excl: true,
                    caller: Caller::default(),
                };
                c.ns(0).handle(create).await.unwrap();
                let req = match op {
                    "mkdir" => mkdir_req(EntryId::ROOT, "new"),
                    "rmdir" => Request::Rmdir { parent: EntryId::ROOT, name: b"d".to_vec() },
                    _ => Request::RenameTo {
                        parent: EntryId::ROOT,
                        name: b"f".to_vec(),
                        new_parent: d.id,
                        new_parent_owner: NodeId(2),
                        new_name: b"g".to_vec(),
                        flags: 0,
                    },
                };
                let fired = Arc::new(AtomicBool::new(false));
                // The peer step runs on node 2, the others on node 1.
                let victim = if step == "peer" { 1 } else { 0 };
                c.ns(victim).set_crash_hook(CrashHook::Stop(format!("{op}:{step}"), fired.clone()));
                let n1 = c.ns(0);
                let r1 = retryable(9, &req);
                let call = tokio::spawn(async move { n1.handle(r1).await });
                while !fired.load(Ordering::SeqCst) {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                if victim == 0 {
                    assert!(call.await.unwrap().is_err(), "{op}:{step}: the stopped call fails");
                    c.restart(victim).await;
                } else {
                    c.restart(victim).await;
                    call.await.unwrap().unwrap_or_else(|e| panic!("{op}:{step}: {e}"));
                }
                let (n1, n2) = (c.ns(0), c.ns(1));
                assert!(intents(&n1).is_empty(), "{op}:{step}: {:?}", intents(&n1));
                // The client's retry gets the outcome; the state is complete.
                n1.handle(retryable(9, &req)).await.unwrap_or_else(|e| panic!("{op}:{step} retry: {e}"));
                match op {
                    "mkdir" => {
                        let a = n1.lookup_any(EntryId::ROOT, b"new").await.unwrap();
                        assert_eq!(a.owner, NodeId(2));
                        assert_eq!(n1.getattr(EntryId::ROOT).unwrap().nlink, 4, "{op}:{step}");
                    }
                    "rmdir" => {
                        assert!(n1.lookup_any(EntryId::ROOT, b"d").await.is_err());
                        assert!(n2.getattr(d.id).is_err(), "{op}:{step}: no orphaned inode");
                        assert_eq!(n1.getattr(EntryId::ROOT).unwrap().nlink, 2, "{op}:{step}");
                    }
                    _ => {
                        assert!(n1.lookup(EntryId::ROOT, b"f").is_err(), "{op}:{step}");
                        let g = n2.lookup(d.id, b"g").unwrap();
                        assert!(n1.getattr(g.id).is_err(), "{op}:{step}: the inode is only on node 2");
                        assert_eq!(n2.counts().unwrap().0, 1);
                        assert_eq!(n1.counts().unwrap().0, 0);
                    }
                }
            }
        }
    }
}
