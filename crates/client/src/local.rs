//! Short-circuit chunk I/O: chunk files of targets whose storage service
//! runs on this host are read and written through descriptors the service
//! handed over (`hivefs_chunk::local`), not through requests over TCP.
//!
//! Same bytes, same files: the service serves the very same chunk files to
//! other clients, and the kernel's page cache is shared, so every read here
//! sees every completed write of any client, as on the network path.
//! A service hands over each target's `chunks/` directory once; through it
//! the client opens (and, to write, makes) chunk files of unmirrored files
//! itself, at their first access, without a request
//! (`hivefs_chunk::store::open_in_chunks_dir`, the service's own layout).
//! Where a service hands out no directory (an older version), a chunk
//! file's descriptor is fetched at its second access (one access over TCP
//! costs what the fetch would); a mirrored chunk's always is. Descriptors
//! are kept until the file is released by this client, and all of a
//! service's (directories too) are dropped as soon as its socket hangs up
//! (it stopped or died): from then on requests go over TCP and fail or wait
//! as they always did. A target the service does not offer
//! (rate-limited) and a service that does not answer (another host, an older
//! version) use the network path.
//!
//! This module must not decide anything about chunk contents or sizes: it
//! only finds a descriptor or says "use the network".

use hivefs_chunk::local::{socket_name, LocalConn, Offer};
use hivefs_chunk::store::{chunks_dir_owner, open_in_chunks_dir, ChunkOwner};
use hivefs_cluster::Cluster;
use hivefs_net::Secret;
use hivefs_types::error::FsError;
use hivefs_types::ids::{BuddyGroupId, EntryId, NodeId, NodeType, TargetId};
use hivefs_types::pattern::StripeUnit;
use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tracing::{debug, info, warn};

/// Descriptors kept at most (all files and targets), and at most a quarter
/// of the process's descriptor limit; beyond, all are dropped and fetched
/// again as needed.
const FILES_MAX: usize = 4096;

/// [`FILES_MAX`], or a quarter of the soft `RLIMIT_NOFILE` if that is less.
fn files_max() -> usize {
    use rustix::process::{getrlimit, Resource};
    // None is RLIM_INFINITY.
    let cur = getrlimit(Resource::Nofile).current.unwrap_or(u64::MAX);
    usize::try_from(cur / 4).unwrap_or(FILES_MAX).min(FILES_MAX)
}
/// After a service did not answer on its socket: try again after this long.
const RETRY_ABSENT: Duration = Duration::from_secs(30);
/// After a service hung up or failed: try again after this long.
const RETRY_FAILED: Duration = Duration::from_secs(1);

/// Where a piece of chunk I/O goes.
pub(crate) enum Local {
    /// The chunk file itself.
    File(Arc<File>),
    /// The chunk file does not exist (asked without create): a hole.
    NoChunk,
    /// Over TCP to the storage service.
    Network,
}

enum NodeState {
    Conn(Arc<LocalConn>),
    /// No connection until then.
    Later(Instant),
}

/// A mirrored chunk held to read: its group's primary target when it was
/// handed out, the node serving it, the group's epoch, and until when the
/// primary's lease lets it be read.
struct Mirrored {
    target: TargetId,
    node: NodeId,
    epoch: u64,
    until: Instant,
    file: Arc<File>,
}

/// A target's `chunks/` directory, handed out by the node serving it.
struct ChunksDir {
    node: NodeId,
    dir: File,
    /// Who files made here must belong to (the service's user, if not ours).
    owner: Option<ChunkOwner>,
}

/// Where [`LocalChunks::conn_for`] sends a caller.
enum Found {
    /// The answer, without asking the service.
    Answer(Local),
    /// The target's `chunks/` directory is held: open the file through it.
    Dir(Arc<ChunksDir>),
    /// Ask the service through this connection; `true`: first for the
    /// target's `chunks/` directory.
    Ask(Arc<LocalConn>, bool),
}

