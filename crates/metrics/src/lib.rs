//! Metrics of a HiveFS process: every metric's name and meaning (this file is the
//! catalogue, `docs/operations.md` and `dist/grafana/` build on its names), the
//! bounded per-user and per-client label sets, and the HTTP endpoint that serves them
//! in Prometheus text format (`metrics_listen`).
//!
//! Metrics are process-wide statics: a process is one service (or one mount), named
//! once with [`set_service`]; every series carries it as the `service` label. The hot
//! path only increments atomics (a counter or histogram found in a label map under a
//! read lock); the text is built when scraped, after the refresh hooks
//! ([`on_scrape`]) have set the gauges that are read from elsewhere (memory, space).
//!
//! It must not know the services' internals: services call it, never the reverse.

#![forbid(unsafe_code)]

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;
use std::collections::BTreeSet;
use std::sync::atomic::AtomicU64;
use std::sync::{LazyLock, Mutex, OnceLock};
use std::time::Duration;

mod http;
pub use http::serve;

/// Distinct users (and clients) that get a series of their own; the rest are counted as
/// `other`, so a million users cannot blow up the label set.
pub const TOP_N: usize = 100;

static SERVICE: OnceLock<&'static str> = OnceLock::new();

/// `HIVEFS_METRICS=off` in a process's environment: nothing is recorded (the endpoint
/// still answers, with process figures only). For measuring what recording costs.
static OFF: LazyLock<bool> = LazyLock::new(|| std::env::var("HIVEFS_METRICS").is_ok_and(|v| v == "off"));

/// Whether metrics are recorded in this process.
pub fn enabled() -> bool {
    !*OFF
}

/// Names this process's service (mgmtd, meta, storage, mount, ...); the first call wins.
pub fn set_service(name: &'static str) {
    let _ = SERVICE.set(name);
    // Series that exist from the start, at 0, so that dashboards and alerts see them.
    for kind in ["admission", "handshake", "bad_frame"] {
        let _ = metrics().refusals.get_or_create(&KindLabels { service: service(), kind });
    }
}

