//! Attribute leases through real mounts: a mount's kernel caches a file's
//! attributes while the metadata node's lease lasts, and any other mount's
//! change is acknowledged only after the lease was revoked, so a `stat`
//! right after another mount's change (no sleep) sees it.

mod common;

use common::{errno_of as errno, Stopped, TestFs};
use hivefs_bench::md::MetaCounts;
use hivefs_bench::FsConn;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::time::{Duration, Instant};

fn counts(fs: &TestFs) -> MetaCounts {
    let secret = hivefs_net::load_secret(&fs.secret()).expect("secret");
    MetaCounts::connect(&FsConn { mgmtd: fs.mgmtd_addr(), secret: Some(secret) }).expect("connect")
}

fn total(m: &MetaCounts) -> u64 {
    m.snapshot().expect("request counts").values().sum()
}

/// Stats `p` until a run of `n` stats sends no metadata request (the mount
/// polls for revocations in the background, which may add one now and
/// then); false if that never happens in 20 tries.
fn stats_served_from_cache(m: &MetaCounts, p: &Path, n: usize) -> bool {
    (0..20).any(|_| {
        std::fs::metadata(p).unwrap();
        let before = total(m);
        for _ in 0..n {
            std::fs::metadata(p).unwrap();
        }
        // The mount's first poll of the node may still be on its way.
        total(m) == before || {
            std::thread::sleep(Duration::from_millis(50));
            false
        }
    })
}

#[test]
fn another_mounts_change_shows_at_once_while_stats_hit_the_cache() {
    let fs = TestFs::up(&["--storage", "1"]);
    let other = fs.second_mount();
    let m = counts(&fs);
    let (here, there) = (fs.path("f"), other.mnt.join("f"));
    std::fs::write(&here, b"hello").unwrap();
    // Leased: repeated stats send nothing (a stat renews the lease).
    assert!(stats_served_from_cache(&m, &here, 20), "stats of a leased file still asked the metadata node");

    // Each change through the other mount, then at once a stat here.
    std::fs::set_permissions(&there, std::fs::Permissions::from_mode(0o600)).unwrap();
    assert_eq!(std::fs::metadata(&here).unwrap().mode() & 0o7777, 0o600, "chmod elsewhere");

    std::fs::metadata(&here).unwrap();
    std::fs::write(&there, b"hello, world").unwrap();
    assert_eq!(std::fs::metadata(&here).unwrap().len(), 12, "write + close elsewhere");

    std::fs::metadata(&here).unwrap();
    std::fs::OpenOptions::new().write(true).open(&there).unwrap().set_len(3).unwrap();
    assert_eq!(std::fs::metadata(&here).unwrap().len(), 3, "truncate elsewhere");

    std::fs::metadata(&here).unwrap();
    std::fs::hard_link(&there, other.mnt.join("g")).unwrap();
    assert_eq!(std::fs::metadata(&here).unwrap().nlink(), 2, "link elsewhere");

    let ctime = std::fs::metadata(&here).unwrap().ctime_nsec();
    let ctime_s = std::fs::metadata(&here).unwrap().ctime();
    std::thread::sleep(Duration::from_millis(20));
    std::fs::remove_file(other.mnt.join("g")).unwrap();
    let after = std::fs::metadata(&here).unwrap();
    assert_eq!(after.nlink(), 1, "unlink of the other name elsewhere");
    assert!((after.ctime(), after.ctime_nsec()) > (ctime_s, ctime), "ctime of the unlink");

    // The writer's own view: what it wrote shows at once too.
    std::fs::write(&here, b"0123456789").unwrap();
    assert_eq!(std::fs::metadata(&here).unwrap().len(), 10);
    assert_eq!(std::fs::metadata(&there).unwrap().len(), 10);
}

