//! The walks over a running file system: which nodes and targets there are,
//! the pages of records they list, and the two-walk confirmation.

use crate::checker::{Checker, Problem};
use crate::{FsckError, Result};
use hivefs_net::{call_once, ClientConfig, Pool};
use hivefs_proto::{Envelope, FsckFix, GroupKind, MirrorHdr, MirrorRole, Reachability, Reply, Request};
use hivefs_types::ids::{BuddyGroupId, EntryId, NodeId, NodeType, TargetId};
use hivefs_types::pattern::StripeUnit;
use serde::Serialize;
use std::collections::{HashMap, HashSet};

/// Records asked for per page.
const PAGE: u32 = 1024;

/// The way to a namespace: the node serving it, with the mirroring header
/// when a metadata buddy group mirrors it (its primary may be another node).
pub(crate) struct MetaWay {
    pool: Pool,
    env: Envelope,
}

impl MetaWay {
    pub(crate) async fn rpc(&self, req: &Request) -> std::result::Result<Reply, hivefs_types::error::FsError> {
        self.pool.rpc_with(&self.env, req).await
    }
}

/// Every namespace (metadata node id) and storage target of a file system,
/// each with a way to reach it: what a check walks and where repairs go.
pub struct Nodes {
    pub(crate) metas: Vec<(NodeId, MetaWay)>,
    pub(crate) targets: Vec<(TargetId, Pool)>,
    /// Storage buddy groups: the mirroring header and the way to the primary.
    pub(crate) groups: Vec<(BuddyGroupId, Envelope, TargetId, Pool)>,
    /// Storage buddy groups' secondaries: a checking header and the way to the secondary.
    pub(crate) secondaries: Vec<(BuddyGroupId, Envelope, TargetId, Pool)>,
    /// Metadata groups with a good secondary: the namespace, the secondary,
    /// a checking header and the way to the primary (which compares both copies).
    pub(crate) meta_groups: Vec<(BuddyGroupId, NodeId, u32, Envelope, Pool)>,
    /// mgmtd, for repairs of buddy groups.
    pub(crate) mgmtd: Option<Pool>,
}

impl Nodes {
    /// mgmtd and the secondary of storage buddy group `g` (for a resync request).
    pub(crate) fn mgmt_secondary(&self, g: BuddyGroupId) -> Option<(&Pool, u32)> {
        let member = match self.secondaries.iter().find(|s| s.0 == g) {
            Some(s) => s.2 .0,
            None => self.meta_groups.iter().find(|m| m.0 == g)?.2,
        };
        Some((self.mgmtd.as_ref()?, member))
    }
}

