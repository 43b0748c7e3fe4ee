//! User and group quotas: `hivefs quota set|list` (`docs/design-quota.md`).

use crate::admin::Conn;
use crate::pools::Mgmt;
use crate::util::{human, parse_size, print_table};
use anyhow::{bail, Result};
use clap::Subcommand;
use hivefs_proto::{QuotaId, QuotaKind, QuotaLimit, QuotaUse, Reply, Request};
use hivefs_types::ids::{NodeId, NodeType};
use std::collections::BTreeMap;

#[derive(Subcommand, Debug)]
pub enum QuotaCmd {
    /// Set the limits of a user or a group: space (the lengths of their regular
    /// files) and inodes (files, directories, symlinks), on the whole file system or,
    /// with --pool, on their regular files in one storage pool (inodes: files). A user
    /// or group at a limit gets EDQUOT ("Disk quota exceeded") for new files and for
    /// writes that grow a file. `none` removes one limit; both `none` removes the quota.
    #[command(group(clap::ArgGroup::new("who").required(true).args(["uid", "gid"])))]
    Set {
        /// The user (numeric uid).
        #[arg(long)]
        uid: Option<u32>,
        /// The group (numeric gid).
        #[arg(long)]
        gid: Option<u32>,
        /// Space limit: bytes with an optional k/m/g/t suffix (powers of 1024), or `none`.
        #[arg(long, value_name = "SIZE|none")]
        space: String,
        /// Inode limit, or `none`.
        #[arg(long, value_name = "N|none")]
        inodes: String,
        /// Limit the regular files in this storage pool (id or name) instead of everything.
        #[arg(long)]
        pool: Option<String>,
        #[command(flatten)]
        conn: Conn,
    },
    /// List every quota with its usage as the metadata nodes last reported it (every
    /// `quota_interval_ms`, mgmtd.toml; the age is shown). With --all: the usage of
    /// every user and group holding anything, limited or not, asked from every
    /// metadata node now.
    List {
        /// Every user and group with their current usage, instead of the limits.
        #[arg(long)]
        all: bool,
        #[command(flatten)]
        conn: Conn,
    },
}

fn limit(s: &str, what: &str, parse: impl Fn(&str) -> Result<u64>) -> Result<Option<u64>> {
    if s.eq_ignore_ascii_case("none") {
        return Ok(None);
    }
    match parse(s) {
        Ok(0) => bail!("--{what} 0 would allow nothing; use `none` to remove the limit"),
        Ok(v) => Ok(Some(v)),
        Err(e) => bail!("--{what} {s:?}: {e}"),
    }
}

