//! Admin commands: `nodes`, `targets`, `entry info`, `pattern get|set`.
//! They talk to a running file system found through a mount point
//! (`--mount`) or directly through mgmtd (`--mgmtd`, `--secret-file`).

use crate::services::mount_record;
use crate::util::{absolute, hivefs_mounts, human, parse_size, print_table};
use anyhow::{anyhow, bail, Context, Result};
use clap::{Args, Subcommand};
use hivefs_client::{Client, Ent, Options};
use hivefs_net::{call_once, ClientConfig, Secret};
use hivefs_proto::{MetaChooser, Reply, Request};
use hivefs_types::attr::{EntryAttr, FileKind};
use hivefs_types::pattern::{validate_chunk_size, Chooser, DirPattern};
use hivefs_types::PoolId;
use serde::Serialize;
use std::path::{Path, PathBuf};
use std::sync::Arc;

#[derive(Args, Debug, Clone)]
pub struct Conn {
    /// A mount point of the file system to talk to.
    #[arg(long)]
    pub mount: Option<PathBuf>,
    /// Address of mgmtd (instead of --mount).
    #[arg(long)]
    pub mgmtd: Option<String>,
    /// Shared secret file (with --mgmtd).
    #[arg(long)]
    pub secret_file: Option<PathBuf>,
    /// Machine-readable output.
    #[arg(long)]
    pub json: bool,
}

#[derive(Subcommand, Debug)]
pub enum EntryCmd {
    /// Show an entry's id, inode number, owner metadata node and stripe pattern.
    Info {
        /// Paths inside a mounted HiveFS (with several, --json prints an array).
        #[arg(required = true)]
        paths: Vec<PathBuf>,
        /// Machine-readable output.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Subcommand, Debug)]
pub enum PatternCmd {
    /// Show a directory's stripe settings.
    Get {
        /// A directory inside a mounted HiveFS.
        dir: PathBuf,
        /// Machine-readable output.
        #[arg(long)]
        json: bool,
    },
    /// Change a directory's stripe settings for files created afterwards (inherited by new subdirectories).
    Set {
        /// A directory inside a mounted HiveFS.
        dir: PathBuf,
        /// Chunk size: power of two from 4k to 1g.
        #[arg(long)]
        chunk_size: Option<String>,
        /// Stripe count: a number, or "all" for every target of the pool.
        #[arg(long)]
        stripe: Option<String>,
        /// Target chooser: random, roundrobin, randomized-roundrobin, balanced.
        #[arg(long)]
        chooser: Option<String>,
        /// Storage pool id.
        #[arg(long)]
        pool: Option<u16>,
        /// Metadata-node chooser for new subdirectories: balanced, random, roundrobin.
        #[arg(long)]
        meta_chooser: Option<String>,
        /// New files stripe over storage buddy groups (each chunk on two targets
        /// of different servers; `hivefs mirror create` makes the groups).
        #[arg(long, conflicts_with = "no_mirror")]
        mirror: bool,
        /// New files stripe over single targets again.
        #[arg(long)]
        no_mirror: bool,
    },
}

pub(crate) struct Resolved {
    pub mgmtd: String,
    pub secret: Option<Secret>,
}

fn load_secret_opt(p: Option<&Path>) -> Result<Option<Secret>> {
    p.map(|p| hivefs_net::load_secret(p).map_err(|e| anyhow!(e))).transpose()
}

fn from_mount(mnt: &Path) -> Result<Resolved> {
    let mnt = std::fs::canonicalize(mnt).with_context(|| format!("{}", mnt.display()))?;
    let r = mount_record(&mnt)?;
    Ok(Resolved { mgmtd: r.mgmtd, secret: load_secret_opt(r.secret_file.as_deref())? })
}

pub(crate) fn resolve(c: &Conn) -> Result<Resolved> {
    match (&c.mount, &c.mgmtd) {
        (Some(m), _) => from_mount(m),
        (None, Some(addr)) => Ok(Resolved { mgmtd: addr.clone(), secret: load_secret_opt(c.secret_file.as_deref())? }),
        (None, None) => {
            let mounts = hivefs_mounts();
            match mounts.as_slice() {
                [(m, _)] => from_mount(m),
                [] => bail!("no HiveFS is mounted here; give --mount MNT or --mgmtd ADDR"),
                _ => bail!("several HiveFS mounts exist; choose one with --mount MNT"),
            }
        }
    }
}

/// Finds the mount containing `path` and the path relative to its root.
fn locate(path: &Path) -> Result<(PathBuf, String)> {
    let abs = absolute(path)?;
    let canon = std::fs::canonicalize(&abs).with_context(|| format!("{}", path.display()))?;
    let mut best: Option<PathBuf> = None;
    for (m, _) in hivefs_mounts() {
        if canon.starts_with(&m) && best.as_ref().is_none_or(|b| m.as_os_str().len() > b.as_os_str().len()) {
            best = Some(m);
        }
    }
    let m = best.ok_or_else(|| anyhow!("{} is not inside a HiveFS mount", path.display()))?;
    let rel = canon.strip_prefix(&m).expect("prefix checked").to_string_lossy().into_owned();
    Ok((m, rel))
}

pub(crate) fn rt() -> Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_current_thread().enable_all().build()?)
}

