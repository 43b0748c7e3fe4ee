//! Storage pools and space: `hivefs pool create|add-target|list`, `hivefs df`.

use crate::admin::{resolve, rt, target_row, Conn, TARGET_HEADER};
use crate::util::{human, print_table};
use anyhow::{anyhow, bail, Result};
use clap::Subcommand;
use hivefs_net::{call_once, ClientConfig};
use hivefs_proto::{CapacityPool, NodeInfo, PoolInfo, Reply, Request, TargetInfo};
use hivefs_types::ids::{NodeType, PoolId, TargetId};
use serde::Serialize;
use std::collections::BTreeMap;

#[derive(Subcommand, Debug)]
pub enum PoolCmd {
    /// Create a storage pool; prints its id.
    Create {
        /// Pool name: 1-64 characters of A-Z a-z 0-9 . _ -
        name: String,
        #[command(flatten)]
        conn: Conn,
    },
    /// Move storage targets into a pool. New files of directories using the pool
    /// go to its targets; existing files keep theirs.
    AddTarget {
        /// Pool id or name.
        pool: String,
        /// Target ids.
        #[arg(required = true)]
        targets: Vec<u32>,
        #[command(flatten)]
        conn: Conn,
    },
    /// List the storage pools and their targets.
    List {
        #[command(flatten)]
        conn: Conn,
    },
}

pub(crate) struct Mgmt {
    addr: String,
    cfg: ClientConfig,
    rt: tokio::runtime::Runtime,
}

impl Mgmt {
    pub(crate) fn new(c: &Conn) -> Result<Mgmt> {
        let r = resolve(c)?;
        Ok(Mgmt { addr: r.mgmtd, cfg: ClientConfig::new(r.secret), rt: rt()? })
    }

    pub(crate) fn call(&self, req: Request) -> Result<Reply> {
        self.rt.block_on(call_once(&self.addr, &self.cfg, &req)).map_err(|e| anyhow!("{e}"))
    }

    pub(crate) fn pools(&self) -> Result<Vec<PoolInfo>> {
        match self.call(Request::ListPools)? {
            Reply::Pools(p) => Ok(p),
            r => bail!("unexpected reply from mgmtd: {r:?}"),
        }
    }

    pub(crate) fn targets(&self) -> Result<Vec<TargetInfo>> {
        match self.call(Request::ListTargets)? {
            Reply::Targets(t) => Ok(t),
            r => bail!("unexpected reply from mgmtd: {r:?}"),
        }
    }

    pub(crate) fn nodes(&self) -> Result<Vec<NodeInfo>> {
        match self.call(Request::ListNodes { node_type: None })? {
            Reply::Nodes(n) => Ok(n),
            r => bail!("unexpected reply from mgmtd: {r:?}"),
        }
    }
}

pub(crate) fn find_pool(pools: &[PoolInfo], spec: &str) -> Result<PoolId> {
    if let Ok(id) = spec.parse::<u16>() {
        if pools.iter().any(|p| p.id.0 == id) {
            return Ok(PoolId(id));
        }
    }
    pools
        .iter()
        .find(|p| p.name == spec)
        .map(|p| p.id)
        .ok_or_else(|| anyhow!("storage pool {spec:?} does not exist (see `hivefs pool list`)"))
}

pub fn pool(cmd: PoolCmd) -> Result<()> {
    match cmd {
        PoolCmd::Create { name, conn } => {
            let m = Mgmt::new(&conn)?;
            match m.call(Request::CreatePool { name: name.clone() })? {
                Reply::PoolCreated { pool } => {
                    if conn.json {
                        println!("{}", serde_json::json!({ "id": pool.0, "name": name }));
                    } else {
                        println!("created storage pool {name:?} with id {pool}");
                    }
                    Ok(())
                }
                r => bail!("unexpected reply from mgmtd: {r:?}"),
            }
        }
        PoolCmd::AddTarget { pool, targets, conn } => {
            let m = Mgmt::new(&conn)?;
            let id = find_pool(&m.pools()?, &pool)?;
            for t in targets {
                m.call(Request::MoveTargetToPool { target: TargetId(t), pool: id })?;
                println!("storage target {t} is now in pool {id}");
            }
            Ok(())
        }
        PoolCmd::List { conn } => {
            let m = Mgmt::new(&conn)?;
            let pools = m.pools()?;
            if conn.json {
                let v: Vec<_> = pools
                    .iter()
                    .map(|p| serde_json::json!({"id": p.id.0, "name": p.name, "targets": p.targets.iter().map(|t| t.0).collect::<Vec<_>>()}))
                    .collect();
                println!("{}", serde_json::to_string_pretty(&v)?);
                return Ok(());
            }
            let rows: Vec<Vec<String>> = pools
                .iter()
                .map(|p| {
                    let t: Vec<String> = p.targets.iter().map(|t| t.to_string()).collect();
                    vec![p.id.to_string(), p.name.clone(), if t.is_empty() { "-".into() } else { t.join(",") }]
                })
                .collect();
            print_table(&["ID", "NAME", "TARGETS"], &rows);
            Ok(())
        }
    }
}

