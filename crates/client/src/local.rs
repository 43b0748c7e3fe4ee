//! Short-circuit chunk I/O: chunk files of targets whose storage service
//! runs on this host are read and written through descriptors the service
//! handed over (`hivefs_chunk::local`), not through requests over TCP.
//!
//! Same bytes, same files: the service serves the very same chunk files to
//! other clients, and the kernel's page cache is shared, so every read here
//! sees every completed write of any client, as on the network path.
//! A descriptor is fetched at the second access to a chunk file (one access
//! over TCP costs what the fetch would) and kept until the file is released
//! by this client, and all of a service's are dropped as soon as its socket
//! hangs up (it stopped or died): from then on requests go over TCP and
//! fail or wait as they always did. A target the service does not offer
//! (rate-limited) and a service that does not answer (another host, an older
//! version) use the network path.
//!
//! This module must not decide anything about chunk contents or sizes: it
//! only finds a descriptor or says "use the network".

use hivefs_chunk::local::{socket_name, LocalConn, Offer};
use hivefs_cluster::Cluster;
use hivefs_net::Secret;
use hivefs_types::ids::{EntryId, NodeId, NodeType, TargetId};
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

#[derive(Default)]
struct State {
    nodes: HashMap<NodeId, NodeState>,
    /// Per file: (target, node serving it, descriptor).
    files: HashMap<EntryId, Vec<(TargetId, NodeId, Arc<File>)>>,
    count: usize,
    /// Chunk files accessed once over the network since their file was last
    /// released here: the next access fetches the descriptor.
    seen: HashMap<EntryId, Vec<TargetId>>,
    /// Targets their service does not hand out.
    refused: HashSet<TargetId>,
}

impl State {
    fn cached(&self, target: TargetId, entry: EntryId) -> Option<(NodeId, Arc<File>)> {
        self.files.get(&entry)?.iter().find(|(t, _, _)| *t == target).map(|(_, n, f)| (*n, f.clone()))
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
        let mut count = 0;
        self.files.retain(|_, v| {
            v.retain(|(_, n, _)| *n != node);
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

    /// Where `target`'s chunk of `entry` is to be read or written (`create`:
    /// for a write, so the chunk file is made if missing).
    pub(crate) async fn file(&self, cluster: &Cluster, target: TargetId, entry: EntryId, create: bool) -> Local {
        if !self.enabled {
            return Local::Network;
        }
        let Some(node) = cluster.view().targets.get(&target).map(|t| t.node) else {
            return Local::Network;
        };
        let conn = {
            let mut st = self.state.lock().expect("local chunks");
            if st.refused.contains(&target) {
                return Local::Network;
            }
            let conn = match st.nodes.get(&node) {
                Some(NodeState::Conn(_)) => {
                    let c = st.live_conn(node);
                    match (&c, st.cached(target, entry)) {
                        (None, _) => return Local::Network,
                        (Some(_), Some((n, f))) if n == node => return Local::File(f),
                        _ => c,
                    }
                }
                Some(NodeState::Later(t)) if Instant::now() < *t => return Local::Network,
                _ => None,
            };
            // A descriptor costs a round trip to the service, as much as the
            // request it saves: fetched on the second access to a chunk file
            // only, so a small file written or read once stays on the
            // network path and a file used more gains from the second access on.
            if st.seen.len() >= self.files_max {
                st.seen.clear();
            }
            let seen = st.seen.entry(entry).or_default();
            if !seen.contains(&target) {
                seen.push(target);
                return Local::Network;
            }
            conn
        };
        let conn = match conn {
            Some(c) => c,
            None => match self.connect(cluster, node).await {
                Some(c) => c,
                None => return Local::Network,
            },
        };
        let c = conn.clone();
        let r = tokio::task::spawn_blocking(move || c.open(target, entry, create)).await;
        let mut st = self.state.lock().expect("local chunks");
        match r {
            Ok(Ok(Ok(Offer::File(f)))) => {
                match st.cached(target, entry) {
                    Some((n, f)) if n == node => return Local::File(f), // fetched meanwhile
                    Some(_) => st.forget_one(target, entry),            // from the target's former node
                    None => {}
                }
                if st.count >= self.files_max {
                    st.files.clear();
                    st.count = 0;
                }
                let f = Arc::new(f);
                st.files.entry(entry).or_default().push((target, node, f.clone()));
                st.count += 1;
                Local::File(f)
            }
            Ok(Ok(Ok(Offer::NoChunk))) => Local::NoChunk,
            Ok(Ok(Ok(Offer::Refused(why)))) => {
                debug!("storage node {node} does not hand out target {target}'s chunk files: {why}");
                st.refused.insert(target);
                Local::Network
            }
            // The service's own error (a full target, say): the network path
            // reports it with the usual context.
            Ok(Ok(Err(e))) => {
                debug!("short-circuit open of target {target}, file {entry} failed: {e}");
                Local::Network
            }
            Ok(Err(e)) => {
                warn!("short-circuit socket of storage node {node} failed: {e}; using the network");
                st.drop_node(node, RETRY_FAILED);
                Local::Network
            }
            Err(e) => {
                warn!("short-circuit open of target {target}, file {entry}: {e}");
                Local::Network
            }
        }
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

    /// The chunk files of `entry` on `targets`, in order, if a descriptor is
    /// held now for every one of them (appended to `out`; false, with `out`
    /// unspecified, otherwise). Never waits: no connection or request is
    /// made. One lock, one look at the cluster view and one liveness check
    /// per storage node for the whole request.
    pub(crate) fn held_files(
        &self,
        cluster: &Cluster,
        entry: EntryId,
        targets: impl Iterator<Item = TargetId>,
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
        for target in targets {
            let Some((node, f)) = st.cached(target, entry) else { return false };
            if !alive[..n_alive].contains(&node) {
                if st.live_conn(node).is_none() {
                    return false;
                }
                if n_alive < alive.len() {
                    alive[n_alive] = node;
                    n_alive += 1;
                }
            }
            // The target may have moved to another node since (a new view).
            if view.targets.get(&target).map(|t| t.node) != Some(node) {
                return false;
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
    fn the_cap_follows_the_descriptor_limit() {
        let m = files_max();
        assert!(m > 0 && m <= FILES_MAX, "{m}");
    }
}
