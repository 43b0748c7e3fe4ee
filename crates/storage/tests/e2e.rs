//! mgmtd and a storage service in-process on 127.0.0.1, talking over real
//! TCP with authentication: chunk I/O through a client pool, a refused wrong
//! secret, and ids that survive a restart of the storage service.

use hivefs_net::{generate_secret_file, load_secret, ClientConfig, Pool, Secret};
use hivefs_proto::{Reachability, Reply, Request, MAX_PAYLOAD_LEN};
use hivefs_storage::{init_target, open_target, Config, TARGET_FILE};
use hivefs_types::error::ErrorCode;
use hivefs_types::ids::{EntryId, NodeId, NodeType, TargetId};
use std::path::Path;
use std::time::Duration;

const FS: &str = "0f5e1c2a-fs";

async fn start_mgmtd(root: &Path, secret: &Path) -> hivefs_mgmtd::MgmtService {
    hivefs_mgmtd::start(hivefs_mgmtd::Config {
        dir: root.join("mgmtd"),
        listen: "127.0.0.1:0".into(),
        secret_file: Some(secret.to_path_buf()),
        ..Default::default()
    })
    .await
    .expect("mgmtd starts")
}

fn storage_config(root: &Path, secret: &Path, mgmtd: &str) -> Config {
    Config {
        dir: root.join("storage"),
        targets: vec![root.join("t1"), root.join("t2")],
        listen: "127.0.0.1:0".into(),
        mgmtd: mgmtd.to_string(),
        secret_file: Some(secret.to_path_buf()),
        heartbeat_interval_ms: 50,
        fs_uuid: Some(FS.into()),
        ..Default::default()
    }
}

