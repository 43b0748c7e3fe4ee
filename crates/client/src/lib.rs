//! The HiveFS native client library.
//!
//! Owns the client's side of the protocol: routing namespace calls to the
//! metadata node that owns an entry, and striped file I/O — one read or
//! write is cut along the pattern's chunks and sent to all involved storage
//! targets concurrently. It holds no file data cache: every read goes to the
//! targets; only writes may wait in memory, in cache mode `buffered`
//! (`writeback`), until they are flushed. Attribute leases (`leases`) are the
//! protocol side of the mount's attribute cache; the cache is the kernel's.
//! It must not know about FUSE or errno; the mount crate and the CLI sit on
//! top of it.

#![forbid(unsafe_code)]

mod ahead;
mod data;
mod dirattrs;
mod leases;
mod local;
mod locks;
mod overlap;
pub mod quota;
mod releases;
pub mod writeback;

use hivefs_cluster::Cluster;
use hivefs_net::{ClientConfig, Net, Pools, Secret};
use hivefs_proto::{Caller, Capacity, DirEntry, Envelope, MetaChooser, OpId, Reachability, Reply, Request};
use hivefs_types::attr::{EntryAttr, FileKind, SetAttr, Timespec};
use hivefs_types::error::{ErrorCode, FsError, FsResult};
use hivefs_types::ids::{EntryId, NodeId, NodeType};
use hivefs_types::pattern::DirPattern;
use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

pub use data::MAX_PIECE;
pub use leases::{OnRevoke, Revocation};
pub use locks::Interrupt;

/// Where an entry's inode lives: its id and the metadata node storing it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Ent {
    pub id: EntryId,
    pub owner: NodeId,
}

impl From<&EntryAttr> for Ent {
    fn from(a: &EntryAttr) -> Ent {
        Ent { id: a.id, owner: a.owner }
    }
}

#[derive(Clone, Debug)]
pub struct Options {
    pub mgmtd: String,
    pub secret: Option<Secret>,
    /// Longest any one request waits for a server that does not answer, all
    /// retries and reconnects included; then it fails (`TimedOut` or
    /// `Unavailable`, EIO/ETIMEDOUT through the mount). Never forever.
    pub io_timeout: Duration,
    pub conns_per_peer: usize,
    /// Read and write the chunk files of storage services on this host
    /// through descriptors they hand over, not over TCP (see `local`).
    pub short_circuit: bool,
    /// How long a request to a storage buddy group is retried against the
    /// group's current primary while no primary answers (a failover):
    /// `docs/design-mirror.md`. Then it fails (EIO/ETIMEDOUT).
    pub mirror_retry: Duration,
}

impl Options {
    pub fn new(mgmtd: impl Into<String>, secret: Option<Secret>) -> Options {
        Options {
            mgmtd: mgmtd.into(),
            secret,
            io_timeout: Duration::from_secs(30),
            conns_per_peer: 4,
            short_circuit: true,
            mirror_retry: Duration::from_secs(90),
        }
    }
}

/// File system totals for `statfs`.
#[derive(Clone, Copy, Debug, Default)]
pub struct FsStat {
    pub storage: Capacity,
    pub files: u64,
    pub dirs: u64,
}

pub struct Client {
    cluster: Arc<Cluster>,
    root: Ent,
    ops: OpIds,
    io_timeout: Duration,
    mirror_retry: Duration,
    locks: Arc<locks::LockSession>,
    /// Attribute leases, once turned on (see `leases`).
    leases: std::sync::OnceLock<Arc<leases::LeaseSession>>,
    /// Directories' attributes after this client's changes, once turned on
    /// (see `dirattrs`).
    dir_attrs: std::sync::OnceLock<dirattrs::DirAttrs>,
    /// Chunk files of storage services on this host (see `local`).
    local: local::LocalChunks,
    /// Releases on their way (see `releases`).
    releases: Arc<releases::Releases>,
    /// Files made ahead (see `ahead`).
    ahead: Arc<ahead::Ahead>,
    /// Quota limits fetched from mgmtd (see `quota`).
    quotas: quota::Quotas,
    /// A metadata node answered `UpdateSizeIf` as unknown (an older
    /// version): sizes are reported the old way from then on.
    no_size_if: std::sync::atomic::AtomicBool,
}

/// Ids of this client's non-idempotent metadata operations, so that they
/// can be retried safely (`Envelope::op`): a random client id, a
/// sequence number per operation, and the operations still waiting for an
/// answer (the lowest of them tells the server what it may forget).
struct OpIds {
    client: u64,
    state: Mutex<(u64, BTreeSet<u64>)>,
}

