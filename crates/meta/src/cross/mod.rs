//! Several metadata nodes: the transactions of operations that touch two
//! owners, and what the node keeps for them.
//!
//! Owns the writer mutations of the crash-safe protocol ([`MultiMut`]: each
//! operation's intent, commit and abort on the coordinator and its step on
//! the peer), the choice of a new directory's owner (metadata-node
//! choosers), the peers trait and the crash hook for tests
//! (`HIVEFS_CRASH_AT`). It must not hold the single-node rules (those stay in
//! `ops`: a local rule that meets a remote part answers
//! [`crate::ops::needs_protocol`]) nor talk to the network: the namespace
//! runs the protocol (`namespace/cross.rs`) and the writer applies these
//! mutations.
//!
//! Protocol (one coordinator, the node that received the client's request):
//! 1. *intent*: one transaction writes an intent record (with the client's
//!    operation id) and locks the dentries involved; for mkdir it also writes
//!    the new dentry (naming the remote owner) and the parent's link count.
//! 2. *remote step* on the peer, idempotent: keyed by the new directory's id
//!    (create, remove) or by the intent id (a rename's destination half is
//!    recorded in `peer_done`); sent as `Request::PeerStep`, applied at most
//!    once ever, even when delivered after the operation finished (`step`).
//! 3. *commit*: one transaction finishes the local part, removes the intent
//!    and records the client's answer under its operation id, so a client
//!    retry gets that answer. A refusal of the remote step undoes the intent
//!    instead (and is recorded as the answer).
//!
//! At start every intent is driven again from step 2 by a task that retries
//! until the peer answers; client retries of such an operation wait for it.
//! See `docs/design-meta.md` ("Several metadata nodes").

mod exchange;
mod link;
mod mkdir;
mod rename;
mod rmdir;
mod step;
mod unlink;

pub use exchange::{ExchangeCommit, ExchangeIntent, PeerExchangeIn};
pub use link::{LinkAbort, LinkCommit, LinkIntent, PeerLinkIn};
pub use mkdir::{MkdirAbort, MkdirCommit, MkdirIntent, PeerCreateDir};
pub use rename::{PeerRenameIn, PeerSetParent, RenameCommit, RenameIntent};
pub use rmdir::{PeerRemoveDir, RmdirCommit, RmdirIntent};
pub(crate) use step::settled;
pub use step::{PeerStep, StepId};
pub use unlink::{PeerDropLink, UnlinkCommit, UnlinkIntent};

use crate::ops::{
    check_name, check_unlocked, dentry, dir_inode, drop_link, inherit_group, inode, is_empty_dir, load_dentry,
    load_inode, new_inode, refuse_moving, to_attr, touch_dir, Ctx, LINK_MAX,
};
use crate::store::Kv;
use crate::store::{
    child_key, clear_intent, id_key, load_dirx, put_dirx, put_intent, q, scan_children, Dentry, DirExtra, Inode,
    Intent, IntentStep, OpResult, Tables,
};
use crate::targets::BoxFut;
use hivefs_cluster::Cluster;
use hivefs_proto::{Envelope, GroupKind, MetaChooser, OpId, Reachability, Reply, Request, RENAME_NOREPLACE};
use hivefs_types::attr::{EntryAttr, FileKind, Timespec};
use hivefs_types::error::{FsError, FsResult};
use hivefs_types::fs_err;
use hivefs_types::ids::{EntryId, NodeId, NodeType};
use rand::rngs::StdRng;
use rand::SeedableRng;
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use tracing::{error, warn};

// ------------------------------------------------------------ crash hook

/// Test hook: `HIVEFS_CRASH_AT=<op>:<step>` makes the metadata service abort
/// (`std::process::abort`, as `kill -9`) at that step of a cross-node protocol.
/// `op` is `mkdir`, `rmdir`, `rename`, `link`, `unlink` or `exchange`; `step` is
/// `intent` (the intent is committed, nothing sent), `peer` (the peer committed its
/// step and has not answered), `remote` (the coordinator has the peer's answer,
/// nothing committed) or `commit` (committed, the client not answered).
pub use crate::store::CRASH_ENV;