async fn client_for(mnt: &Path) -> Result<Arc<Client>> {
    let r = from_mount(mnt)?;
    Client::connect(Options::new(r.mgmtd, r.secret)).await.map_err(|e| anyhow!("{e}"))
}

pub fn nodes(c: Conn) -> Result<()> {
    let r = resolve(&c)?;
    let reply = rt()?
        .block_on(call_once(&r.mgmtd, &ClientConfig::new(r.secret), &Request::ListNodes { node_type: None }))
        .map_err(|e| anyhow!("{e}"))?;
    let Reply::Nodes(mut nodes) = reply else { bail!("unexpected reply from mgmtd") };
    nodes.sort_by_key(|n| (n.node_type as u8, n.id));
    if c.json {
        println!(
            "{}",
            serde_json::to_string_pretty(
                &nodes
                    .iter()
                    .map(|n| serde_json::json!({
                        "id": n.id.0, "type": n.node_type.to_string(), "address": n.addr, "hostname": n.hostname,
                        "last_seen_ms": n.last_seen_ms, "state": n.reachability.as_str(),
                    }))
                    .collect::<Vec<_>>()
            )?
        );
        return Ok(());
    }
    let rows: Vec<Vec<String>> = nodes
        .iter()
        .map(|n| {
            vec![
                n.node_type.to_string(),
                n.id.to_string(),
                n.addr.clone(),
                n.hostname.clone(),
                n.reachability.as_str().into(),
                format!("{:.1}s", n.last_seen_ms as f64 / 1000.0),
            ]
        })
        .collect();
    print_table(&["TYPE", "ID", "ADDRESS", "HOST", "STATE", "LAST SEEN"], &rows);
    Ok(())
}

pub fn targets(c: Conn) -> Result<()> {
    let r = resolve(&c)?;
    let reply = rt()?
        .block_on(call_once(&r.mgmtd, &ClientConfig::new(r.secret.clone()), &Request::ListTargets))
        .map_err(|e| anyhow!("{e}"))?;
    let Reply::Targets(mut ts) = reply else { bail!("unexpected reply from mgmtd") };
    ts.sort_by_key(|t| t.id);
    let groups = list_groups(&r.mgmtd, &ClientConfig::new(r.secret.clone()))?;
    if c.json {
        println!(
            "{}",
            serde_json::to_string_pretty(
                &ts.iter()
                    .map(|t| serde_json::json!({
                                "id": t.id.0, "node": t.node.0, "pool": t.pool.0,
                                "total_bytes": t.capacity.total_bytes, "free_bytes": t.capacity.free_bytes,
                                "total_inodes": t.capacity.total_inodes, "free_inodes": t.capacity.free_inodes,
                                "state": t.reachability.as_str(), "last_seen_ms": t.last_seen_ms,
                    "capacity_pool": t.capacity_pool.as_str(),
                    "mirror": target_group(t.id, &groups).map(|(g, role, state)| serde_json::json!({"group": g, "role": role, "state": state})),
                            }))
                    .collect::<Vec<_>>()
            )?
        );
        return Ok(());
    }
    let rows: Vec<Vec<String>> = ts.iter().map(|t| target_row(t, &groups)).collect();
    print_table(&TARGET_HEADER, &rows);
    Ok(())
}