/// One operation in flight; dropping it marks it answered.
struct OpGuard<'a> {
    ids: &'a OpIds,
    op: OpId,
}

impl OpIds {
    fn new() -> OpIds {
        OpIds { client: rand::random::<u64>() | 1, state: Mutex::new((1, BTreeSet::new())) }
    }

    fn begin(&self) -> OpGuard<'_> {
        let mut st = self.state.lock().expect("op ids lock");
        let seq = st.0;
        st.0 += 1;
        st.1.insert(seq);
        let done_below = *st.1.first().expect("just inserted");
        OpGuard { ids: self, op: OpId { client: self.client, seq, done_below } }
    }
}

impl Drop for OpGuard<'_> {
    fn drop(&mut self) {
        self.ids.state.lock().expect("op ids lock").1.remove(&self.op.seq);
    }
}

fn unexpected(r: Reply) -> FsError {
    FsError::new(ErrorCode::Protocol, format!("unexpected reply {r:?}"))
}

fn entry(r: Reply) -> FsResult<EntryAttr> {
    match r {
        Reply::Entry(a) => Ok(a),
        r => Err(unexpected(r)),
    }
}

fn ok(r: Reply) -> FsResult<()> {
    match r {
        Reply::Ok => Ok(()),
        r => Err(unexpected(r)),
    }
}

impl Client {
    /// Connects to mgmtd, loads the cluster view and finds the root's owner.
    pub async fn connect(opts: Options) -> FsResult<Arc<Client>> {
        Client::connect_with(opts, Net::Tcp).await
    }

    /// [`Client::connect`] over `net`: TCP, or the calls of a simulated
    /// network (`hivefs-sim`), where `opts.mgmtd` and the nodes' addresses
    /// name its endpoints.
    pub async fn connect_with(opts: Options, net: Net) -> FsResult<Arc<Client>> {
        let mut cc = ClientConfig::new(opts.secret.clone()).with_timeout(opts.io_timeout);
        cc.conns_per_peer = opts.conns_per_peer;
        let pools = match net {
            Net::Tcp => Pools::new(cc),
            Net::Pools(p) => p.with_config(cc),
        };
        let cluster = Cluster::new(&opts.mgmtd, pools);
        let view = cluster.refresh().await?;
        let owner = view.root_owner.ok_or_else(|| {
            FsError::new(ErrorCode::Unavailable, format!("mgmtd {}: no metadata node has registered yet", opts.mgmtd))
        })?;
        cluster.spawn_refresh(Duration::from_secs(5));
        let client = Arc::new(Client {
            cluster,
            root: Ent { id: EntryId::ROOT, owner },
            ops: OpIds::new(),
            io_timeout: opts.io_timeout,
            mirror_retry: opts.mirror_retry,
            locks: locks::new_session(),
            leases: std::sync::OnceLock::new(),
            dir_attrs: std::sync::OnceLock::new(),
            local: local::LocalChunks::new(opts.short_circuit, opts.secret.clone()),
            releases: Default::default(),
            ahead: Default::default(),
            quotas: Default::default(),
            no_size_if: Default::default(),
        });
        client.locks.set_client(&client);
        tokio::spawn(quota::refresh(Arc::downgrade(&client)));
        Ok(client)
    }

    /// The quota limits in force and reported growth not summed yet (see `quota`).
    pub fn quota(&self) -> &quota::Quotas {
        &self.quotas
    }

    /// The storage pool a file's pattern lives in (that of its first unit,
    /// as the cluster view has it).
    pub fn pool_of(&self, p: &hivefs_types::pattern::Pattern) -> Option<hivefs_types::ids::PoolId> {
        let view = self.cluster.view();
        let target = match p.unit(0) {
            hivefs_types::pattern::StripeUnit::Target(t) => t,
            hivefs_types::pattern::StripeUnit::Group(g) => hivefs_types::ids::TargetId(view.groups.get(&g)?.primary),
        };
        Some(view.targets.get(&target)?.pool)
    }

    /// How long one request may wait on a metadata node for something (a
    /// lock, a revocation) before it is sent again: below the request timeout.
    fn wait_slice(&self) -> Duration {
        (self.io_timeout / 2).clamp(Duration::from_millis(50), Duration::from_secs(10))
    }