#[derive(Default)]
struct State {
    nodes: HashMap<NodeId, NodeState>,
    /// Per file: (target, node serving it, descriptor).
    files: HashMap<EntryId, Vec<(TargetId, NodeId, Arc<File>)>>,
    /// Per file: its mirrored chunks held to read.
    mirrored: HashMap<EntryId, Vec<Mirrored>>,
    /// Descriptors held, of both kinds.
    count: usize,
    /// Chunk files accessed once over the network since their file was last
    /// released here: the next access fetches the descriptor.
    seen: HashMap<EntryId, Vec<TargetId>>,
    /// Targets their service does not hand out.
    refused: HashSet<TargetId>,
    /// Per target: its `chunks/` directory, once handed out.
    dirs: HashMap<TargetId, Arc<ChunksDir>>,
    /// Targets whose node (the value) hands out no `chunks/` directory:
    /// their chunk files are asked for one by one.
    no_dirs: HashMap<TargetId, NodeId>,
}

impl State {
    fn cached(&self, target: TargetId, entry: EntryId) -> Option<(NodeId, Arc<File>)> {
        self.files.get(&entry)?.iter().find(|(t, _, _)| *t == target).map(|(_, n, f)| (*n, f.clone()))
    }

    /// A mirrored chunk held to read from `target` on `node` at `epoch`, still valid at `now`.
    fn cached_mirrored(
        &self,
        (target, node, epoch): (TargetId, NodeId, u64),
        entry: EntryId,
        now: Instant,
    ) -> Option<Arc<File>> {
        let v = self.mirrored.get(&entry)?;
        v.iter()
            .find(|m| m.target == target && m.node == node && m.epoch == epoch && now < m.until)
            .map(|m| m.file.clone())
    }

    /// Holds a mirrored chunk handed out to read, replacing any older one of that target.
    fn hold_mirrored(&mut self, entry: EntryId, m: Mirrored, max: usize) {
        if self.count >= max {
            self.clear();
        }
        let v = self.mirrored.entry(entry).or_default();
        let before = v.len();
        v.retain(|x| x.target != m.target);
        let replaced = before - v.len();
        v.push(m);
        self.count = self.count + 1 - replaced;
    }

    fn clear(&mut self) {
        self.files.clear();
        self.mirrored.clear();
        self.count = 0;
    }

    fn forget_one(&mut self, target: TargetId, entry: EntryId) {
        if let Some(v) = self.files.get_mut(&entry) {
            let before = v.len();
            v.retain(|(t, _, _)| *t != target);
            self.count -= before - v.len();
            if v.is_empty() {
                self.files.remove(&entry);
            }
        }
    }

    /// Node `node`'s connection if it is up; a connection whose service hung
    /// up is dropped with all its descriptors.
    fn live_conn(&mut self, node: NodeId) -> Option<Arc<LocalConn>> {
        match self.nodes.get(&node) {
            Some(NodeState::Conn(c)) if c.alive() => Some(c.clone()),
            Some(NodeState::Conn(_)) => {
                info!("storage node {node} hung up its short-circuit socket: its chunk I/O goes over the network");
                self.drop_node(node, RETRY_FAILED);
                None
            }
            _ => None,
        }
    }

    /// Forgets node `node`'s connection and descriptors.
    fn drop_node(&mut self, node: NodeId, retry: Duration) {
        self.nodes.insert(node, NodeState::Later(Instant::now() + retry));
        self.dirs.retain(|_, d| d.node != node);
        self.no_dirs.retain(|_, n| *n != node);
        let mut count = 0;
        self.files.retain(|_, v| {
            v.retain(|(_, n, _)| *n != node);
            count += v.len();
            !v.is_empty()
        });
        self.mirrored.retain(|_, v| {
            v.retain(|m| m.node != node);
            count += v.len();
            !v.is_empty()
        });
        self.count = count;
    }
}

pub(crate) struct LocalChunks {
    enabled: bool,
    files_max: usize,
    secret: Option<Secret>,
    state: Mutex<State>,
}

impl LocalChunks {
    pub(crate) fn new(enabled: bool, secret: Option<Secret>) -> LocalChunks {
        LocalChunks { enabled, files_max: files_max(), secret, state: Mutex::new(State::default()) }
    }

