//! Hostile peers against real `hivefs up` services: wrong or missing secrets,
//! connection floods, oversized, truncated and random frames, ids of extreme
//! values. Honest clients keep being served and memory stays bounded.

mod common;
use common::*;
use hivefs_net::{ClientConfig, Pool, Secret};
use hivefs_proto::{
    body_type_id, decode_body, encode_body, Caller, FrameHeader, FrameKind, Hello, Reply, Request, Response,
    BODY_VERSION, HEADER_LEN, MAX_BODY_LEN, MAX_PAYLOAD_LEN, PROTOCOL_VERSION,
};
use hivefs_types::ids::{EntryId, NodeType, TargetId};
use hivefs_types::ErrorCode;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Addresses of the services of a file system started by `hivefs up`.
struct Addrs {
    mgmtd: String,
    meta: String,
    storage: String,
}

fn addrs(fs: &TestFs) -> Addrs {
    let s = std::fs::read_to_string(fs.dir.join("fs.toml")).unwrap();
    let v: toml::Value = toml::from_str(&s).unwrap();
    let host = v["host"].as_str().unwrap();
    let port = |k: &str| v[k].as_array().unwrap()[0].as_integer().unwrap();
    Addrs {
        mgmtd: fs.mgmtd_addr(),
        meta: format!("{host}:{}", port("meta_ports")),
        storage: format!("{host}:{}", port("storage_ports")),
    }
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap()
}

fn client_cfg(secret: Option<Secret>) -> ClientConfig {
    let mut c = ClientConfig::new(secret);
    c.retries = 0;
    c
}

fn right_secret(fs: &TestFs) -> Secret {
    hivefs_net::load_secret(&fs.secret()).unwrap()
}

/// Writes a secret file with `mode` and returns its path.
fn secret_file(dir: &Path, name: &str, content: &str, mode: u32) -> std::path::PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, content).unwrap();
    std::fs::set_permissions(&p, std::os::unix::fs::PermissionsExt::from_mode(mode)).unwrap();
    p
}

fn frame(kind: FrameKind, request_id: u64, body: &[u8], payload: &[u8]) -> Vec<u8> {
    let h = FrameHeader {
        body_version: BODY_VERSION,
        kind,
        msg_type: body_type_id(body),
        flags: 0,
        request_id,
        body_len: body.len() as u32,
        payload_len: payload.len() as u32,
    };
    let mut v = h.encode().to_vec();
    v.extend_from_slice(body);
    v.extend_from_slice(payload);
    v
}

/// A header announcing `body_len` and `payload_len` bytes (the lengths are not checked here).
fn header_only(kind: FrameKind, body_len: u32, payload_len: u32) -> Vec<u8> {
    FrameHeader { body_version: BODY_VERSION, kind, msg_type: 0, flags: 0, request_id: 7, body_len, payload_len }
        .encode()
        .to_vec()
}

/// Reads one frame; `None` when the peer closed (EOF or reset) before a whole frame.
fn read_frame(s: &mut TcpStream) -> Option<(FrameHeader, Vec<u8>, Vec<u8>)> {
    let mut hb = [0u8; HEADER_LEN];
    s.read_exact(&mut hb).ok()?;
    let h = FrameHeader::decode(&hb).expect("the server sends valid headers");
    let mut body = vec![0u8; h.body_len as usize];
    s.read_exact(&mut body).ok()?;
    let mut payload = vec![0u8; h.payload_len as usize];
    s.read_exact(&mut payload).ok()?;
    Some((h, body, payload))
}

/// Reads until the server closes; panics if it keeps the connection open for 15 s.
fn expect_closed(s: &mut TcpStream, what: &str) -> Vec<u8> {
    s.set_read_timeout(Some(Duration::from_secs(15))).unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 8192];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return got,
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {
                panic!("{what}: the server kept the connection open")
            }
            Err(_) => return got, // reset
        }
    }
}