#[derive(Serialize)]
struct EntryInfo {
    path: String,
    entry_id: String,
    /// st_ino on every mount (a function of the entry id).
    inode: u64,
    kind: String,
    owner_meta_node: u32,
    size: u64,
    chunk_size: Option<u32>,
    stripe_count: Option<usize>,
    /// Stripe ids: targets, or buddy groups when `mirrored`.
    targets: Option<Vec<u32>>,
    mirrored: bool,
    /// Mirrored files: each group with its current primary and secondary target.
    groups: Option<Vec<GroupRow>>,
    dir_pattern: Option<PatternInfo>,
    /// Stripe targets per storage server, and the (min,max) over all storage servers.
    allocation: Option<Allocation>,
}

#[derive(Serialize)]
struct GroupRow {
    id: u32,
    primary: Option<u32>,
    secondary: Option<u32>,
}

#[derive(Serialize)]
struct Allocation {
    per_server: std::collections::BTreeMap<u32, usize>,
    min: usize,
    max: usize,
}

impl Allocation {
    /// The seed paper's notation: `(min,max)` of stripe targets per server.
    fn notation(&self) -> String {
        format!("({},{})", self.min, self.max)
    }
}

/// Counts a file's stripe targets on every storage server of the cluster
/// (servers without any of them count 0).
fn allocation(view: &hivefs_cluster::ClusterView, targets: &[hivefs_types::TargetId]) -> Allocation {
    let per_server = view.targets_per_server(targets);
    let min = per_server.values().copied().min().unwrap_or(0);
    let max = per_server.values().copied().max().unwrap_or(0);
    Allocation { per_server, min, max }
}

#[derive(Serialize)]
struct PatternInfo {
    chunk_size: u32,
    stripe_count: String,
    pool: u16,
    chooser: String,
    mirror: bool,
}

fn pattern_info(p: &DirPattern) -> PatternInfo {
    PatternInfo {
        chunk_size: p.chunk_size,
        stripe_count: if p.stripe_count == 0 { "all".into() } else { p.stripe_count.to_string() },
        pool: p.pool.0,
        chooser: p.chooser.to_string(),
        mirror: p.mirror,
    }
}

async fn resolve_path(path: &Path) -> Result<(Arc<Client>, String, EntryAttr)> {
    let (m, rel) = locate(path)?;
    let c = client_for(&m).await?;
    let a = c.resolve(&rel).await.map_err(|e| anyhow!("{}: {e}", path.display()))?;
    Ok((c, rel, a))
}