    /// Where to go for `target`'s chunk of `entry` on storage node `node`:
    /// the answer without asking (the descriptor `held` finds, or the
    /// network: the service is away or refuses the target, or this is the
    /// first access, see below), the target's `chunks/` directory held
    /// (`dir`: the caller can use one), or the connection to ask through.
    async fn conn_for(
        &self,
        cluster: &Cluster,
        (node, target, entry): (NodeId, TargetId, EntryId),
        held: impl Fn(&State) -> Option<Arc<File>>,
        dir: bool,
    ) -> Found {
        let (conn, want_dir) = {
            let mut st = self.state.lock().expect("local chunks");
            if st.refused.contains(&target) {
                return Found::Answer(Local::Network);
            }
            let want_dir = dir && !st.no_dirs.contains_key(&target);
            let conn = match st.nodes.get(&node) {
                Some(NodeState::Conn(_)) => {
                    let Some(c) = st.live_conn(node) else { return Found::Answer(Local::Network) };
                    if let Some(f) = held(&st) {
                        return Found::Answer(Local::File(f));
                    }
                    if let Some(d) = st.dirs.get(&target).filter(|d| want_dir && d.node == node) {
                        return Found::Dir(d.clone());
                    }
                    Some(c)
                }
                Some(NodeState::Later(t)) if Instant::now() < *t => return Found::Answer(Local::Network),
                _ => None,
            };
            // Without the directory, a descriptor costs a round trip to the
            // service, as much as the request it saves: fetched on the
            // second access to a chunk file only, so a small file written or
            // read once stays on the network path and a file used more gains
            // from the second access on.
            if !want_dir {
                if st.seen.len() >= self.files_max {
                    st.seen.clear();
                }
                let seen = st.seen.entry(entry).or_default();
                if !seen.contains(&target) {
                    seen.push(target);
                    return Found::Answer(Local::Network);
                }
            }
            (conn, want_dir)
        };
        match conn {
            Some(c) => Found::Ask(c, want_dir),
            None => match self.connect(cluster, node).await {
                Some(c) => Found::Ask(c, want_dir),
                None => Found::Answer(Local::Network),
            },
        }
    }

    /// Asks node `node` for `target`'s `chunks/` directory and holds it;
    /// `None` (and the target is asked for file by file from then on, until
    /// the node's connection is dropped) if it hands out none.
    async fn fetch_dir(&self, conn: &Arc<LocalConn>, node: NodeId, target: TargetId) -> Option<Arc<ChunksDir>> {
        let c = conn.clone();
        let r = tokio::task::spawn_blocking(move || c.open_chunks_dir(target)).await;
        let mut st = self.state.lock().expect("local chunks");
        let why = match r {
            Ok(Ok(Ok(Offer::File(dir)))) => match chunks_dir_owner(&dir) {
                Ok(owner) => {
                    let d = Arc::new(ChunksDir { node, dir, owner });
                    debug!("storage node {node} handed out the chunks directory of target {target}");
                    st.dirs.insert(target, d.clone());
                    return Some(d);
                }
                Err(e) => format!("fstat of the directory handed out: {e}"),
            },
            Ok(Ok(Ok(Offer::Refused(why)))) => why,
            Ok(Ok(Ok(other))) => format!("unexpected answer {other:?}"),
            Ok(Ok(Err(e))) => e.to_string(),
            Ok(Err(e)) => {
                warn!("short-circuit socket of storage node {node} failed: {e}; using the network");
                st.drop_node(node, RETRY_FAILED);
                return None;
            }
            Err(e) => e.to_string(),
        };
        debug!("storage node {node} hands out no chunks directory of target {target}: {why}");
        st.no_dirs.insert(target, node);
        None
    }

    /// `target`'s chunk of `entry`, opened (made if `create`) through the
    /// target's `chunks/` directory `d`, and held.
    fn open_in_dir(&self, d: &ChunksDir, target: TargetId, entry: EntryId, create: bool) -> Local {
        match open_in_chunks_dir(&d.dir, d.owner, entry, create) {
            Ok(Some(f)) => self.hold(&mut self.state.lock().expect("local chunks"), d.node, target, entry, f),
            Ok(None) => Local::NoChunk,
            Err(e) => {
                // A full target, say: the network path reports it with the usual context.
                debug!("opening target {target}'s chunk of {entry} on this host failed: {e}");
                Local::Network
            }
        }
    }

