//! Modification events through the real pieces: a scripted sequence of operations on a
//! mount over two metadata nodes (so some are cross-node), read back with `hivefs events`,
//! complete and in order per node; `--follow` delivers a new one as it happens.

mod common;

use common::*;
use std::collections::BTreeMap;
use std::io::BufRead;
use std::process::{Command, Stdio};
use std::time::Duration;

fn sh(fs: &TestFs, script: &str) {
    let o = Command::new("sh").arg("-c").arg(script).current_dir(&fs.mnt).output().unwrap();
    assert!(o.status.success(), "{script}: {}", String::from_utf8_lossy(&o.stderr));
}

#[test]
fn a_scripted_sequence_arrives_complete_and_in_order_per_node() {
    let fs = TestFs::up(&["--meta", "2", "--meta-chooser", "roundrobin"]);
    // (kind, name or new name) of each step with a name, in the order done.
    let steps = [
        ("mkdir A", ("mkdir", "A")),
        ("mkdir B", ("mkdir", "B")),
        ("echo hello > A/f", ("create", "f")),
        ("setfattr -n user.k -v v A/f", ("setxattr", "user.k")),
        ("truncate -s 3 A/f", ("", "")),
        ("chmod 600 A/f", ("", "")),
        ("ln A/f B/g", ("link", "g")),
        ("mv B/g A/h", ("rename", "h")),
        ("ln -s f A/s", ("symlink", "s")),
        ("rm A/h", ("unlink", "h")),
        ("rm A/s", ("unlink", "s")),
        ("rmdir B", ("rmdir", "B")),
    ];
    for (script, _) in &steps {
        sh(&fs, script);
    }
    let out = hivefs_ok(&["events", "--mount", fs.mnt_s(), "--json"]);
    let events: Vec<serde_json::Value> = out.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert!(events.iter().all(|e| e.get("notice").is_none()), "{out}");
    // Per node: numbered 1, 2, 3, ... with nothing missing.
    let mut by_node: BTreeMap<u64, Vec<&serde_json::Value>> = BTreeMap::new();
    for e in &events {
        by_node.entry(e["node"].as_u64().unwrap()).or_default().push(e);
    }
    for (node, evs) in &by_node {
        let seqs: Vec<u64> = evs.iter().map(|e| e["seq"].as_u64().unwrap()).collect();
        assert_eq!(seqs, (1..=seqs.len() as u64).collect::<Vec<_>>(), "node {node}: {out}");
    }
    // Every named step once, and on each node in the order they were done.
    let key = |e: &serde_json::Value| {
        let name = match e["kind"].as_str().unwrap() {
            "link" | "rename" => e["new_name"].as_str().unwrap(),
            _ => e["name"].as_str().unwrap(),
        };
        (e["kind"].as_str().unwrap().to_string(), name.to_string())
    };
    for (i, (script, (kind, name))) in steps.iter().enumerate().filter(|(_, s)| !s.1 .0.is_empty()) {
        let found: Vec<_> = events.iter().filter(|e| key(e) == (kind.to_string(), name.to_string())).collect();
        assert_eq!(found.len(), 1, "step {i} `{script}`: {found:?}\n{out}");
    }
    for (node, evs) in &by_node {
        let order: Vec<usize> = evs
            .iter()
            .filter_map(|e| {
                steps.iter().position(|(_, (k, n))| !k.is_empty() && (k.to_string(), n.to_string()) == key(e))
            })
            .collect();
        assert!(order.windows(2).all(|w| w[0] < w[1]), "node {node} out of order: {order:?}\n{out}");
    }
    // Entry-only changes: the close after the write, the truncate and the chmod.
    for kind in ["close_write", "truncate", "setattr"] {
        assert!(events.iter().any(|e| e["kind"] == kind && !e["entry"].is_null()), "no {kind}: {out}");
    }
    let create = events.iter().find(|e| e["kind"] == "create").unwrap();
    assert_eq!(create["uid"], 0, "{create}");
    assert!(!create["entry"].is_null(), "a create names the new entry: {create}");
    // The two nodes both had work (directories alternate between them).
    assert_eq!(by_node.len(), 2, "{out}");
}

#[test]
fn follow_delivers_new_events_as_they_happen() {
    let fs = TestFs::up(&[]);
    sh(&fs, "mkdir before");
    let mut child = Command::new(hivefs_bin())
        .args(["events", "--follow", "--json", "--mount", fs.mnt_s()])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    // It starts from now: what was before is not printed, what comes is (a new
    // directory each round: the first may come before the follower took its position).
    let mut seen = Vec::new();
    let mut n = 0;
    wait_for("the follower to print a new directory", Duration::from_secs(20), || {
        n += 1;
        sh(&fs, &format!("mkdir after{n}"));
        std::thread::sleep(Duration::from_millis(100));
        while let Ok(l) = rx.try_recv() {
            seen.push(l);
        }
        seen.iter().any(|l| l.contains("\"name\":\"after"))
    });
    let _ = child.kill();
    let _ = child.wait();
    assert!(!seen.iter().any(|l| l.contains("\"name\":\"before\"")), "{seen:?}");
}