pub fn entry(cmd: EntryCmd) -> Result<()> {
    let EntryCmd::Info { paths, json } = cmd;
    let infos = rt()?.block_on(async {
        let mut infos = Vec::with_capacity(paths.len());
        let mut clients: std::collections::HashMap<PathBuf, Arc<Client>> = std::collections::HashMap::new();
        for path in &paths {
            let (m, rel) = locate(path)?;
            let c = match clients.get(&m) {
                Some(c) => c.clone(),
                None => {
                    let c = client_for(&m).await?;
                    c.cluster().refresh().await.map_err(|e| anyhow!("{e}"))?;
                    clients.insert(m.clone(), c.clone());
                    c
                }
            };
            let a = c.resolve(&rel).await.map_err(|e| anyhow!("{}: {e}", path.display()))?;
            let view = c.cluster().view();
            infos.push(EntryInfo {
                path: format!("/{rel}"),
                entry_id: a.id.to_string(),
                inode: a.id.ino(),
                kind: format!("{:?}", a.kind).to_lowercase(),
                owner_meta_node: a.owner.0,
                size: a.size,
                chunk_size: a.pattern.as_ref().map(|p| p.chunk_size()),
                stripe_count: a.pattern.as_ref().map(|p| p.targets().len()),
                targets: a.pattern.as_ref().map(|p| p.targets().iter().map(|t| t.0).collect()),
                mirrored: a.pattern.as_ref().is_some_and(|p| p.is_mirrored()),
                groups: a.pattern.as_ref().filter(|p| p.is_mirrored()).map(|p| {
                    p.groups()
                        .iter()
                        .map(|g| {
                            let info = view.groups.get(g);
                            GroupRow { id: g.0, primary: info.map(|i| i.primary), secondary: info.map(|i| i.secondary) }
                        })
                        .collect()
                }),
                dir_pattern: a.dir_pattern.as_ref().map(pattern_info),
                allocation: a.pattern.as_ref().map(|p| {
                    // Mirrored: where the primaries are.
                    let primaries: Vec<hivefs_types::ids::TargetId> = if p.is_mirrored() {
                        p.groups()
                            .iter()
                            .filter_map(|g| view.groups.get(g).map(|i| hivefs_types::ids::TargetId(i.primary)))
                            .collect()
                    } else {
                        p.targets().to_vec()
                    };
                    allocation(&view, &primaries)
                }),
            });
        }
        Ok::<_, anyhow::Error>(infos)
    })?;
    if json {
        if infos.len() == 1 {
            println!("{}", serde_json::to_string_pretty(&infos[0])?);
        } else {
            println!("{}", serde_json::to_string_pretty(&infos)?);
        }
        return Ok(());
    }
    for (i, info) in infos.iter().enumerate() {
        if i > 0 {
            println!();
        }
        println!("Path:          {}", info.path);
        println!("Entry ID:      {}", info.entry_id);
        println!("Inode:         {}", info.inode);
        println!("Type:          {}", info.kind);
        println!("Metadata node: {}", info.owner_meta_node);
        if let (Some(cs), Some(targets)) = (info.chunk_size, &info.targets) {
            println!("Size:          {}", info.size);
            let kind = if info.mirrored { "buddy mirror" } else { "RAID0" };
            println!("Pattern:       {kind}, chunk size {}", human(u64::from(cs)));
            println!("Stripe count:  {}", targets.len());
            match &info.groups {
                Some(groups) => {
                    let show = |t: Option<u32>| t.map_or("?".to_string(), |t| t.to_string());
                    let g: Vec<String> = groups
                        .iter()
                        .map(|g| format!("{} (primary {}, secondary {})", g.id, show(g.primary), show(g.secondary)))
                        .collect();
                    println!("Buddy groups:  {}", g.join(", "));
                }
                None => {
                    let t: Vec<String> = targets.iter().map(|t| t.to_string()).collect();
                    println!("Targets:       {}", t.join(", "));
                }
            }
        }
        if let Some(al) = &info.allocation {
            let per: Vec<String> = al.per_server.iter().map(|(n, c)| format!("node {n}: {c}")).collect();
            println!("Allocation:    {} — targets per storage server: {}", al.notation(), per.join(", "));
        }
        if let Some(d) = &info.dir_pattern {
            println!(
                "Stripe for new files: chunk size {}, stripe count {}, pool {}, chooser {}{}",
                human(u64::from(d.chunk_size)),
                d.stripe_count,
                d.pool,
                d.chooser,
                if d.mirror { ", mirrored" } else { "" }
            );
        }
    }
    Ok(())
}

