//! Buddy groups: `hivefs mirror create|list` (`docs/design-mirror.md`).

use crate::admin::Conn;
use crate::pools::Mgmt;
use crate::util::print_table;
use anyhow::{bail, Result};
use clap::{Subcommand, ValueEnum};
use hivefs_proto::{Consistency, GroupInfo, GroupKind, Reply, Request};
use hivefs_types::ids::{NodeId, NodeType, TargetId};
use std::collections::{BTreeMap, HashSet};

#[derive(Subcommand, Debug)]
pub enum MirrorCmd {
    /// Make buddy groups: one of --primary/--secondary, or pairs of all
    /// ungrouped members with --auto. Members of a storage group are two
    /// targets in one storage pool, on different storage nodes unless --force.
    /// A metadata group mirrors the namespace of its primary (the entries it
    /// owns) onto the secondary, which gets a full copy first; --auto mirrors
    /// every metadata node's namespace onto the next node, so that the whole
    /// namespace, root included, is mirrored.
    Create {
        /// What the group mirrors: storage targets or metadata nodes.
        #[arg(long = "type", value_enum)]
        kind: Kind,
        /// Target id (storage) or metadata node id (meta) of the primary.
        #[arg(long, requires = "secondary", conflicts_with = "auto")]
        primary: Option<u32>,
        /// Target id (storage) or metadata node id (meta) of the secondary.
        #[arg(long, requires = "primary")]
        secondary: Option<u32>,
        /// Pair every member not yet in a group, each with one on another
        /// server (storage: per storage pool; meta: every namespace not yet
        /// mirrored, onto the next metadata node).
        #[arg(long)]
        auto: bool,
        /// Allow a group whose two members are on one server (it survives a
        /// failed disk or process, not a failed server).
        #[arg(long)]
        force: bool,
        #[command(flatten)]
        conn: Conn,
    },
    /// Ask for a resync of a group's secondary from its primary: of what the
    /// primary lists as changed (the default), or of everything (--full: every
    /// mirrored chunk file copied, the secondary's extra ones deleted).
    Resync {
        /// Buddy group id.
        #[arg(long)]
        group: u32,
        /// Copy everything, not only what changed.
        #[arg(long)]
        full: bool,
        /// Wait until the secondary is good again, with progress on a terminal.
        #[arg(long)]
        wait: bool,
        /// Give up waiting after this many seconds (0: no limit).
        #[arg(long, default_value_t = 0)]
        timeout: u64,
        #[command(flatten)]
        conn: Conn,
    },
    /// List the buddy groups with each member's role, reachability and
    /// consistency (good / needs-resync / resyncing / bad).
    List {
        /// Only groups of this type.
        #[arg(long = "type", value_enum)]
        kind: Option<Kind>,
        #[command(flatten)]
        conn: Conn,
    },
}

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum Kind {
    Storage,
    Meta,
}

impl From<Kind> for GroupKind {
    fn from(k: Kind) -> GroupKind {
        match k {
            Kind::Storage => GroupKind::Storage,
            Kind::Meta => GroupKind::Meta,
        }
    }
}

fn groups(m: &Mgmt, kind: Option<GroupKind>) -> Result<Vec<GroupInfo>> {
    match m.call(Request::ListGroups { kind })? {
        Reply::Groups(g) => Ok(g),
        r => bail!("unexpected reply from mgmtd: {r:?}"),
    }
}

/// Pairs `members` (id, server) so that the two of a pair are on different
/// servers: members are taken from the servers with the most left first.
/// Returns the pairs and what stays unpaired.
pub(crate) fn pair_up(members: &[(u32, u32)]) -> (Vec<(u32, u32)>, Vec<u32>) {
    let mut by_server: BTreeMap<u32, Vec<u32>> = BTreeMap::new();
    for &(id, server) in members {
        by_server.entry(server).or_default().push(id);
    }
    for ids in by_server.values_mut() {
        ids.sort_unstable();
        ids.reverse(); // pop() takes the lowest id first
    }
    let mut pairs = Vec::new();
    let mut primaries: BTreeMap<u32, usize> = BTreeMap::new();
    loop {
        let mut fullest: Vec<u32> = by_server.iter().filter(|(_, v)| !v.is_empty()).map(|(s, _)| *s).collect();
        if fullest.len() < 2 {
            break;
        }
        fullest.sort_by_key(|s| (std::cmp::Reverse(by_server[s].len()), *s));
        let a = by_server.get_mut(&fullest[0]).and_then(|v| v.pop()).expect("non-empty");
        let b = by_server.get_mut(&fullest[1]).and_then(|v| v.pop()).expect("non-empty");
        // The primary goes to the server with fewer primaries so far: primaries serve
        // every read and forward every write, so they are spread like targets.
        let (sa, sb) = (fullest[0], fullest[1]);
        let count = |s: u32| *primaries.get(&s).unwrap_or(&0);
        let (p, q, sp) = if count(sb) < count(sa) { (b, a, sb) } else { (a, b, sa) };
        *primaries.entry(sp).or_insert(0) += 1;
        pairs.push((p, q));
    }
    let left = by_server.into_values().flatten().collect();
    (pairs, left)
}

