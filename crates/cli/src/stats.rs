//! `hivefs stats`: a live view of what the servers do, from the counters they export
//! (the ones Prometheus scrapes): operations/s and bytes/s per node and per storage
//! target, or per user or per client. Every interval it asks mgmtd and every node for
//! its metrics (`Request::Metrics`) and shows the differences.

use crate::admin::{resolve, Conn};
use crate::util::print_table;
use anyhow::{anyhow, bail, Result};
use clap::Args;
use hivefs_net::{call_once, ClientConfig};
use hivefs_proto::{Reply, Request};
use std::collections::BTreeMap;
use std::io::IsTerminal;
use std::time::{Duration, Instant};

#[derive(Args, Debug)]
pub struct StatsArgs {
    #[command(flatten)]
    pub conn: Conn,
    /// Seconds between reports.
    #[arg(long, default_value_t = 2.0)]
    pub interval: f64,
    /// Stop after this many reports (default: until interrupted).
    #[arg(long)]
    pub count: Option<u64>,
    /// Operations per user id (namespace requests that name their user), summed over
    /// the metadata nodes, instead of per node.
    #[arg(long, conflicts_with = "per_client")]
    pub per_user: bool,
    /// Requests per client address, summed over all nodes, instead of per node.
    #[arg(long)]
    pub per_client: bool,
    /// Rows of the per-user and per-client views, and operation types per node.
    #[arg(long, default_value_t = 10)]
    pub top: usize,
}

/// One series of the exposition text.
#[derive(Debug, PartialEq)]
struct Series {
    name: String,
    labels: BTreeMap<String, String>,
    value: f64,
}

/// Parses Prometheus text format (as the services write it).
fn parse(text: &str) -> Vec<Series> {
    let mut out = Vec::new();
    for line in text.lines().filter(|l| !l.starts_with('#') && !l.trim().is_empty()) {
        let Some((head, value)) = line.rsplit_once(' ') else { continue };
        let Ok(value) = value.parse::<f64>() else { continue };
        let (name, labels) = match head.split_once('{') {
            None => (head.to_string(), BTreeMap::new()),
            Some((n, rest)) => (n.to_string(), parse_labels(rest.trim_end_matches('}'))),
        };
        out.push(Series { name, labels, value });
    }
    out
}

fn parse_labels(s: &str) -> BTreeMap<String, String> {
    let mut m = BTreeMap::new();
    let mut chars = s.chars().peekable();
    loop {
        let key: String = chars.by_ref().take_while(|c| *c != '=').collect();
        if key.is_empty() || chars.next() != Some('"') {
            break;
        }
        let mut val = String::new();
        while let Some(c) = chars.next() {
            match c {
                '\\' => match chars.next() {
                    Some('n') => val.push('\n'),
                    Some(x) => val.push(x),
                    None => break,
                },
                '"' => break,
                c => val.push(c),
            }
        }
        m.insert(key.trim_start_matches(',').to_string(), val);
        if chars.peek() == Some(&',') {
            chars.next();
        }
    }
    m
}

/// What one node's counters say now.
#[derive(Default, Clone)]
struct Counters {
    ops: BTreeMap<String, f64>,
    received: f64,
    sent: f64,
    /// (target, direction) → bytes.
    targets: BTreeMap<(String, String), f64>,
    users: BTreeMap<String, f64>,
    clients: BTreeMap<String, f64>,
}

fn counters(text: &str) -> Counters {
    let mut c = Counters::default();
    let label = |s: &Series, k: &str| s.labels.get(k).cloned().unwrap_or_default();
    for s in parse(text) {
        match s.name.as_str() {
            "hivefs_requests_total" => *c.ops.entry(label(&s, "op")).or_default() += s.value,
            "hivefs_received_bytes_total" => c.received += s.value,
            "hivefs_sent_bytes_total" => c.sent += s.value,
            "hivefs_target_io_bytes_total" => {
                *c.targets.entry((label(&s, "target"), label(&s, "direction"))).or_default() += s.value
            }
            "hivefs_user_requests_total" => *c.users.entry(label(&s, "key")).or_default() += s.value,
            "hivefs_client_requests_total" => *c.clients.entry(label(&s, "key")).or_default() += s.value,
            _ => {}
        }
    }
    c
}

/// Per-second differences of two maps of counters (a counter that went down: restarted).
fn rates<K: Ord + Clone>(now: &BTreeMap<K, f64>, before: &BTreeMap<K, f64>, secs: f64) -> BTreeMap<K, f64> {
    now.iter().map(|(k, v)| (k.clone(), (v - before.get(k).copied().unwrap_or(0.0)).max(0.0) / secs)).collect()
}

struct Node {
    name: String,
    addr: String,
}