/// A mount that holds a lease and does not answer (its process stopped)
/// delays another mount's change by at most the lease, not forever.
#[test]
fn a_frozen_mount_delays_a_change_only_until_its_lease_ends() {
    let fs = TestFs::up_with(&["--storage", "1"], |fs| {
        std::fs::create_dir_all(fs.dir.join("meta1")).unwrap();
        std::fs::write(fs.dir.join("meta1/meta.toml"), "attr_lease_ms = 1500\n").unwrap();
    });
    let other = fs.second_mount();
    let m = counts(&fs);
    let (here, there) = (fs.path("f"), other.mnt.join("f"));
    std::fs::write(&here, b"x").unwrap();
    let pid = other.pid() as i32;
    assert!(stats_served_from_cache(&m, &there, 5), "the other mount got no lease");
    // A change here revokes the lease there (acknowledged before the chmod
    // returns), so the next stat there asks the node and gets a fresh
    // lease, granted after `asked`; then the mount is stopped and cannot
    // answer the next revocation.
    std::fs::set_permissions(&here, std::fs::Permissions::from_mode(0o600)).unwrap();
    let asked = Instant::now();
    assert_eq!(std::fs::metadata(&there).unwrap().mode() & 0o7777, 0o600);
    let stopped = Stopped::new(pid);
    let start = Instant::now();
    std::fs::set_permissions(&here, std::fs::Permissions::from_mode(0o640)).unwrap();
    let (took, since_grant) = (start.elapsed(), asked.elapsed());
    drop(stopped);
    eprintln!("chmod with a frozen lease holder took {took:?}");
    // It waited for the lease to end: 1.5 s after a grant that came after
    // `asked` (however slow the machine was in between)...
    assert!(
        since_grant >= Duration::from_millis(1500),
        "chmod did not wait for the frozen holder: done {since_grant:?} after the stat that leased, took {took:?}"
    );
    // ...and not forever (the bound is loose for a loaded machine).
    assert!(took < Duration::from_secs(20), "chmod waited {took:?}");
    assert_eq!(std::fs::metadata(&there).unwrap().mode() & 0o7777, 0o640);
}

/// With `attr_lease_ms = 0` the metadata node grants nothing: every stat asks.
#[test]
fn leases_off_means_every_stat_asks() {
    let fs = TestFs::up_with(&["--storage", "1"], |fs| {
        std::fs::create_dir_all(fs.dir.join("meta1")).unwrap();
        std::fs::write(fs.dir.join("meta1/meta.toml"), "attr_lease_ms = 0\n").unwrap();
    });
    let m = counts(&fs);
    let p = fs.path("f");
    std::fs::write(&p, b"x").unwrap();
    std::fs::metadata(&p).unwrap();
    let before = total(&m);
    for _ in 0..10 {
        std::fs::metadata(&p).unwrap();
    }
    assert!(total(&m) - before >= 10, "stats without leases must each ask the metadata node");
}

/// With three metadata nodes each node leases the inodes it stores: changes
/// through another mount show at once in directories of every node.
#[test]
fn leases_hold_on_every_metadata_node() {
    let fs = TestFs::up(&["--storage", "1", "--meta", "3"]);
    let other = fs.second_mount();
    let m = counts(&fs);
    let mut owners = std::collections::BTreeSet::new();
    for i in 0..6 {
        let d = format!("d{i}");
        std::fs::create_dir(fs.path(&d)).unwrap();
        owners.insert(fs.entry_info(&d)["owner_meta_node"].as_u64().expect("owner_meta_node"));
        let (here, there) = (fs.path(&format!("{d}/f")), other.mnt.join(format!("{d}/f")));
        std::fs::write(&here, b"hello").unwrap();
        assert!(stats_served_from_cache(&m, &here, 10), "{d}: stats of a leased file still asked");
        std::fs::write(&there, b"hello, world").unwrap();
        assert_eq!(std::fs::metadata(&here).unwrap().len(), 12, "{d}: write + close elsewhere");
        std::fs::set_permissions(&there, std::fs::Permissions::from_mode(0o604)).unwrap();
        assert_eq!(std::fs::metadata(&here).unwrap().mode() & 0o7777, 0o604, "{d}: chmod elsewhere");
    }
    assert!(owners.len() >= 2, "the directories all landed on one node: {owners:?}");
}