/// Connects and completes the handshake with `secret` (a wrong one gets the refusal back as `Err`).
fn raw_connect(addr: &str, secret: &Secret) -> Result<TcpStream, String> {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(15))).unwrap();
    let (_, body, _) = read_frame(&mut s).expect("server hello");
    let Ok(Hello::Server { nonce: server_nonce, .. }) = decode_body::<Hello>(&body) else {
        panic!("not a server hello")
    };
    let client_nonce = [42u8; 32];
    let mac = secret.mac(b"client", &server_nonce, &client_nonce);
    let hello = encode_body(&Hello::Client { protocol_version: PROTOCOL_VERSION, nonce: client_nonce, mac });
    s.write_all(&frame(FrameKind::Hello, 0, &hello, &[])).unwrap();
    let (_, body, _) = read_frame(&mut s).ok_or("closed during the handshake")?;
    match decode_body::<Hello>(&body) {
        Ok(Hello::Accepted { .. }) => Ok(s),
        Ok(Hello::Refused { reason }) => Err(reason),
        other => panic!("unexpected handshake reply {other:?}"),
    }
}

fn decode_response(body: &[u8]) -> Response {
    decode_body::<Response>(body).expect("a well-formed response")
}

/// Runs a hivefs command that must refuse to start; kills it (and fails) if it keeps running.
fn must_refuse(args: &[&str], needle: &str) {
    let mut child = Command::new(hivefs_bin())
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let start = Instant::now();
    loop {
        if child.try_wait().unwrap().is_some() {
            break;
        }
        if start.elapsed() > Duration::from_secs(20) {
            let _ = child.kill();
            let _ = child.wait();
            panic!("hivefs {args:?} kept running instead of refusing to start");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "hivefs {args:?} must fail");
    assert!(err.contains(needle), "hivefs {args:?}: expected {needle:?} in:\n{err}");
}

#[test]
fn wrong_secret_is_refused() {
    let fs = TestFs::up(&["--storage", "1", "--targets-per-storage", "2"]);
    let a = addrs(&fs);
    let tmp = tempfile::tempdir().unwrap();
    let wrong_path = secret_file(tmp.path(), "wrong", "not-the-secret\n", 0o600);
    let wrong = hivefs_net::load_secret(&wrong_path).unwrap();
    let right = right_secret(&fs);
    let target = TargetId(*fs.target_dirs().keys().min().unwrap() as u32);
    let intruder = EntryId { node: 0xdead, epoch: 1, counter: 1 };

    let e = hivefs(&["nodes", "--mgmtd", &a.mgmtd, "--secret-file", wrong_path.to_str().unwrap()]);
    assert!(!e.status.success());
    assert!(String::from_utf8_lossy(&e.stderr).contains("authentication failed"), "{e:?}");

    // Requests that would change each service's state, with a wrong secret and with none.
    let attempts: Vec<(&str, &str, Request, Vec<u8>)> = vec![
        (
            "mgmtd",
            &a.mgmtd,
            Request::RegisterNode {
                node_type: NodeType::Storage,
                uuid: "intruder-uuid".into(),
                addr: "127.0.0.1:1".into(),
                hostname: "intruder".into(),
            },
            Vec::new(),
        ),
        (
            "meta",
            &a.meta,
            Request::Mkdir {
                parent: EntryId::ROOT,
                name: b"intruder".to_vec(),
                mode: 0o777,
                caller: Caller::default(),
            },
            Vec::new(),
        ),
        ("storage", &a.storage, Request::WriteChunk { target, entry: intruder, offset: 0 }, b"intruder".to_vec()),
    ];
    let rt = rt();
    for (name, addr, req, payload) in &attempts {
        for (label, secret) in [("wrong secret", Some(wrong.clone())), ("no secret", None)] {
            let pool = Pool::new(*addr, client_cfg(secret));
            let e = rt.block_on(pool.call(req, payload.clone())).expect_err("must be refused");
            assert_eq!(e.code, ErrorCode::Auth, "{name}, {label}: {e}");
            println!("{name}, {label}: {e}");
        }
        // A raw peer with a wrong MAC that sends its request anyway gets a
        // refusal and a closed connection, never a response.
        let mut s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(15))).unwrap();
        let (_, body, _) = read_frame(&mut s).expect("server hello");
        assert!(matches!(decode_body::<Hello>(&body), Ok(Hello::Server { auth_required: true, .. })));
        let hello =
            encode_body(&Hello::Client { protocol_version: PROTOCOL_VERSION, nonce: [1; 32], mac: vec![9; 32] });
        let mut bytes = frame(FrameKind::Hello, 0, &hello, &[]);
        bytes.extend(frame(FrameKind::Request, 5, &encode_body(req), payload));
        let _ = s.write_all(&bytes);
        let rest = expect_closed(&mut s, name);
        let h = FrameHeader::decode(rest[..HEADER_LEN].try_into().unwrap()).unwrap();
        assert_eq!(h.kind, FrameKind::Hello, "{name}: only a handshake reply");
        let reply = decode_body::<Hello>(&rest[HEADER_LEN..HEADER_LEN + h.body_len as usize]).unwrap();
        assert!(matches!(&reply, Hello::Refused { reason } if reason.contains("wrong shared secret")), "{reply:?}");
        assert_eq!(rest.len(), HEADER_LEN + h.body_len as usize, "{name}: nothing after the refusal");
    }

    // Nothing reached a handler: no node, no directory, no chunk.
    let cfg = client_cfg(Some(right));
    let Reply::Nodes(nodes) =
        rt.block_on(hivefs_net::call_once(&a.mgmtd, &cfg, &Request::ListNodes { node_type: None })).unwrap()
    else {
        panic!("ListNodes")
    };
    assert!(nodes.iter().all(|n| n.hostname != "intruder" && n.addr != "127.0.0.1:1"), "{nodes:?}");
    assert!(!fs.path("intruder").exists(), "the refused mkdir must not exist");
    let stat = rt.block_on(hivefs_net::call_once(&a.storage, &cfg, &Request::StatChunk { target, entry: intruder }));
    assert_eq!(stat.unwrap(), Reply::ChunkLen(0));
    assert_eq!(fs.chunk_len(u64::from(target.0), &intruder.to_string()), 0);

    // A secret file its group may read: every service and the mount refuse to start.
    let group = secret_file(tmp.path(), "group", &std::fs::read_to_string(fs.secret()).unwrap(), 0o640);
    let g = group.to_str().unwrap();
    let d = |n: &str| tmp.path().join(n).to_str().unwrap().to_string();
    let needle = "accessible by other users";
    must_refuse(&["nodes", "--mgmtd", &a.mgmtd, "--secret-file", g], needle);
    must_refuse(&["mgmtd", "--dir", &d("m"), "--listen", "127.0.0.1:0", "--secret-file", g], needle);
    must_refuse(
        &["meta", "--dir", &d("me"), "--listen", "127.0.0.1:0", "--mgmtd", &a.mgmtd, "--secret-file", g],
        needle,
    );
    let tdir = d("t");
    must_refuse(
        &[
            "storage",
            "--dir",
            &d("s"),
            "--listen",
            "127.0.0.1:0",
            "--mgmtd",
            &a.mgmtd,
            "--target",
            &tdir,
            "--secret-file",
            g,
        ],
        needle,
    );
    let mnt = tmp.path().join("mnt");
    std::fs::create_dir(&mnt).unwrap();
    must_refuse(&["mount", "--mgmtd", &a.mgmtd, "--secret-file", g, mnt.to_str().unwrap()], needle);
    assert!(!is_mounted(&mnt));
    std::fs::set_permissions(&group, std::os::unix::fs::PermissionsExt::from_mode(0o604)).unwrap();
    must_refuse(&["nodes", "--mgmtd", &a.mgmtd, "--secret-file", g], needle);

    // The file system is untouched and works.
    std::fs::write(fs.path("after"), b"still served").unwrap();
    assert_eq!(std::fs::read(fs.path("after")).unwrap(), b"still served");
}