    /// Holds `f`, `target`'s chunk of `entry` on node `node`, unless one was
    /// held meanwhile (then that one).
    fn hold(&self, st: &mut State, node: NodeId, target: TargetId, entry: EntryId, f: File) -> Local {
        match st.cached(target, entry) {
            Some((n, f)) if n == node => return Local::File(f), // fetched meanwhile
            Some(_) => st.forget_one(target, entry),            // from the target's former node
            None => {}
        }
        if st.count >= self.files_max {
            st.clear();
        }
        let f = Arc::new(f);
        st.files.entry(entry).or_default().push((target, node, f.clone()));
        st.count += 1;
        Local::File(f)
    }

    /// Where `target`'s chunk of `entry` is to be read or written (`create`:
    /// for a write, so the chunk file is made if missing).
    pub(crate) async fn file(&self, cluster: &Cluster, target: TargetId, entry: EntryId, create: bool) -> Local {
        if !self.enabled {
            return Local::Network;
        }
        let Some(node) = cluster.view().targets.get(&target).map(|t| t.node) else {
            return Local::Network;
        };
        let held = |st: &State| st.cached(target, entry).filter(|(n, _)| *n == node).map(|(_, f)| f);
        let conn = match self.conn_for(cluster, (node, target, entry), held, true).await {
            Found::Answer(answer) => return answer,
            Found::Dir(d) => return self.open_in_dir(&d, target, entry, create),
            Found::Ask(c, true) => match self.fetch_dir(&c, node, target).await {
                Some(d) => return self.open_in_dir(&d, target, entry, create),
                None => c,
            },
            Found::Ask(c, false) => c,
        };
        let c = conn.clone();
        let r = tokio::task::spawn_blocking(move || c.open(target, entry, create)).await;
        let what = format!("target {target}'s chunk of {entry}");
        let mut st = self.state.lock().expect("local chunks");
        self.answer(&mut st, node, target, &what, r, |st, f| self.hold(st, node, target, entry, f))
    }

    /// Where a short-circuit open's answer `r` sends the caller: `keep` takes
    /// a handed-out file; a refusal (the target is never asked again), the
    /// service's own error (a full target, say: the network path reports it
    /// with the usual context) and a failed socket send it to the network.
    fn answer(
        &self,
        st: &mut State,
        node: NodeId,
        target: TargetId,
        what: &str,
        r: Result<std::io::Result<Result<Offer, FsError>>, tokio::task::JoinError>,
        keep: impl FnOnce(&mut State, File) -> Local,
    ) -> Local {
        match r {
            Ok(Ok(Ok(Offer::File(f)))) => keep(st, f),
            Ok(Ok(Ok(Offer::NoChunk))) => Local::NoChunk,
            Ok(Ok(Ok(Offer::Refused(why)))) => {
                debug!("storage node {node} does not hand out {what}: {why}");
                st.refused.insert(target);
                Local::Network
            }
            Ok(Ok(Err(e))) => {
                debug!("short-circuit open of {what} failed: {e}");
                Local::Network
            }
            Ok(Err(e)) => {
                warn!("short-circuit socket of storage node {node} failed: {e}; using the network");
                st.drop_node(node, RETRY_FAILED);
                Local::Network
            }
            Err(e) => {
                warn!("short-circuit open of {what}: {e}");
                Local::Network
            }
        }
    }

