//! User and group quotas through the real pieces: limits set with `hivefs quota set`,
//! enforced on other users working through the mount (EDQUOT at the limit, room again
//! after a removal, chgrp to a group without room refused), and usage that follows
//! chown, rename, hard links, truncation, unlink and a restart over two metadata nodes.

mod common;

use common::*;
use std::process::{Command, Output};
use std::time::Duration;

/// Metadata nodes report usage and fetch limits every 200 ms here.
fn up(extra: &[&str]) -> TestFs {
    TestFs::up_with(extra, |fs| {
        std::fs::create_dir_all(fs.dir.join("mgmtd")).unwrap();
        std::fs::write(fs.dir.join("mgmtd/mgmtd.toml"), "quota_interval_ms = 200\n").unwrap();
    })
}

fn as_user(fs: &TestFs, uid: u32, gid: u32, script: &str) -> Output {
    Command::new("setpriv")
        .args([&format!("--reuid={uid}"), &format!("--regid={gid}"), "--clear-groups", "sh", "-c", script])
        .current_dir(&fs.mnt)
        .output()
        .unwrap()
}

fn sh(fs: &TestFs, script: &str) {
    let o = Command::new("sh").arg("-c").arg(script).current_dir(&fs.mnt).output().unwrap();
    assert!(o.status.success(), "{script}: {}", out(&o));
}

fn quotas(fs: &TestFs) -> serde_json::Value {
    serde_json::from_str(&hivefs_ok(&["quota", "list", "--json", "--mount", fs.mnt_s()])).unwrap()
}

/// (inodes, bytes) mgmtd shows for `kind` `id` (on the whole file system).
fn used(fs: &TestFs, kind: &str, id: u64) -> Option<(u64, u64)> {
    let q = quotas(fs);
    let e = q["quotas"].as_array()?.iter().find(|e| e["kind"] == kind && e["id"] == id && e["pool"].is_null())?.clone();
    Some((e["inodes_used"].as_u64()?, e["space_used"].as_u64()?))
}

/// Waits until the usage of `kind` `id` is `want` (metadata nodes report it every 200 ms).
fn wait_used(fs: &TestFs, kind: &str, id: u64, want: (u64, u64), step: &str) {
    let mut last = None;
    wait_for(
        &format!("{kind} {id} to use {want:?} after {step} (last seen {last:?})"),
        Duration::from_secs(20),
        || {
            last = used(fs, kind, id);
            last == Some(want)
        },
    );
}

fn edquot(o: &Output) -> bool {
    !o.status.success() && String::from_utf8_lossy(&o.stderr).contains("Disk quota exceeded")
}

