//! Metrics through a real Prometheus server (Debian package `prometheus`): it scrapes
//! every service and the mount of `hivefs up`, and its HTTP API shows series from each,
//! with the counts of what the test did.

mod common;

use common::*;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

struct Prometheus(Child);

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `GET url` with curl; the body.
fn get(url: &str) -> Option<String> {
    let o =
        Command::new("curl").args(["-sf", "--max-time", "5", url]).output().expect("run curl (Debian package curl)");
    o.status.success().then(|| String::from_utf8_lossy(&o.stdout).into_owned())
}

/// An instant query: its whole answer.
fn query_raw(api: &str, q: &str) -> serde_json::Value {
    let url = format!("{api}/api/v1/query?query={}", urlencode(q));
    get(&url).and_then(|body| serde_json::from_str(&body).ok()).unwrap_or_default()
}

/// An instant query: (labels, value) of each series.
fn query(api: &str, q: &str) -> Vec<(serde_json::Value, f64)> {
    let v = query_raw(api, q);
    v["data"]["result"]
        .as_array()
        .map(|r| {
            r.iter()
                .map(|s| (s["metric"].clone(), s["value"][1].as_str().and_then(|x| x.parse().ok()).unwrap_or(f64::NAN)))
                .collect()
        })
        .unwrap_or_default()
}

fn urlencode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

