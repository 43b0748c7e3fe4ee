//! Striped data through the real mount: exact sizes and bytes, also through
//! a second mount, and chunk files whose lengths follow the offset mapping.

#![allow(unsafe_code)] // fallocate(2)

mod common;
use common::*;

fn chunk_file_len(size: u64, cs: u64, n: u64, idx: u64) -> u64 {
    // Independent of hivefs-types: walk chunk by chunk.
    let mut len = 0;
    let mut chunk = 0;
    while chunk * cs < size {
        if chunk % n == idx {
            let in_chunk = (size - chunk * cs).min(cs);
            len = (chunk / n) * cs + in_chunk;
        }
        chunk += 1;
    }
    len
}

#[test]
fn files_round_trip_with_exact_sizes_and_chunk_layout() {
    let fs = TestFs::up(&["--storage", "2", "--targets-per-storage", "2", "--chunk-size", "64k"]);
    // (directory, chunk size, stripe)
    let layouts: [(&str, u64, &str); 4] =
        [("s1", 4096, "1"), ("s2", 65536, "2"), ("s3", 16384, "3"), ("sall", 65536, "all")];
    let m2 = fs.second_mount();
    let mut seed = 1u64;
    for (d, cs, stripe) in layouts {
        let dir = fs.path(d);
        std::fs::create_dir(&dir).unwrap();
        hivefs_ok(&["pattern", "set", dir.to_str().unwrap(), "--chunk-size", &cs.to_string(), "--stripe", stripe]);
        let sizes = [0, 1, cs - 1, cs, cs + 1, 7 * cs + 123, 3 * 1024 * 1024 + 17];
        for size in sizes {
            seed += 1;
            let name = format!("{d}/f{size}");
            let data = random_bytes(seed, size as usize);
            std::fs::write(fs.path(&name), &data).unwrap();
            // Same mount: size and bytes.
            assert_eq!(std::fs::metadata(fs.path(&name)).unwrap().len(), size, "seed {seed} {name}");
            assert!(std::fs::read(fs.path(&name)).unwrap() == data, "seed {seed}: {name} differs");
            // Second mount sees the closed file at once.
            let other = m2.mnt.join(&name);
            assert_eq!(std::fs::metadata(&other).unwrap().len(), size, "second mount size of {name}");
            assert!(std::fs::read(&other).unwrap() == data, "second mount bytes of {name}");
            // Chunk files on the targets.
            let info = fs.entry_info(&name);
            let targets: Vec<u64> = info["targets"].as_array().unwrap().iter().map(|t| t.as_u64().unwrap()).collect();
            assert_eq!(info["chunk_size"].as_u64().unwrap(), cs);
            let n = targets.len() as u64;
            let want_n = if stripe == "all" { 4 } else { stripe.parse().unwrap() };
            assert_eq!(n, want_n, "{name}: stripe count");
            let id = info["entry_id"].as_str().unwrap().to_string();
            let mut total = 0;
            for (i, t) in targets.iter().enumerate() {
                let want = chunk_file_len(size, cs, n, i as u64);
                assert_eq!(fs.chunk_len(*t, &id), want, "{name}: chunk file on target {t} (stripe index {i})");
                total += want;
            }
            assert_eq!(total, size);
        }
    }
}

#[test]
fn sparse_writes_truncate_and_overwrite() {
    use std::io::{Seek, SeekFrom, Write};
    use std::os::unix::fs::FileExt;
    let fs = TestFs::up(&["--storage", "1", "--targets-per-storage", "3", "--chunk-size", "4k"]);
    let p = fs.path("sparse");
    let mut f = std::fs::File::create(&p).unwrap();
    f.seek(SeekFrom::Start(100_000)).unwrap();
    f.write_all(b"tail").unwrap();
    drop(f);
    let d = std::fs::read(&p).unwrap();
    assert_eq!(d.len(), 100_004);
    assert!(d[..100_000].iter().all(|&b| b == 0));
    assert_eq!(&d[100_000..], b"tail");
    // Truncate up: a hole at the end reads as zeros.
    let f = std::fs::OpenOptions::new().write(true).open(&p).unwrap();
    f.set_len(200_000).unwrap();
    drop(f);
    let d = std::fs::read(&p).unwrap();
    assert_eq!(d.len(), 200_000);
    assert!(d[100_004..].iter().all(|&b| b == 0));
    // Truncate down, then overwrite in the middle.
    let f = std::fs::OpenOptions::new().read(true).write(true).open(&p).unwrap();
    f.set_len(5000).unwrap();
    f.write_all_at(b"XYZ", 4095).unwrap();
    drop(f);
    let d = std::fs::read(&p).unwrap();
    assert_eq!(d.len(), 5000);
    assert_eq!(&d[4095..4098], b"XYZ");
    // O_TRUNC empties.
    std::fs::write(&p, b"new").unwrap();
    assert_eq!(std::fs::read(&p).unwrap(), b"new");
    // Append.
    let mut f = std::fs::OpenOptions::new().append(true).open(&p).unwrap();
    f.write_all(b"+more").unwrap();
    drop(f);
    assert_eq!(std::fs::read(&p).unwrap(), b"new+more");
}