#[test]
fn users_and_groups_get_edquot_at_their_limits_and_room_after_removing() {
    let fs = up(&[]);
    sh(&fs, "mkdir u v w p && chown 1001:1001 u && chown 1002:1002 v && chown 1003:2001 w && chown 1004:1004 p");
    hivefs_ok(&["quota", "set", "--uid", "1001", "--inodes", "5", "--space", "none", "--mount", fs.mnt_s()]);
    hivefs_ok(&["quota", "set", "--uid", "1002", "--inodes", "none", "--space", "1m", "--mount", fs.mnt_s()]);
    hivefs_ok(&["quota", "set", "--gid", "2001", "--inodes", "3", "--space", "none", "--mount", fs.mnt_s()]);
    let pool = ["--pool", "default", "--mount", fs.mnt_s()];
    hivefs_ok(&[&["quota", "set", "--uid", "1004", "--inodes", "2", "--space", "512k"][..], &pool].concat());
    // A metadata node reports only the users and groups it knows limits of: the
    // directories' counts showing up means the limits are in force there.
    wait_used(&fs, "user", 1001, (1, 0), "setting the limit");
    wait_used(&fs, "user", 1002, (1, 0), "setting the limit");
    wait_used(&fs, "group", 2001, (1, 0), "setting the limit");

    // Inodes: the directory and four files are five; the sixth inode of any kind is refused.
    let o = as_user(&fs, 1001, 1001, "touch u/f1 u/f2 u/f3 u/f4");
    assert!(o.status.success(), "{}", out(&o));
    for script in ["touch u/f5", "mkdir u/d", "ln -s f1 u/s"] {
        let o = as_user(&fs, 1001, 1001, script);
        assert!(edquot(&o), "`{script}` at the inode limit: {}", out(&o));
    }
    // Other users are not limited by it.
    sh(&fs, "touch u/by-root");
    let o = as_user(&fs, 1001, 1001, "rm u/f1 && touch u/f5");
    assert!(o.status.success(), "a removal makes room at once: {}", out(&o));
    wait_used(&fs, "user", 1001, (5, 0), "removing and creating");

    // Groups: user 1003 in group 2001 (limit 3 inodes: the directory and two files).
    let o = as_user(&fs, 1003, 2001, "touch w/a w/b");
    assert!(o.status.success(), "{}", out(&o));
    assert!(edquot(&as_user(&fs, 1003, 2001, "touch w/c")), "group at its inode limit");
    // Handing a file to that group: refused for its owner (chgrp to one of
    // their groups), done for root (as Linux, whose quota transfers ignore
    // the limits for root).
    sh(&fs, "mkdir x && chown 1005:1005 x");
    let o = Command::new("setpriv")
        .args(["--reuid=1005", "--regid=1005", "--groups=2001", "sh", "-c", "touch x/f && chgrp 2001 x/f"])
        .current_dir(&fs.mnt)
        .output()
        .unwrap();
    assert!(edquot(&o), "chgrp to a group at its inode limit: {}", out(&o));
    assert_eq!(std::os::unix::fs::MetadataExt::gid(&std::fs::metadata(fs.path("x/f")).unwrap()), 1005);
    sh(&fs, "chgrp 2001 x/f && chgrp 1005 x/f && rm -r x");

    // Space: 2 MiB into a 1 MiB quota stops at exactly 1 MiB with EDQUOT.
    let o = as_user(&fs, 1002, 1002, "dd if=/dev/zero of=v/big bs=64k count=32 2>&1 >/dev/null; echo rc=$?");
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(text.contains("Disk quota exceeded") && !text.contains("rc=0"), "{text}");
    assert_eq!(std::fs::metadata(fs.path("v/big")).unwrap().len(), 1 << 20);
    wait_used(&fs, "user", 1002, (2, 1 << 20), "filling the quota");
    // A new file is refused too while the space is used up ...
    assert!(edquot(&as_user(&fs, 1002, 1002, "echo x > v/small")), "new file at the space limit");
    // ... and so is growing a file by truncation (space is counted as length),
    // whether it is open for writing here or not; shrinking is not refused.
    assert!(edquot(&as_user(&fs, 1002, 1002, "truncate -s 2M v/big")), "truncate beyond the limit");
    assert_eq!(std::fs::metadata(fs.path("v/big")).unwrap().len(), 1 << 20);
    let o = as_user(&fs, 1002, 1002, "truncate -s 512K v/big");
    assert!(o.status.success(), "shrinking: {}", out(&o));
    wait_for("room to grow v/big again after shrinking it", Duration::from_secs(20), || {
        as_user(&fs, 1002, 1002, "truncate -s 1M v/big").status.success()
    });
    // ... and after the removal there is room again.
    let o = as_user(&fs, 1002, 1002, "rm v/big");
    assert!(o.status.success(), "{}", out(&o));
    wait_for("room for user 1002 after removing", Duration::from_secs(20), || {
        as_user(&fs, 1002, 1002, "dd if=/dev/zero of=v/again bs=64k count=8 2>/dev/null").status.success()
    });
    assert_eq!(std::fs::metadata(fs.path("v/again")).unwrap().len(), 512 << 10);

    // A storage pool's limits count the regular files in it: 512 KiB, two files.
    let o = as_user(&fs, 1004, 1004, "head -c 300000 /dev/zero > p/a && head -c 300000 /dev/zero > p/b");
    assert!(edquot(&o), "the pool's space limit: {}", out(&o));
    // A write that does not fit is refused whole: p/b ends within one write of the room.
    let b = std::fs::metadata(fs.path("p/b")).unwrap().len();
    assert!(b <= (512 << 10) - 300_000 && b + 65_536 > (512 << 10) - 300_000, "p/b has {b} bytes");
    let o = as_user(&fs, 1004, 1004, "rm p/b && mkdir p/d1 p/d2");
    assert!(o.status.success(), "{}", out(&o));
    // A pool's usage is mgmtd's sum alone: the removal makes room once it is
    // reported (within about two intervals, docs/design-quota.md).
    wait_for("room in the pool after removing p/b", Duration::from_secs(20), || {
        as_user(&fs, 1004, 1004, "head -c 1000 /dev/zero > p/c").status.success()
    });
    // Two files, two directories: directories are not files of the pool.
    wait_for("the pool's file count to reach its limit", Duration::from_secs(20), || {
        quotas(&fs)["quotas"].as_array().unwrap().iter().any(|e| e["id"] == 1004 && e["inodes_used"] == 2)
    });
    assert!(edquot(&as_user(&fs, 1004, 1004, "touch p/d1/third")), "the pool's file limit");

    // The limits are listed, and removing them lifts them.
    let q = quotas(&fs);
    assert_eq!(q["quotas"].as_array().unwrap().len(), 4, "{q}");
    assert!(q["quotas"].as_array().unwrap().iter().any(|e| e["id"] == 1004 && e["pool"] == 1), "{q}");
    hivefs_ok(&["quota", "set", "--uid", "1001", "--inodes", "none", "--space", "none", "--mount", fs.mnt_s()]);
    wait_for("user 1001 without limits", Duration::from_secs(20), || {
        as_user(&fs, 1001, 1001, "touch u/free").status.success()
    });
    // Bad input names the problem.
    let o = hivefs(&["quota", "set", "--uid", "1", "--inodes", "0", "--space", "none", "--mount", fs.mnt_s()]);
    assert!(!o.status.success() && out(&o).contains("none"), "{}", out(&o));
    fs.assert_fsck_clean();
}

