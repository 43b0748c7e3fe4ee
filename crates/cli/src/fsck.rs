//! `hivefs fsck [--repair]`: consistency check (and repair) of a whole file
//! system: every metadata node (from mgmtd's registry) and every storage target.
//!
//! A walk lists every target's chunk files, then every metadata node's
//! disposal records, inodes and dentries, page by page, into a [`Checker`].
//! The checker keeps, per entry id, a small summary of its inode (and the
//! stripe targets of files), the chunk-file lengths per target, link counts
//! and the name of every directory: memory grows with the number of entries
//! and chunk files, never with page contents. An online walk is not a
//! snapshot, so problems of a first walk are candidates: a second walk
//! re-reads everything and only problems found by both are reported.
//!
//! Repairs go to the metadata node that holds the record (`FsckFix`, applied
//! by its writer, refused when the record changed) or to the storage target
//! (`UnlinkChunk`).

use crate::admin::{resolve, rt, Conn};
use crate::util::{absolute, pid_alive, read_pid};
use anyhow::{anyhow, bail, Context, Result};
use clap::Args;
use hivefs_net::{call_once, ClientConfig, Pool};
use hivefs_proto::{FsckDentry, FsckDisposal, FsckFix, FsckInode, Reachability, Reply, Request};
use hivefs_types::attr::FileKind;
use hivefs_types::ids::{EntryId, NodeId, NodeType, TargetId};
use serde::Serialize;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Records asked for per page.
const PAGE: u32 = 1024;

#[derive(Args, Debug)]
pub struct FsckArgs {
    #[command(flatten)]
    pub conn: Conn,
    /// Apply the repairs and report what was done.
    #[arg(long)]
    pub repair: bool,
    /// A file system directory of `hivefs up` whose services are stopped: its
    /// services are started (without a mount) for the check and stopped again.
    /// If they are running, the check runs online against them.
    #[arg(long, conflicts_with_all = ["mount", "mgmtd"])]
    pub dir: Option<PathBuf>,
    /// Only list the pending cross-node operations of the metadata nodes
    /// (no check); exits 0 when there are none, 1 otherwise.
    #[arg(long, conflicts_with = "repair")]
    pub pending: bool,
}

/// A cross-node operation a metadata node has not finished yet: its
/// coordinator finishes (or undoes) it on its own, so the transient state of
/// the entries it names is not a problem.
#[derive(Clone, Debug, Serialize)]
pub struct Pending {
    pub meta_node: NodeId,
    pub operation: String,
}

/// Pending cross-node operations of every metadata node.
async fn pending_ops(cl: &Cluster) -> Result<Vec<Pending>> {
    let mut out = Vec::new();
    for (n, pool) in &cl.metas {
        match pool.rpc(&Request::FsckIntents).await.map_err(|e| anyhow!("metadata node {n}: {e}"))? {
            Reply::FsckIntents(list) => {
                out.extend(list.into_iter().map(|operation| Pending { meta_node: *n, operation }))
            }
            r => bail!("metadata node {n}: unexpected reply to FsckIntents: {r:?}"),
        }
    }
    Ok(out)
}

/// Whether a problem concerns an entry that a pending operation names.
fn touched_by(p: &Problem, pending: &[Pending]) -> bool {
    pending.iter().any(|o| o.operation.split(|c: char| !(c.is_ascii_alphanumeric() || c == '-')).any(|w| w == p.entry))
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Kind {
    DanglingDentry,
    OrphanedInode,
    OrphanedChunk,
    WrongNlink,
    WrongParent,
    SizeMismatch,
}

impl Kind {
    fn as_str(self) -> &'static str {
        match self {
            Kind::DanglingDentry => "dangling-dentry",
            Kind::OrphanedInode => "orphaned-inode",
            Kind::OrphanedChunk => "orphaned-chunk",
            Kind::WrongNlink => "wrong-nlink",
            Kind::WrongParent => "wrong-parent",
            Kind::SizeMismatch => "size-mismatch",
        }
    }
}

/// Where a repair goes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Fix {
    Meta(NodeId, FsckFix),
    UnlinkChunk(TargetId, EntryId),
    /// Nothing safe to do automatically.
    None,
}

impl Fix {
    /// Repairs run in this order: removals first, names for orphans last (a
    /// new `/lost+found` changes the root's link count).
    fn order(&self) -> u8 {
        match self {
            Fix::Meta(_, FsckFix::RemoveDentry { .. }) => 0,
            Fix::UnlinkChunk(..) => 1,
            Fix::Meta(_, FsckFix::DropUnlinked { .. }) => 2,
            Fix::Meta(_, FsckFix::SetSize { .. } | FsckFix::SetParent { .. }) => 3,
            Fix::Meta(_, FsckFix::SetNlink { .. }) => 4,
            Fix::Meta(_, FsckFix::LostFound { .. }) => 5,
            Fix::None => 6,
        }
    }
}