/// Names are leased too: a name older than the 1 s entry TTL is still
/// answered by the kernel, and another mount's rename, unlink or re-create
/// of it shows at once.
#[test]
fn names_changed_elsewhere_show_at_once_while_old_names_hit_the_cache() {
    use std::os::unix::fs::MetadataExt;
    let fs = TestFs::up(&["--storage", "1"]);
    let other = fs.second_mount();
    let m = counts(&fs);
    std::fs::create_dir(fs.path("d")).unwrap();
    let (here, there) = (|n: &str| fs.path(&format!("d/{n}")), |n: &str| other.mnt.join(format!("d/{n}")));
    std::fs::write(here("f"), b"1").unwrap();
    std::fs::metadata(there("f")).unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    assert!(stats_served_from_cache(&m, &there("f"), 10), "a leased name older than 1 s was looked up again");

    std::fs::rename(here("f"), here("g")).unwrap();
    assert_eq!(errno(std::fs::metadata(there("f"))), libc::ENOENT, "rename elsewhere: the old name");
    assert_eq!(std::fs::metadata(there("g")).unwrap().len(), 1, "rename elsewhere: the new name");

    let old_ino = std::fs::metadata(there("g")).unwrap().ino();
    std::fs::remove_file(here("g")).unwrap();
    assert_eq!(errno(std::fs::metadata(there("g"))), libc::ENOENT, "unlink elsewhere");
    std::fs::write(here("g"), b"22").unwrap();
    let now = std::fs::metadata(there("g")).unwrap();
    assert_eq!(now.len(), 2, "re-created elsewhere");
    assert_ne!(now.ino(), old_ino, "re-created elsewhere: another inode");
}

/// Two mounts that both cache all names of one directory remove their own
/// files in it at the same time: every revocation is answered (dropping
/// names takes no directory lock), so nothing waits for a lease to end.
#[test]
fn two_mounts_removing_in_one_directory_both_finish() {
    let fs = TestFs::up(&["--storage", "1"]);
    let other = fs.second_mount();
    std::fs::create_dir(fs.path("d")).unwrap();
    let mounts = [fs.path("d"), other.mnt.join("d")];
    for (i, dir) in mounts.iter().enumerate() {
        for n in 0..50 {
            std::fs::write(dir.join(format!("m{i}-{n}")), b"x").unwrap();
        }
    }
    let start = Instant::now();
    std::thread::scope(|s| {
        for (i, dir) in mounts.iter().enumerate() {
            s.spawn(move || {
                for round in 0..3 {
                    // Lease every name, then remove some of this mount's own.
                    for e in std::fs::read_dir(dir).unwrap() {
                        let _ = std::fs::metadata(e.unwrap().path());
                    }
                    for n in (round * 17)..((round + 1) * 17).min(50) {
                        std::fs::remove_file(dir.join(format!("m{i}-{n}"))).unwrap();
                    }
                }
            });
        }
    });
    eprintln!("removing took {:?}", start.elapsed());
    assert_eq!(std::fs::read_dir(fs.path("d")).unwrap().count(), 0);
    assert_eq!(std::fs::read_dir(other.mnt.join("d")).unwrap().count(), 0);
}