#[test]
fn usage_follows_chown_rename_links_truncate_unlink_and_restart() {
    let fs = up(&["--meta", "2", "--meta-chooser", "roundrobin"]);
    hivefs_ok(&["quota", "set", "--uid", "1001", "--inodes", "1000", "--space", "1g", "--mount", fs.mnt_s()]);
    hivefs_ok(&["quota", "set", "--gid", "1001", "--inodes", "1000", "--space", "1g", "--mount", fs.mnt_s()]);
    // Directories alternate between the two metadata nodes.
    sh(&fs, "mkdir A B && chown 1001:1001 A B");
    assert_ne!(fs.entry_info("A")["owner_meta_node"], fs.entry_info("B")["owner_meta_node"]);
    wait_used(&fs, "user", 1001, (2, 0), "mkdir");
    sh(&fs, "head -c 100000 /dev/zero > A/f && chown 1001:1001 A/f");
    wait_used(&fs, "user", 1001, (3, 100_000), "chown of a written file");
    wait_used(&fs, "group", 1001, (3, 100_000), "chown of a written file");
    sh(&fs, "ln A/f B/h");
    wait_used(&fs, "user", 1001, (3, 100_000), "a hard link (one inode)");
    sh(&fs, "mv A/f B/g");
    wait_used(&fs, "user", 1001, (3, 100_000), "a rename to the other node");
    sh(&fs, "truncate -s 50000 B/g");
    wait_used(&fs, "user", 1001, (3, 50_000), "truncate");
    sh(&fs, "chown 1002 B/g");
    wait_used(&fs, "user", 1001, (2, 0), "chown to another user");
    wait_used(&fs, "group", 1001, (3, 50_000), "chown to another user (same group)");
    sh(&fs, "chown 1001 B/g && rm B/g");
    wait_used(&fs, "user", 1001, (3, 50_000), "unlink of one of two links");
    sh(&fs, "rm B/h");
    wait_used(&fs, "user", 1001, (2, 0), "unlink of the last link");
    sh(&fs, "head -c 4096 /dev/zero > A/kept && chown 1001:1001 A/kept");
    wait_used(&fs, "user", 1001, (3, 4096), "a kept file");
    fs.down();
    fs.reup();
    wait_used(&fs, "user", 1001, (3, 4096), "a restart");
    fs.assert_fsck_clean();
    // Every user and group holding anything, asked from both metadata nodes now.
    let all: serde_json::Value =
        serde_json::from_str(&hivefs_ok(&["quota", "list", "--all", "--json", "--mount", fs.mnt_s()])).unwrap();
    let row = |kind: &str, id: u64| {
        all["usage"].as_array().unwrap().iter().find(|e| e["kind"] == kind && e["id"] == id).cloned()
    };
    let u1001 = row("user", 1001).unwrap_or_else(|| panic!("{all}"));
    assert_eq!((u1001["inodes_used"].as_u64(), u1001["space_used"].as_u64()), (Some(3), Some(4096)), "{all}");
    assert!(row("user", 0).is_some_and(|r| r["inodes_used"].as_u64() >= Some(1)), "root holds the root: {all}");
    assert!(row("user", 1002).is_none(), "user 1002 holds nothing any more: {all}");

    // A wrong usage record (as a lost write would leave it) is found and recounted by fsck.
    fs.down();
    let who = hivefs_proto::QuotaId { kind: hivefs_proto::QuotaKind::User, id: 1001 };
    hivefs_meta::fsck::offline::set_usage(&fs.dir.join("meta1"), who, hivefs_proto::QuotaUse { inodes: 77, bytes: 7 })
        .unwrap();
    fs.reup();
    let o = hivefs(&["fsck", "--json", "--mount", fs.mnt_s()]);
    assert_eq!(o.status.code(), Some(1), "{}", out(&o));
    let report: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let problems = report["problems"].as_array().unwrap();
    assert!(problems.iter().all(|p| p["kind"] == "wrong-usage"), "{report}");
    assert!(problems.iter().any(|p| p["detail"].as_str().unwrap().contains("user 1001")), "{report}");
    let o = hivefs(&["fsck", "--repair", "--mount", fs.mnt_s()]);
    assert_eq!(o.status.code(), Some(0), "{}", out(&o));
    fs.assert_fsck_clean();
    wait_used(&fs, "user", 1001, (3, 4096), "fsck --repair");
}