#[derive(Clone, Debug, Serialize)]
pub struct Problem {
    pub kind: Kind,
    pub entry: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub meta_node: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub target: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    pub detail: String,
    #[serde(skip)]
    pub fix: Fix,
    /// Same problem in another walk: kind, entry and place.
    #[serde(skip)]
    key: String,
}

impl Problem {
    fn new(kind: Kind, entry: EntryId, place: String, detail: String, fix: Fix) -> Problem {
        Problem {
            kind,
            entry: entry.to_string(),
            meta_node: None,
            target: None,
            path: None,
            key: format!("{} {entry} {place}", kind.as_str()),
            detail,
            fix,
        }
    }
    fn on_node(mut self, n: NodeId) -> Self {
        self.meta_node = Some(n.0);
        self
    }
    fn on_target(mut self, t: TargetId) -> Self {
        self.target = Some(t.0);
        self
    }
}

struct Ino {
    node: NodeId,
    kind: FileKind,
    nlink: u32,
    size: u64,
    open: bool,
    parent: Option<EntryId>,
    /// Files: stripe targets and chunk size.
    targets: Vec<TargetId>,
    pattern: Option<hivefs_types::pattern::Pattern>,
}

/// The pure comparison: feed it chunk files, disposal records and inodes of
/// every node, then dentries (which are checked against the inodes), then
/// [`Checker::finish`].
#[derive(Default)]
pub struct Checker {
    inodes: HashMap<EntryId, Ino>,
    chunks: HashMap<EntryId, Vec<(TargetId, u64)>>,
    disposal: HashMap<EntryId, bool>,
    /// Dentries naming each id (only those whose inode exists on their owner).
    links: HashMap<EntryId, u32>,
    /// Subdirectory dentries per directory.
    subdirs: HashMap<EntryId, u32>,
    /// Directories: (holder node, parent, name) of their dentry.
    dir_names: HashMap<EntryId, (NodeId, EntryId, Vec<u8>)>,
    /// Names of other entries whose path a report wants.
    want: HashSet<EntryId>,
    names: HashMap<EntryId, (EntryId, Vec<u8>)>,
    problems: Vec<Problem>,
    /// Dangling dentries: (index in `problems`, directory, name) for their path.
    dangling: Vec<(usize, EntryId, Vec<u8>)>,
    pub scanned: u64,
}

impl Checker {
    fn with_wanted(want: HashSet<EntryId>) -> Checker {
        Checker { want, ..Default::default() }
    }

    pub fn add_chunk(&mut self, target: TargetId, id: EntryId, len: u64) {
        self.scanned += 1;
        self.chunks.entry(id).or_default().push((target, len));
    }

    pub fn add_disposal(&mut self, d: &FsckDisposal) {
        self.scanned += 1;
        self.disposal.insert(d.id, d.open_unlinked);
    }

    pub fn add_inode(&mut self, node: NodeId, i: FsckInode) {
        self.scanned += 1;
        let targets = i.pattern.as_ref().map(|p| p.targets().to_vec()).unwrap_or_default();
        self.inodes.insert(
            i.id,
            Ino {
                node,
                kind: i.kind,
                nlink: i.nlink,
                size: i.size,
                open: i.open,
                parent: i.parent,
                targets,
                pattern: i.pattern,
            },
        );
    }

    /// `holder`: the node whose store holds the dentry.
    pub fn add_dentry(&mut self, holder: NodeId, d: FsckDentry) {
        self.scanned += 1;
        match self.inodes.get(&d.id) {
            Some(i) if i.node == d.owner => {}
            other => {
                let why = match other {
                    Some(i) => format!("its inode is on metadata node {}, not on owner {}", i.node, d.owner),
                    None => format!("inode {} does not exist on metadata node {}", d.id, d.owner),
                };
                let place = format!("{}/{}", d.parent, String::from_utf8_lossy(&d.name));
                let name = String::from_utf8_lossy(&d.name).into_owned();
                let p = Problem::new(
                    Kind::DanglingDentry,
                    d.id,
                    place,
                    format!("dentry {name:?} in directory {}: {why}", d.parent),
                    Fix::Meta(holder, FsckFix::RemoveDentry { parent: d.parent, name: d.name.clone(), id: d.id }),
                )
                .on_node(holder);
                self.dangling.push((self.problems.len(), d.parent, d.name));
                self.problems.push(p);
                return;
            }
        }
        *self.links.entry(d.id).or_default() += 1;
        if d.kind == FileKind::Dir {
            *self.subdirs.entry(d.parent).or_default() += 1;
            self.dir_names.entry(d.id).or_insert((holder, d.parent, d.name));
        } else if self.want.contains(&d.id) {
            self.names.entry(d.id).or_insert((d.parent, d.name));
        }
    }