#[test]
fn wire_ids_stay_inside_targets() {
    let fs = TestFs::up(&["--storage", "1", "--targets-per-storage", "2"]);
    let a = addrs(&fs);
    let dirs = fs.target_dirs();
    let served = *dirs.keys().min().unwrap();
    let tdir = std::fs::canonicalize(&dirs[&served]).unwrap();
    let max_served = *dirs.keys().max().unwrap() as u32;
    let pool = Pool::new(a.storage.clone(), client_cfg(Some(right_secret(&fs))));
    let rt = rt();
    let call = |req: Request, payload: Vec<u8>| rt.block_on(pool.call(&req, payload));
    let entry = EntryId { node: 3, epoch: 4, counter: 5 };

    for t in [TargetId(0), TargetId(max_served + 1), TargetId(u32::MAX)] {
        let reqs = [
            Request::WriteChunk { target: t, entry, offset: 0 },
            Request::ReadChunk { target: t, entry, offset: 0, len: 10 },
            Request::TruncateChunk { target: t, entry, len: 10 },
            Request::StatChunk { target: t, entry },
            Request::UnlinkChunk { target: t, entry },
            Request::FsyncChunk { target: t, entry },
        ];
        for req in reqs {
            let e = call(req.clone(), b"x".to_vec()).expect_err("a target this node does not serve");
            assert_eq!(e.code, ErrorCode::NotFound, "{req:?}: {e}");
            assert!(e.message.contains(&format!("target {t}")) && e.message.contains("not served"), "{e}");
        }
    }

    let t = TargetId(served as u32);
    let extremes = [
        EntryId { node: u32::MAX, epoch: u32::MAX, counter: u64::MAX },
        EntryId { node: 0, epoch: 0, counter: 0 },
        EntryId { node: 0, epoch: 0, counter: u64::MAX },
        EntryId { node: u32::MAX, epoch: 0, counter: 0 },
    ];
    for id in extremes {
        assert_eq!(
            call(Request::WriteChunk { target: t, entry: id, offset: 0 }, b"edge".to_vec()).unwrap().0,
            Reply::Written(4)
        );
        let (r, data) = call(Request::ReadChunk { target: t, entry: id, offset: 0, len: 100 }, Vec::new()).unwrap();
        assert_eq!((r, data.as_slice()), (Reply::Data, &b"edge"[..]));
        let path = tdir.join(hivefs_chunk::chunk_rel_path(id));
        let real = std::fs::canonicalize(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        assert!(real.starts_with(tdir.join("chunks")), "{id:?} lands at {}", real.display());
        assert_eq!(std::fs::metadata(&real).unwrap().len(), 4);
        // Offsets and lengths at the edges are refused or answered, never a crash.
        let e = call(Request::WriteChunk { target: t, entry: id, offset: u64::MAX - 1 }, b"xy".to_vec()).unwrap_err();
        assert_eq!(e.code, ErrorCode::Invalid, "{e}");
        let e = call(Request::ReadChunk { target: t, entry: id, offset: 0, len: u32::MAX }, Vec::new()).unwrap_err();
        assert_eq!(e.code, ErrorCode::Invalid, "{e}");
        let r = call(Request::ReadChunk { target: t, entry: id, offset: u64::MAX, len: 10 }, Vec::new());
        assert!(matches!(&r, Ok((Reply::Data, d)) if d.is_empty()) || r.is_err(), "{r:?}");
        assert!(call(Request::TruncateChunk { target: t, entry: id, len: u64::MAX }, Vec::new()).is_err());
        assert_eq!(call(Request::UnlinkChunk { target: t, entry: id }, Vec::new()).unwrap().0, Reply::Ok);
        assert!(!path.exists(), "{} must be gone", path.display());
    }
    // Nothing was created outside the targets' chunk directories.
    for (_, d) in dirs {
        for e in std::fs::read_dir(&d).unwrap() {
            let n = e.unwrap().file_name().into_string().unwrap();
            assert!(["chunks", "target.toml", "mirror"].contains(&n.as_str()), "unexpected {n} in {}", d.display());
        }
    }
    assert!(matches!(call(Request::Ping, Vec::new()).unwrap().0, Reply::Pong { .. }));
}

#[test]
fn oversized_and_truncated_frames() {
    let fs = TestFs::up(&["--storage", "1", "--targets-per-storage", "2"]);
    let a = addrs(&fs);
    let secret = right_secret(&fs);
    std::fs::write(fs.path("canary"), b"canary").unwrap();

    for addr in [&a.mgmtd, &a.meta, &a.storage] {
        // Absurd lengths after a valid handshake: an error reply, then the connection is closed.
        for (body, payload) in [(u32::MAX, 0), (MAX_BODY_LEN + 1, 0), (0, MAX_PAYLOAD_LEN + 1), (u32::MAX, u32::MAX)] {
            let mut s = raw_connect(addr, &secret).unwrap();
            s.write_all(&header_only(FrameKind::Request, body, payload)).unwrap();
            let (h, b, _) = read_frame(&mut s).expect("an error reply before the close");
            assert_eq!(h.kind, FrameKind::Response);
            let e = decode_response(&b).unwrap_err();
            assert_eq!(e.code, ErrorCode::Protocol, "{addr}: {e}");
            assert!(e.message.contains("exceeds the limit"), "{e}");
            expect_closed(&mut s, "oversized frame");
        }
        // Truncated header, truncated body, truncated payload: the connection is closed.
        let ping = encode_body(&Request::Ping);
        let full = frame(FrameKind::Request, 3, &ping, &[]);
        let cuts: Vec<Vec<u8>> = vec![
            full[..10].to_vec(),
            header_only(FrameKind::Request, MAX_BODY_LEN, 0).into_iter().chain([1, 2, 3]).collect(),
            header_only(FrameKind::Request, 1, MAX_PAYLOAD_LEN).into_iter().chain([0u8; 100]).collect(),
        ];
        for cut in cuts {
            let mut s = raw_connect(addr, &secret).unwrap();
            s.write_all(&cut).unwrap();
            s.shutdown(std::net::Shutdown::Write).unwrap();
            let rest = expect_closed(&mut s, "truncated frame");
            assert!(rest.is_empty(), "{addr}: no reply to a frame that never completed");
        }
        // A body that does not decode and a frame of the wrong kind: an error
        // reply each, and the connection stays usable.
        let mut s = raw_connect(addr, &secret).unwrap();
        s.write_all(&frame(FrameKind::Request, 11, &[0xff, 0xff, 0xff, 0x7f, 1, 2, 3], &[])).unwrap();
        let (h, b, _) = read_frame(&mut s).unwrap();
        assert_eq!((h.request_id, decode_response(&b).unwrap_err().code), (11, ErrorCode::Protocol));
        s.write_all(&frame(FrameKind::Response, 12, &encode_body(&Ok::<Reply, ()>(Reply::Ok)), &[])).unwrap();
        let (h, b, _) = read_frame(&mut s).unwrap();
        assert_eq!((h.request_id, decode_response(&b).unwrap_err().code), (12, ErrorCode::Protocol));
        s.write_all(&frame(FrameKind::Request, 13, &ping, &[])).unwrap();
        let (h, b, _) = read_frame(&mut s).unwrap();
        assert_eq!(h.request_id, 13);
        assert!(matches!(decode_response(&b), Ok(Reply::Pong { .. })), "{addr}: ping after bad frames");
        // Random bytes after a valid handshake: replies or a close, never a hang.
        for seed in 1..=4u64 {
            let mut s = raw_connect(addr, &secret).unwrap();
            let _ = s.write_all(&random_bytes(seed, 64 << 10));
            let _ = s.shutdown(std::net::Shutdown::Write);
            expect_closed(&mut s, "random bytes");
        }
        // Before the handshake: an absurd handshake frame is refused without allocation.
        let mut s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(15))).unwrap();
        read_frame(&mut s).expect("server hello");
        s.write_all(&header_only(FrameKind::Hello, MAX_BODY_LEN, MAX_PAYLOAD_LEN)).unwrap();
        let (_, b, _) = read_frame(&mut s).expect("a refusal");
        assert!(matches!(decode_body::<Hello>(&b), Ok(Hello::Refused { .. })), "{addr}");
        expect_closed(&mut s, "oversized hello");
    }
    // Every service keeps serving.
    let rt = rt();
    let cfg = client_cfg(Some(secret));
    for addr in [&a.mgmtd, &a.meta, &a.storage] {
        assert!(matches!(rt.block_on(hivefs_net::call_once(addr, &cfg, &Request::Ping)), Ok(Reply::Pong { .. })));
    }
    assert_eq!(std::fs::read(fs.path("canary")).unwrap(), b"canary");
    let data = random_bytes(9, 3 << 20);
    std::fs::write(fs.path("after"), &data).unwrap();
    assert!(std::fs::read(fs.path("after")).unwrap() == data);
}

