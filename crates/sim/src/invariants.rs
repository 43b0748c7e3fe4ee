//! The checks at the end of a run, once every node has restarted and gone
//! quiet: no pending intent on any node; every client's subtree on the
//! nodes (walked with `ReadDir` and `Lookup` through the owners) equals its
//! model; the whole namespace passes the fsck checker (the records of every
//! node fed as `hivefs fsck`'s walk feeds them: disposals, inodes, then
//! dentries; there are no chunk files); and each node's file and directory
//! counters match the inodes it holds.

use crate::model::{Kind, Mid, Model};
use hivefs_fsck::Checker;
use hivefs_meta::Namespace;
use hivefs_proto::{Reply, Request};
use hivefs_types::attr::FileKind;
use hivefs_types::ids::{EntryId, NodeId};
use std::collections::BTreeMap;
use std::sync::Arc;

const PAGE: u32 = 64;

/// The namespace of each metadata node, where it is served at the end.
pub struct Nodes<'a> {
    pub ids: Vec<NodeId>,
    pub serving: &'a dyn Fn(NodeId) -> Option<Arc<Namespace>>,
}

fn node(world: &Nodes<'_>, n: NodeId) -> Result<Arc<Namespace>, String> {
    (world.serving)(n).ok_or_else(|| format!("the namespace of metadata node {n} is not served at the end"))
}

/// All checks; each problem found is one line.
pub async fn check(world: &Nodes<'_>, models: &[Model]) -> Vec<String> {
    let mut out = Vec::new();
    for n in world.ids.iter().copied() {
        match node(world, n).and_then(|ns| ns.intents_text().map_err(|e| e.to_string())) {
            Ok(list) => out.extend(list.into_iter().map(|i| format!("metadata node {n}: pending intent {i}"))),
            Err(e) => out.push(e),
        }
    }
    for m in models {
        if let Err(e) = compare(world, m, m.root).await {
            out.push(e);
        }
    }
    match fsck(world).await {
        Ok(problems) => out.extend(problems),
        Err(e) => out.push(e),
    }
    out
}

async fn entries(ns: &Namespace, dir: EntryId) -> Result<Vec<(Vec<u8>, EntryId, FileKind)>, String> {
    let mut out = Vec::new();
    let mut after = None;
    loop {
        match ns.handle(Request::ReadDir { dir, after: after.clone(), max: PAGE }).await {
            Ok(Reply::DirPage { entries, more }) => {
                after = entries.last().map(|e| e.name.clone());
                out.extend(entries.into_iter().map(|e| (e.name, e.id, e.kind)));
                if !more || after.is_none() {
                    return Ok(out);
                }
            }
            r => return Err(format!("readdir of {dir} on metadata node {}: {r:?}", ns.node())),
        }
    }
}

/// The subtree at model directory `d` against the nodes.
async fn compare(world: &Nodes<'_>, m: &Model, d: Mid) -> Result<(), String> {
    let dir = &m.nodes[d];
    let ns = node(world, dir.owner)?;
    let path = m.path(d);
    let real: BTreeMap<Vec<u8>, (EntryId, FileKind)> =
        entries(&ns, dir.id).await?.into_iter().map(|(n, id, k)| (n, (id, k))).collect();
    let want: Vec<&Vec<u8>> = dir.children.keys().collect();
    let have: Vec<&Vec<u8>> = real.keys().collect();
    if want != have {
        let show = |v: &[&Vec<u8>]| v.iter().map(|n| String::from_utf8_lossy(n).into_owned()).collect::<Vec<_>>();
        return Err(format!("{path}: the nodes list {:?}, the model {:?}", show(&have), show(&want)));
    }
    for (name, &c) in &dir.children {
        let e = &m.nodes[c];
        let at = format!("{path}/{}", String::from_utf8_lossy(name));
        let a = match ns.handle(Request::Lookup { parent: dir.id, name: name.clone() }).await {
            Ok(Reply::Entry(a)) => a,
            r => return Err(format!("{at}: lookup answered {r:?}")),
        };
        let kind = if e.kind == Kind::Dir { FileKind::Dir } else { FileKind::File };
        if a.id != e.id || a.kind != kind || real[name] != (e.id, kind) {
            return Err(format!("{at}: the nodes have {} ({:?}), the model {} ({kind:?})", a.id, a.kind, e.id));
        }
        match e.kind {
            Kind::File if a.nlink != e.links => {
                return Err(format!("{at}: link count {} on the nodes, {} in the model", a.nlink, e.links))
            }
            Kind::Dir if a.owner != e.owner => {
                return Err(format!("{at}: owned by node {}, the model says {}", a.owner, e.owner))
            }
            Kind::Dir => Box::pin(compare(world, m, c)).await?,
            Kind::File => {}
        }
    }
    Ok(())
}

/// The fsck checker over every node's records, and the nodes' counters.
async fn fsck(world: &Nodes<'_>) -> Result<Vec<String>, String> {
    let mut c = Checker::default();
    let mut out = Vec::new();
    let nodes: Vec<(NodeId, Arc<Namespace>)> =
        world.ids.iter().map(|&n| node(world, n).map(|ns| (n, ns))).collect::<Result<_, _>>()?;
    for (n, ns) in &nodes {
        let mut after = None;
        loop {
            let Ok(Reply::FsckDisposals { records, more }) =
                ns.handle(Request::FsckDisposals { after, max: PAGE }).await
            else {
                return Err(format!("metadata node {n}: FsckDisposals failed"));
            };
            after = records.last().map(|r| r.id);
            records.iter().for_each(|r| c.add_disposal(r));
            if !more || after.is_none() {
                break;
            }
        }
    }
    for (n, ns) in &nodes {
        let (mut files, mut dirs) = (0u64, 0u64);
        let mut after = None;
        loop {
            let Ok(Reply::FsckInodes { inodes, more }) = ns.handle(Request::FsckInodes { after, max: PAGE }).await
            else {
                return Err(format!("metadata node {n}: FsckInodes failed"));
            };
            after = inodes.last().map(|i| i.id);
            for i in inodes {
                match i.kind {
                    FileKind::Dir => dirs += 1,
                    _ if i.nlink > 0 => files += 1,
                    _ => {}
                }
                c.add_inode(*n, i);
            }
            if !more || after.is_none() {
                break;
            }
        }
        match ns.counts() {
            Ok(counted) if counted == (files, dirs) => {}
            Ok((f, d)) => out
                .push(format!("metadata node {n} counts {f} files and {d} directories, but holds {files} and {dirs}")),
            Err(e) => out.push(format!("metadata node {n}: counts: {e}")),
        }
    }
    for (n, ns) in &nodes {
        let mut after = None;
        loop {
            let req = Request::FsckDentries { after: after.clone(), max: PAGE };
            let Ok(Reply::FsckDentries { entries, more }) = ns.handle(req).await else {
                return Err(format!("metadata node {n}: FsckDentries failed"));
            };
            after = entries.last().map(|d| (d.parent, d.name.clone()));
            entries.into_iter().for_each(|d| c.add_dentry(*n, d));
            if !more || after.is_none() {
                break;
            }
        }
    }
    out.extend(c.finish().into_iter().map(|p| {
        format!(
            "fsck: {} {} on node {:?} at {}: {}",
            p.kind.as_str(),
            p.entry,
            p.meta_node,
            p.path.as_deref().unwrap_or("?"),
            p.detail
        )
    }));
    Ok(out)
}