pub fn pattern(cmd: PatternCmd) -> Result<()> {
    match cmd {
        PatternCmd::Get { dir, json } => {
            let (info, meta_chooser) = rt()?.block_on(async {
                let (c, _, a) = resolve_path(&dir).await?;
                let p = a.dir_pattern.as_ref().ok_or_else(|| anyhow!("{} is not a directory", dir.display()))?;
                let mc = c.meta_chooser(Ent::from(&a)).await.map_err(|e| anyhow!("{}: {e}", dir.display()))?;
                Ok::<_, anyhow::Error>((pattern_info(p), mc))
            })?;
            if json {
                let mut v = serde_json::to_value(&info)?;
                v["meta_chooser"] = serde_json::Value::from(meta_chooser.name());
                println!("{}", serde_json::to_string_pretty(&v)?);
            } else {
                println!("chunk size:   {}", human(u64::from(info.chunk_size)));
                println!("stripe count: {}", info.stripe_count);
                println!("pool:         {}", info.pool);
                println!("chooser:      {}", info.chooser);
                println!("meta chooser: {}", meta_chooser.name());
            }
            Ok(())
        }
        PatternCmd::Set { dir, chunk_size, stripe, chooser, pool, meta_chooser, mirror, no_mirror } => {
            let mirror = match (mirror, no_mirror) {
                (true, _) => Some(true),
                (_, true) => Some(false),
                _ => None,
            };
            let meta_chooser = meta_chooser
                .map(|s| {
                    MetaChooser::parse(&s)
                        .ok_or_else(|| anyhow!("unknown metadata chooser {s:?}: use balanced, random or roundrobin"))
                })
                .transpose()?;
            let chunk = chunk_size
                .map(|s| parse_size(&s).and_then(|b| validate_chunk_size(b).map_err(|e| anyhow!(e))))
                .transpose()?;
            let stripe = stripe
                .map(|s| {
                    if s == "all" {
                        Ok(0)
                    } else {
                        s.parse::<u32>()
                            .ok()
                            .filter(|n| *n > 0)
                            .ok_or_else(|| anyhow!("invalid stripe count {s:?}: a positive number or \"all\""))
                    }
                })
                .transpose()?;
            let chooser = chooser
                .map(|s| {
                    Chooser::parse(&s).ok_or_else(|| {
                        anyhow!("unknown chooser {s:?}: use random, roundrobin, randomized-roundrobin or balanced")
                    })
                })
                .transpose()?;
            rt()?.block_on(async {
                let (c, _, a) = resolve_path(&dir).await?;
                if a.kind != FileKind::Dir {
                    bail!("{} is not a directory: patterns are set on directories", dir.display());
                }
                let mut p = a.dir_pattern.clone().unwrap_or_default();
                if let Some(cs) = chunk {
                    p.chunk_size = cs;
                }
                if let Some(s) = stripe {
                    p.stripe_count = s;
                }
                if let Some(ch) = chooser {
                    p.chooser = ch;
                }
                if let Some(pl) = pool {
                    p.pool = PoolId(pl);
                }
                if let Some(m) = mirror {
                    p.mirror = m;
                }
                if let Some(mc) = meta_chooser {
                    c.set_meta_chooser(Ent::from(&a), mc).await.map_err(|e| anyhow!("{}: {e}", dir.display()))?;
                    println!("{}: metadata chooser {}", dir.display(), mc.name());
                    if chunk.is_none() && stripe.is_none() && chooser.is_none() && pool.is_none() && mirror.is_none() {
                        return Ok(());
                    }
                }
                let a = c.set_dir_pattern(Ent::from(&a), p).await.map_err(|e| anyhow!("{}: {e}", dir.display()))?;
                let info = pattern_info(a.dir_pattern.as_ref().expect("directory"));
                println!(
                    "{}: chunk size {}, stripe count {}, pool {}, chooser {}{}",
                    dir.display(),
                    human(u64::from(info.chunk_size)),
                    info.stripe_count,
                    info.pool,
                    info.chooser,
                    if info.mirror { ", mirrored over buddy groups" } else { "" }
                );
                Ok(())
            })
        }
    }
}

pub const TARGET_HEADER: [&str; 10] =
    ["TARGET", "NODE", "POOL", "FREE", "TOTAL", "FREE INODES", "INODES", "CAPACITY", "STATE", "MIRROR"];

/// A target's storage buddy group: (group, role, its consistency).
pub fn target_group(
    t: hivefs_types::ids::TargetId,
    groups: &[hivefs_proto::GroupInfo],
) -> Option<(u32, &'static str, &'static str)> {
    groups.iter().filter(|g| g.kind == hivefs_proto::GroupKind::Storage).find_map(|g| {
        if g.primary == t.0 {
            Some((g.id.0, "primary", g.primary_state.as_str()))
        } else if g.secondary == t.0 {
            Some((g.id.0, "secondary", g.secondary_state.as_str()))
        } else {
            None
        }
    })
}

/// mgmtd's buddy groups (both kinds).
pub fn list_groups(mgmtd: &str, cfg: &ClientConfig) -> Result<Vec<hivefs_proto::GroupInfo>> {
    match rt()?.block_on(call_once(mgmtd, cfg, &Request::ListGroups { kind: None })).map_err(|e| anyhow!("{e}"))? {
        Reply::Groups(g) => Ok(g),
        r => bail!("unexpected reply from mgmtd: {r:?}"),
    }
}

/// One row of a target table (`hivefs targets`, `hivefs df`).
pub fn target_row(t: &hivefs_proto::TargetInfo, groups: &[hivefs_proto::GroupInfo]) -> Vec<String> {
    let mirror =
        target_group(t.id, groups).map_or("-".to_string(), |(g, role, state)| format!("group {g} {role} ({state})"));
    vec![
        t.id.to_string(),
        t.node.to_string(),
        t.pool.to_string(),
        human(t.capacity.free_bytes),
        human(t.capacity.total_bytes),
        t.capacity.free_inodes.to_string(),
        t.capacity.total_inodes.to_string(),
        t.capacity_pool.as_str().into(),
        t.reachability.as_str().into(),
        mirror,
    ]
}