    /// The path of directory `dir`, if its chain of names reaches the root.
    fn dir_path(&self, dir: EntryId) -> Option<String> {
        let mut parts = Vec::new();
        let mut cur = dir;
        while !cur.is_root() {
            let (_, parent, name) = self.dir_names.get(&cur)?;
            parts.push(String::from_utf8_lossy(name).into_owned());
            cur = *parent;
            if parts.len() > 4096 {
                return None;
            }
        }
        parts.reverse();
        Some(format!("/{}", parts.join("/")))
    }

    fn path_of(&self, id: EntryId) -> Option<String> {
        if self.dir_names.contains_key(&id) || id.is_root() {
            return self.dir_path(id);
        }
        let (parent, name) = self.names.get(&id)?;
        let dp = self.dir_path(*parent)?;
        Some(format!("{}/{}", dp.trim_end_matches('/'), String::from_utf8_lossy(name)))
    }

    pub fn finish(mut self) -> Vec<Problem> {
        let mut out = std::mem::take(&mut self.problems);
        for (i, parent, name) in std::mem::take(&mut self.dangling) {
            out[i].path = self
                .dir_path(parent)
                .map(|dp| format!("{}/{}", dp.trim_end_matches('/'), String::from_utf8_lossy(&name)));
        }
        let mut ids: Vec<&EntryId> = self.inodes.keys().collect();
        ids.sort();
        for &id in ids {
            let i = &self.inodes[&id];
            let links = self.links.get(&id).copied().unwrap_or(0);
            let n = i.node;
            if i.kind == FileKind::Dir {
                if !id.is_root() && links == 0 {
                    let fix = if i.nlink > 0 { Fix::Meta(n, FsckFix::LostFound { id }) } else { Fix::None };
                    out.push(
                        Problem::new(
                            Kind::OrphanedInode,
                            id,
                            n.to_string(),
                            "directory that no dentry names".into(),
                            fix,
                        )
                        .on_node(n),
                    );
                    continue;
                }
                let want = 2 + self.subdirs.get(&id).copied().unwrap_or(0);
                if i.nlink != want {
                    out.push(
                        Problem::new(
                            Kind::WrongNlink,
                            id,
                            n.to_string(),
                            format!("directory has link count {}, expected {want} (2 + subdirectories)", i.nlink),
                            Fix::Meta(n, FsckFix::SetNlink { id, from: i.nlink, to: want }),
                        )
                        .on_node(n),
                    );
                }
                let holder_parent = if id.is_root() { Some(id) } else { self.dir_names.get(&id).map(|x| x.1) };
                if let Some(hp) = holder_parent {
                    if i.parent != Some(hp) {
                        out.push(
                            Problem::new(
                                Kind::WrongParent,
                                id,
                                n.to_string(),
                                format!(
                                    "directory's parent pointer is {}, but its dentry is in directory {hp}",
                                    i.parent.map_or("none".into(), |p| p.to_string())
                                ),
                                Fix::Meta(n, FsckFix::SetParent { id, from: i.parent, to: hp }),
                            )
                            .on_node(n),
                        );
                    }
                }
                continue;
            }
            if i.nlink == 0 {
                if links == 0 && !self.disposal.get(&id).copied().unwrap_or(false) {
                    out.push(
                        Problem::new(
                            Kind::OrphanedInode,
                            id,
                            n.to_string(),
                            "unlinked inode (link count 0) without an open-unlinked disposal record".into(),
                            if i.open { Fix::None } else { Fix::Meta(n, FsckFix::DropUnlinked { id }) },
                        )
                        .on_node(n),
                    );
                }
                continue;
            }
            if links == 0 {
                out.push(
                    Problem::new(
                        Kind::OrphanedInode,
                        id,
                        n.to_string(),
                        format!("{:?} with link count {} that no dentry names", i.kind, i.nlink).to_lowercase(),
                        Fix::Meta(n, FsckFix::LostFound { id }),
                    )
                    .on_node(n),
                );
                continue;
            }
            if i.nlink != links {
                out.push(
                    Problem::new(
                        Kind::WrongNlink,
                        id,
                        n.to_string(),
                        format!("link count {}, but {links} dentries name it", i.nlink),
                        Fix::Meta(n, FsckFix::SetNlink { id, from: i.nlink, to: links }),
                    )
                    .on_node(n),
                );
            }
            if let (Some(p), false) = (&i.pattern, i.open) {
                let have = self.chunks.get(&id);
                let lens: Vec<u64> = p
                    .targets()
                    .iter()
                    .map(|t| have.and_then(|c| c.iter().find(|(ct, _)| ct == t)).map_or(0, |(_, l)| *l))
                    .collect();
                let computed = p.size_from_chunk_lens(&lens);
                if computed != i.size {
                    out.push(
                        Problem::new(
                            Kind::SizeMismatch,
                            id,
                            n.to_string(),
                            format!("cached size {} but the chunk files make it {computed}", i.size),
                            Fix::Meta(n, FsckFix::SetSize { id, from: i.size, to: computed }),
                        )
                        .on_node(n),
                    );
                }
            }
        }
        let mut cids: Vec<&EntryId> = self.chunks.keys().collect();
        cids.sort();
        for &id in cids {
            let pending = self.disposal.contains_key(&id);
            let ino = self.inodes.get(&id);
            for &(t, len) in &self.chunks[&id] {
                let why = match ino {
                    Some(i) if i.targets.contains(&t) => continue,
                    Some(_) => "its file's stripe pattern does not include this target",
                    None if pending => continue,
                    None => "no inode and no pending disposal record",
                };
                out.push(
                    Problem::new(
                        Kind::OrphanedChunk,
                        id,
                        format!("target {t}"),
                        format!("chunk file of {len} bytes: {why}"),
                        Fix::UnlinkChunk(t, id),
                    )
                    .on_target(t),
                );
            }
        }
        for p in &mut out {
            if p.path.is_none() && p.kind != Kind::DanglingDentry && p.kind != Kind::OrphanedChunk {
                if let Some(id) = EntryId::parse(&p.entry) {
                    p.path = self.path_of(id);
                }
            }
        }
        out.sort_by(|a, b| (a.kind, &a.key).cmp(&(b.kind, &b.key)));
        out
    }
}