/// Peak resident memory (VmHWM) of a process, in KiB.
fn vm_hwm_kib(pid: i32) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = s.lines().find(|l| l.starts_with("VmHWM:")).expect("VmHWM in /proc/PID/status");
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

fn raise_nofile_limit() -> u64 {
    use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};
    let r = getrlimit(Resource::Nofile);
    let _ = setrlimit(Resource::Nofile, Rlimit { current: r.maximum, maximum: r.maximum });
    // None is RLIM_INFINITY.
    getrlimit(Resource::Nofile).current.unwrap_or(u64::MAX)
}

#[derive(Clone, Copy, Debug)]
enum Attack {
    /// Connects and sends nothing.
    Idle,
    /// Sends random bytes.
    Garbage,
    /// A handshake frame announcing a huge body and payload, then some of it.
    Huge,
    /// A complete handshake with a wrong MAC, then a request anyway.
    WrongMac,
}

#[derive(Default)]
struct FloodStats {
    connected: AtomicU64,
    connect_failed: AtomicU64,
    /// Connections the server closed before the test gave up waiting (15 s).
    closed_by_server: AtomicU64,
    /// Connections the server accepted (it sent its hello) that were still
    /// open after 15 s: must stay 0 (the handshake deadline is 5 s).
    held_open: AtomicU64,
    /// Connections the kernel completed but the server never accepted (its
    /// accept queue overflowed during the flood): the client sees no byte and
    /// no close, while the server holds nothing for them.
    never_accepted: AtomicU64,
    /// Handshake refusals received (wrong MAC, oversized or malformed hello).
    handshake_refusals: AtomicU64,
    /// Response frames received by a peer that failed the handshake: must stay 0.
    leaked_responses: AtomicU64,
}

