//! `hivefs events`: the file-system modification events of every metadata node (what
//! changed, in commit order per node), once or as they happen (`--follow`), as text or
//! one JSON document per line. A gap in a node's numbering (its buffer overflowed while
//! nobody read) and a node's restart are reported as such.

use crate::admin::{resolve, Conn};
use anyhow::{anyhow, bail, Result};
use clap::Args;
use hivefs_net::{call_once, ClientConfig};
use hivefs_proto::{Event, Reply, Request, EVENTS_MAX};
use hivefs_types::ids::{NodeId, NodeType};
use std::io::Write;
use std::time::Duration;

#[derive(Args, Debug)]
pub struct EventsArgs {
    #[command(flatten)]
    pub conn: Conn,
    /// Keep reading: print events as they are committed, until interrupted.
    #[arg(long)]
    pub follow: bool,
    /// With --follow: start with the events the nodes still hold (default: only new ones).
    #[arg(long)]
    pub from_start: bool,
}

/// One node's stream position.
struct Stream {
    node: NodeId,
    addr: String,
    boot: Option<u64>,
    after: u64,
}

fn print(out: &mut impl Write, node: NodeId, e: &Event, json: bool) -> std::io::Result<()> {
    let name = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    let id = |x: Option<hivefs_types::ids::EntryId>| x.map(|i| i.to_string());
    if json {
        let v = serde_json::json!({
            "node": node.0, "seq": e.seq, "time_ns": e.time_ns, "kind": e.kind.name(),
            "entry": id(e.entry), "parent": id(e.parent), "name": name(&e.name),
            "new_parent": id(e.new_parent), "new_name": name(&e.new_name), "uid": e.uid,
        });
        writeln!(out, "{v}")
    } else {
        let mut line = format!(
            "{}.{:09} node {} #{} {}",
            e.time_ns / 1_000_000_000,
            e.time_ns % 1_000_000_000,
            node,
            e.seq,
            e.kind.name()
        );
        if let Some(i) = e.entry {
            line.push_str(&format!(" entry {i}"));
        }
        if let Some(p) = e.parent {
            line.push_str(&format!(" {p}/{}", name(&e.name)));
        } else if !e.name.is_empty() {
            line.push_str(&format!(" {}", name(&e.name)));
        }
        if let Some(p) = e.new_parent {
            line.push_str(&format!(" -> {p}/{}", name(&e.new_name)));
        }
        if let Some(u) = e.uid {
            line.push_str(&format!(" uid {u}"));
        }
        writeln!(out, "{line}")
    }
}

/// A notice about a stream (restart, lost events), on stderr, or as JSON on stdout.
fn notice(node: NodeId, what: &str, json: bool) {
    if json {
        println!("{}", serde_json::json!({ "node": node.0, "notice": what }));
    } else {
        eprintln!("node {node}: {what}");
    }
}

/// One poll of `s`: prints what came and moves the position on.
async fn poll(s: &mut Stream, ccfg: &ClientConfig, wait_ms: u32, json: bool) -> Result<usize> {
    let req = Request::Events { after: s.after, max: EVENTS_MAX, wait_ms };
    let r = call_once(&s.addr, ccfg, &req).await.map_err(|e| anyhow!("metadata node {} ({}): {e}", s.node, s.addr))?;
    let Reply::Events { boot, oldest, last, dropped, events, .. } = r else {
        bail!("metadata node {} ({}): unexpected answer", s.node, s.addr);
    };
    if s.boot.is_some_and(|b| b != boot) {
        notice(s.node, "restarted; its numbering starts again", json);
        s.after = 0;
        s.boot = Some(boot);
        return Ok(0);
    }
    s.boot = Some(boot);
    if s.after == u64::MAX {
        s.after = last;
        return Ok(0);
    }
    if s.after + 1 < oldest {
        notice(
            s.node,
            &format!(
                "events {} to {} were dropped before they were read ({dropped} dropped in all)",
                s.after + 1,
                oldest - 1
            ),
            json,
        );
    }
    let mut out = std::io::stdout().lock();
    for e in &events {
        print(&mut out, s.node, e, json)?;
    }
    out.flush()?;
    if let Some(e) = events.last() {
        s.after = e.seq;
    }
    Ok(events.len())
}

pub fn events(a: EventsArgs) -> Result<()> {
    let r = resolve(&a.conn)?;
    let json = a.conn.json;
    let ccfg = ClientConfig::new(r.secret).with_timeout(Duration::from_secs(15));
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let Reply::Nodes(nodes) = rt
        .block_on(call_once(&r.mgmtd, &ccfg, &Request::ListNodes { node_type: Some(NodeType::Meta) }))
        .map_err(|e| anyhow!("mgmtd {}: {e}", r.mgmtd))?
    else {
        bail!("mgmtd {}: unexpected answer", r.mgmtd);
    };
    let start = if a.follow && !a.from_start { u64::MAX } else { 0 };
    let streams: Vec<Stream> =
        nodes.into_iter().map(|n| Stream { node: n.id, addr: n.addr, boot: None, after: start }).collect();
    if !a.follow {
        return rt.block_on(async {
            for mut s in streams {
                // Until a node has nothing more (a poll returns at most EVENTS_MAX).
                while poll(&mut s, &ccfg, 0, json).await? > 0 {}
            }
            Ok(())
        });
    }
    rt.block_on(async {
        let mut tasks = tokio::task::JoinSet::new();
        for mut s in streams {
            let ccfg = ccfg.clone();
            tasks.spawn(async move {
                loop {
                    if let Err(e) = poll(&mut s, &ccfg, 5000, json).await {
                        // A node that is away: said once per failure, then tried again.
                        notice(s.node, &format!("{e:#}"), json);
                        tokio::time::sleep(Duration::from_secs(1)).await;
                    }
                }
            });
        }
        while tasks.join_next().await.is_some() {}
        Ok(())
    })
}