/// At an inode limit, a removal makes room at once every time, also while a
/// usage report is on its way to mgmtd: the node counts what changed since
/// the usage it reported, not since mgmtd's answer arrived.
#[test]
fn a_removal_at_the_limit_always_makes_room() {
    let fs = TestFs::up_with(&[], |fs| {
        std::fs::create_dir_all(fs.dir.join("mgmtd")).unwrap();
        std::fs::write(fs.dir.join("mgmtd/mgmtd.toml"), "quota_interval_ms = 100\n").unwrap();
    });
    sh(&fs, "mkdir r && chown 1005:1005 r");
    hivefs_ok(&["quota", "set", "--uid", "1005", "--inodes", "3", "--space", "none", "--mount", fs.mnt_s()]);
    wait_used(&fs, "user", 1005, (1, 0), "setting the limit");
    // Directories: no open handle whose release (sent in the background)
    // could keep a removed file counted for a moment.
    let o = as_user(&fs, 1005, 1005, "mkdir r/a r/b");
    assert!(o.status.success(), "{}", out(&o));
    assert!(edquot(&as_user(&fs, 1005, 1005, "mkdir r/c")), "at the inode limit");
    let o =
        as_user(&fs, 1005, 1005, "i=0; while [ $i -lt 400 ]; do rmdir r/a && mkdir r/a || exit 1; i=$((i+1)); done");
    assert!(o.status.success(), "a removal at the limit did not make room: {}", out(&o));
}