/// A close reports where this mount's own writes ended, without asking the
/// targets for their chunks' lengths, unless the file changed since the
/// mount looked: then the size comes from the chunk files, so a truncation
/// by another mount between the writes and the close stands.
#[test]
fn a_close_reports_its_own_writes_end_unless_another_mount_changed_the_file() {
    use std::os::unix::fs::FileExt;
    let fs = TestFs::up(&["--storage", "1", "--targets-per-storage", "2", "--chunk-size", "4k"]);
    let layout: toml::Value = toml::from_str(&std::fs::read_to_string(fs.dir.join("fs.toml")).unwrap()).unwrap();
    // Metrics ports: mgmtd, the metadata node, the storage node, the mount.
    let mount_port = layout["metrics_ports"].as_array().unwrap()[3].as_integer().unwrap() as u16;
    // Sizes computed from the chunk files go out as UpdateSize, a writer's own as UpdateSizeIf.
    let (computed, own) = (|| calls_sent(mount_port, "UpdateSize"), || calls_sent(mount_port, "UpdateSizeIf"));
    let (before, own_before) = (computed(), own());
    for i in 0..20u64 {
        std::fs::write(fs.path(&format!("f{i}")), random_bytes(i, 5_000 + 1_000 * i as usize)).unwrap();
    }
    // New files hold their sizes: the closes sent nothing, and each
    // release's size landed as where the writes ended (no chunk file asked).
    let meta_port = layout["metrics_ports"].as_array().unwrap()[1].as_integer().unwrap() as u16;
    std::thread::sleep(std::time::Duration::from_millis(300));
    assert_eq!((computed(), own()), (before, own_before), "sizes reported at close");
    assert_eq!(calls_sent(meta_port, "StatChunk"), 0, "the metadata node read chunk files' lengths");
    let m2 = fs.second_mount();
    for i in 0..20u64 {
        let want = random_bytes(i, 5_000 + 1_000 * i as usize);
        assert_eq!(std::fs::read(m2.mnt.join(format!("f{i}"))).unwrap(), want, "f{i} through the other mount");
    }
    // An existing file written and closed: its close reports the writes' end.
    let f = std::fs::OpenOptions::new().write(true).open(fs.path("f0")).unwrap();
    f.write_all_at(b"more", 5_000).unwrap();
    drop(f);
    assert_eq!((computed(), own()), (before, own_before + 1), "an existing file's close");
    assert_eq!(std::fs::metadata(m2.mnt.join("f0")).unwrap().len(), 5_004);
    // Published once (fsync), written further, truncated by the other mount, closed.
    let data = random_bytes(7, 30_000);
    let f = std::fs::File::create(fs.path("t")).unwrap();
    f.write_all_at(&data[..20_000], 0).unwrap();
    f.sync_all().unwrap();
    f.write_all_at(&data[20_000..], 20_000).unwrap();
    std::fs::OpenOptions::new().write(true).open(m2.mnt.join("t")).unwrap().set_len(5_000).unwrap();
    drop(f);
    assert_eq!(std::fs::metadata(m2.mnt.join("t")).unwrap().len(), 5_000, "the truncation was undone");
    assert_eq!(std::fs::read(m2.mnt.join("t")).unwrap(), &data[..5_000]);
}