impl Nodes {
    /// Asks mgmtd (`mgmtd`, reached with `cfg`) for the registered nodes and
    /// targets. Fails when a node is offline (a check needs every node) or
    /// there is no metadata node.
    pub async fn connect(mgmtd: &str, cfg: &ClientConfig) -> Result<Nodes> {
        let Reply::Nodes(nodes) = call_once(mgmtd, cfg, &Request::ListNodes { node_type: None })
            .await
            .map_err(|e| FsckError::call(format!("mgmtd {mgmtd}"), e))?
        else {
            return Err(FsckError::Reply(format!("mgmtd {mgmtd}: unexpected reply to ListNodes")));
        };
        let Reply::Targets(targets) = call_once(mgmtd, cfg, &Request::ListTargets)
            .await
            .map_err(|e| FsckError::call(format!("mgmtd {mgmtd}"), e))?
        else {
            return Err(FsckError::Reply(format!("mgmtd {mgmtd}: unexpected reply to ListTargets")));
        };
        let Reply::Groups(meta_groups) = call_once(mgmtd, cfg, &Request::ListGroups { kind: Some(GroupKind::Meta) })
            .await
            .map_err(|e| FsckError::call(format!("mgmtd {mgmtd}"), e))?
        else {
            return Err(FsckError::Reply(format!("mgmtd {mgmtd}: unexpected reply to ListGroups")));
        };
        let mut metas = Vec::new();
        let mut meta_checks = Vec::new();
        let mut storage = HashMap::new();
        let online = |id: NodeId| {
            nodes
                .iter()
                .find(|n| n.node_type == NodeType::Meta && n.id == id && n.reachability != Reachability::Offline)
        };
        for n in &nodes {
            if n.node_type == NodeType::Meta {
                // A mirrored namespace is served by its group's primary,
                // whichever node that is now.
                let way = match meta_groups.iter().find(|g| g.serves == Some(n.id)) {
                    Some(g) => online(NodeId(g.primary)).map(|p| {
                        let hdr = |role| Envelope {
                            mirror: Some(MirrorHdr { group: g.id, epoch: g.epoch, role, session: 0 }),
                            ..Envelope::default()
                        };
                        let pool = Pool::new(p.addr.clone(), cfg.clone());
                        // A secondary that misses changes is not compared: its resync is pending.
                        if g.secondary_state == hivefs_proto::Consistency::Good {
                            let check = Pool::new(p.addr.clone(), cfg.clone());
                            meta_checks.push((g.id, n.id, g.secondary, hdr(MirrorRole::Check), check));
                        }
                        MetaWay { pool, env: hdr(MirrorRole::Client) }
                    }),
                    None => online(n.id)
                        .map(|p| MetaWay { pool: Pool::new(p.addr.clone(), cfg.clone()), env: Envelope::default() }),
                };
                match way {
                    Some(w) => metas.push((n.id, w)),
                    None => {
                        return Err(FsckError::Cluster(format!(
                            "the namespace of metadata node {} ({}) is served by no online node: a check needs \
                             every namespace",
                            n.id, n.addr
                        )))
                    }
                }
                continue;
            }
            if n.reachability == Reachability::Offline {
                return Err(FsckError::Cluster(format!(
                    "{} node {} at {} is offline: a check needs every node",
                    n.node_type, n.id, n.addr
                )));
            }
            if n.node_type == NodeType::Storage {
                storage.insert(n.id, n.addr.clone());
            }
        }
        metas.sort_by_key(|m| m.0);
        let mut ts = Vec::new();
        let mut addrs = HashMap::new();
        for t in targets {
            let addr = storage.get(&t.node).ok_or_else(|| {
                FsckError::Cluster(format!("target {}: its storage node {} is unknown", t.id, t.node))
            })?;
            ts.push((t.id, Pool::new(addr.clone(), cfg.clone())));
            addrs.insert(t.id, addr.clone());
        }
        ts.sort_by_key(|t| t.0);
        if metas.is_empty() {
            return Err(FsckError::Cluster(format!("mgmtd {mgmtd} knows no metadata node")));
        }
        let Reply::Groups(gs) = call_once(mgmtd, cfg, &Request::ListGroups { kind: Some(GroupKind::Storage) })
            .await
            .map_err(|e| FsckError::call(format!("mgmtd {mgmtd}"), e))?
        else {
            return Err(FsckError::Reply(format!("mgmtd {mgmtd}: unexpected reply to ListGroups")));
        };
        let mut groups = Vec::new();
        let mut secondaries = Vec::new();
        for g in gs {
            let secondary = TargetId(g.secondary);
            // A secondary that misses changes is not compared: its resync is pending.
            if g.secondary_state == hivefs_proto::Consistency::Good {
                if let Some(a) = addrs.get(&secondary) {
                    let env = Envelope {
                        mirror: Some(MirrorHdr { group: g.id, epoch: g.epoch, role: MirrorRole::Check, session: 0 }),
                        ..Envelope::default()
                    };
                    secondaries.push((g.id, env, secondary, Pool::new(a.clone(), cfg.clone())));
                }
            }
            let primary = TargetId(g.primary);
            let pool = addrs.get(&primary).map(|a| Pool::new(a.clone(), cfg.clone())).ok_or_else(|| {
                FsckError::Cluster(format!("buddy group {}: its primary target {primary} is unknown", g.id))
            })?;
            let env = Envelope {
                mirror: Some(MirrorHdr { group: g.id, epoch: g.epoch, role: MirrorRole::Client, session: 0 }),
                ..Envelope::default()
            };
            groups.push((g.id, env, primary, pool));
        }
        Ok(Nodes {
            metas,
            targets: ts,
            groups,
            secondaries,
            meta_groups: meta_checks,
            mgmtd: Some(Pool::new(mgmtd.to_string(), cfg.clone())),
        })
    }
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
pub async fn pending_ops(nodes: &Nodes) -> Result<Vec<Pending>> {
    let mut out = Vec::new();
    for (n, pool) in &nodes.metas {
        match pool.rpc(&Request::FsckIntents).await.map_err(|e| FsckError::call(format!("metadata node {n}"), e))? {
            Reply::FsckIntents(list) => {
                out.extend(list.into_iter().map(|operation| Pending { meta_node: *n, operation }))
            }
            r => return Err(FsckError::Reply(format!("metadata node {n}: unexpected reply to FsckIntents: {r:?}"))),
        }
    }
    Ok(out)
}

/// Whether a problem concerns an entry that a pending operation names.
fn touched_by(p: &Problem, pending: &[Pending]) -> bool {
    pending.iter().any(|o| o.operation.split(|c: char| !(c.is_ascii_alphanumeric() || c == '-')).any(|w| w == p.entry))
}

/// What two walks confirmed.
#[derive(Debug)]
pub struct Checked {
    /// Problems both walks found, sorted by kind and place.
    pub problems: Vec<Problem>,
    /// Records the last walk read.
    pub scanned: u64,
    /// Cross-node operations still pending after the walks.
    pub pending: Vec<Pending>,
}

/// Every chunk file `target` lists (with `env`: a buddy group's mirrored
/// ones), page by page, each handed to `add`; `what` names the source in errors.
async fn list_chunks(
    pool: &Pool,
    env: &Envelope,
    target: TargetId,
    what: &str,
    c: &mut Checker,
    progress: &mut (dyn FnMut(u64) + Send),
    add: impl Fn(&mut Checker, EntryId, u64),
) -> Result<()> {
    let mut after = None;
    loop {
        let r = pool.rpc_with(env, &Request::ListChunks { target, after, max: PAGE }).await;
        let Reply::Chunks { chunks, more } = r.map_err(|e| FsckError::call(format!("listing chunks of {what}"), e))?
        else {
            return Err(FsckError::Reply(format!("{what}: unexpected reply to ListChunks")));
        };
        after = chunks.last().map(|x| x.0);
        for (id, len) in chunks {
            add(c, id, len);
        }
        progress(c.scanned);
        if !more || after.is_none() {
            return Ok(());
        }
    }
}

/// One walk: every target's chunk files, then every metadata node's disposal
/// records, inodes and dentries, page by page; `progress` hears the number of
/// records scanned so far after each page.
async fn walk(
    nodes: &Nodes,
    want: HashSet<EntryId>,
    progress: &mut (dyn FnMut(u64) + Send),
) -> Result<(Vec<Problem>, u64)> {
    let mut c = Checker::with_wanted(want);
    let plain = Envelope::default();
    for (t, pool) in &nodes.targets {
        let what = format!("target {t}");
        list_chunks(pool, &plain, *t, &what, &mut c, progress, |c, id, len| c.add_chunk(*t, id, len)).await?;
    }
    // Mirrored chunk files, from each group's primary.
    for (g, env, primary, pool) in &nodes.groups {
        let what = format!("buddy group {g}");
        let unit = StripeUnit::Group(*g);
        list_chunks(pool, env, *primary, &what, &mut c, progress, |c, id, len| c.add_chunk(unit, id, len)).await?;
    }
    // The secondaries' copies, compared with the primaries'.
    for (g, env, sec, pool) in &nodes.secondaries {
        let what = format!("the secondary copy of buddy group {g}");
        list_chunks(pool, env, *sec, &what, &mut c, progress, |c, id, len| c.add_secondary_chunk(*g, *sec, id, len))
            .await?;
    }
    let meta_err = |n: &NodeId, what: &str, e| FsckError::call(format!("scanning {what} of metadata node {n}"), e);
    for (n, pool) in &nodes.metas {
        let mut after = None;
        loop {
            let Reply::FsckDisposals { records, more } = pool
                .rpc(&Request::FsckDisposals { after, max: PAGE })
                .await
                .map_err(|e| meta_err(n, "disposal records", e))?
            else {
                return Err(FsckError::Reply(format!("metadata node {n}: unexpected reply to FsckDisposals")));
            };
            after = records.last().map(|r| r.id);
            records.iter().for_each(|r| c.add_disposal(r));
            progress(c.scanned);
            if !more || after.is_none() {
                break;
            }
        }
    }
    for (n, pool) in &nodes.metas {
        let mut after = None;
        loop {
            let Reply::FsckInodes { inodes, more } =
                pool.rpc(&Request::FsckInodes { after, max: PAGE }).await.map_err(|e| meta_err(n, "inodes", e))?
            else {
                return Err(FsckError::Reply(format!("metadata node {n}: unexpected reply to FsckInodes")));
            };
            after = inodes.last().map(|i| i.id);
            inodes.into_iter().for_each(|i| c.add_inode(*n, i));
            progress(c.scanned);
            if !more || after.is_none() {
                break;
            }
        }
    }
    for (n, pool) in &nodes.metas {
        let mut after = None;
        loop {
            let Reply::FsckDentries { entries, more } = pool
                .rpc(&Request::FsckDentries { after: after.clone(), max: PAGE })
                .await
                .map_err(|e| meta_err(n, "dentries", e))?
            else {
                return Err(FsckError::Reply(format!("metadata node {n}: unexpected reply to FsckDentries")));
            };
            after = entries.last().map(|d| (d.parent, d.name.clone()));
            entries.into_iter().for_each(|d| c.add_dentry(*n, d));
            progress(c.scanned);
            if !more || after.is_none() {
                break;
            }
        }
    }
    // The contents of chunk files both buddies hold with the same length:
    // every byte read on both (CRC-32 per file).
    for (g, sec, ids) in c.same_length_pairs() {
        let (Some(p), Some(s)) =
            (nodes.groups.iter().find(|x| x.0 == g), nodes.secondaries.iter().find(|x| x.0 == g && x.2 == sec))
        else {
            continue;
        };
        for part in ids.chunks(hivefs_proto::DIGEST_CHUNKS_MAX) {
            let what = format!("comparing chunk contents of buddy group {g}");
            let (a, b) = (
                p.3.rpc_with(&p.1, &Request::DigestChunks { target: p.2, entries: part.to_vec() }).await,
                s.3.rpc_with(&s.1, &Request::DigestChunks { target: s.2, entries: part.to_vec() }).await,
            );
            let (Reply::ChunkDigests(a), Reply::ChunkDigests(b)) =
                (a.map_err(|e| FsckError::call(what.clone(), e))?, b.map_err(|e| FsckError::call(what.clone(), e))?)
            else {
                return Err(FsckError::Reply(format!("{what}: unexpected reply to DigestChunks")));
            };
            for ((id, x), y) in part.iter().zip(a).zip(b) {
                if x != y {
                    c.add_content_mismatch(g, *id, x, y);
                }
            }
            progress(c.scanned);
        }
    }
    // Both copies of every mirrored namespace, compared by its primary.
    for (g, ns, sec, env, pool) in &nodes.meta_groups {
        match pool.rpc_with(env, &Request::MetaMirror { step: hivefs_proto::MetaStep::Compare }).await {
            Ok(_) => {}
            Err(e) if e.code == hivefs_types::error::ErrorCode::Io => c.add_meta_mismatch(*g, *ns, *sec, e.message),
            // Not current (a resync is due) or switching over: nothing to compare now.
            Err(e) if e.code == hivefs_types::error::ErrorCode::Unavailable => {}
            Err(e) => return Err(FsckError::call(format!("comparing the copies of buddy group {g}"), e)),
        }
    }
    let scanned = c.scanned;
    Ok((c.finish(), scanned))
}

/// Two walks; a problem counts only if both found it (see the crate doc).
/// Problems of entries that a pending cross-node operation names (before or
/// after the walks) are left out: that operation's coordinator resolves them.
pub async fn check(nodes: &Nodes, progress: &mut (dyn FnMut(u64) + Send)) -> Result<Checked> {
    let mut pending = pending_ops(nodes).await?;
    let (first, scanned) = walk(nodes, HashSet::new(), progress).await?;
    if first.is_empty() {
        return Ok(Checked { problems: usage_problems(nodes).await?, scanned, pending });
    }
    let keys: HashSet<String> = first.iter().map(|p| p.key.clone()).collect();
    let want = first.iter().filter_map(|p| EntryId::parse(&p.entry)).collect();
    let (second, scanned) = walk(nodes, want, progress).await?;
    let after = pending_ops(nodes).await?;
    let mut all = pending.clone();
    all.extend(after.iter().cloned());
    let mut problems: Vec<Problem> =
        second.into_iter().filter(|p| keys.contains(&p.key) && !touched_by(p, &all)).collect();
    problems.extend(usage_problems(nodes).await?);
    // Report what is still pending now.
    pending = after;
    Ok(Checked { problems, scanned, pending })
}

/// Each namespace counts its inodes' quota usage and compares the count with
/// its records (in one batch of its writer: a consistent count, so one look
/// is enough).
async fn usage_problems(nodes: &Nodes) -> Result<Vec<Problem>> {
    let mut out = Vec::new();
    for (n, way) in &nodes.metas {
        match way.rpc(&Request::FsckFix { fix: FsckFix::CountUsage { apply: false } }).await {
            Ok(Reply::UsageDiff(diff)) => {
                out.extend(diff.into_iter().map(|(who, r, c)| Problem::wrong_usage(*n, who, r, c)))
            }
            Ok(other) => return Err(FsckError::Reply(format!("metadata node {n}: unexpected reply {other:?}"))),
            Err(e) => return Err(FsckError::call(format!("metadata node {n}"), e)),
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use hivefs_types::attr::FileKind;

    #[test]
    fn a_problem_is_touched_by_a_pending_operation_that_names_its_entry() {
        let e = EntryId { node: 1, epoch: 1, counter: 0x2A };
        let mut c = Checker::default();
        c.add_chunk(TargetId(1), e, 1);
        c.add_dentry(
            NodeId(1),
            hivefs_proto::FsckDentry {
                parent: EntryId::ROOT,
                name: b"x".to_vec(),
                id: e,
                kind: FileKind::File,
                owner: NodeId(1),
            },
        );
        let ps = c.finish();
        assert_eq!(ps.len(), 2);
        let op = |s: &str| vec![Pending { meta_node: NodeId(2), operation: s.into() }];
        for p in &ps {
            assert!(touched_by(p, &op("rename 1-1-2A into root (from node 2)")));
            assert!(touched_by(p, &op("link(1-1-2A)")));
            assert!(!touched_by(p, &op("rename 1-1-2A0 into root")));
            assert!(!touched_by(p, &op("rename 1-1-2 into root")));
            assert!(!touched_by(p, &[]));
        }
    }
}