    /// With leases on: keeps the directory attributes that metadata nodes add
    /// to the answers of this client's changes, for `ttl` (the time the
    /// program lets directory attributes be cached anyway; see `dirattrs`).
    pub fn cache_dir_attrs(&self, ttl: Duration) {
        let _ = self.dir_attrs.set(dirattrs::DirAttrs::new(ttl));
    }

    /// A directory's attributes as this client's last change in it left
    /// them, and for how much longer they may be used.
    pub fn cached_dir_attr(&self, id: EntryId) -> Option<(EntryAttr, Duration)> {
        self.dir_attrs.get()?.get(id)
    }

    pub fn root(&self) -> Ent {
        self.root
    }

    pub fn cluster(&self) -> &Arc<Cluster> {
        &self.cluster
    }

    /// Sends a request to a metadata node. Changes of the namespace carry
    /// an operation id in their envelope, so that the transport may repeat
    /// them after a lost connection or a restart of the node and the node
    /// applies them once. Open and release are not repeated (they count
    /// handles in the node's memory); they fail instead.
    /// With leases on, the envelope names this client's lease session, and a
    /// granted lease is remembered (the answer is then an ordinary `Entry`).
    async fn meta(&self, owner: NodeId, req: &Request) -> FsResult<Reply> {
        if !matches!(req, Request::CreateMany { .. } | Request::ReserveCreates { .. }) {
            // Nothing overtakes a file made ahead (see `ahead`).
            self.ahead.landed().await;
            self.ahead.before(req);
        }
        let plain = req.is_idempotent() || matches!(req, Request::Open { .. } | Request::Release { .. });
        let op = (!plain).then(|| self.ops.begin());
        let mut env = Envelope { op: op.as_ref().map(|o| o.op), lease_client: None, mirror: None };
        let budget = self.mirror_retry;
        let Some(session) = self.leases.get() else {
            return self.cluster.call_meta(owner, &env, req, budget).await;
        };
        self.poll_leases(session, owner);
        env.lease_client = Some(self.ops.client);
        let dirs = self.dir_attrs.get().map(|d| (d, d.begin(req)));
        let files = session.begin(req);
        let sent = std::time::Instant::now();
        let in_flight = self.request_begins();
        let r = self.dir_names_answer(req, sent, self.cluster.call_meta(owner, &env, req, budget).await);
        let (mut r, parent) = match r {
            Ok(Reply::WithParent { parent, reply }) => (Ok(*reply), Some(parent)),
            r => (r, None),
        };
        let attr = match &mut r {
            Ok(Reply::Entry(a) | Reply::Leased { attr: a, .. }) => Some(a),
            _ => None,
        };
        self.request_ends(in_flight, attr);
        if let Some((d, ticket)) = dirs {
            d.end(ticket, parent, sent);
        }
        match r {
            Ok(Reply::Leased { attr, lease_ms, name_ms }) => {
                session.granted(attr.id, req.names(), sent, lease_ms, name_ms);
                session.end(files, Some((&attr, lease_ms)), sent);
                Ok(Reply::Entry(attr))
            }
            r => {
                session.end(files, None, sent);
                r
            }
        }
    }

    pub async fn lookup(&self, parent: Ent, name: &[u8]) -> FsResult<EntryAttr> {
        entry(self.meta(parent.owner, &Request::Lookup { parent: parent.id, name: name.to_vec() }).await?)
    }

    pub async fn getattr(&self, e: Ent) -> FsResult<EntryAttr> {
        entry(self.meta(e.owner, &Request::GetAttr { id: e.id }).await?)
    }

    pub async fn setattr(&self, e: Ent, attr: SetAttr, caller: Caller) -> FsResult<EntryAttr> {
        entry(self.meta(e.owner, &Request::SetAttr { id: e.id, attr, caller }).await?)
    }

    #[allow(clippy::too_many_arguments)]
    pub async fn create(
        &self,
        parent: Ent,
        name: &[u8],
        kind: FileKind,
        mode: u32,
        rdev: u32,
        excl: bool,
        caller: Caller,
    ) -> FsResult<EntryAttr> {
        let req = Request::Create { parent: parent.id, name: name.to_vec(), kind, mode, rdev, excl, caller };
        entry(self.meta(parent.owner, &req).await?)
    }