pub fn mirror(cmd: MirrorCmd) -> Result<()> {
    match cmd {
        MirrorCmd::Create { kind, primary, secondary, auto, force, conn } => {
            let m = Mgmt::new(&conn)?;
            let kind = GroupKind::from(kind);
            let pairs = match (primary, secondary, auto) {
                (Some(p), Some(s), false) => vec![(p, s)],
                (None, None, true) => auto_pairs(&m, kind)?,
                _ => bail!("give --primary and --secondary, or --auto"),
            };
            let mut made = Vec::new();
            for (p, s) in pairs {
                match m.call(Request::CreateGroup { kind, primary: p, secondary: s, force })? {
                    Reply::GroupCreated { group } => {
                        if !conn.json {
                            println!("created {} buddy group {group}: primary {p}, secondary {s}", kind.as_str());
                        }
                        made.push(serde_json::json!({"id": group.0, "primary": p, "secondary": s}));
                    }
                    r => bail!("unexpected reply from mgmtd: {r:?}"),
                }
            }
            if conn.json {
                println!("{}", serde_json::to_string_pretty(&made)?);
            }
            Ok(())
        }
        MirrorCmd::Resync { group, full, wait, timeout, conn } => {
            let m = Mgmt::new(&conn)?;
            let Some(g) = groups(&m, None)?.into_iter().find(|g| g.id.0 == group) else {
                bail!("buddy group {group} does not exist (see `hivefs mirror list`)");
            };
            let state = if full { Consistency::Bad } else { Consistency::NeedsResync };
            m.call(Request::SetMemberState { group: g.id, epoch: None, member: g.secondary, state })?;
            let member = if g.kind == GroupKind::Meta { "metadata node" } else { "target" };
            eprintln!(
                "buddy group {group}: {} resync of {member} {} from {member} {} requested",
                if full { "full" } else { "a" },
                g.secondary,
                g.primary
            );
            if wait {
                wait_resynced(&m, g.id, timeout)?;
            }
            Ok(())
        }
        MirrorCmd::List { kind, conn } => {
            let m = Mgmt::new(&conn)?;
            let groups = groups(&m, kind.map(GroupKind::from))?;
            let targets = m.targets()?;
            let nodes = m.nodes()?;
            let reach = |g: &GroupInfo, member: u32| -> &'static str {
                let r = match g.kind {
                    GroupKind::Storage => targets.iter().find(|t| t.id == TargetId(member)).map(|t| t.reachability),
                    GroupKind::Meta => nodes
                        .iter()
                        .find(|n| n.node_type == NodeType::Meta && n.id == NodeId(member))
                        .map(|n| n.reachability),
                };
                r.map_or("unknown", |r| r.as_str())
            };
            if conn.json {
                let v: Vec<_> = groups
                    .iter()
                    .map(|g| {
                        serde_json::json!({
                            "id": g.id.0,
                            "type": g.kind.as_str(),
                            "epoch": g.epoch,
                            "primary": {"id": g.primary, "reachability": reach(g, g.primary), "state": g.primary_state.as_str()},
                            "secondary": {"id": g.secondary, "reachability": reach(g, g.secondary), "state": g.secondary_state.as_str()},
                            "resync": g.resync.map(|(done, total)| serde_json::json!({"done": done, "total": total})),
                        })
                    })
                    .collect();
                println!("{}", serde_json::to_string_pretty(&v)?);
                return Ok(());
            }
            let rows: Vec<Vec<String>> = groups
                .iter()
                .map(|g| {
                    let member = |id: u32, state: Consistency| format!("{id} ({}, {})", reach(g, id), state.as_str());
                    vec![
                        g.id.to_string(),
                        g.kind.as_str().to_string(),
                        member(g.primary, g.primary_state),
                        member(g.secondary, g.secondary_state),
                        g.epoch.to_string(),
                        g.resync.map_or("-".into(), |(d, t)| format!("{d}/{t}")),
                    ]
                })
                .collect();
            print_table(&["GROUP", "TYPE", "PRIMARY", "SECONDARY", "EPOCH", "RESYNC"], &rows);
            Ok(())
        }
    }
}