#[derive(Serialize, Default)]
struct Totals {
    targets: usize,
    total_bytes: u64,
    free_bytes: u64,
    total_inodes: u64,
    free_inodes: u64,
    normal: usize,
    low: usize,
    emergency: usize,
    offline: usize,
}

pub fn df(conn: Conn) -> Result<()> {
    let m = Mgmt::new(&conn)?;
    let mut targets = m.targets()?;
    targets.sort_by_key(|t| t.id);
    let pools = m.pools()?;
    let names: BTreeMap<u16, String> = pools.iter().map(|p| (p.id.0, p.name.clone())).collect();
    let mut totals: BTreeMap<u16, Totals> = pools.iter().map(|p| (p.id.0, Totals::default())).collect();
    for t in &targets {
        let tot = totals.entry(t.pool.0).or_default();
        tot.targets += 1;
        tot.total_bytes += t.capacity.total_bytes;
        tot.free_bytes += t.capacity.free_bytes;
        tot.total_inodes += t.capacity.total_inodes;
        tot.free_inodes += t.capacity.free_inodes;
        match t.capacity_pool {
            CapacityPool::Normal => tot.normal += 1,
            CapacityPool::Low => tot.low += 1,
            CapacityPool::Emergency => tot.emergency += 1,
        }
        if t.reachability != hivefs_proto::Reachability::Online {
            tot.offline += 1;
        }
    }
    let metas: Vec<NodeInfo> = m.nodes()?.into_iter().filter(|n| n.node_type == NodeType::Meta).collect();
    if conn.json {
        let v = serde_json::json!({
            "metadata": metas.iter().map(|n| serde_json::json!({
                "node": n.id.0, "state": n.reachability.as_str(),
                "total_bytes": n.capacity.map(|c| c.total_bytes), "free_bytes": n.capacity.map(|c| c.free_bytes),
                "total_inodes": n.capacity.map(|c| c.total_inodes), "free_inodes": n.capacity.map(|c| c.free_inodes),
            })).collect::<Vec<_>>(),
            "targets": targets.iter().map(|t| serde_json::json!({
                "id": t.id.0, "node": t.node.0, "pool": t.pool.0,
                "total_bytes": t.capacity.total_bytes, "free_bytes": t.capacity.free_bytes,
                "total_inodes": t.capacity.total_inodes, "free_inodes": t.capacity.free_inodes,
                "capacity_pool": t.capacity_pool.as_str(), "state": t.reachability.as_str(),
            })).collect::<Vec<_>>(),
            "pools": totals.iter().map(|(id, t)| {
                let mut v = serde_json::to_value(t).expect("totals serialise");
                v["id"] = (*id).into();
                v["name"] = names.get(id).cloned().unwrap_or_default().into();
                v
            }).collect::<Vec<_>>(),
        });
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    println!("METADATA NODES");
    let rows: Vec<Vec<String>> = metas
        .iter()
        .map(|n| {
            let c = n.capacity.unwrap_or_default();
            vec![
                n.id.to_string(),
                human(c.free_bytes),
                human(c.total_bytes),
                c.free_inodes.to_string(),
                c.total_inodes.to_string(),
                n.reachability.as_str().into(),
            ]
        })
        .collect();
    print_table(&["NODE", "FREE", "TOTAL", "FREE INODES", "INODES", "STATE"], &rows);
    println!();
    println!("STORAGE TARGETS");
    let groups = match m.call(Request::ListGroups { kind: None })? {
        Reply::Groups(g) => g,
        r => bail!("unexpected reply from mgmtd: {r:?}"),
    };
    let rows: Vec<Vec<String>> = targets.iter().map(|t| target_row(t, &groups)).collect();
    print_table(&TARGET_HEADER, &rows);
    println!();
    println!("POOLS");
    let rows: Vec<Vec<String>> = totals
        .iter()
        .map(|(id, t)| {
            vec![
                format!("{id} ({})", names.get(id).map(String::as_str).unwrap_or("?")),
                t.targets.to_string(),
                human(t.free_bytes),
                human(t.total_bytes),
                format!("{}/{}/{}", t.normal, t.low, t.emergency),
                t.offline.to_string(),
            ]
        })
        .collect();
    print_table(&["POOL", "TARGETS", "FREE", "TOTAL", "NORMAL/LOW/EMERGENCY", "NOT ONLINE"], &rows);
    Ok(())
}