/// One attacking connection from `src` to `dst`.
async fn attack(kind: Attack, src: std::net::IpAddr, dst: SocketAddr, seed: u64, st: &FloodStats) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let sock = tokio::net::TcpSocket::new_v4().unwrap();
    if sock.bind(SocketAddr::new(src, 0)).is_err() {
        st.connect_failed.fetch_add(1, Ordering::Relaxed);
        return;
    }
    let mut s = match tokio::time::timeout(Duration::from_secs(10), sock.connect(dst)).await {
        Ok(Ok(s)) => s,
        _ => {
            st.connect_failed.fetch_add(1, Ordering::Relaxed);
            return;
        }
    };
    st.connected.fetch_add(1, Ordering::Relaxed);
    let mut got = Vec::new();
    match kind {
        Attack::Idle => {}
        Attack::Garbage => {
            let _ = s.write_all(&random_bytes(seed, 4096)).await;
        }
        Attack::Huge => {
            let (b, p) = if seed.is_multiple_of(2) { (MAX_BODY_LEN, MAX_PAYLOAD_LEN) } else { (u32::MAX, u32::MAX) };
            let _ = s.write_all(&header_only(FrameKind::Hello, b, p)).await;
            let _ = s.write_all(&[0u8; 16 << 10]).await;
        }
        Attack::WrongMac => {
            let hello = encode_body(&Hello::Client {
                protocol_version: PROTOCOL_VERSION,
                nonce: [3; 32],
                mac: random_bytes(seed, 32),
            });
            let mut bytes = frame(FrameKind::Hello, 0, &hello, &[]);
            bytes.extend(frame(FrameKind::Request, 1, &encode_body(&Request::ListTargets), &[]));
            let _ = s.write_all(&bytes).await;
        }
    }
    let closed = tokio::time::timeout(Duration::from_secs(15), async {
        let mut buf = [0u8; 4096];
        loop {
            match s.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => got.extend_from_slice(&buf[..n]),
            }
        }
    })
    .await;
    if closed.is_ok() {
        st.closed_by_server.fetch_add(1, Ordering::Relaxed);
    } else if got.is_empty() {
        st.never_accepted.fetch_add(1, Ordering::Relaxed);
    } else {
        st.held_open.fetch_add(1, Ordering::Relaxed);
    }
    // Whatever the server sent: handshake frames only, never a response.
    let mut rest = got.as_slice();
    while rest.len() >= HEADER_LEN {
        let Ok(h) = FrameHeader::decode(rest[..HEADER_LEN].try_into().unwrap()) else { break };
        let end = (HEADER_LEN + h.body_len as usize + h.payload_len as usize).min(rest.len());
        match h.kind {
            FrameKind::Response => {
                st.leaked_responses.fetch_add(1, Ordering::Relaxed);
            }
            FrameKind::Hello => {
                if let Ok(Hello::Refused { .. }) = decode_body::<Hello>(&rest[HEADER_LEN..end]) {
                    st.handshake_refusals.fetch_add(1, Ordering::Relaxed);
                }
            }
            FrameKind::Request => {}
        }
        rest = &rest[end..];
    }
}