pub fn quota(cmd: QuotaCmd) -> Result<()> {
    match cmd {
        QuotaCmd::Set { uid, gid, space, inodes, pool, conn } => {
            let who = match (uid, gid) {
                (Some(id), None) => QuotaId { kind: QuotaKind::User, id },
                (None, Some(id)) => QuotaId { kind: QuotaKind::Group, id },
                _ => bail!("give one of --uid and --gid"),
            };
            let bytes = limit(&space, "space", parse_size)?;
            let inodes = limit(&inodes, "inodes", |s| Ok(s.parse::<u64>()?))?;
            let m = Mgmt::new(&conn)?;
            let pool = match pool {
                Some(spec) => Some(crate::pools::find_pool(&m.pools()?, &spec)?),
                None => None,
            };
            match m.call(Request::SetQuota(QuotaLimit { who, pool, bytes, inodes }))? {
                Reply::Ok => Ok(()),
                r => bail!("unexpected reply from mgmtd: {r:?}"),
            }
        }
        QuotaCmd::List { all: true, conn } => list_all(&conn),
        QuotaCmd::List { all: false, conn } => {
            let Reply::Quotas { interval_ms, age_ms, quotas } = Mgmt::new(&conn)?.call(Request::GetQuotas)? else {
                bail!("unexpected reply from mgmtd to GetQuotas");
            };
            let age = (age_ms != u64::MAX).then_some(age_ms);
            if conn.json {
                let rows: Vec<_> = quotas
                    .iter()
                    .map(|q| {
                        serde_json::json!({
                            "kind": q.limit.who.kind.name(), "id": q.limit.who.id, "pool": q.limit.pool.map(|p| p.0),
                            "space_limit": q.limit.bytes, "inode_limit": q.limit.inodes,
                            "space_used": q.used.bytes, "inodes_used": q.used.inodes,
                            "exceeded": q.exceeded_by(0, 0),
                        })
                    })
                    .collect();
                let v = serde_json::json!({ "interval_ms": interval_ms, "age_ms": age, "quotas": rows });
                println!("{}", serde_json::to_string_pretty(&v)?);
                return Ok(());
            }
            let show = |v: Option<u64>, f: &dyn Fn(u64) -> String| v.map_or("-".to_string(), f);
            let rows: Vec<Vec<String>> = quotas
                .iter()
                .map(|q| {
                    vec![
                        q.limit.who.kind.name().to_string(),
                        q.limit.who.id.to_string(),
                        q.limit.pool.map_or("all".to_string(), |p| p.to_string()),
                        human(q.used.bytes),
                        show(q.limit.bytes, &human),
                        q.used.inodes.to_string(),
                        show(q.limit.inodes, &|v| v.to_string()),
                        if q.exceeded_by(0, 0) { "exceeded" } else { "" }.to_string(),
                    ]
                })
                .collect();
            print_table(&["KIND", "ID", "POOL", "SPACE", "SPACE LIMIT", "INODES", "INODE LIMIT", ""], &rows);
            match age {
                Some(a) => println!("usage as reported {:.1} s ago (every {interval_ms} ms)", a as f64 / 1000.0),
                None => println!("no metadata node has reported usage yet"),
            }
            Ok(())
        }
    }
}

/// Every user's and group's usage, summed over every metadata namespace (each
/// asked where it is served now: its node, or its buddy group's primary).
fn list_all(conn: &Conn) -> Result<()> {
    let r = crate::admin::resolve(conn)?;
    let usage = crate::admin::rt()?.block_on(async {
        let pools = hivefs_net::Pools::new(hivefs_net::ClientConfig::new(r.secret.clone()));
        let cluster = hivefs_cluster::Cluster::new(&r.mgmtd, pools);
        let view = cluster.refresh().await.map_err(|e| anyhow::anyhow!("mgmtd {}: {e}", r.mgmtd))?;
        let mut namespaces: Vec<NodeId> =
            view.nodes.keys().filter(|(t, _)| *t == NodeType::Meta).map(|(_, n)| *n).collect();
        namespaces.sort();
        let mut sum: BTreeMap<QuotaId, QuotaUse> = BTreeMap::new();
        for n in namespaces {
            let req = Request::QuotaUsage { ids: Vec::new() };
            match cluster.meta_rpc(n, &req).await {
                Ok(Reply::QuotaUsage(rows)) => {
                    for (who, u) in rows {
                        let s = sum.entry(who).or_default();
                        s.inodes += u.inodes;
                        s.bytes += u.bytes;
                    }
                }
                Ok(other) => bail!("metadata node {n}: unexpected reply {other:?}"),
                Err(e) => bail!("metadata node {n}: {e}"),
            }
        }
        Ok(sum)
    })?;
    if conn.json {
        let rows: Vec<_> = usage
            .iter()
            .map(|(w, u)| serde_json::json!({"kind": w.kind.name(), "id": w.id, "space_used": u.bytes, "inodes_used": u.inodes}))
            .collect();
        println!("{}", serde_json::to_string_pretty(&serde_json::json!({ "usage": rows }))?);
        return Ok(());
    }
    let rows: Vec<Vec<String>> = usage
        .iter()
        .map(|(w, u)| vec![w.kind.name().to_string(), w.id.to_string(), human(u.bytes), u.inodes.to_string()])
        .collect();
    print_table(&["KIND", "ID", "SPACE", "INODES"], &rows);
    Ok(())
}