/// The kernel drops a directory's attributes after each create or unlink in
/// it and asks for them before the next (its permission check) and for a
/// `stat`: the mount answers both from the attributes the unlink's answer
/// carried, which are exactly what the metadata node holds afterwards.
#[test]
fn a_directory_this_mount_changed_is_answered_from_the_change() {
    let fs = TestFs::up(&["--storage", "1"]);
    let m = counts(&fs);
    // The comparison asks the metadata node every time: a mount keeping
    // directory attributes for the default TTL would show a round's earlier
    // stat in the next round.
    let other = fs.extra_mount("fresh", &["--dir-attr-ttl-ms", "0"]);
    std::fs::create_dir(fs.path("d")).unwrap();
    std::fs::create_dir(fs.path("d/sub")).unwrap();
    let mut seen = Vec::new();
    let quiet = (0..10).any(|i| {
        let f = fs.path(&format!("d/f{i}"));
        // Made without an open (mknod): the release that follows a close
        // reaches the node in the background and would count below.
        use rustix::fs::{mknodat, FileType, Mode, CWD};
        mknodat(CWD, &f, FileType::RegularFile, Mode::from_raw_mode(0o644), 0).expect("mknod");
        // The create dropped the kernel's copy of d; the unlink's check and
        // the stat after it need d's attributes.
        let before = total(&m);
        std::fs::remove_file(&f).unwrap();
        let here = std::fs::metadata(fs.path("d")).unwrap();
        let sent = total(&m) - before;
        seen.push(sent);
        // The other mount asks the metadata node.
        let there = std::fs::metadata(other.mnt.join("d")).unwrap();
        assert_eq!(
            (here.nlink(), here.mtime(), here.mtime_nsec(), here.ctime_nsec()),
            (there.nlink(), there.mtime(), there.mtime_nsec(), there.ctime_nsec()),
            "the directory as the unlink left it"
        );
        // Only the unlink itself (a background lease poll may add one).
        sent <= 1
    });
    assert!(
        quiet,
        "metadata requests per unlink + stat of the directory: {seen:?} (without the answer's attributes: 3)"
    );
}

/// A directory this mount made: its names are leased to the mount, which
/// answers the kernel's lookups of names it does not hold itself, so a
/// create there is one metadata request; another mount's new name there is
/// seen at once (the lease is revoked before that create is acknowledged).
#[test]
fn creates_in_a_directory_this_mount_made_need_no_lookup() {
    use rustix::fs::{mknodat, FileType, Mode, CWD};
    let fs = TestFs::up(&["--storage", "1"]);
    let other = fs.second_mount();
    let m = counts(&fs);
    let mknod = |p: &Path| mknodat(CWD, p, FileType::RegularFile, Mode::from_raw_mode(0o644), 0).expect("mknod");
    std::fs::create_dir(fs.path("d")).unwrap();
    let before = total(&m);
    for i in 0..20 {
        mknod(&fs.path(&format!("d/f{i}")));
    }
    let sent = total(&m) - before;
    // 40 with a lookup per create.
    assert!(sent <= 22, "metadata requests for 20 creates in a directory this mount made: {sent}");

    // A name too long for any directory gets its own error, not ENOENT.
    assert_eq!(errno(std::fs::metadata(fs.path(&format!("d/{}", "n".repeat(256))))), libc::ENAMETOOLONG);

    // This mount's own names are known: renamed, removed, made again.
    std::fs::rename(fs.path("d/f0"), fs.path("d/g0")).unwrap();
    assert!(std::fs::metadata(fs.path("d/g0")).is_ok());
    assert_eq!(errno(std::fs::metadata(fs.path("d/f0"))), libc::ENOENT);
    std::fs::remove_file(fs.path("d/f1")).unwrap();
    assert_eq!(errno(std::fs::metadata(fs.path("d/f1"))), libc::ENOENT);
    mknod(&fs.path("d/f1"));
    assert!(std::fs::metadata(fs.path("d/f1")).is_ok());
    assert_eq!(std::fs::read_dir(fs.path("d")).unwrap().count(), 20);

    // Another mount's new names show here at once, however they were made.
    std::fs::write(other.mnt.join("d/x"), b"x").unwrap();
    assert_eq!(std::fs::metadata(fs.path("d/x")).map(|m| m.len()).ok(), Some(1), "a create elsewhere");
    std::fs::rename(other.mnt.join("d/g0"), other.mnt.join("d/y")).unwrap();
    assert!(std::fs::metadata(fs.path("d/y")).is_ok(), "a rename elsewhere");
    std::fs::create_dir(other.mnt.join("e")).unwrap();
    std::fs::write(other.mnt.join("e/z"), b"z").unwrap();
    std::fs::hard_link(other.mnt.join("e/z"), other.mnt.join("d/z")).unwrap();
    assert!(std::fs::metadata(fs.path("d/z")).is_ok(), "a link elsewhere");
    // And the other way round: a directory the other mount made.
    std::fs::write(fs.path("e/w"), b"w").unwrap();
    assert!(std::fs::metadata(other.mnt.join("e/w")).is_ok(), "a create in a directory the other mount made");
}