    pub async fn mkdir(&self, parent: Ent, name: &[u8], mode: u32, caller: Caller) -> FsResult<EntryAttr> {
        let a = entry(
            self.meta(parent.owner, &Request::Mkdir { parent: parent.id, name: name.to_vec(), mode, caller }).await?,
        )?;
        if a.owner != parent.owner && self.leases.get().is_some() {
            // Made on another node through the parent's: the lease on its
            // (empty) names comes from its owner, so that creates there
            // need no lookup of their new names.
            if let Err(e) = self.meta(a.owner, &Request::LeaseDirNames { dir: a.id }).await {
                tracing::debug!("metadata node {}: no lease on the names of new directory {}: {e}", a.owner, a.id);
            }
        }
        Ok(a)
    }

    pub async fn unlink(&self, parent: Ent, name: &[u8]) -> FsResult<()> {
        ok(self.meta(parent.owner, &Request::Unlink { parent: parent.id, name: name.to_vec() }).await?)
    }

    pub async fn rmdir(&self, parent: Ent, name: &[u8]) -> FsResult<()> {
        ok(self.meta(parent.owner, &Request::Rmdir { parent: parent.id, name: name.to_vec() }).await?)
    }

    pub async fn rename(&self, parent: Ent, name: &[u8], new_parent: Ent, new_name: &[u8], flags: u32) -> FsResult<()> {
        if parent.owner != new_parent.owner {
            // The old parent's owner coordinates the move to the other node.
            let req = Request::RenameTo {
                parent: parent.id,
                name: name.to_vec(),
                new_parent: new_parent.id,
                new_parent_owner: new_parent.owner,
                new_name: new_name.to_vec(),
                flags,
            };
            return ok(self.meta(parent.owner, &req).await?);
        }
        let req = Request::Rename {
            parent: parent.id,
            name: name.to_vec(),
            new_parent: new_parent.id,
            new_name: new_name.to_vec(),
            flags,
        };
        ok(self.meta(parent.owner, &req).await?)
    }

    /// One page of a directory listing: entries after `after`, and whether more follow.
    pub async fn readdir(&self, dir: Ent, after: Option<Vec<u8>>, max: u32) -> FsResult<(Vec<DirEntry>, bool)> {
        match self.meta(dir.owner, &Request::ReadDir { dir: dir.id, after, max }).await? {
            Reply::DirPage { entries, more } => Ok((entries, more)),
            r => Err(unexpected(r)),
        }
    }

    /// The first page of a directory listing, and the directory's parent.
    pub async fn readdir_first(&self, dir: Ent, max: u32) -> FsResult<(EntryId, Vec<DirEntry>, bool)> {
        match self.meta(dir.owner, &Request::ReadDirFirst { dir: dir.id, max }).await? {
            Reply::DirPageFirst { parent, entries, more } => Ok((parent, entries, more)),
            r => Err(unexpected(r)),
        }
    }

    pub async fn symlink(&self, parent: Ent, name: &[u8], target: &[u8], caller: Caller) -> FsResult<EntryAttr> {
        let req = Request::Symlink { parent: parent.id, name: name.to_vec(), target: target.to_vec(), caller };
        entry(self.meta(parent.owner, &req).await?)
    }

    pub async fn readlink(&self, e: Ent) -> FsResult<Vec<u8>> {
        match self.meta(e.owner, &Request::ReadLink { id: e.id }).await? {
            Reply::LinkTarget(t) => Ok(t),
            r => Err(unexpected(r)),
        }
    }

    pub async fn link(&self, e: Ent, new_parent: Ent, new_name: &[u8]) -> FsResult<EntryAttr> {
        if e.owner != new_parent.owner {
            // The inode's owner keeps the link count and coordinates the new name.
            let req = Request::LinkTo {
                id: e.id,
                new_parent: new_parent.id,
                new_parent_owner: new_parent.owner,
                new_name: new_name.to_vec(),
            };
            return entry(self.meta(e.owner, &req).await?);
        }
        entry(
            self.meta(e.owner, &Request::Link { id: e.id, new_parent: new_parent.id, new_name: new_name.to_vec() })
                .await?,
        )
    }

    pub async fn getxattr(&self, e: Ent, name: &[u8]) -> FsResult<Vec<u8>> {
        match self.meta(e.owner, &Request::GetXattr { id: e.id, name: name.to_vec() }).await? {
            Reply::Xattr(v) => Ok(v),
            r => Err(unexpected(r)),
        }
    }

    pub async fn setxattr(&self, e: Ent, name: &[u8], value: &[u8], flags: u32) -> FsResult<()> {
        let req = Request::SetXattr { id: e.id, name: name.to_vec(), value: value.to_vec(), flags };
        ok(self.meta(e.owner, &req).await?)
    }