async fn nodes(mgmtd: &str, ccfg: &ClientConfig) -> Result<Vec<Node>> {
    let Reply::Nodes(mut list) = call_once(mgmtd, ccfg, &Request::ListNodes { node_type: None })
        .await
        .map_err(|e| anyhow!("mgmtd {mgmtd}: {e}"))?
    else {
        bail!("mgmtd {mgmtd}: unexpected answer");
    };
    list.sort_by_key(|n| (n.node_type as u8, n.id));
    let mut v = vec![Node { name: "mgmtd".into(), addr: mgmtd.to_string() }];
    v.extend(list.into_iter().map(|n| Node { name: format!("{} {}", n.node_type, n.id), addr: n.addr }));
    Ok(v)
}

/// Every node's counters (None where it did not answer), asked all at once.
async fn sample(nodes: &[Node], ccfg: &ClientConfig) -> Vec<Option<Counters>> {
    let handles: Vec<_> = nodes
        .iter()
        .map(|n| {
            let (addr, ccfg) = (n.addr.clone(), ccfg.clone());
            tokio::spawn(async move {
                match call_once(&addr, &ccfg, &Request::Metrics).await {
                    Ok(Reply::Metrics(text)) => Some(counters(&text)),
                    _ => None,
                }
            })
        })
        .collect();
    let mut out = Vec::with_capacity(handles.len());
    for h in handles {
        out.push(h.await.ok().flatten());
    }
    out
}

pub fn stats(a: StatsArgs) -> Result<()> {
    anyhow::ensure!(a.interval >= 0.1, "--interval must be at least 0.1 s");
    let r = resolve(&a.conn)?;
    let ccfg = ClientConfig::new(r.secret).with_timeout(Duration::from_secs(2));
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let tty = std::io::stdout().is_terminal();
    let mut list = rt.block_on(nodes(&r.mgmtd, &ccfg))?;
    let mut before = rt.block_on(sample(&list, &ccfg));
    let mut t0 = Instant::now();
    let mut reports = 0u64;
    while a.count.is_none_or(|c| reports < c) {
        std::thread::sleep(Duration::from_secs_f64(a.interval));
        let now = rt.block_on(sample(&list, &ccfg));
        let secs = t0.elapsed().as_secs_f64();
        t0 = Instant::now();
        let report = build(&list, &before, &now, secs, &a);
        if a.conn.json {
            println!("{}", serde_json::to_string(&report)?);
        } else {
            if tty {
                print!("\x1b[2J\x1b[H");
            }
            show(&report, &a);
        }
        reports += 1;
        before = now;
        // Nodes that joined since: from the next report on.
        if let Ok(l) = rt.block_on(nodes(&r.mgmtd, &ccfg)) {
            if l.len() != list.len() {
                before = rt.block_on(sample(&l, &ccfg));
                t0 = Instant::now();
                list = l;
            }
        }
    }
    Ok(())
}

fn build(
    list: &[Node],
    before: &[Option<Counters>],
    now: &[Option<Counters>],
    secs: f64,
    a: &StatsArgs,
) -> serde_json::Value {
    let mut nodes = Vec::new();
    let mut targets = Vec::new();
    let (mut users, mut clients): (BTreeMap<String, f64>, BTreeMap<String, f64>) = Default::default();
    for ((n, b), c) in list.iter().zip(before).zip(now) {
        let (Some(b), Some(c)) = (b, c) else {
            nodes.push(serde_json::json!({ "node": n.name, "addr": n.addr, "reachable": false }));
            continue;
        };
        let ops = rates(&c.ops, &b.ops, secs);
        let total: f64 = ops.values().sum();
        let mut top: Vec<(&String, &f64)> = ops.iter().filter(|(_, v)| **v > 0.0).collect();
        top.sort_by(|x, y| y.1.total_cmp(x.1));
        top.truncate(a.top);
        nodes.push(serde_json::json!({
            "node": n.name,
            "addr": n.addr,
            "reachable": true,
            "ops_per_s": total,
            "ops": top.iter().map(|(k, v)| (k.to_string(), **v)).collect::<BTreeMap<String, f64>>(),
            "received_bytes_per_s": (c.received - b.received).max(0.0) / secs,
            "sent_bytes_per_s": (c.sent - b.sent).max(0.0) / secs,
        }));
        let t = rates(&c.targets, &b.targets, secs);
        let ids: std::collections::BTreeSet<&String> = t.keys().map(|(id, _)| id).collect();
        for id in ids {
            let get = |d: &str| t.get(&(id.clone(), d.to_string())).copied().unwrap_or(0.0);
            targets.push(serde_json::json!({
                "target": id.parse::<u64>().unwrap_or(0), "node": n.name,
                "read_bytes_per_s": get("read"), "write_bytes_per_s": get("write"),
            }));
        }
        for (k, v) in rates(&c.users, &b.users, secs) {
            *users.entry(k).or_default() += v;
        }
        for (k, v) in rates(&c.clients, &b.clients, secs) {
            *clients.entry(k).or_default() += v;
        }
    }
    let ranked = |m: BTreeMap<String, f64>, key: &str| {
        let mut v: Vec<(String, f64)> = m.into_iter().filter(|(_, r)| *r > 0.0).collect();
        v.sort_by(|x, y| y.1.total_cmp(&x.1));
        v.truncate(a.top);
        v.into_iter().map(|(k, r)| serde_json::json!({ key: k, "ops_per_s": r })).collect::<Vec<_>>()
    };
    let mut out = serde_json::json!({
        "time_unix": std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0),
        "interval_s": secs,
        "nodes": nodes,
        "targets": targets,
    });
    if a.per_user {
        out["users"] = serde_json::json!(ranked(users, "uid"));
    }
    if a.per_client {
        out["clients"] = serde_json::json!(ranked(clients, "client"));
    }
    out
}