/// `hivefs_requests_total` of metadata node meta1 for request `op`.
fn meta_requests(fs: &TestFs, op: &str) -> u64 {
    let st: serde_json::Value =
        serde_json::from_str(&common::hivefs_ok(&["status", "--dir", fs.dir_s(), "--json"])).unwrap();
    let url = st["services"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["name"] == "meta1")
        .and_then(|s| s["metrics"].as_str())
        .expect("meta1's metrics endpoint")
        .to_string();
    let o = std::process::Command::new("curl").args(["-sf", "--max-time", "5", &url]).output().expect("run curl");
    let text = String::from_utf8_lossy(&o.stdout);
    let key = format!("op=\"{op}\"}}");
    text.lines()
        .filter(|l| l.starts_with("hivefs_requests_total{") && l.contains(&key))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64
}

/// A file made and written through one mount is seen whole by another
/// mount right after its close, though the writer reports its size only
/// with the handle's release, in the background: until then the metadata
/// node reads the size off the chunk files for anyone else. The writer's
/// close sends nothing to the metadata node.
#[test]
fn a_size_reported_after_the_close_is_seen_at_once_elsewhere() {
    let fs = TestFs::up(&[]);
    let other = fs.second_mount();
    for i in 0..150usize {
        // Up to 1.2 MiB: the last ones span three 512 KiB chunks.
        let data: Vec<u8> = (0..i * 8191 + 1).map(|j| (i * 7 + j) as u8).collect();
        std::fs::write(fs.path(&format!("f{i}")), &data).unwrap();
        let there = other.mnt.join(format!("f{i}"));
        assert_eq!(std::fs::metadata(&there).unwrap().len(), data.len() as u64, "f{i}: size right after the close");
        assert!(std::fs::read(&there).unwrap() == data, "f{i}: content right after the close");
        // The writer's own view, with the report maybe still on its way.
        assert_eq!(std::fs::metadata(fs.path(&format!("f{i}"))).unwrap().len(), data.len() as u64, "f{i} here");
    }
    // Files written once: the create is the writer's only request; the
    // sizes go with the batched releases.
    let (held, exact, computed) = ("CreateOpenHeld", "UpdateSizeIf", "UpdateSize");
    let before = [held, exact, computed].map(|op| meta_requests(&fs, op));
    for i in 0..100 {
        std::fs::write(fs.path(&format!("g{i}")), format!("file {i:03}")).unwrap();
    }
    let after = [held, exact, computed].map(|op| meta_requests(&fs, op));
    assert_eq!(after[0] - before[0], 100, "one CreateOpenHeld per file");
    assert_eq!((after[1] - before[1], after[2] - before[2]), (0, 0), "size reports at close");
    for i in 0..100 {
        assert_eq!(std::fs::read(other.mnt.join(format!("g{i}"))).unwrap(), format!("file {i:03}").as_bytes());
    }
}