#[test]
fn prometheus_scrapes_every_service_and_the_mount() {
    let fs = TestFs::up(&[]);
    // Some work for the counters.
    for i in 0..5 {
        std::fs::create_dir(fs.path(&format!("d{i}"))).unwrap();
    }
    let data = random_bytes(1, 3 << 20);
    std::fs::write(fs.path("d0/f"), &data).unwrap();
    assert_eq!(std::fs::read(fs.path("d0/f")).unwrap(), data);

    let st: serde_json::Value = serde_json::from_str(&hivefs_ok(&["status", "--dir", fs.dir_s(), "--json"])).unwrap();
    let mut targets = Vec::new();
    let mut texts = Vec::new();
    for s in st["services"].as_array().unwrap() {
        let url = s["metrics"].as_str().unwrap_or_else(|| panic!("{s} has no metrics endpoint"));
        let hostport = url.trim_start_matches("http://").trim_end_matches("/metrics");
        // The endpoint answers by itself too.
        let text = get(url).unwrap_or_else(|| panic!("{url} does not answer"));
        assert!(text.contains("# TYPE hivefs_resident_memory_bytes gauge"), "{url}: {text}");
        texts.push(text);
        targets.push(format!("'{hostport}'"));
    }
    assert_eq!(targets.len(), 5, "mgmtd, meta, 2 storage, mount");

    let tmp = tempfile::tempdir().unwrap();
    let cfg = tmp.path().join("prometheus.yml");
    std::fs::write(
        &cfg,
        format!(
            "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\nscrape_configs:\n  - job_name: hivefs\n    \
             static_configs:\n      - targets: [{}]\n",
            targets.join(", ")
        ),
    )
    .unwrap();
    let port = free_port();
    let child = Command::new("prometheus")
        .arg(format!("--config.file={}", cfg.display()))
        .arg(format!("--storage.tsdb.path={}", tmp.path().join("data").display()))
        .arg(format!("--web.listen-address=127.0.0.1:{port}"))
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(tmp.path().join("prometheus.log")).unwrap())
        .spawn()
        .expect("run prometheus (Debian package prometheus)");
    let _prom = Prometheus(child);
    let api = format!("http://127.0.0.1:{port}");

    // Every target scraped and up.
    wait_for("prometheus to scrape all 5 endpoints", Duration::from_secs(60), || {
        let up = query(&api, "up");
        up.len() == 5 && up.iter().all(|(_, v)| *v == 1.0)
    });
    // Series from every service.
    wait_for("series of every service", Duration::from_secs(30), || {
        let by = query(&api, r#"count by (service) ({__name__=~"hivefs_.+"})"#);
        let mut services: Vec<String> =
            by.iter().filter_map(|(m, _)| m["service"].as_str().map(str::to_string)).collect();
        services.sort();
        services == ["meta", "mgmtd", "mount", "storage"]
    });
    // What the test did, counted where it happened.
    let mkdirs = query(&api, r#"hivefs_requests_total{service="meta",op="Mkdir"}"#);
    assert_eq!(mkdirs.first().map(|s| s.1), Some(5.0), "{mkdirs:?}");
    let written = query(&api, r#"hivefs_client_io_bytes_total{service="mount",kind="write"}"#);
    assert!(written.first().is_some_and(|s| s.1 >= data.len() as f64), "{written:?}");
    // The mount wrote and read the chunk files itself (short-circuit): it counts that target I/O.
    let direct = query(&api, r#"sum(hivefs_target_io_bytes_total{service="mount",direction="write"})"#);
    assert!(direct.first().is_some_and(|s| s.1 >= data.len() as f64), "{direct:?}");
    let space = query(&api, r#"count(hivefs_target_free_bytes{service="mgmtd"})"#);
    assert_eq!(space.first().map(|s| s.1), Some(8.0), "mgmtd reports the space of all 8 targets: {space:?}");
    let online = query(&api, r#"hivefs_targets{service="mgmtd",state="online"}"#);
    assert_eq!(online.first().map(|s| s.1), Some(8.0), "{online:?}");
    let lat = query(&api, r#"sum(hivefs_request_duration_seconds_count{service="meta"})"#);
    assert!(lat.first().is_some_and(|s| s.1 > 0.0), "{lat:?}");

    // The Grafana dashboard's queries are valid and find series (names exist).
    let dash: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../dist/grafana/hivefs.json")).unwrap(),
    )
    .unwrap();
    for panel in dash["panels"].as_array().unwrap() {
        for t in panel["targets"].as_array().unwrap() {
            let expr = t["expr"].as_str().unwrap();
            let v = query_raw(&api, expr);
            assert_eq!(v["status"], "success", "panel {}: {expr}: {v}", panel["title"]);
            // Every metric name it uses is one the services export.
            for name in
                expr.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).filter(|w| w.starts_with("hivefs_"))
            {
                let base = name.trim_end_matches("_bucket").trim_end_matches("_sum").trim_end_matches("_count");
                assert!(
                    texts.iter().any(|t| t.contains(&format!("# TYPE {base} "))),
                    "panel {}: no service exports {name}",
                    panel["title"]
                );
            }
        }
    }
}

/// One JSON report of `hivefs stats` taken while `work` runs in another thread.
fn stats_during(fs: &TestFs, extra: &[&str], work: impl FnOnce() + Send + 'static) -> serde_json::Value {
    let t = std::thread::spawn(work);
    let (mgmtd, secret) = (fs.mgmtd_addr(), fs.secret().display().to_string());
    let mut args = vec!["stats", "--mgmtd", &mgmtd, "--secret-file", &secret, "--json"];
    args.extend(["--interval", "1.5", "--count", "1"]);
    args.extend(extra);
    let out = hivefs_ok(&args);
    t.join().unwrap();
    serde_json::from_str(out.lines().last().unwrap()).unwrap_or_else(|e| panic!("{e}: {out}"))
}

#[test]
fn stats_shows_operations_and_bytes_per_node_target_user_and_client() {
    let fs = TestFs::up(&["--storage", "1", "--targets-per-storage", "2"]);
    // Over TCP, so that the storage service sees the bytes (short-circuit I/O is counted
    // by the mount only).
    let m = fs.extra_mount("tcp", &["--no-short-circuit"]);
    let mnt = m.mnt.clone();
    let writer = move || {
        let end = std::time::Instant::now() + Duration::from_millis(2500);
        let mut i = 0;
        while std::time::Instant::now() < end {
            std::fs::write(mnt.join(format!("f{i}")), vec![7u8; 256 << 10]).unwrap();
            i += 1;
        }
    };
    let r = stats_during(&fs, &[], writer.clone());
    let nodes = r["nodes"].as_array().unwrap();
    let node = |prefix: &str| nodes.iter().find(|n| n["node"].as_str().unwrap().starts_with(prefix)).unwrap().clone();
    let meta = node("meta");
    let creates = ["CreateOpen", "CreateOpenHeld"].map(|op| meta["ops"][op].as_f64().unwrap_or(0.0));
    assert!(creates.iter().sum::<f64>() > 0.0, "{r:#}");
    let storage = node("storage");
    assert!(storage["ops"]["WriteChunk"].as_f64().unwrap_or(0.0) > 0.0, "{r:#}");
    assert!(storage["received_bytes_per_s"].as_f64().unwrap() > 100_000.0, "{r:#}");
    let targets = r["targets"].as_array().unwrap();
    assert_eq!(targets.len(), 2, "{r:#}");
    assert!(targets.iter().all(|t| t["write_bytes_per_s"].as_f64().unwrap() > 0.0), "{r:#}");

    let r = stats_during(&fs, &["--per-user"], writer.clone());
    let users = r["users"].as_array().unwrap();
    assert_eq!(users[0]["uid"], "0", "creates as root: {r:#}");
    assert!(users[0]["ops_per_s"].as_f64().unwrap() > 0.0);
    let r = stats_during(&fs, &["--per-client"], writer);
    assert!(r["clients"].as_array().unwrap().iter().any(|c| c["client"] == "127.0.0.1"), "{r:#}");
}