// ------------------------------------------------------------------ walk

struct Cluster {
    metas: Vec<(NodeId, Pool)>,
    targets: Vec<(TargetId, Pool)>,
}

async fn cluster(mgmtd: &str, cfg: &ClientConfig) -> Result<Cluster> {
    let Reply::Nodes(nodes) = call_once(mgmtd, cfg, &Request::ListNodes { node_type: None })
        .await
        .map_err(|e| anyhow!("mgmtd {mgmtd}: {e}"))?
    else {
        bail!("mgmtd {mgmtd}: unexpected reply to ListNodes");
    };
    let Reply::Targets(targets) =
        call_once(mgmtd, cfg, &Request::ListTargets).await.map_err(|e| anyhow!("mgmtd {mgmtd}: {e}"))?
    else {
        bail!("mgmtd {mgmtd}: unexpected reply to ListTargets");
    };
    let mut metas = Vec::new();
    let mut storage = HashMap::new();
    for n in &nodes {
        if n.reachability == Reachability::Offline {
            bail!("{} node {} at {} is offline: a check needs every node", n.node_type, n.id, n.addr);
        }
        match n.node_type {
            NodeType::Meta => metas.push((n.id, Pool::new(n.addr.clone(), cfg.clone()))),
            NodeType::Storage => {
                storage.insert(n.id, n.addr.clone());
            }
            _ => {}
        }
    }
    metas.sort_by_key(|m| m.0);
    let mut ts = Vec::new();
    for t in targets {
        let addr =
            storage.get(&t.node).ok_or_else(|| anyhow!("target {}: its storage node {} is unknown", t.id, t.node))?;
        ts.push((t.id, Pool::new(addr.clone(), cfg.clone())));
    }
    ts.sort_by_key(|t| t.0);
    if metas.is_empty() {
        bail!("mgmtd {mgmtd} knows no metadata node");
    }
    Ok(Cluster { metas, targets: ts })
}

struct Progress {
    on: bool,
    last: Instant,
}

impl Progress {
    fn show(&mut self, c: &Checker) {
        if self.on && self.last.elapsed() > Duration::from_millis(200) {
            eprint!("\rfsck: {} records scanned", c.scanned);
            self.last = Instant::now();
        }
    }
    fn done(&self) {
        if self.on {
            eprint!("\r\x1b[K");
        }
    }
}