/// Waits until `group`'s secondary is good, showing the primary's progress.
fn wait_resynced(m: &Mgmt, group: hivefs_types::ids::BuddyGroupId, timeout: u64) -> Result<()> {
    use std::io::IsTerminal;
    let tty = std::io::stderr().is_terminal();
    let start = std::time::Instant::now();
    loop {
        let Some(g) = groups(m, None)?.into_iter().find(|g| g.id == group) else {
            bail!("buddy group {group} disappeared");
        };
        if g.secondary_state == Consistency::Good {
            if tty {
                eprint!("\r\x1b[K");
            }
            eprintln!("buddy group {group}: resync done, both copies are equal");
            return Ok(());
        }
        if tty {
            let (done, total) = g.resync.unwrap_or((0, 0));
            let pct = (done * 100).checked_div(total).unwrap_or(0);
            let width = 30usize;
            let fill = (pct as usize * width / 100).min(width);
            eprint!(
                "\r\x1b[Kresync of group {group} [{}{}] {done}/{total} chunk files ({pct}%), {}",
                "#".repeat(fill),
                " ".repeat(width - fill),
                g.secondary_state.as_str()
            );
        }
        if timeout > 0 && start.elapsed().as_secs() >= timeout {
            bail!("buddy group {group}: secondary still {} after {timeout} s", g.secondary_state.as_str());
        }
        std::thread::sleep(std::time::Duration::from_millis(250));
    }
}

/// Pairs for `mirror create --auto`: ungrouped members, each with one on
/// another server (storage targets within their pool).
fn auto_pairs(m: &Mgmt, kind: GroupKind) -> Result<Vec<(u32, u32)>> {
    let grouped: HashSet<u32> = groups(m, Some(kind))?.iter().flat_map(|g| [g.primary, g.secondary]).collect();
    let mut pairs = Vec::new();
    let mut left = Vec::new();
    match kind {
        GroupKind::Storage => {
            let mut per_pool: BTreeMap<u16, Vec<(u32, u32)>> = BTreeMap::new();
            for t in m.targets()?.iter().filter(|t| !grouped.contains(&t.id.0)) {
                per_pool.entry(t.pool.0).or_default().push((t.id.0, t.node.0));
            }
            for members in per_pool.values() {
                let (p, l) = pair_up(members);
                pairs.extend(p);
                left.extend(l);
            }
        }
        GroupKind::Meta => {
            // A ring: each namespace not yet mirrored gets the next metadata
            // node as its secondary (a node may keep several copies).
            let served: HashSet<u32> = groups(m, Some(kind))?.iter().filter_map(|g| g.serves.map(|n| n.0)).collect();
            let mut ids: Vec<u32> =
                m.nodes()?.iter().filter(|n| n.node_type == NodeType::Meta).map(|n| n.id.0).collect();
            ids.sort_unstable();
            if ids.len() < 2 {
                left = ids;
            } else {
                for (i, id) in ids.iter().enumerate() {
                    if !served.contains(id) {
                        pairs.push((*id, ids[(i + 1) % ids.len()]));
                    }
                }
            }
        }
    }
    if pairs.is_empty() {
        bail!(
            "no {} members to pair: each group needs two ungrouped members on different servers{}",
            kind.as_str(),
            if left.is_empty() { String::new() } else { format!(" (ungrouped: {left:?})") }
        );
    }
    if !left.is_empty() {
        eprintln!("left without a buddy on another server: {left:?}");
    }
    Ok(pairs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pairs_are_on_different_servers_and_use_everything_they_can() {
        // Targets 1-3 on server 1, 4 on server 2, 5-6 on server 3.
        let m = [(1, 1), (2, 1), (3, 1), (4, 2), (5, 3), (6, 3)];
        let (pairs, left) = pair_up(&m);
        let server = |id: u32| m.iter().find(|x| x.0 == id).unwrap().1;
        assert_eq!(pairs.len(), 3);
        assert!(left.is_empty());
        for (a, b) in &pairs {
            assert_ne!(server(*a), server(*b), "{pairs:?}");
        }
        // Primaries spread over the servers: 2 servers x 2 targets give one primary each.
        let (pairs, _) = pair_up(&[(1, 1), (2, 1), (3, 2), (4, 2)]);
        let servers: std::collections::BTreeSet<u32> = pairs.iter().map(|(p, _)| if *p <= 2 { 1 } else { 2 }).collect();
        assert_eq!(servers.len(), 2, "primaries on both servers: {pairs:?}");
        // One server only: nothing pairs.
        let (pairs, left) = pair_up(&[(1, 1), (2, 1)]);
        assert!(pairs.is_empty());
        assert_eq!(left, vec![2, 1]);
    }
}