/// A file unlinked while open keeps its data for the open handle; its chunk
/// files go after the close (the mount tells the metadata node in the
/// background, batched with other closes).
#[test]
fn a_file_unlinked_while_open_keeps_its_data_until_the_close() {
    use std::io::{Read, Seek, SeekFrom};
    let fs = TestFs::up(&["--storage", "1", "--targets-per-storage", "2", "--chunk-size", "4k"]);
    let p = fs.path("open");
    let data = random_bytes(10, 50_000);
    std::fs::write(&p, &data).unwrap();
    let info = fs.entry_info("open");
    let id = info["entry_id"].as_str().unwrap().to_string();
    let targets: Vec<u64> = info["targets"].as_array().unwrap().iter().map(|t| t.as_u64().unwrap()).collect();
    let mut f = std::fs::File::open(&p).unwrap();
    // Other handles of it opened and closed meanwhile do not end it.
    for _ in 0..20 {
        drop(std::fs::File::open(&p).unwrap());
    }
    std::fs::remove_file(&p).unwrap();
    std::thread::sleep(std::time::Duration::from_millis(500));
    let mut back = Vec::new();
    f.seek(SeekFrom::Start(0)).unwrap();
    f.read_to_end(&mut back).unwrap();
    assert!(back == data, "the open handle reads what was written");
    assert!(targets.iter().any(|t| fs.chunk_len(*t, &id) > 0), "chunk files went while the file was open");
    drop(f);
    let start = std::time::Instant::now();
    while targets.iter().any(|t| fs.chunk_len(*t, &id) > 0) {
        assert!(start.elapsed() < std::time::Duration::from_secs(20), "chunk files of {id} were not removed");
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

/// A mount unmounted right after a close sends that release before it
/// exits, and exits cleanly: the metadata node no longer counts the file
/// open, so an unlink removes its chunk files.
#[test]
fn an_unmounted_mount_sends_its_last_releases_and_exits_cleanly() {
    let fs = TestFs::up(&["--storage", "1", "--targets-per-storage", "2", "--chunk-size", "4k"]);
    let other = fs.second_mount();
    std::fs::write(fs.path("f"), random_bytes(11, 20_000)).unwrap();
    let info = fs.entry_info("f");
    let id = info["entry_id"].as_str().unwrap().to_string();
    let targets: Vec<u64> = info["targets"].as_array().unwrap().iter().map(|t| t.as_u64().unwrap()).collect();
    drop(std::fs::File::open(other.mnt.join("f")).unwrap());
    let (status, log) = other.unmount();
    assert!(status.success() && !log.contains("panicked"), "hivefs mount exited with {status}:\n{log}");
    std::fs::remove_file(fs.path("f")).unwrap();
    let start = std::time::Instant::now();
    while targets.iter().any(|t| fs.chunk_len(*t, &id) > 0) {
        assert!(
            start.elapsed() < std::time::Duration::from_secs(20),
            "chunk files of {id} were kept: still counted open"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

/// A file created and closed without a write has no chunk files: removing
/// it asks no storage target (the metadata node sends no `UnlinkChunks`).
/// A file written through the short-circuit mount, or over TCP through a
/// second mount and removed by the first, loses its chunk files; one
/// written at a single stripe position loses it with one request.
#[test]
fn removing_files_never_written_asks_no_target_and_written_ones_lose_their_chunks() {
    let fs = TestFs::up(&["--storage", "1", "--targets-per-storage", "2", "--chunk-size", "4k"]);
    let layout: toml::Value = toml::from_str(&std::fs::read_to_string(fs.dir.join("fs.toml")).unwrap()).unwrap();
    // Metrics ports: mgmtd, then the metadata node.
    let meta_port = layout["metrics_ports"].as_array().unwrap()[1].as_integer().unwrap() as u16;
    let tcp = fs.extra_mount("tcp", &["--no-short-circuit"]);
    let before = calls_sent(meta_port, "UnlinkChunks");
    for i in 0..40 {
        let mnt = if i % 2 == 0 { &fs.mnt } else { &tcp.mnt };
        drop(std::fs::File::create(mnt.join(format!("empty{i}"))).unwrap());
    }
    // Opened for writing again and closed unwritten, by both mounts.
    drop(std::fs::OpenOptions::new().write(true).open(fs.path("empty0")).unwrap());
    drop(std::fs::OpenOptions::new().write(true).open(tcp.mnt.join("empty0")).unwrap());
    for i in 0..40 {
        std::fs::remove_file(fs.path(&format!("empty{i}"))).unwrap();
    }
    // Chunk deletions are sent within milliseconds of a remove's commit.
    for _ in 0..10 {
        std::thread::sleep(std::time::Duration::from_millis(100));
        assert_eq!(calls_sent(meta_port, "UnlinkChunks"), before, "removing unwritten files asked a target");
    }
    // Chunk files of `id` on any target.
    let chunk_files = |id: &str| -> usize {
        let dirs = fs.target_dirs();
        dirs.values()
            .flat_map(|t| std::fs::read_dir(t.join("chunks")).unwrap())
            .filter(|sub| sub.as_ref().unwrap().path().join(id).exists())
            .count()
    };
    // Written through the short-circuit mount, over TCP, and allocated
    // without a size change (its chunk files exist, the size stays 0).
    for (name, mnt) in [("local", &fs.mnt), ("tcp", &tcp.mnt), ("kept", &tcp.mnt)] {
        let f = std::fs::File::create(mnt.join(name)).unwrap();
        if name == "kept" {
            use std::os::fd::AsRawFd;
            // SAFETY: fallocate(2) on an open descriptor.
            let r = unsafe { libc::fallocate(f.as_raw_fd(), libc::FALLOC_FL_KEEP_SIZE, 0, 20_000) };
            assert_eq!(r, 0, "fallocate: {}", std::io::Error::last_os_error());
        } else {
            std::io::Write::write_all(&mut &f, &random_bytes(3, 50_000)).unwrap();
        }
        drop(f);
        let id = fs.entry_info(name)["entry_id"].as_str().unwrap().to_string();
        assert!(chunk_files(&id) >= 2, "{name}: chunk files on both targets");
        std::fs::remove_file(fs.path(name)).unwrap();
        let start = std::time::Instant::now();
        while chunk_files(&id) > 0 {
            assert!(start.elapsed() < std::time::Duration::from_secs(20), "{name}: chunk files of {id} were kept");
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
    }
    assert!(calls_sent(meta_port, "UnlinkChunks") > before);
    // Written only in its second chunk, so at one stripe position: its
    // removal asks that target alone (the release said where it wrote).
    for (name, mnt) in [("part-local", &fs.mnt), ("part-tcp", &tcp.mnt)] {
        use std::os::unix::fs::FileExt;
        let f = std::fs::File::create(mnt.join(name)).unwrap();
        f.write_all_at(&random_bytes(4, 4096), 4096).unwrap();
        drop(f);
        let id = fs.entry_info(name)["entry_id"].as_str().unwrap().to_string();
        assert_eq!(chunk_files(&id), 1, "{name}: one chunk file");
        let asked = calls_sent(meta_port, "UnlinkChunks");
        std::fs::remove_file(fs.path(name)).unwrap();
        let start = std::time::Instant::now();
        while chunk_files(&id) > 0 {
            assert!(start.elapsed() < std::time::Duration::from_secs(20), "{name}: chunk file of {id} was kept");
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        assert_eq!(calls_sent(meta_port, "UnlinkChunks"), asked + 1, "{name}: a target it never wrote was asked");
    }
}

#[test]
fn unlink_removes_chunk_files() {
    let fs = TestFs::up(&["--storage", "1", "--targets-per-storage", "2", "--chunk-size", "4k"]);
    let p = fs.path("gone");
    std::fs::write(&p, random_bytes(9, 50_000)).unwrap();
    let info = fs.entry_info("gone");
    let id = info["entry_id"].as_str().unwrap().to_string();
    let targets: Vec<u64> = info["targets"].as_array().unwrap().iter().map(|t| t.as_u64().unwrap()).collect();
    assert!(targets.iter().any(|t| fs.chunk_len(*t, &id) > 0));
    std::fs::remove_file(&p).unwrap();
    let start = std::time::Instant::now();
    while targets.iter().any(|t| fs.chunk_len(*t, &id) > 0) {
        assert!(start.elapsed() < std::time::Duration::from_secs(20), "chunk files of {id} were not removed");
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}