async fn expect_err(pool: &Pool, req: Request, code: ErrorCode) -> String {
    let e = pool.rpc(&req).await.expect_err("request fails");
    assert_eq!(e.code, code, "{e}");
    e.message
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chunk_io_auth_and_restart() {
    let d = tempfile::tempdir().unwrap();
    let root = d.path();
    let secret_path = root.join("secret");
    generate_secret_file(&secret_path).unwrap();
    let secret = load_secret(&secret_path).unwrap();
    init_target(&root.join("t1"), FS).unwrap();
    init_target(&root.join("t2"), FS).unwrap();

    let mgmtd = start_mgmtd(root, &secret_path).await;
    let mgmt_addr = mgmtd.local_addr.to_string();
    let cfg = storage_config(root, &secret_path, &mgmt_addr);
    let svc = hivefs_storage::start(cfg.clone()).await.expect("storage starts");
    assert_eq!(svc.node_id, NodeId(1));
    assert_eq!(svc.targets, vec![TargetId(1), TargetId(2)]);
    let t1 = open_target(&root.join("t1"), Some(FS)).unwrap();
    assert_eq!((t1.target_id, t1.node_id), (Some(TargetId(1)), Some(NodeId(1))), "ids persisted in {TARGET_FILE}");

    let pool = Pool::new(svc.local_addr.to_string(), ClientConfig::new(Some(secret.clone())));
    assert_eq!(pool.rpc(&Request::Ping).await.unwrap(), Reply::Pong { node_type: NodeType::Storage, node: NodeId(1) });

    // Write 1 MiB in one request and read it back, whole and in part.
    let e = EntryId { node: 1, epoch: 1, counter: 42 };
    let data: Vec<u8> = (0..1u32 << 20).map(|i| (i % 251) as u8).collect();
    let w = Request::WriteChunk { target: TargetId(2), entry: e, offset: 4096 };
    assert_eq!(pool.call(&w, data.clone()).await.unwrap().0, Reply::Written(1 << 20));
    let read = |offset: u64, len: u32| Request::ReadChunk { target: TargetId(2), entry: e, offset, len };
    let (r, got) = pool.call(&read(4096, 1 << 20), Vec::new()).await.unwrap();
    assert_eq!(r, Reply::Data);
    assert!(got == data, "read back what was written");
    let (_, got) = pool.call(&read(0, 4100), Vec::new()).await.unwrap();
    assert_eq!((&got[..4096], &got[4096..]), (&[0u8; 4096][..], &data[..4]));
    let (_, got) = pool.call(&read(4096 + (1 << 20) - 10, 100), Vec::new()).await.unwrap();
    assert_eq!(got, &data[data.len() - 10..], "short read at the end");
    let (_, got) = pool.call(&read(1 << 30, 100), Vec::new()).await.unwrap();
    assert!(got.is_empty(), "empty read past the end");
    let stat = Request::StatChunk { target: TargetId(2), entry: e };
    assert_eq!(pool.rpc(&stat).await.unwrap(), Reply::ChunkLen(4096 + (1 << 20)));
    assert_eq!(pool.rpc(&Request::FsyncChunk { target: TargetId(2), entry: e }).await.unwrap(), Reply::Ok);
    // The same entry on the other target is another chunk file.
    let other = Request::StatChunk { target: TargetId(1), entry: e };
    assert_eq!(pool.rpc(&other).await.unwrap(), Reply::ChunkLen(0));
    // Both in one request, in the order asked; a target of another node fails it.
    let both = Request::StatChunks { entry: e, targets: vec![TargetId(2), TargetId(1), TargetId(2)] };
    assert_eq!(pool.rpc(&both).await.unwrap(), Reply::ChunkLens(vec![4096 + (1 << 20), 0, 4096 + (1 << 20)]));
    let m = expect_err(
        &pool,
        Request::StatChunks { entry: e, targets: vec![TargetId(1), TargetId(9)] },
        ErrorCode::NotFound,
    )
    .await;
    assert_eq!(m, "storage target 9 is not served by storage node 1");

    assert_eq!(pool.rpc(&Request::TruncateChunk { target: TargetId(2), entry: e, len: 10 }).await.unwrap(), Reply::Ok);
    assert_eq!(pool.rpc(&stat).await.unwrap(), Reply::ChunkLen(10));
    let unlink = Request::UnlinkChunk { target: TargetId(2), entry: e };
    assert_eq!(pool.rpc(&unlink).await.unwrap(), Reply::Ok);
    assert_eq!(pool.rpc(&unlink).await.unwrap(), Reply::Ok, "unlink is idempotent");
    assert_eq!(pool.rpc(&stat).await.unwrap(), Reply::ChunkLen(0));
    let (_, got) = pool.call(&read(0, 100), Vec::new()).await.unwrap();
    assert!(got.is_empty(), "a missing chunk reads as empty");

    // Errors.
    let m = expect_err(&pool, Request::StatChunk { target: TargetId(9), entry: e }, ErrorCode::NotFound).await;
    assert_eq!(m, "storage target 9 is not served by storage node 1");
    expect_err(&pool, read(0, MAX_PAYLOAD_LEN + 1), ErrorCode::Invalid).await;
    expect_err(&pool, Request::ListTargets, ErrorCode::NotSupported).await;

    // A wrong secret, or none, is refused.
    let bad = Pool::new(svc.local_addr.to_string(), ClientConfig::new(Some(Secret::from_bytes(b"wrong"))));
    expect_err(&bad, Request::Ping, ErrorCode::Auth).await;
    let none = Pool::new(svc.local_addr.to_string(), ClientConfig::new(None));
    expect_err(&none, Request::Ping, ErrorCode::Auth).await;
    let bad_mgmt = Pool::new(mgmt_addr.clone(), ClientConfig::new(Some(Secret::from_bytes(b"wrong"))));
    expect_err(&bad_mgmt, Request::Ping, ErrorCode::Auth).await;

    // mgmtd sees both targets online with their capacity from heartbeats.
    let mgmt = Pool::new(mgmt_addr.clone(), ClientConfig::new(Some(secret.clone())));
    let mut tries = 0;
    let targets = loop {
        let Reply::Targets(ts) = mgmt.rpc(&Request::ListTargets).await.unwrap() else { panic!("not Targets") };
        if ts.iter().all(|t| t.capacity.total_bytes > 0) || tries > 100 {
            break ts;
        }
        tries += 1;
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(targets.len(), 2);
    for t in &targets {
        assert_eq!((t.node, t.reachability), (NodeId(1), Reachability::Online));
        assert!(t.capacity.total_bytes > 0 && t.capacity.free_bytes <= t.capacity.total_bytes, "{t:?}");
    }

    // Restart: same node id and target ids, data still there.
    let w = Request::WriteChunk { target: TargetId(1), entry: e, offset: 0 };
    pool.call(&w, b"kept".to_vec()).await.unwrap();
    let old_addr = svc.local_addr;
    svc.stop();
    drop(pool);
    let svc = hivefs_storage::start(cfg.clone()).await.expect("storage restarts");
    assert_ne!(svc.local_addr, old_addr);
    assert_eq!((svc.node_id, svc.targets.clone()), (NodeId(1), vec![TargetId(1), TargetId(2)]));
    let pool = Pool::new(svc.local_addr.to_string(), ClientConfig::new(Some(secret.clone())));
    let r = Request::ReadChunk { target: TargetId(1), entry: e, offset: 0, len: 100 };
    assert_eq!(pool.call(&r, Vec::new()).await.unwrap().1, b"kept");
    // mgmtd has the new address.
    let Reply::Nodes(nodes) = mgmt.rpc(&Request::ListNodes { node_type: Some(NodeType::Storage) }).await.unwrap()
    else {
        panic!("not Nodes")
    };
    assert_eq!(nodes.len(), 1);
    assert_eq!(nodes[0].addr, svc.local_addr.to_string());

    // Restart of mgmtd too (registry reloaded): still the same ids; a new
    // target dir gets the next target id.
    svc.stop();
    drop(mgmtd);
    let mgmtd = start_mgmtd(root, &secret_path).await;
    init_target(&root.join("t3"), FS).unwrap();
    let mut cfg = storage_config(root, &secret_path, &mgmtd.local_addr.to_string());
    cfg.targets.push(root.join("t3"));
    let svc = hivefs_storage::start(cfg).await.expect("storage restarts with a new target");
    assert_eq!((svc.node_id, svc.targets.clone()), (NodeId(1), vec![TargetId(1), TargetId(2), TargetId(3)]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn foreign_or_renumbered_targets_are_refused() {
    let d = tempfile::tempdir().unwrap();
    let root = d.path();
    let secret = root.join("secret");
    generate_secret_file(&secret).unwrap();
    init_target(&root.join("t1"), FS).unwrap();
    init_target(&root.join("t2"), FS).unwrap();
    let mgmtd = start_mgmtd(root, &secret).await;
    let cfg = storage_config(root, &secret, &mgmtd.local_addr.to_string());
    let svc = hivefs_storage::start(cfg.clone()).await.unwrap();
    svc.stop();
    // A target whose stored id is not the one mgmtd has for its uuid.
    let t1 = root.join("t1");
    let mut tf = open_target(&t1, None).unwrap();
    tf.target_id = Some(TargetId(7));
    tf.save(&t1).unwrap();
    let e = hivefs_storage::start(cfg.clone()).await.err().expect("refused");
    assert!(matches!(e, hivefs_storage::StorageError::TargetIdMismatch { .. }), "{e}");
    assert!(e.to_string().contains(&t1.display().to_string()), "{e}");
    tf.target_id = Some(TargetId(1));
    tf.save(&t1).unwrap();
    hivefs_storage::start(cfg.clone()).await.expect("starts again once repaired").stop();
    // Another storage service (another data dir, so another node) claims t2.
    let other = Config { dir: root.join("storage2"), targets: vec![root.join("t2")], ..cfg };
    let e = hivefs_storage::start(other).await.err().expect("refused");
    let msg = e.to_string();
    assert!(msg.contains("storage node 1") && msg.contains("storage node 2"), "{msg}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_secret_fails_registration_quickly() {
    let d = tempfile::tempdir().unwrap();
    let root = d.path();
    let secret = root.join("secret");
    generate_secret_file(&secret).unwrap();
    let other_secret = root.join("other");
    generate_secret_file(&other_secret).unwrap();
    init_target(&root.join("t1"), FS).unwrap();
    init_target(&root.join("t2"), FS).unwrap();
    let mgmtd = start_mgmtd(root, &secret).await;
    let cfg = storage_config(root, &other_secret, &mgmtd.local_addr.to_string());
    let t0 = std::time::Instant::now();
    let e = hivefs_storage::start(cfg).await.err().expect("refused");
    assert!(matches!(&e, hivefs_storage::StorageError::Mgmt { source, .. } if source.code == ErrorCode::Auth), "{e}");
    assert!(t0.elapsed() < Duration::from_secs(10), "no retrying on an auth failure");
}