    /// Where buddy group `group`'s chunk of `entry` is to be read: the
    /// copy of the group's primary when its service is on this host and
    /// hands it out (read-only, and only for as long as that primary's lease
    /// from mgmtd lasts: it is asked again after), else the network. Writes
    /// never come here: they pass the primary, which forwards them.
    pub(crate) async fn group_file(&self, cluster: &Cluster, group: BuddyGroupId, entry: EntryId) -> Local {
        if !self.enabled {
            return Local::Network;
        }
        let (target, epoch, node) = {
            let view = cluster.view();
            let Some(g) = view.groups.get(&group) else { return Local::Network };
            let target = TargetId(g.primary);
            let Some(node) = view.targets.get(&target).map(|t| t.node) else { return Local::Network };
            (target, g.epoch, node)
        };
        let held = |st: &State| st.cached_mirrored((target, node, epoch), entry, Instant::now());
        let conn = match self.conn_for(cluster, (node, target, entry), held, false).await {
            Found::Answer(answer) => return answer,
            Found::Ask(c, _) => c,
            Found::Dir(_) => unreachable!("no directory is asked for a mirrored chunk"),
        };
        let asked = Instant::now();
        let c = conn.clone();
        let r = tokio::task::spawn_blocking(move || c.open_mirrored(target, entry, group, epoch)).await;
        let valid = match &r {
            Ok(Ok(Ok((_, d)))) => *d,
            _ => Duration::ZERO,
        };
        let r = r.map(|io| io.map(|res| res.map(|(o, _)| o)));
        let mut st = self.state.lock().expect("local chunks");
        // Not the primary (any more), no lease: an error, and the network path knows what to do.
        let what = format!("buddy group {group}'s chunk of {entry} on target {target}");
        self.answer(&mut st, node, target, &what, r, |st, f| {
            let file = Arc::new(f);
            // Measured from before the question: never past the lease.
            let m = Mirrored { target, node, epoch, until: asked + valid, file: file.clone() };
            st.hold_mirrored(entry, m, self.files_max);
            Local::File(file)
        })
    }

    async fn connect(&self, cluster: &Cluster, node: NodeId) -> Option<Arc<LocalConn>> {
        let port = cluster
            .view()
            .nodes
            .get(&(NodeType::Storage, node))
            .and_then(|n| n.addr.parse::<std::net::SocketAddr>().ok())
            .map(|a| a.port())?;
        let name = socket_name(node, port);
        let secret = self.secret.clone();
        let n = name.clone();
        let r = tokio::task::spawn_blocking(move || LocalConn::connect(&n, node, secret.as_ref())).await;
        let mut st = self.state.lock().expect("local chunks");
        if let Some(NodeState::Conn(c)) = st.nodes.get(&node) {
            return Some(c.clone()); // connected meanwhile
        }
        match r {
            Ok(Ok(Some(c))) => {
                info!("storage node {node} is on this host: its chunk files are read and written directly");
                let c = Arc::new(c);
                st.nodes.insert(node, NodeState::Conn(c.clone()));
                Some(c)
            }
            Ok(Ok(None)) => {
                debug!("storage node {node} offers no short-circuit socket here ({name})");
                st.nodes.insert(node, NodeState::Later(Instant::now() + RETRY_ABSENT));
                None
            }
            Ok(Err(e)) => {
                warn!("short-circuit socket {name}: {e}; storage node {node}'s chunk I/O goes over the network");
                st.nodes.insert(node, NodeState::Later(Instant::now() + RETRY_ABSENT));
                None
            }
            Err(e) => {
                warn!("short-circuit connect to storage node {node}: {e}");
                None
            }
        }
    }

    /// The chunk files of `entry` on `units`, in order, if a descriptor is
    /// held now for every one of them (appended to `out`; false, with `out`
    /// unspecified, otherwise): a target's own, a buddy group's primary's
    /// (to read) while still valid. Never waits: no connection or request is
    /// made. One lock, one look at the cluster view and one liveness check
    /// per storage node for the whole request.
    pub(crate) fn held_files(
        &self,
        cluster: &Cluster,
        entry: EntryId,
        units: impl Iterator<Item = StripeUnit>,
        out: &mut Vec<Arc<File>>,
    ) -> bool {
        if !self.enabled {
            return false;
        }
        let view = cluster.view();
        let mut st = self.state.lock().expect("local chunks");
        // Nodes found alive in this request (a request spans a few at most;
        // beyond four, a node may be checked again).
        let mut alive = [NodeId(0); 4];
        let mut n_alive = 0;
        // Taken once, and only for a mirrored file's pieces.
        let mut now = None;
        for unit in units {
            let (node, f) = match unit {
                StripeUnit::Target(target) => {
                    let Some((node, f)) = st.cached(target, entry) else { return false };
                    // The target may have moved to another node since (a new view).
                    if view.targets.get(&target).map(|t| t.node) != Some(node) {
                        return false;
                    }
                    (node, f)
                }
                StripeUnit::Group(g) => {
                    let Some(g) = view.groups.get(&g) else { return false };
                    let target = TargetId(g.primary);
                    let Some(node) = view.targets.get(&target).map(|t| t.node) else { return false };
                    let now = *now.get_or_insert_with(Instant::now);
                    let Some(f) = st.cached_mirrored((target, node, g.epoch), entry, now) else { return false };
                    (node, f)
                }
            };
            if !alive[..n_alive].contains(&node) {
                if st.live_conn(node).is_none() {
                    return false;
                }
                if n_alive < alive.len() {
                    alive[n_alive] = node;
                    n_alive += 1;
                }
            }
            out.push(f);
        }
        true
    }