    pub async fn listxattr(&self, e: Ent) -> FsResult<Vec<Vec<u8>>> {
        match self.meta(e.owner, &Request::ListXattr { id: e.id }).await? {
            Reply::XattrNames(v) => Ok(v),
            r => Err(unexpected(r)),
        }
    }

    pub async fn removexattr(&self, e: Ent, name: &[u8]) -> FsResult<()> {
        ok(self.meta(e.owner, &Request::RemoveXattr { id: e.id, name: name.to_vec() }).await?)
    }

    /// Sets the metadata-node chooser of directory `e` (inherited by new subdirectories).
    pub async fn set_meta_chooser(&self, e: Ent, chooser: MetaChooser) -> FsResult<EntryAttr> {
        entry(self.meta(e.owner, &Request::SetMetaChooser { id: e.id, chooser }).await?)
    }

    pub async fn meta_chooser(&self, e: Ent) -> FsResult<MetaChooser> {
        match self.meta(e.owner, &Request::GetMetaChooser { id: e.id }).await? {
            Reply::MetaChooser(c) => Ok(c),
            r => Err(unexpected(r)),
        }
    }

    pub async fn set_dir_pattern(&self, e: Ent, pattern: DirPattern) -> FsResult<EntryAttr> {
        entry(self.meta(e.owner, &Request::SetDirPattern { id: e.id, pattern }).await?)
    }

    /// Opens a file at its metadata node: fresh attributes with the pattern.
    pub async fn open(&self, e: Ent, write: bool) -> FsResult<EntryAttr> {
        entry(self.meta(e.owner, &Request::Open { id: e.id, write }).await?)
    }

    /// Creates a regular file (or finds it, without `excl`) and opens it in
    /// one request; release it with [`Client::release`].
    pub async fn create_open(
        &self,
        parent: Ent,
        name: &[u8],
        mode: u32,
        excl: bool,
        caller: Caller,
    ) -> FsResult<EntryAttr> {
        let req = Request::CreateOpen { parent: parent.id, name: name.to_vec(), mode, excl, caller };
        entry(self.meta(parent.owner, &req).await?)
    }

    /// [`Client::create_open`] whose handle holds the file's size
    /// (`Request::CreateOpenHeld`) when leases are on and the file's node
    /// takes it: the answer, and whether the handle holds the size. Such a
    /// handle is released with [`Client::release_held_later`], which
    /// reports the size its writes left; its close reports nothing.
    pub async fn create_open_held(
        &self,
        parent: Ent,
        name: &[u8],
        mode: u32,
        excl: bool,
        caller: Caller,
    ) -> FsResult<(EntryAttr, bool)> {
        let refused = || self.releases.no_holds.lock().expect("no holds").contains(&parent.owner);
        if self.leases.get().is_some() && !refused() {
            let req = Request::CreateOpenHeld { parent: parent.id, name: name.to_vec(), mode, excl, caller };
            match self.meta(parent.owner, &req).await {
                Ok(r) => {
                    let a = entry(r)?;
                    let held = a.kind == FileKind::File && a.owner == parent.owner;
                    return Ok((a, held));
                }
                Err(e) if e.code == ErrorCode::Protocol => {
                    tracing::debug!("metadata node {} holds no sizes: {e}", parent.owner);
                    self.releases.no_holds.lock().expect("no holds").insert(parent.owner);
                }
                Err(e) => return Err(e),
            }
        }
        Ok((self.create_open(parent, name, mode, excl, caller).await?, false))
    }

    /// Releases a handle of `e` now (`write`: it may have changed chunk
    /// files; what this client wrote to `e` counts in any case).
    pub async fn release(&self, e: Ent, write: bool) -> FsResult<()> {
        self.local.forget(e.id);
        let write = !self.take_written(e.id).is_empty() || write;
        ok(self.meta(e.owner, &Request::Release { id: e.id, write }).await?)
    }

    async fn release_now(&self, id: EntryId, owner: NodeId, write: bool) -> FsResult<()> {
        ok(self.meta(owner, &Request::Release { id, write }).await?)
    }

    /// Tells the metadata node this client read `e` at `at` (access times:
    /// `Request::TouchAtime`).
    pub async fn touch_atime(&self, e: Ent, at: Timespec, strict: bool) -> FsResult<EntryAttr> {
        entry(self.meta(e.owner, &Request::TouchAtime { id: e.id, at, strict }).await?)
    }

    pub async fn update_size(&self, e: Ent, size: u64, mtime: Option<Timespec>) -> FsResult<EntryAttr> {
        entry(self.meta(e.owner, &Request::UpdateSize { id: e.id, size, mtime }).await?)
    }