pub fn service() -> &'static str {
    SERVICE.get().copied().unwrap_or("hivefs")
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OpLabels {
    pub service: &'static str,
    pub op: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KeyLabels {
    pub service: &'static str,
    pub key: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabels {
    pub service: &'static str,
    pub kind: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TargetLabels {
    pub service: &'static str,
    pub target: String,
    pub direction: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SpaceLabels {
    pub service: &'static str,
    pub target: String,
    pub node: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StateLabels {
    pub service: &'static str,
    pub kind: &'static str,
    pub state: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ServiceLabels {
    pub service: &'static str,
}

fn latency_histogram() -> Histogram {
    // 25 us to ~13 s.
    Histogram::new(exponential_buckets(25e-6, 2.0, 20))
}

fn batch_histogram() -> Histogram {
    Histogram::new(exponential_buckets(1.0, 2.0, 12))
}

type OpCounters = Family<OpLabels, Counter>;
type OpHistograms = Family<OpLabels, Histogram, fn() -> Histogram>;

/// Every metric of a process (see each field's help text in [`registry`]).
pub struct Metrics {
    pub requests: OpCounters,
    pub request_errors: OpCounters,
    pub request_seconds: OpHistograms,
    pub requests_in_flight: Family<ServiceLabels, Gauge>,
    pub request_bytes_held: Family<ServiceLabels, Gauge>,
    pub bytes_received: Family<ServiceLabels, Counter>,
    pub bytes_sent: Family<ServiceLabels, Counter>,
    pub connections: Family<ServiceLabels, Gauge>,
    pub refusals: Family<KindLabels, Counter>,
    pub by_client: Family<KeyLabels, Counter>,
    pub by_user: Family<KeyLabels, Counter>,
    pub calls: OpCounters,
    pub call_errors: OpCounters,
    pub call_seconds: OpHistograms,
    pub commit_batch_ops: Family<ServiceLabels, Histogram, fn() -> Histogram>,
    pub commit_seconds: Family<ServiceLabels, Histogram, fn() -> Histogram>,
    pub target_bytes: Family<TargetLabels, Counter>,
    pub target_total_bytes: Family<SpaceLabels, Gauge<u64, AtomicU64>>,
    pub target_free_bytes: Family<SpaceLabels, Gauge<u64, AtomicU64>>,
    pub client_bytes: Family<KindLabels, Counter>,
    pub nodes: Family<StateLabels, Gauge>,
    pub targets: Family<StateLabels, Gauge>,
    pub events: Family<KindLabels, Counter>,
    pub append_locks_let_go: Family<KindLabels, Counter>,
    pub resident_bytes: Family<ServiceLabels, Gauge<u64, AtomicU64>>,
    pub cpu_seconds: Family<ServiceLabels, Counter<f64, std::sync::atomic::AtomicU64>>,
    pub build_info: Family<KeyLabels, Gauge>,
}

static METRICS: LazyLock<Metrics> = LazyLock::new(|| Metrics {
    requests: Family::default(),
    request_errors: Family::default(),
    request_seconds: Family::new_with_constructor(latency_histogram),
    requests_in_flight: Family::default(),
    request_bytes_held: Family::default(),
    bytes_received: Family::default(),
    bytes_sent: Family::default(),
    connections: Family::default(),
    refusals: Family::default(),
    by_client: Family::default(),
    by_user: Family::default(),
    calls: Family::default(),
    call_errors: Family::default(),
    call_seconds: Family::new_with_constructor(latency_histogram),
    commit_batch_ops: Family::new_with_constructor(batch_histogram),
    commit_seconds: Family::new_with_constructor(latency_histogram),
    target_bytes: Family::default(),
    target_total_bytes: Family::default(),
    target_free_bytes: Family::default(),
    client_bytes: Family::default(),
    nodes: Family::default(),
    targets: Family::default(),
    events: Family::default(),
    append_locks_let_go: Family::default(),
    resident_bytes: Family::default(),
    cpu_seconds: Family::default(),
    build_info: Family::default(),
});

/// The process's metrics.
pub fn metrics() -> &'static Metrics {
    &METRICS
}

/// The registry: every metric with its name and help (names get the `hivefs_` prefix;
/// counters get `_total`).
fn registry() -> &'static Registry {
    static REG: LazyLock<Registry> = LazyLock::new(|| {
        let m = metrics();
        let mut r = Registry::with_prefix("hivefs");
        r.register("requests", "Requests served, by message type", m.requests.clone());
        r.register("request_errors", "Requests answered with an error, by message type", m.request_errors.clone());
        r.register(
            "request_duration_seconds",
            "Time from a request's arrival to its answer, by message type",
            m.request_seconds.clone(),
        );
        r.register("requests_in_flight", "Requests being served now (the request queue)", m.requests_in_flight.clone());
        r.register(
            "request_bytes_held",
            "Bytes of requests held now against the server's budget (max_request_bytes)",
            m.request_bytes_held.clone(),
        );
        r.register("received_bytes", "Payload bytes received with requests", m.bytes_received.clone());
        r.register("sent_bytes", "Payload bytes sent with answers", m.bytes_sent.clone());
        r.register("connections", "Authenticated connections open now", m.connections.clone());
        r.register("refusals", "Connections and frames refused, by kind", m.refusals.clone());
        r.register(
            "client_requests",
            "Requests served per client address (the first 100 addresses; the rest as key=other)",
            m.by_client.clone(),
        );
        r.register(
            "user_requests",
            "Namespace requests served per user id (the first 100 users; the rest as key=other)",
            m.by_user.clone(),
        );
        r.register("calls", "Requests this process sent to other services, by message type", m.calls.clone());
        r.register("call_errors", "Requests sent that failed, by message type", m.call_errors.clone());
        r.register(
            "call_duration_seconds",
            "Time of a request sent to another service until its answer (retries included), by message type",
            m.call_seconds.clone(),
        );
        r.register(
            "commit_batch_operations",
            "Operations per metadata journal batch (group commit)",
            m.commit_batch_ops.clone(),
        );
        r.register("commit_duration_seconds", "Time to append (and sync) a journal batch", m.commit_seconds.clone());
        r.register(
            "target_io_bytes",
            "Chunk bytes read and written per storage target (by its service for requests over the network, by a client on its host for short-circuit I/O)",
            m.target_bytes.clone(),
        );
        r.register("target_capacity_bytes", "Size of a storage target's file system", m.target_total_bytes.clone());
        r.register("target_free_bytes", "Free bytes of a storage target", m.target_free_bytes.clone());
        r.register("client_io_bytes", "File bytes read and written by this client", m.client_bytes.clone());
        r.register("nodes", "Registered nodes, by type and reachability (mgmtd)", m.nodes.clone());
        r.register("targets", "Registered storage targets, by reachability (mgmtd)", m.targets.clone());
        r.register("events", "File-system modification events, by outcome", m.events.clone());
        r.register(
            "append_locks_let_go",
            "Append locks a client kept between appends and let go, by why: revoked (another client asked), \
             refused (a confirmation refused: another client waits), expired (unused for its hold), closed (the \
             file's last handle closed), waited (granted too late to keep), late (a confirmation answered too \
             late), failed (an append failed)",
            m.append_locks_let_go.clone(),
        );
        r.register("resident_memory_bytes", "Resident memory of the process (VmRSS)", m.resident_bytes.clone());
        r.register("cpu_seconds", "CPU time of the process (user and system)", m.cpu_seconds.clone());
        r.register("build_info", "Version of the running binary (key)", m.build_info.clone());
        r
    });
    &REG
}

type Hook = Box<dyn Fn() + Send + Sync>;
static HOOKS: Mutex<Vec<Hook>> = Mutex::new(Vec::new());

/// Runs `hook` before every scrape (to set gauges read from elsewhere).
pub fn on_scrape(hook: impl Fn() + Send + Sync + 'static) {
    HOOKS.lock().unwrap_or_else(|e| e.into_inner()).push(Box::new(hook));
}

/// The text a scrape gets (Prometheus text format 0.0.4).
pub fn render() -> String {
    refresh_process();
    for h in HOOKS.lock().unwrap_or_else(|e| e.into_inner()).iter() {
        h();
    }
    let mut s = String::new();
    // Writing into a String cannot fail.
    let _ = prometheus_client::encoding::prometheus_text::encode(&mut s, registry());
    s
}

fn refresh_process() {
    let m = metrics();
    let svc = ServiceLabels { service: service() };
    if let Ok(status) = std::fs::read_to_string("/proc/self/status") {
        if let Some(kib) = status
            .lines()
            .find(|l| l.starts_with("VmRSS:"))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse::<u64>().ok())
        {
            m.resident_bytes.get_or_create(&svc).set(kib * 1024);
        }
    }
    if let Ok(stat) = std::fs::read_to_string("/proc/self/stat") {
        // utime and stime are fields 14 and 15; fields after the command name.
        let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
        let f: Vec<&str> = rest.split_whitespace().collect();
        let ticks: u64 = [11, 12].iter().filter_map(|&i| f.get(i).and_then(|v| v.parse::<u64>().ok())).sum();
        let secs = ticks as f64 / 100.0;
        let c = m.cpu_seconds.get_or_create(&svc);
        let now = c.get();
        if secs > now {
            c.inc_by(secs - now);
        }
    }
    m.build_info.get_or_create(&KeyLabels { service: service(), key: env!("CARGO_PKG_VERSION").into() }).set(1);
}

/// A set of at most [`TOP_N`] keys that keep their own series; others map to `other`.
pub struct Bounded {
    seen: Mutex<BTreeSet<String>>,
}

impl Bounded {
    pub const fn new() -> Bounded {
        Bounded { seen: Mutex::new(BTreeSet::new()) }
    }

    /// `key` itself when it has a series or there is room for one, else `other`.
    pub fn label(&self, key: &str) -> String {
        let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        if seen.contains(key) || (seen.len() < TOP_N && seen.insert(key.to_string())) {
            key.to_string()
        } else {
            "other".to_string()
        }
    }
}

impl Default for Bounded {
    fn default() -> Self {
        Self::new()
    }
}

static USERS: Bounded = Bounded::new();
static CLIENTS: Bounded = Bounded::new();

/// The series of one message type, found once per thread ([`with_op`]).
#[derive(Clone)]
struct OpSeries {
    count: Counter,
    errors: Counter,
    seconds: Histogram,
}

impl OpSeries {
    fn record(&self, took: Duration, ok: bool) {
        self.count.inc();
        if !ok {
            self.errors.inc();
        }
        self.seconds.observe(took.as_secs_f64());
    }
}

thread_local! {
    /// Per thread: the series of each message type served (keyed by the name's address
    /// and length: names are `&'static str`, and the compiler may place one name at the
    /// start of another, as "UpdateSize" in "UpdateSizeIf") and sent, and of each user,
    /// so that the hot path takes no lock and hashes no label set.
    static SERVED: std::cell::RefCell<std::collections::HashMap<(usize, usize), OpSeries>> = Default::default();
    static CALLED: std::cell::RefCell<std::collections::HashMap<(usize, usize), OpSeries>> = Default::default();
    static BY_USER: std::cell::RefCell<std::collections::HashMap<u32, Counter>> = Default::default();
}

fn with_op(
    cache: &'static std::thread::LocalKey<std::cell::RefCell<std::collections::HashMap<(usize, usize), OpSeries>>>,
    served: bool,
    op: &'static str,
    f: impl FnOnce(&OpSeries),
) {
    cache.with(|c| {
        let mut c = c.borrow_mut();
        let s = c.entry((op.as_ptr() as usize, op.len())).or_insert_with(|| {
            let m = metrics();
            let l = OpLabels { service: service(), op };
            let (count, errors, seconds) = if served {
                (&m.requests, &m.request_errors, &m.request_seconds)
            } else {
                (&m.calls, &m.call_errors, &m.call_seconds)
            };
            OpSeries {
                count: count.get_or_create_owned(&l),
                errors: errors.get_or_create_owned(&l),
                seconds: seconds.get_or_create_owned(&l),
            }
        });
        f(s)
    })
}

/// A service-wide counter, found once.
fn service_counter(f: &Family<ServiceLabels, Counter>) -> Counter {
    f.get_or_create_owned(&ServiceLabels { service: service() })
}

/// The counter of requests from client address `client` (kept by its connection).
pub fn client_counter(client: &str) -> Counter {
    metrics().by_client.get_or_create_owned(&KeyLabels { service: service(), key: CLIENTS.label(client) })
}

/// One request served: its type, time, outcome, payload bytes, client and user.
pub fn served(
    op: &'static str,
    took: Duration,
    ok: bool,
    bytes_in: usize,
    bytes_out: usize,
    client: &Counter,
    uid: Option<u32>,
) {
    if *OFF {
        return;
    }
    with_op(&SERVED, true, op, |s| s.record(took, ok));
    static RECEIVED: LazyLock<Counter> = LazyLock::new(|| service_counter(&metrics().bytes_received));
    static SENT: LazyLock<Counter> = LazyLock::new(|| service_counter(&metrics().bytes_sent));
    if bytes_in > 0 {
        RECEIVED.inc_by(bytes_in as u64);
    }
    if bytes_out > 0 {
        SENT.inc_by(bytes_out as u64);
    }
    client.inc();
    if let Some(uid) = uid {
        BY_USER.with(|u| {
            u.borrow_mut()
                .entry(uid)
                .or_insert_with(|| {
                    metrics()
                        .by_user
                        .get_or_create_owned(&KeyLabels { service: service(), key: USERS.label(&uid.to_string()) })
                })
                .inc();
        });
    }
}

/// One request sent to another service (retries included).
pub fn called(op: &'static str, took: Duration, ok: bool) {
    if *OFF {
        return;
    }
    with_op(&CALLED, false, op, |s| s.record(took, ok));
}

/// Adds `delta` (+1 / -1) to a gauge of this service.
pub fn gauge_add(g: &Family<ServiceLabels, Gauge>, delta: i64) {
    g.get_or_create(&ServiceLabels { service: service() }).inc_by(delta);
}

/// Counts one refusal of `kind`.
pub fn refused(kind: &'static str) {
    metrics().refusals.get_or_create(&KindLabels { service: service(), kind }).inc();
}

/// Chunk bytes read from or written to a target.
pub fn target_io(target: u32, direction: &'static str, bytes: u64) {
    if *OFF {
        return;
    }
    thread_local! {
        static TARGETS: std::cell::RefCell<std::collections::HashMap<(u32, &'static str), Counter>> = Default::default();
    }
    TARGETS.with(|t| {
        t.borrow_mut()
            .entry((target, direction))
            .or_insert_with(|| {
                metrics().target_bytes.get_or_create_owned(&TargetLabels {
                    service: service(),
                    target: target.to_string(),
                    direction,
                })
            })
            .inc_by(bytes);
    });
}

/// File bytes this client read or wrote.
pub fn client_io(direction: &'static str, bytes: u64) {
    if *OFF {
        return;
    }
    static READ: LazyLock<Counter> = LazyLock::new(|| client_bytes("read"));
    static WRITE: LazyLock<Counter> = LazyLock::new(|| client_bytes("write"));
    match direction {
        "read" => READ.inc_by(bytes),
        _ => WRITE.inc_by(bytes),
    };
}

fn client_bytes(kind: &'static str) -> Counter {
    metrics().client_bytes.get_or_create_owned(&KindLabels { service: service(), kind })
}

/// Sets the space gauges of target `target` on node `node`.
pub fn target_space(target: u32, node: u32, total: u64, free: u64) {
    let m = metrics();
    let l = SpaceLabels { service: service(), target: target.to_string(), node: node.to_string() };
    m.target_total_bytes.get_or_create(&l).set(total);
    m.target_free_bytes.get_or_create(&l).set(free);
}

/// Sets the number of nodes (kind = node type) or targets (kind = "storage") in `state`.
pub fn registered(nodes: bool, kind: &'static str, state: &'static str, n: usize) {
    let m = metrics();
    let f = if nodes { &m.nodes } else { &m.targets };
    f.get_or_create(&StateLabels { service: service(), kind, state }).set(n as i64);
}

/// A modification event published (`emitted`) or dropped from a full buffer.
pub fn event(emitted: bool) {
    let kind = if emitted { "emitted" } else { "dropped" };
    metrics().events.get_or_create(&KindLabels { service: service(), kind }).inc();
}

/// A client let a kept append lock go, for reason `why`.
pub fn append_lock_let_go(why: &'static str) {
    metrics().append_locks_let_go.get_or_create(&KindLabels { service: service(), kind: why }).inc();
}

/// One metadata journal batch.
pub fn committed(ops: usize, took: Duration) {
    if *OFF {
        return;
    }
    let m = metrics();
    let s = ServiceLabels { service: service() };
    m.commit_batch_ops.get_or_create(&s).observe(ops as f64);
    m.commit_seconds.get_or_create(&s).observe(took.as_secs_f64());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_text_has_every_family_and_the_counts() {
        set_service("test");
        let client = client_counter("10.0.0.1");
        served("CreateFile", Duration::from_micros(80), true, 0, 0, &client, Some(1000));
        served("CreateFile", Duration::from_micros(120), false, 0, 0, &client, Some(1000));
        target_io(3, "write", 4096);
        committed(5, Duration::from_micros(50));
        let t = render();
        assert!(t.contains(r#"hivefs_requests_total{service="test",op="CreateFile"} 2"#), "{t}");
        assert!(t.contains(r#"hivefs_request_errors_total{service="test",op="CreateFile"} 1"#), "{t}");
        assert!(t.contains(r#"hivefs_user_requests_total{service="test",key="1000"} 2"#), "{t}");
        assert!(t.contains(r#"hivefs_client_requests_total{service="test",key="10.0.0.1"} 2"#), "{t}");
        assert!(t.contains(r#"hivefs_target_io_bytes_total{service="test",target="3",direction="write"} 4096"#), "{t}");
        assert!(t.contains("hivefs_commit_batch_operations_bucket"), "{t}");
        assert!(t.contains("# TYPE hivefs_request_duration_seconds histogram"), "{t}");
        assert!(t.contains("hivefs_resident_memory_bytes{service=\"test\"}"), "{t}");
    }

    #[test]
    fn a_name_at_the_start_of_another_counts_apart() {
        set_service("test");
        // As the compiler may lay out two names: one at the other's address.
        const LONG: &str = "PrefixedOpIf";
        let short: &'static str = &LONG[..10];
        called(LONG, Duration::from_micros(10), true);
        called(short, Duration::from_micros(10), true);
        called(short, Duration::from_micros(10), true);
        let t = render();
        assert!(t.contains(r#"hivefs_calls_total{service="test",op="PrefixedOpIf"} 1"#), "{t}");
        assert!(t.contains(r#"hivefs_calls_total{service="test",op="PrefixedOp"} 2"#), "{t}");
    }

    #[test]
    fn label_sets_stay_bounded() {
        let b = Bounded::new();
        for i in 0..TOP_N {
            assert_eq!(b.label(&i.to_string()), i.to_string());
        }
        assert_eq!(b.label("new"), "other");
        assert_eq!(b.label("0"), "0", "a key with a series keeps it");
    }
}