    /// Drops the descriptors of `entry`'s chunk files (the file was released).
    pub(crate) fn forget(&self, entry: EntryId) {
        if !self.enabled {
            return;
        }
        let mut st = self.state.lock().expect("local chunks");
        if let Some(v) = st.files.remove(&entry) {
            st.count -= v.len();
        }
        if let Some(v) = st.mirrored.remove(&entry) {
            st.count -= v.len();
        }
        st.seen.remove(&entry);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn e(c: u64) -> EntryId {
        EntryId { node: 1, epoch: 1, counter: c }
    }

    fn file() -> Arc<File> {
        Arc::new(File::open("/dev/null").unwrap())
    }

    #[test]
    fn descriptors_are_counted_and_dropped_per_file_target_and_node() {
        let mut st = State::default();
        for (t, n, c) in [(1, 1, 1), (2, 2, 1), (1, 1, 2), (3, 2, 2)] {
            st.files.entry(e(c)).or_default().push((TargetId(t), NodeId(n), file()));
            st.count += 1;
        }
        assert_eq!(st.cached(TargetId(2), e(1)).map(|(n, _)| n), Some(NodeId(2)));
        assert!(st.cached(TargetId(2), e(2)).is_none());
        st.forget_one(TargetId(1), e(2));
        assert_eq!(st.count, 3);
        assert!(st.cached(TargetId(1), e(2)).is_none() && st.cached(TargetId(3), e(2)).is_some());
        st.forget_one(TargetId(9), e(2));
        assert_eq!(st.count, 3, "forgetting what is not held changes nothing");
        // A node hanging up takes all its descriptors, of every file.
        st.drop_node(NodeId(2), RETRY_FAILED);
        assert_eq!(st.count, 1);
        assert!(st.cached(TargetId(1), e(1)).is_some());
        assert!(!st.files.contains_key(&e(2)), "a file without descriptors is no entry");
        assert!(matches!(st.nodes.get(&NodeId(2)), Some(NodeState::Later(_))));
    }

    #[test]
    fn a_mirrored_chunk_is_used_only_within_its_lease_at_its_epoch() {
        let mut st = State::default();
        let until = Instant::now() + Duration::from_millis(300);
        let m = |epoch| Mirrored { target: TargetId(4), node: NodeId(2), epoch, until, file: file() };
        st.hold_mirrored(e(1), m(3), 10);
        assert!(st.cached_mirrored((TargetId(4), NodeId(2), 3), e(1), Instant::now()).is_some());
        assert!(
            st.cached_mirrored((TargetId(4), NodeId(2), 4), e(1), Instant::now()).is_none(),
            "another epoch: a switch-over"
        );
        assert!(st.cached_mirrored((TargetId(5), NodeId(2), 3), e(1), Instant::now()).is_none(), "another primary");
        assert!(st.cached_mirrored((TargetId(4), NodeId(1), 3), e(1), Instant::now()).is_none(), "the target moved");
        // A newer one of the same target replaces it; the count follows.
        st.hold_mirrored(e(1), m(4), 10);
        assert_eq!(st.count, 1);
        assert!(st.cached_mirrored((TargetId(4), NodeId(2), 3), e(1), Instant::now()).is_none());
        std::thread::sleep(Duration::from_millis(350));
        assert!(st.cached_mirrored((TargetId(4), NodeId(2), 4), e(1), Instant::now()).is_none(), "past the lease");
        // The node hanging up takes it.
        st.drop_node(NodeId(2), RETRY_FAILED);
        assert_eq!(st.count, 0);
        assert!(st.mirrored.is_empty());
    }

    #[test]
    fn the_cap_follows_the_descriptor_limit() {
        let m = files_max();
        assert!(m > 0 && m <= FILES_MAX, "{m}");
    }
}