fn show(r: &serde_json::Value, a: &StatsArgs) {
    let mb = |v: &serde_json::Value| format!("{:.1}", v.as_f64().unwrap_or(0.0) / 1e6);
    let n1 = |v: &serde_json::Value| format!("{:.1}", v.as_f64().unwrap_or(0.0));
    println!("hivefs stats: every {:.1} s", r["interval_s"].as_f64().unwrap_or(0.0));
    if a.per_user || a.per_client {
        let (key, head, list) =
            if a.per_user { ("uid", "USER", &r["users"]) } else { ("client", "CLIENT", &r["clients"]) };
        let rows: Vec<Vec<String>> = list
            .as_array()
            .into_iter()
            .flatten()
            .map(|u| vec![u[key].as_str().unwrap_or("").to_string(), n1(&u["ops_per_s"])])
            .collect();
        print_table(&[head, "OPS/S"], &rows);
        return;
    }
    let rows: Vec<Vec<String>> = r["nodes"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|n| {
            if n["reachable"] == false {
                return vec![
                    n["node"].as_str().unwrap_or("").into(),
                    n["addr"].as_str().unwrap_or("").into(),
                    "no answer".into(),
                ];
            }
            let ops: Vec<String> = n["ops"]
                .as_object()
                .map(|o| {
                    let mut v: Vec<(&String, f64)> = o.iter().map(|(k, x)| (k, x.as_f64().unwrap_or(0.0))).collect();
                    v.sort_by(|x, y| y.1.total_cmp(&x.1));
                    v.iter().map(|(k, x)| format!("{k} {x:.0}")).collect()
                })
                .unwrap_or_default();
            vec![
                n["node"].as_str().unwrap_or("").into(),
                n["addr"].as_str().unwrap_or("").into(),
                n1(&n["ops_per_s"]),
                mb(&n["received_bytes_per_s"]),
                mb(&n["sent_bytes_per_s"]),
                ops.join(", "),
            ]
        })
        .collect();
    print_table(&["NODE", "ADDRESS", "OPS/S", "IN MB/S", "OUT MB/S", "OPERATIONS/S"], &rows);
    let rows: Vec<Vec<String>> = r["targets"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|t| {
            vec![
                t["target"].to_string(),
                t["node"].as_str().unwrap_or("").into(),
                mb(&t["read_bytes_per_s"]),
                mb(&t["write_bytes_per_s"]),
            ]
        })
        .collect();
    if !rows.is_empty() {
        println!();
        print_table(&["TARGET", "NODE", "READ MB/S", "WRITE MB/S"], &rows);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exposition_text_parses() {
        let t = "# HELP x\n# TYPE x counter\nhivefs_requests_total{service=\"meta\",op=\"Mkdir\"} 5\n\
                 hivefs_target_io_bytes_total{service=\"storage\",target=\"3\",direction=\"write\"} 4096\n\
                 hivefs_cpu_seconds_total{service=\"meta\"} 0.25\nodd{k=\"a\\\"b\"} 1\n";
        let s = parse(t);
        assert_eq!(s.len(), 4);
        assert_eq!(s[0].labels["op"], "Mkdir");
        assert_eq!(s[3].labels["k"], "a\"b");
        let c = counters(t);
        assert_eq!(c.ops["Mkdir"], 5.0);
        assert_eq!(c.targets[&("3".to_string(), "write".to_string())], 4096.0);
        let before = BTreeMap::from([("Mkdir".to_string(), 1.0)]);
        assert_eq!(rates(&c.ops, &before, 2.0)["Mkdir"], 2.0);
    }
}