async fn walk(cl: &Cluster, want: HashSet<EntryId>, prog: &mut Progress) -> Result<(Vec<Problem>, u64)> {
    let mut c = Checker::with_wanted(want);
    for (t, pool) in &cl.targets {
        let mut after = None;
        loop {
            let r = pool.rpc(&Request::ListChunks { target: *t, after, max: PAGE }).await;
            let Reply::Chunks { chunks, more } = r.map_err(|e| anyhow!("listing chunks of target {t}: {e}"))? else {
                bail!("target {t}: unexpected reply to ListChunks");
            };
            after = chunks.last().map(|x| x.0);
            for (id, len) in chunks {
                c.add_chunk(*t, id, len);
            }
            prog.show(&c);
            if !more || after.is_none() {
                break;
            }
        }
    }
    let meta_err =
        |n: &NodeId, what: &str, e: hivefs_types::error::FsError| anyhow!("scanning {what} of metadata node {n}: {e}");
    for (n, pool) in &cl.metas {
        let mut after = None;
        loop {
            let Reply::FsckDisposals { records, more } = pool
                .rpc(&Request::FsckDisposals { after, max: PAGE })
                .await
                .map_err(|e| meta_err(n, "disposal records", e))?
            else {
                bail!("metadata node {n}: unexpected reply to FsckDisposals");
            };
            after = records.last().map(|r| r.id);
            records.iter().for_each(|r| c.add_disposal(r));
            prog.show(&c);
            if !more || after.is_none() {
                break;
            }
        }
    }
    for (n, pool) in &cl.metas {
        let mut after = None;
        loop {
            let Reply::FsckInodes { inodes, more } =
                pool.rpc(&Request::FsckInodes { after, max: PAGE }).await.map_err(|e| meta_err(n, "inodes", e))?
            else {
                bail!("metadata node {n}: unexpected reply to FsckInodes");
            };
            after = inodes.last().map(|i| i.id);
            inodes.into_iter().for_each(|i| c.add_inode(*n, i));
            prog.show(&c);
            if !more || after.is_none() {
                break;
            }
        }
    }
    for (n, pool) in &cl.metas {
        let mut after = None;
        loop {
            let Reply::FsckDentries { entries, more } = pool
                .rpc(&Request::FsckDentries { after: after.clone(), max: PAGE })
                .await
                .map_err(|e| meta_err(n, "dentries", e))?
            else {
                bail!("metadata node {n}: unexpected reply to FsckDentries");
            };
            after = entries.last().map(|d| (d.parent, d.name.clone()));
            entries.into_iter().for_each(|d| c.add_dentry(*n, d));
            prog.show(&c);
            if !more || after.is_none() {
                break;
            }
        }
    }
    let scanned = c.scanned;
    Ok((c.finish(), scanned))
}

/// Two walks; a problem counts only if both found it (see the module doc).
/// Problems of entries that a pending cross-node operation names (before or
/// after the walks) are left out: that operation's coordinator resolves them.
async fn check(cl: &Cluster, prog: &mut Progress) -> Result<(Vec<Problem>, u64, Vec<Pending>)> {
    let mut pending = pending_ops(cl).await?;
    let (first, scanned) = walk(cl, HashSet::new(), prog).await?;
    if first.is_empty() {
        return Ok((first, scanned, pending));
    }
    let keys: HashSet<String> = first.iter().map(|p| p.key.clone()).collect();
    let want = first.iter().filter_map(|p| EntryId::parse(&p.entry)).collect();
    let (second, scanned) = walk(cl, want, prog).await?;
    let after = pending_ops(cl).await?;
    let mut all = pending.clone();
    all.extend(after.iter().cloned());
    let problems = second.into_iter().filter(|p| keys.contains(&p.key) && !touched_by(p, &all)).collect();
    // Report what is still pending now.
    pending = after;
    Ok((problems, scanned, pending))
}

#[derive(Serialize)]
struct Repair {
    kind: Kind,
    entry: String,
    done: bool,
    message: String,
}

async fn repair(cl: &Cluster, problems: &[Problem]) -> Vec<Repair> {
    let mut order: Vec<&Problem> = problems.iter().collect();
    order.sort_by_key(|p| p.fix.order());
    let mut out = Vec::new();
    for p in order {
        let r = match &p.fix {
            Fix::None => Err("no automatic repair; inspect it by hand".to_string()),
            Fix::UnlinkChunk(t, id) => match cl.targets.iter().find(|x| x.0 == *t) {
                Some((_, pool)) => pool
                    .rpc(&Request::UnlinkChunk { target: *t, entry: *id })
                    .await
                    .map(|_| format!("removed chunk file of {id} on target {t}"))
                    .map_err(|e| format!("target {t}: {e}")),
                None => Err(format!("target {t} is not registered")),
            },
            Fix::Meta(n, fix) => match cl.metas.iter().find(|x| x.0 == *n) {
                Some((_, pool)) => match pool.rpc(&Request::FsckFix { fix: fix.clone() }).await {
                    Ok(Reply::FsckFixed(m)) => Ok(m),
                    Ok(other) => Err(format!("metadata node {n}: unexpected reply {other:?}")),
                    Err(e) => Err(format!("metadata node {n}: {e}")),
                },
                None => Err(format!("metadata node {n} is not registered")),
            },
        };
        let (done, message) = match r {
            Ok(m) => (true, m),
            Err(m) => (false, m),
        };
        tracing::info!(entry = %p.entry, done, "fsck repair: {message}");
        out.push(Repair { kind: p.kind, entry: p.entry.clone(), done, message });
    }
    out
}