#[test]
fn connection_flood_keeps_serving() {
    let nofile = raise_nofile_limit();
    let fs = TestFs::up(&["--storage", "1", "--targets-per-storage", "2"]);
    let a = addrs(&fs);
    let before = random_bytes(1, 4 << 20);
    std::fs::write(fs.path("before"), &before).unwrap();
    assert!(std::fs::read(fs.path("before")).unwrap() == before);
    let services = ["mgmtd", "meta1", "storage1"];
    let hwm_before: Vec<u64> = services.iter().map(|s| vm_hwm_kib(fs.pid(s))).collect();
    let log_lines = |s: &str| {
        std::fs::read_to_string(fs.dir.join(s).join(format!("{s}.log"))).map(|t| t.lines().count()).unwrap_or(0)
    };
    let logs_before: Vec<usize> = services.iter().map(|s| log_lines(s)).collect();

    // 2 services x 8 source addresses x 4 attacks x 40 connections, each
    // reconnecting until the honest I/O is done: thousands of connections.
    let per_kind = if nofile >= 8192 { 40 } else { 10 };
    let st = Arc::new(FloodStats::default());
    let stop = Arc::new(AtomicBool::new(false));
    let rt = rt();
    let mut tasks = Vec::new();
    for dst in [&a.meta, &a.storage] {
        let dst: SocketAddr = dst.parse().unwrap();
        for ip in 2..=9u8 {
            let src = std::net::IpAddr::V4(std::net::Ipv4Addr::new(127, 0, 0, ip));
            for kind in [Attack::Idle, Attack::Garbage, Attack::Huge, Attack::WrongMac] {
                for n in 0..per_kind {
                    let (st, stop) = (st.clone(), stop.clone());
                    tasks.push(rt.spawn(async move {
                        let mut round = 0u64;
                        while !stop.load(Ordering::Relaxed) {
                            attack(kind, src, dst, (u64::from(ip) << 32) | (n << 16) | round, &st).await;
                            round += 1;
                            // Attackers pace themselves a little so the test machine stays usable.
                            tokio::time::sleep(Duration::from_millis(300)).await;
                        }
                    }));
                }
            }
        }
    }
    let flood_start = Instant::now();
    while st.connected.load(Ordering::Relaxed) < 1000 {
        assert!(flood_start.elapsed() < Duration::from_secs(60), "the flood did not get going");
        std::thread::sleep(Duration::from_millis(50));
    }

    // Honest I/O through the mount during the flood.
    let honest = Instant::now();
    let data = random_bytes(2, 8 << 20);
    {
        let mut f = std::fs::File::create(fs.path("during")).unwrap();
        f.write_all(&data).unwrap();
        f.sync_all().unwrap();
    }
    assert!(std::fs::read(fs.path("during")).unwrap() == data, "data written during the flood reads back");
    assert!(std::fs::read(fs.path("before")).unwrap() == before);
    let honest_took = honest.elapsed();
    assert!(honest_took < Duration::from_secs(60), "honest I/O took {honest_took:?} during the flood");
    // Keep the flood going past one handshake deadline.
    while flood_start.elapsed() < Duration::from_secs(8) {
        std::thread::sleep(Duration::from_millis(100));
    }
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        rt.block_on(t).unwrap();
    }
    let flood_took = flood_start.elapsed();

    // The services still serve.
    let cfg = client_cfg(Some(right_secret(&fs)));
    for addr in [&a.mgmtd, &a.meta, &a.storage] {
        assert!(matches!(rt.block_on(hivefs_net::call_once(addr, &cfg, &Request::Ping)), Ok(Reply::Pong { .. })));
    }
    hivefs_ok(&["nodes", "--mgmtd", &a.mgmtd, "--secret-file", fs.secret().to_str().unwrap()]);
    let after = random_bytes(3, 4 << 20);
    std::fs::write(fs.path("after"), &after).unwrap();
    assert!(std::fs::read(fs.path("after")).unwrap() == after);

    let g = |c: &AtomicU64| c.load(Ordering::Relaxed);
    println!(
        "flood: {} connections ({} connect failures) in {flood_took:?} from 8 addresses to meta and storage; \
         {} closed by the servers, {} held open, {} never accepted (accept queue overflow), {} handshake refusals, {} responses leaked; \
         honest 8 MiB write+read during the flood: {honest_took:?}",
        g(&st.connected),
        g(&st.connect_failed),
        g(&st.closed_by_server),
        g(&st.held_open),
        g(&st.never_accepted),
        g(&st.handshake_refusals),
        g(&st.leaked_responses)
    );
    for (i, s) in services.iter().enumerate() {
        let hwm = vm_hwm_kib(fs.pid(s));
        let lines = log_lines(s) - logs_before[i];
        println!(
            "{s}: peak RSS (VmHWM) before the flood {} KiB, after {hwm} KiB; {lines} log lines during the flood",
            hwm_before[i]
        );
        assert!(hwm < 256 << 10, "{s}: peak RSS {hwm} KiB exceeds 256 MiB");
        assert!(lines < 500, "{s}: {lines} log lines during the flood (refusals must be rate limited)");
    }
    assert!(g(&st.connected) >= 2000, "the flood must reach thousands of connections");
    assert_eq!(g(&st.held_open), 0, "every unauthenticated connection is dropped by the handshake deadline");
    assert_eq!(g(&st.leaked_responses), 0, "a peer without the secret never gets a response");
    assert!(g(&st.handshake_refusals) > 0, "bad handshakes got refusals");
}