    /// Reports `size`, the end of this client's own writes, if `e` is
    /// unchanged since this client saw it at `ctime` (`Request::UpdateSizeIf`):
    /// `None` when it changed (or its node does not know the request), and
    /// the size must come from the chunk files ([`Client::size_from_targets`]).
    pub async fn update_size_if(
        &self,
        e: Ent,
        size: u64,
        mtime: Option<Timespec>,
        ctime: Timespec,
    ) -> FsResult<Option<EntryAttr>> {
        use std::sync::atomic::Ordering;
        if self.no_size_if.load(Ordering::Relaxed) {
            return Ok(None);
        }
        match self.meta(e.owner, &Request::UpdateSizeIf { id: e.id, size, mtime, ctime }).await {
            Ok(r) => entry(r).map(Some),
            Err(err) if err.code == ErrorCode::Busy => Ok(None),
            Err(err) if matches!(err.code, ErrorCode::Protocol | ErrorCode::NotSupported) => {
                tracing::debug!("metadata node {}: no UpdateSizeIf ({err}); sizes from the chunk files", e.owner);
                self.no_size_if.store(true, Ordering::Relaxed);
                Ok(None)
            }
            Err(err) => Err(err),
        }
    }

    /// Finds the metadata node storing `id`'s inode, knowing only the id (a
    /// file handle, an inode number the kernel forgot): the node that minted
    /// it (where a file stays unless a rename moved it), and if it has not,
    /// every other metadata node at once (a dead one costs one timeout, not
    /// one per node).
    pub async fn locate(self: &Arc<Self>, id: EntryId) -> FsResult<EntryAttr> {
        if id.is_root() {
            return self.getattr(self.root).await;
        }
        let mut unreachable = match self.getattr(Ent { id, owner: NodeId(id.node) }).await {
            Ok(a) => return Ok(a),
            Err(e) if e.code == ErrorCode::NotFound => None,
            Err(e) => Some(e),
        };
        let view = self.cluster.view();
        let mut asks = tokio::task::JoinSet::new();
        for n in view.nodes.values().filter(|n| n.node_type == NodeType::Meta && n.id.0 != id.node) {
            let (me, owner) = (self.clone(), n.id);
            asks.spawn(async move { me.getattr(Ent { id, owner }).await });
        }
        while let Some(r) = asks.join_next().await {
            match r.map_err(|e| FsError::new(ErrorCode::Internal, e.to_string()))? {
                Ok(a) => return Ok(a),
                Err(e) if e.code == ErrorCode::NotFound => {}
                Err(e) => unreachable = Some(e),
            }
        }
        Err(unreachable
            .unwrap_or_else(|| FsError::new(ErrorCode::NotFound, format!("entry {id} is on no metadata node"))))
    }

    /// Walks a path (relative to the root, components separated by '/').
    pub async fn resolve(&self, path: &str) -> FsResult<EntryAttr> {
        let mut cur = self.getattr(self.root).await?;
        for comp in path.split('/').filter(|c| !c.is_empty() && *c != ".") {
            if cur.kind != FileKind::Dir {
                return Err(FsError::new(ErrorCode::NotDir, format!("{path}: a component is not a directory")));
            }
            cur = self.lookup(Ent::from(&cur), comp.as_bytes()).await?;
        }
        Ok(cur)
    }

    /// Space of all reachable storage targets, and entry counts of all metadata nodes.
    pub async fn statfs(&self) -> FsResult<FsStat> {
        let view = self.cluster.refresh().await?;
        let mut st = FsStat::default();
        for t in view.targets.values().filter(|t| t.reachability != Reachability::Offline) {
            st.storage.total_bytes += t.capacity.total_bytes;
            st.storage.free_bytes += t.capacity.free_bytes;
            st.storage.total_inodes += t.capacity.total_inodes;
            st.storage.free_inodes += t.capacity.free_inodes;
        }
        // Every metadata node counts the entries it stores.
        let mut metas: Vec<NodeId> = view
            .nodes
            .values()
            .filter(|n| n.node_type == NodeType::Meta && n.reachability != Reachability::Offline)
            .map(|n| n.id)
            .collect();
        if metas.is_empty() {
            metas.push(self.root.owner);
        }
        for m in metas {
            if let Ok(Reply::MetaStat { files, dirs, .. }) = self.meta(m, &Request::MetaStat).await {
                st.files += files;
                st.dirs += dirs;
            }
        }
        Ok(st)
    }
}