// ------------------------------------------------------------- offline

/// The services of a stopped `hivefs up` directory, started for the check
/// (no mount) and stopped when this is dropped.
struct OfflineServices {
    children: Vec<(String, Child)>,
}

impl Drop for OfflineServices {
    fn drop(&mut self) {
        // Storage, then metadata, then mgmtd: the reverse of the start order.
        for (name, c) in self.children.iter_mut().rev() {
            // SAFETY: signalling a child process started by this command.
            unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
            let start = Instant::now();
            while matches!(c.try_wait(), Ok(None)) {
                if start.elapsed() > Duration::from_secs(10) {
                    eprintln!("fsck: {name} did not stop within 10 s; killing it");
                    let _ = c.kill();
                    let _ = c.wait();
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }
}

fn start_offline(dir: &Path, mgmtd: &str, cfg: &ClientConfig) -> Result<OfflineServices> {
    let layout = crate::up::load_layout(dir)?;
    let secret = dir.join("secret");
    let exe = std::env::current_exe().context("cannot find the hivefs executable")?;
    let mut svc = OfflineServices { children: Vec::new() };
    let rt = rt()?;
    for (name, role, port, sdir) in layout.services(dir) {
        if read_pid(&sdir.join(format!("{name}.pid"))).is_some_and(pid_alive) {
            bail!("{name} of {} runs although mgmtd does not answer; stop it with `hivefs down`", dir.display());
        }
        let listen = format!("{}:{port}", layout.host);
        let args = layout.service_args(role, port, &sdir, &secret);
        let log_path = sdir.join(format!("{name}.log"));
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
            .with_context(|| format!("cannot open {}", log_path.display()))?;
        let child = Command::new(&exe)
            .args(&args)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .with_context(|| format!("cannot start {name}"))?;
        svc.children.push((name.clone(), child));
        let start = Instant::now();
        loop {
            if rt.block_on(call_once(&listen, cfg, &Request::Ping)).is_ok() {
                break;
            }
            let (_, c) = svc.children.last_mut().expect("just pushed");
            if !matches!(c.try_wait(), Ok(None)) || start.elapsed() > Duration::from_secs(60) {
                bail!("{name} did not come up for the check; see {}", log_path.display());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    // Every target registered and online.
    let want = (layout.storage * layout.targets_per_storage) as usize;
    let start = Instant::now();
    loop {
        let online = match rt.block_on(call_once(mgmtd, cfg, &Request::ListTargets)) {
            Ok(Reply::Targets(t)) => t.iter().filter(|t| t.reachability == Reachability::Online).count(),
            _ => 0,
        };
        if online >= want {
            return Ok(svc);
        }
        if start.elapsed() > Duration::from_secs(60) {
            bail!("only {online} of {want} storage targets of {} came online", dir.display());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

// ------------------------------------------------------------------ main

#[derive(Serialize)]
struct Report<'a> {
    clean: bool,
    scanned: u64,
    problems: &'a [Problem],
    repairs: &'a [Repair],
    summary: BTreeMap<&'static str, usize>,
    pending: &'a [Pending],
}

/// Runs the command; returns the exit status (0 clean, 1 problems left, 2 error).
pub fn fsck(a: FsckArgs) -> i32 {
    match run(a) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("hivefs fsck: {e:#}");
            2
        }
    }
}

fn run(a: FsckArgs) -> Result<i32> {
    let (mgmtd, secret, dir) = match &a.dir {
        Some(d) => {
            let dir = absolute(d)?;
            let layout = crate::up::load_layout(&dir)?;
            let secret = hivefs_net::load_secret(&dir.join("secret")).map_err(|e| anyhow!(e))?;
            (layout.mgmtd_addr(), Some(secret), Some(dir))
        }
        None => {
            let r = resolve(&a.conn)?;
            (r.mgmtd, r.secret, None)
        }
    };
    let cfg = ClientConfig::new(secret);
    let runtime = rt()?;
    let _offline = match &dir {
        Some(d) if runtime.block_on(call_once(&mgmtd, &cfg, &Request::Ping)).is_err() => {
            if !a.conn.json {
                eprintln!("fsck: starting the services of {} (no mount) for the check", d.display());
            }
            Some(start_offline(d, &mgmtd, &cfg)?)
        }
        _ => None,
    };
    if a.pending {
        let pending = runtime.block_on(async { pending_ops(&cluster(&mgmtd, &cfg).await?).await })?;
        if a.conn.json {
            println!("{}", serde_json::to_string_pretty(&pending)?);
        } else {
            print_pending(&pending);
            if pending.is_empty() {
                println!("no pending cross-node operations");
            }
        }
        return Ok(if pending.is_empty() { 0 } else { 1 });
    }
    let mut prog = Progress { on: std::io::stderr().is_terminal(), last: Instant::now() };
    let (problems, scanned, repairs, pending) = runtime.block_on(async {
        let cl = cluster(&mgmtd, &cfg).await?;
        let (problems, scanned, pending) = check(&cl, &mut prog).await?;
        let repairs = if a.repair { repair(&cl, &problems).await } else { Vec::new() };
        Ok::<_, anyhow::Error>((problems, scanned, repairs, pending))
    })?;
    prog.done();
    let mut summary = BTreeMap::new();
    for p in &problems {
        *summary.entry(p.kind.as_str()).or_insert(0) += 1;
    }
    let repaired = repairs.iter().filter(|r| r.done).count();
    let left = problems.len() - if a.repair { repaired } else { 0 };
    if a.conn.json {
        let rep = Report {
            clean: problems.is_empty(),
            scanned,
            problems: &problems,
            repairs: &repairs,
            summary,
            pending: &pending,
        };
        println!("{}", serde_json::to_string_pretty(&rep)?);
    } else {
        for p in &problems {
            let place = match (p.meta_node, p.target) {
                (Some(n), _) => format!("meta node {n}"),
                (_, Some(t)) => format!("target {t}"),
                _ => "-".into(),
            };
            let path = p.path.as_deref().map(|s| format!(" {s}")).unwrap_or_default();
            println!("{:<16} {} {place}{path}: {}", p.kind.as_str(), p.entry, p.detail);
        }
        for r in &repairs {
            println!("{} {}: {}", if r.done { "repaired" } else { "NOT repaired" }, r.entry, r.message);
        }
        print_pending(&pending);
        if problems.is_empty() {
            println!("clean: {scanned} records checked, no problems");
        } else {
            let s: Vec<String> = summary.iter().map(|(k, v)| format!("{v} {k}")).collect();
            println!(
                "{} problems ({}); {scanned} records checked{}",
                problems.len(),
                s.join(", "),
                if a.repair { format!("; {repaired} repaired") } else { "; run with --repair to fix them".into() }
            );
        }
    }
    Ok(if left == 0 { 0 } else { 1 })
}

fn print_pending(pending: &[Pending]) {
    for p in pending {
        println!("pending cross-node operation {}, will be finished by metadata node {}", p.operation, p.meta_node);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hivefs_types::pattern::{Pattern, PatternKind};

    const N: NodeId = NodeId(1);

    fn id(c: u64) -> EntryId {
        EntryId { node: 1, epoch: 1, counter: c }
    }

    fn dir(i: EntryId, nlink: u32, parent: EntryId) -> FsckInode {
        FsckInode { id: i, kind: FileKind::Dir, nlink, size: 0, pattern: None, parent: Some(parent), open: false }
    }

    fn file(i: EntryId, nlink: u32, size: u64, targets: &[u32]) -> FsckInode {
        let pattern = Pattern::new(PatternKind::Raid0, 4096, targets.iter().map(|&t| TargetId(t)).collect()).unwrap();
        FsckInode { id: i, kind: FileKind::File, nlink, size, pattern: Some(pattern), parent: None, open: false }
    }

    fn dentry(parent: EntryId, name: &str, i: EntryId, kind: FileKind) -> FsckDentry {
        FsckDentry { parent, name: name.as_bytes().to_vec(), id: i, kind, owner: N }
    }

    /// root/{d/, d/f (2 targets, 5000 bytes), g (hard link of d/f)}
    fn healthy() -> Checker {
        let mut c = Checker::default();
        c.add_chunk(TargetId(1), id(3), 4096);
        c.add_chunk(TargetId(2), id(3), 904);
        c.add_inode(N, dir(EntryId::ROOT, 3, EntryId::ROOT));
        c.add_inode(N, dir(id(2), 2, EntryId::ROOT));
        c.add_inode(N, file(id(3), 2, 5000, &[1, 2]));
        c.add_dentry(N, dentry(EntryId::ROOT, "d", id(2), FileKind::Dir));
        c.add_dentry(N, dentry(id(2), "f", id(3), FileKind::File));
        c.add_dentry(N, dentry(EntryId::ROOT, "g", id(3), FileKind::File));
        c
    }

    fn kinds(ps: &[Problem]) -> Vec<(Kind, String)> {
        ps.iter().map(|p| (p.kind, p.entry.clone())).collect()
    }

    #[test]
    fn a_consistent_namespace_is_clean() {
        assert!(healthy().finish().is_empty());
    }

    #[test]
    fn each_kind_of_damage_is_found_with_its_fix() {
        let mut c = Checker::with_wanted([id(3)].into());
        c.add_chunk(TargetId(1), id(3), 4096); // target 2's chunk file is gone: size 4096
        c.add_chunk(TargetId(4), id(9), 10); // nobody's
        c.add_chunk(TargetId(5), id(3), 10); // not in the pattern
        c.add_chunk(TargetId(6), id(8), 10); // pending disposal: fine
        c.add_disposal(&FsckDisposal { id: id(8), open_unlinked: false, targets: vec![TargetId(6)] });
        c.add_inode(N, dir(EntryId::ROOT, 3, EntryId::ROOT));
        c.add_inode(N, dir(id(2), 3, id(7))); // nlink 3 with no subdir; parent pointer wrong
        c.add_inode(N, file(id(3), 1, 5000, &[1, 2])); // named twice
        c.add_inode(N, file(id(5), 1, 0, &[1])); // no dentry
        c.add_inode(N, file(id(6), 0, 0, &[1])); // unlinked, no record
        c.add_dentry(N, dentry(EntryId::ROOT, "d", id(2), FileKind::Dir));
        c.add_dentry(N, dentry(id(2), "f", id(3), FileKind::File));
        c.add_dentry(N, dentry(EntryId::ROOT, "g", id(3), FileKind::File));
        c.add_dentry(N, dentry(id(2), "gone", id(4), FileKind::File));
        let ps = c.finish();
        assert_eq!(
            kinds(&ps),
            vec![
                (Kind::DanglingDentry, id(4).to_string()),
                (Kind::OrphanedInode, id(5).to_string()),
                (Kind::OrphanedInode, id(6).to_string()),
                (Kind::OrphanedChunk, id(3).to_string()),
                (Kind::OrphanedChunk, id(9).to_string()),
                (Kind::WrongNlink, id(2).to_string()),
                (Kind::WrongNlink, id(3).to_string()),
                (Kind::WrongParent, id(2).to_string()),
                (Kind::SizeMismatch, id(3).to_string()),
            ]
        );
        let fix = |k: Kind, e: EntryId| ps.iter().find(|p| p.kind == k && p.entry == e.to_string()).unwrap();
        assert_eq!(fix(Kind::DanglingDentry, id(4)).path.as_deref(), Some("/d/gone"));
        assert_eq!(fix(Kind::SizeMismatch, id(3)).path.as_deref(), Some("/d/f"));
        assert_eq!(fix(Kind::WrongNlink, id(2)).path.as_deref(), Some("/d"));
        assert_eq!(
            fix(Kind::SizeMismatch, id(3)).fix,
            Fix::Meta(N, FsckFix::SetSize { id: id(3), from: 5000, to: 4096 })
        );
        assert_eq!(fix(Kind::WrongNlink, id(3)).fix, Fix::Meta(N, FsckFix::SetNlink { id: id(3), from: 1, to: 2 }));
        assert_eq!(fix(Kind::WrongNlink, id(2)).fix, Fix::Meta(N, FsckFix::SetNlink { id: id(2), from: 3, to: 2 }));
        assert_eq!(fix(Kind::OrphanedInode, id(5)).fix, Fix::Meta(N, FsckFix::LostFound { id: id(5) }));
        assert_eq!(fix(Kind::OrphanedInode, id(6)).fix, Fix::Meta(N, FsckFix::DropUnlinked { id: id(6) }));
        assert_eq!(fix(Kind::OrphanedChunk, id(9)).fix, Fix::UnlinkChunk(TargetId(4), id(9)));
        assert_eq!(fix(Kind::OrphanedChunk, id(3)).target, Some(5));
    }

    #[test]
    fn open_files_and_open_unlinked_entries_are_not_problems() {
        let mut c = healthy();
        let mut f = file(id(10), 1, 1 << 20, &[1]); // size ahead of its chunks while written
        f.open = true;
        c.add_inode(N, f);
        c.add_dentry(N, dentry(EntryId::ROOT, "w", id(10), FileKind::File));
        c.add_disposal(&FsckDisposal { id: id(11), open_unlinked: true, targets: vec![TargetId(1)] });
        c.add_inode(N, file(id(11), 0, 0, &[1]));
        c.add_chunk(TargetId(1), id(11), 3);
        assert!(c.finish().is_empty());
    }

    #[test]
    fn a_subdirectory_dentry_without_inode_does_not_count_as_a_link() {
        let mut c = Checker::default();
        c.add_inode(N, dir(EntryId::ROOT, 3, EntryId::ROOT));
        c.add_dentry(N, dentry(EntryId::ROOT, "x", id(2), FileKind::Dir));
        let ps = c.finish();
        assert_eq!(kinds(&ps), vec![(Kind::DanglingDentry, id(2).to_string()), (Kind::WrongNlink, "root".into())]);
        assert_eq!(ps[0].path.as_deref(), Some("/x"));
        // Removals run before the link count is set.
        assert!(ps[0].fix.order() < ps[1].fix.order());
    }
}