/// A mount killed after a close whose size it had not reported yet: the
/// size is read off the chunk files for others at once, and recorded once
/// the mount has gone silent, so a restart of the metadata node keeps it.
#[test]
fn a_size_held_by_a_killed_mount_is_read_off_the_chunk_files() {
    let fs = TestFs::up(&[]);
    // Polls every second: silent soon after it dies.
    let writer = fs.extra_mount("writer", &["--io-timeout-ms", "2000"]);
    let data: Vec<u8> = (0..700_000u32).map(|j| (j % 251) as u8).collect();
    let mut f = std::fs::File::create(writer.mnt.join("f")).unwrap();
    // Written and closed while the metadata node is stopped: the close
    // waits for nothing from it, and the release cannot reach it.
    let meta = Stopped::new(fs.pid("meta1"));
    let (tx, rx) = std::sync::mpsc::channel();
    let d = data.clone();
    std::thread::spawn(move || {
        use std::io::Write;
        let ok = f.write_all(&d).is_ok();
        drop(f);
        let _ = tx.send(ok);
    });
    let closed = rx.recv_timeout(Duration::from_secs(20));
    let killed = std::process::Command::new("kill").args(["-9", &writer.pid().to_string()]).status().unwrap();
    drop(meta);
    assert_eq!(closed, Ok(true), "write and close with the metadata node stopped");
    assert!(killed.success());
    assert_eq!(std::fs::metadata(fs.path("f")).unwrap().len(), data.len() as u64, "size off the chunk files");
    assert!(std::fs::read(fs.path("f")).unwrap() == data, "content");

    // Recorded once the dead mount's polls have stopped for a while. (Its
    // release may have gone out before the kill, in the 2 ms it gathers:
    // the resumed node reads it off the socket and the size lands, which
    // the node counts once it is answered.)
    let log = fs.dir.join("meta1/meta1.log");
    let start = Instant::now();
    while !std::fs::read_to_string(&log).unwrap_or_default().contains("read off its chunk files: 700000")
        && meta_requests(&fs, "ReleaseSized") == 0
    {
        assert!(start.elapsed() < Duration::from_secs(90), "the held size was never settled");
        std::thread::sleep(Duration::from_millis(200));
    }
    fs.kill9("meta1");
    fs.reup();
    assert_eq!(std::fs::metadata(fs.path("f")).unwrap().len(), data.len() as u64, "size after a restart");
    drop(writer);
}

/// Files created in a directory this mount made are answered at once and
/// reach the metadata node in batches (`CreateMany`), not one
/// `CreateOpenHeld` each. Another mount sees every one of them right after
/// its create returned: its look recalls this mount's lease on the names,
/// which waits for them. Files made ahead by a mount that fsyncs the
/// directory and is then killed are all there, and fsck finds nothing.
#[test]
fn files_made_ahead_show_elsewhere_at_once_and_go_in_batches() {
    let fs = TestFs::up(&["--storage", "1"]);
    let writer = fs.extra_mount("writer", &[]);
    let w = |rel: &str| writer.mnt.join(rel);
    std::fs::create_dir(w("d")).unwrap();
    let (held0, many0) = (meta_requests(&fs, "CreateOpenHeld"), meta_requests(&fs, "CreateMany"));
    for i in 0..200 {
        std::fs::write(w(&format!("d/f{i}")), format!("file {i}")).unwrap();
    }
    let held = meta_requests(&fs, "CreateOpenHeld") - held0;
    let many = meta_requests(&fs, "CreateMany") - many0;
    // The first creates go the usual way while the ids are on their way.
    assert!(held < 10 && many > 0, "200 creates: {held} CreateOpenHeld, {many} CreateMany");
    let mut names: Vec<String> =
        std::fs::read_dir(fs.path("d")).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    names.sort();
    assert_eq!(names.len(), 200, "another mount lists every file at once");
    for i in 0..200 {
        assert_eq!(std::fs::read(fs.path(&format!("d/f{i}"))).unwrap(), format!("file {i}").as_bytes(), "f{i}");
    }
    // The lease went back: creates there ask the node, and show too.
    std::fs::write(w("d/late"), b"late").unwrap();
    assert_eq!(std::fs::read(fs.path("d/late")).unwrap(), b"late");

    // Looked at after each create: each look sees it.
    std::fs::create_dir(w("e")).unwrap();
    for i in 0..30 {
        std::fs::write(w(&format!("e/g{i}")), b"g").unwrap();
        assert!(std::fs::metadata(fs.path(&format!("e/g{i}"))).is_ok(), "e/g{i} right after its create");
    }

    // fsync of the directory, then the mount is killed: nothing lost.
    std::fs::create_dir(w("k")).unwrap();
    for i in 0..100 {
        std::fs::write(w(&format!("k/h{i}")), b"").unwrap();
    }
    std::fs::File::open(w("k")).unwrap().sync_all().unwrap();
    let killed = std::process::Command::new("kill").args(["-9", &writer.pid().to_string()]).status().unwrap();
    assert!(killed.success());
    drop(writer);
    assert_eq!(std::fs::read_dir(fs.path("k")).unwrap().count(), 100, "files made ahead and fsynced");
    fs.assert_fsck_clean();
}