/// See `Multi::gate`.
pub type Gate = Arc<dyn Fn() -> FsResult<()> + Send + Sync>;

#[derive(Clone, Debug, Default)]
pub enum CrashHook {
    #[default]
    Off,
    /// Abort the process at `op:step`.
    Abort(String),
    /// Unit tests: stop the operation at `op:step` with an error, leaving the
    /// store as an abort would; the flag tells that it fired. (The error
    /// goes back up the caller's code path, so a step run by the node for
    /// itself reads it as the peer's refusal: use it for a peer that is
    /// another node.)
    Stop(String, Arc<std::sync::atomic::AtomicBool>),
    /// Simulations (`crates/sim`): the task that reaches `op:step` stops
    /// there for good, as the process would at an abort (nothing after the
    /// step runs, no error path either), and `fired` is notified so that
    /// the simulator stops the rest of the node.
    Halt(String, Arc<tokio::sync::Notify>),
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

    /// Called at every step: aborts, fails or halts at the hooked one.
    pub(crate) async fn reached(&self, op: &str, step: &str) -> FsResult<()> {
        if let CrashHook::Halt(s, fired) = self {
            if s.split_once(':') == Some((op, step)) {
                fired.notify_one();
                std::future::pending::<()>().await;
            }
        }
        self.at(op, step)
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
    /// Of those, the ones that may own a directory made in namespace
    /// `parent_ns`: below a mirrored namespace only mirrored ones, so a
    /// mirrored tree stays mirrored.
    fn new_dir_owners(&self, parent_ns: NodeId) -> Vec<NodeId> {
        let _ = parent_ns;
        self.meta_nodes()
    }
    /// Sends a request with its envelope to metadata node `node`.
    fn call_with(&self, node: NodeId, env: Envelope, req: Request) -> BoxFut<FsResult<Reply>>;
    /// Sends a request to metadata node `node`.
    fn call(&self, node: NodeId, req: Request) -> BoxFut<FsResult<Reply>> {
        self.call_with(node, Envelope::default(), req)
    }
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

    fn new_dir_owners(&self, parent_ns: NodeId) -> Vec<NodeId> {
        let mut all = self.meta_nodes();
        let v = self.cluster.view();
        let mirrored = |ns: &NodeId| v.groups.values().any(|g| g.kind == GroupKind::Meta && g.serves == Some(*ns));
        if mirrored(&parent_ns) {
            // Namespaces are few: one pass over the groups per candidate.
            all.retain(mirrored);
        }
        all
    }

    fn call_with(&self, node: NodeId, env: Envelope, req: Request) -> BoxFut<FsResult<Reply>> {
        let cluster = self.cluster.clone();
        Box::pin(async move {
            let (call, mirror) = cluster.meta_route(node).await?;
            call.rpc_with(&Envelope { mirror, ..env }, &req).await
        })
    }
}

/// What a namespace keeps for the multi-node part.
pub struct Multi {
    pub(crate) peers: RwLock<Option<Arc<dyn Peers>>>,
    pub(crate) crash: RwLock<CrashHook>,
    /// Whether this node may act for the namespace now (a mirrored
    /// namespace's primary: its lease holds and mgmtd's view shows no newer
    /// epoch of its group); checked before every step sent to a peer.
    pub(crate) gate: RwLock<Option<Gate>>,
    pub(crate) intent_seq: AtomicU64,
    /// Directories owned per metadata node (last report plus our choices since).
    pub(crate) counts: Mutex<HashMap<NodeId, u64>>,
    pub(crate) rr: AtomicU64,
    /// The `random` chooser's source (seeded by `NamespaceOptions::seed`).
    pub(crate) rng: Mutex<StdRng>,
    /// Client operations being carried out here (an attempt runs, or their
    /// intent is pending after a restart): their repeats wait.
    pub(crate) pending: Mutex<HashSet<(u64, u64)>>,
    /// Intents whose peer step runs here: a repeat of the step waits.
    pub(crate) steps: Mutex<HashSet<EntryId>>,
    /// Intents minted here and not yet recorded: with the recorded ones,
    /// they keep the floor sent with each step (`cross::step`) at or below
    /// every unfinished intent. One whose recording was abandoned stays
    /// (the floor stops there until the next start, as it would at an
    /// intent recorded and never driven).
    pub(crate) minting: Mutex<std::collections::BTreeSet<EntryId>>,
    /// Metadata nodes that answered `PeerStep` as unknown (older builds):
    /// they get `MetaPeer`, and `Forget` after a commit.
    pub(crate) old_peers: Mutex<HashSet<NodeId>>,
    pub(crate) finished: tokio::sync::Notify,
    /// Files whose inode a rename moved to another node while handles
    /// opened here were open: their requests are forwarded there (node, and
    /// handles not yet released).
    pub(crate) moved: Mutex<HashMap<EntryId, (NodeId, u32)>>,
}

impl Multi {
    /// `seed`: of the `random` metadata-node chooser (`None`: from the OS).
    pub(crate) fn new(seed: Option<u64>) -> Multi {
        // Not the target choosers' stream: the two draw independently.
        let rng = match seed {
            Some(s) => StdRng::seed_from_u64(s ^ 0x6d65_7461_6e6f_6465),
            None => StdRng::from_entropy(),
        };
        Multi {
            peers: RwLock::default(),
            crash: RwLock::default(),
            gate: RwLock::default(),
            intent_seq: AtomicU64::default(),
            counts: Mutex::default(),
            rr: AtomicU64::default(),
            rng: Mutex::new(rng),
            pending: Mutex::default(),
            steps: Mutex::default(),
            minting: Mutex::default(),
            old_peers: Mutex::default(),
            finished: tokio::sync::Notify::new(),
            moved: Mutex::default(),
        }
    }
}

pub(crate) fn op_key(op: &OpId) -> (u64, u64) {
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

/// Drops an intent whose remote step was refused; answers `err`.
#[derive(Clone, Debug)]
pub struct Abort {
    pub intent: EntryId,
    pub err: FsError,
}

/// Peer: forgets what it recorded under `intent` (the coordinator committed).
#[derive(Clone, Debug)]
pub struct PeerForget {
    pub intent: EntryId,
}

/// Sets the metadata-node chooser of directory `id` for its new subdirectories.
#[derive(Clone, Debug)]
pub struct SetChooser {
    pub id: EntryId,
    pub chooser: MetaChooser,
}

/// Writer mutations of the protocol (see the module doc): each step's
/// fields, and its transaction (`apply`), are in the file of its operation.
#[derive(Clone, Debug)]
pub enum MultiMut {
    MkdirIntent(mkdir::MkdirIntent),
    MkdirCommit(mkdir::MkdirCommit),
    MkdirAbort(mkdir::MkdirAbort),
    RmdirIntent(rmdir::RmdirIntent),
    RmdirCommit(rmdir::RmdirCommit),
    RenameIntent(rename::RenameIntent),
    RenameCommit(rename::RenameCommit),
    Abort(Abort),
    PeerCreateDir(mkdir::PeerCreateDir),
    PeerRemoveDir(rmdir::PeerRemoveDir),
    PeerSetParent(rename::PeerSetParent),
    PeerRenameIn(rename::PeerRenameIn),
    PeerForget(PeerForget),
    SetChooser(SetChooser),
    LinkIntent(link::LinkIntent),
    LinkCommit(link::LinkCommit),
    LinkAbort(link::LinkAbort),
    UnlinkIntent(unlink::UnlinkIntent),
    UnlinkCommit(unlink::UnlinkCommit),
    PeerLinkIn(link::PeerLinkIn),
    PeerDropLink(unlink::PeerDropLink),
    ExchangeIntent(exchange::ExchangeIntent),
    ExchangeCommit(exchange::ExchangeCommit),
    PeerExchangeIn(exchange::PeerExchangeIn),
    PeerStep(step::PeerStep),
}

impl MultiMut {
    pub(crate) fn adds_to_namespace(&self) -> bool {
        matches!(
            self,
            MultiMut::MkdirIntent(_)
                | MultiMut::PeerCreateDir(_)
                | MultiMut::PeerRenameIn(_)
                | MultiMut::LinkIntent(_)
                | MultiMut::PeerLinkIn(_)
        ) || matches!(self, MultiMut::PeerStep(s) if s.inner.adds_to_namespace())
    }
}

pub(crate) fn apply(t: &mut Tables<'_>, ctx: &mut Ctx<'_>, m: MultiMut) -> OpResult<Reply> {
    match m {
        MultiMut::MkdirIntent(m) => m.apply(t, ctx),
        MultiMut::MkdirCommit(m) => m.apply(t, ctx),
        MultiMut::MkdirAbort(m) => m.apply(t, ctx),
        MultiMut::RmdirIntent(m) => m.apply(t, ctx),
        MultiMut::RmdirCommit(m) => m.apply(t, ctx),
        MultiMut::RenameIntent(m) => m.apply(t, ctx),
        MultiMut::RenameCommit(m) => m.apply(t, ctx),
        MultiMut::Abort(m) => m.apply(t, ctx),
        MultiMut::PeerCreateDir(m) => m.apply(t, ctx),
        MultiMut::PeerRemoveDir(m) => m.apply(t, ctx),
        MultiMut::PeerSetParent(m) => m.apply(t, ctx),
        MultiMut::PeerRenameIn(m) => m.apply(t, ctx),
        MultiMut::PeerForget(m) => m.apply(t, ctx),
        MultiMut::SetChooser(m) => m.apply(t, ctx),
        MultiMut::LinkIntent(m) => m.apply(t, ctx),
        MultiMut::LinkCommit(m) => m.apply(t, ctx),
        MultiMut::LinkAbort(m) => m.apply(t, ctx),
        MultiMut::UnlinkIntent(m) => m.apply(t, ctx),
        MultiMut::UnlinkCommit(m) => m.apply(t, ctx),
        MultiMut::PeerLinkIn(m) => m.apply(t, ctx),
        MultiMut::PeerDropLink(m) => m.apply(t, ctx),
        MultiMut::ExchangeIntent(m) => m.apply(t, ctx),
        MultiMut::ExchangeCommit(m) => m.apply(t, ctx),
        MultiMut::PeerExchangeIn(m) => m.apply(t, ctx),
        MultiMut::PeerStep(m) => m.apply(t, ctx),
    }
}

impl Abort {
    pub(super) fn apply(self, t: &mut Tables<'_>, _ctx: &mut Ctx<'_>) -> OpResult<Reply> {
        let Abort { intent, err } = self;
        clear_intent(t, intent)?;
        Err(err.into())
    }
}

impl PeerForget {
    pub(super) fn apply(self, t: &mut Tables<'_>, _ctx: &mut Ctx<'_>) -> OpResult<Reply> {
        let PeerForget { intent } = self;
        t.peer_done.remove(id_key(intent).as_slice())?;
        Ok(Reply::Ok)
    }
}

impl SetChooser {
    pub(super) fn apply(self, t: &mut Tables<'_>, ctx: &mut Ctx<'_>) -> OpResult<Reply> {
        let SetChooser { id, chooser } = self;
        let node = ctx.node;
        let mut i = dir_inode(&t.inodes, id)?;
        let mut x = load_dirx(&t.dirx, id)?.unwrap_or_default();
        x.chooser = Some(chooser);
        put_dirx(t, id, &x)?;
        i.ctime = ctx.now;
        t.put_inode(id, &i)?;
        Ok(Reply::Entry(to_attr(id, &i, node)))
    }
}

/// The commit of an intent that removes the dentry `parent/name` it held:
/// gone when it still names `id` (a recovery may find it gone already), and
/// the parent directory loses `links` links and gets new times.
fn remove_held(
    t: &mut Tables<'_>,
    now: Timespec,
    parent: EntryId,
    name: &[u8],
    id: EntryId,
    links: u32,
) -> OpResult<()> {
    if load_dentry(&t.dentries, parent, name)?.is_some_and(|d| d.id == id) {
        t.remove_dentry(parent, name)?;
        if let Some(mut p) = load_inode(&t.inodes, parent)? {
            p.nlink = p.nlink.saturating_sub(links);
            touch_dir(&mut p, now);
            t.put_inode(parent, &p)?;
        }
    }
    Ok(())
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
