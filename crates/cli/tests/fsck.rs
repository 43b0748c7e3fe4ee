//! `hivefs fsck`: a file system after ordinary use is clean; damage made
//! with the services stopped (chunk files on the targets, records in the
//! metadata store) is found with the right kind, `--repair` fixes it, and a
//! second check is clean. Also the offline mode (`--dir` of a stopped file
//! system).

mod common;

use common::*;
use hivefs_types::ids::EntryId;
use serde_json::Value;
use std::collections::BTreeSet;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

/// Runs `hivefs fsck --json` with `args`; returns the exit status and the report.
fn fsck(args: &[&str]) -> (i32, Value) {
    let mut all = vec!["fsck", "--json"];
    all.extend_from_slice(args);
    let o = hivefs(&all);
    let stdout = String::from_utf8_lossy(&o.stdout);
    let report = serde_json::from_str(&stdout).unwrap_or_else(|e| {
        panic!("fsck {args:?}: no JSON report ({e}):\nstdout: {stdout}\nstderr: {}", String::from_utf8_lossy(&o.stderr))
    });
    (o.status.code().expect("fsck exited normally"), report)
}

fn problems(report: &Value) -> BTreeSet<(String, String)> {
    report["problems"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| (p["kind"].as_str().unwrap().to_string(), p["entry"].as_str().unwrap().to_string()))
        .collect()
}

fn id_of(fs: &TestFs, rel: &str) -> EntryId {
    EntryId::parse(fs.entry_info(rel)["entry_id"].as_str().unwrap()).unwrap()
}

fn chunk_path(target_dir: &Path, id: EntryId) -> std::path::PathBuf {
    target_dir.join("chunks").join(format!("{:02x}", id.hash_dir())).join(id.to_string())
}

#[test]
fn fsck_reports_and_repairs_each_kind_of_damage() {
    let fs = TestFs::up(&["--chunk-size", "64k", "--storage", "2", "--targets-per-storage", "2"]);
    let mnt = fs.mnt_s().to_string();

    // Ordinary use.
    let big = random_bytes(7, 200 << 10);
    std::fs::create_dir_all(fs.path("d/sub")).unwrap();
    std::fs::write(fs.path("d/big"), &big).unwrap();
    std::fs::write(fs.path("keep"), b"kept").unwrap();
    std::fs::hard_link(fs.path("keep"), fs.path("d/keep2")).unwrap();
    std::fs::write(fs.path("dangle"), b"dangling soon").unwrap();
    std::fs::write(fs.path("orphan"), b"orphan data").unwrap();
    std::fs::write(fs.path("gone"), b"x").unwrap();
    std::fs::remove_file(fs.path("gone")).unwrap();
    std::fs::rename(fs.path("d/sub"), fs.path("sub2")).unwrap();
    std::fs::create_dir(fs.path("d/sub3")).unwrap();

    let (code, report) = fsck(&["--mount", &mnt]);
    assert_eq!((code, report["clean"].as_bool()), (0, Some(true)), "{report:#}");

    let big_id = id_of(&fs, "d/big");
    let big_targets: Vec<u64> =
        fs.entry_info("d/big")["targets"].as_array().unwrap().iter().map(|t| t.as_u64().unwrap()).collect();
    let (d_id, keep_id, dangle_id, orphan_id) =
        (id_of(&fs, "d"), id_of(&fs, "keep"), id_of(&fs, "dangle"), id_of(&fs, "orphan"));
    fs.down();

    // Damage, with the services stopped.
    let dirs = fs.target_dirs();
    let unknown = EntryId { node: 999, epoch: 7, counter: 1 };
    let (&t0, t0_dir) = dirs.iter().min_by_key(|(t, _)| **t).unwrap();
    let p = chunk_path(t0_dir, unknown);
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::fs::write(&p, b"stray chunk").unwrap();
    // The chunk holding big's last byte (chunk 3 of 64 KiB chunks) goes: its size shrinks to 3 chunks.
    let last = big_targets[3 % big_targets.len()];
    std::fs::remove_file(chunk_path(&dirs[&last], big_id)).unwrap();
    let meta = fs.dir.join("meta1");
    hivefs_meta::fsck::offline::remove_inode(&meta, dangle_id).unwrap();
    hivefs_meta::fsck::offline::remove_dentry(&meta, EntryId::ROOT, b"orphan").unwrap();
    hivefs_meta::fsck::offline::set_nlink(&meta, keep_id, 5).unwrap();
    hivefs_meta::fsck::offline::set_nlink(&meta, d_id, 9).unwrap();

    let want: BTreeSet<(String, String)> = [
        ("dangling-dentry", dangle_id),
        ("orphaned-chunk", dangle_id), // its inode went, its chunk file stayed
        ("orphaned-chunk", unknown),
        ("orphaned-inode", orphan_id),
        ("wrong-nlink", keep_id),
        ("wrong-nlink", d_id),
        ("size-mismatch", big_id),
    ]
    .into_iter()
    .map(|(k, id)| (k.to_string(), id.to_string()))
    // The removed inode is still counted in root's quota usage.
    .chain(["user 0", "group 0"].map(|who| ("wrong-usage".to_string(), who.to_string())))
    .collect();

    // Offline mode: the services are started for the check and stopped again.
    let (code, report) = fsck(&["--dir", fs.dir_s()]);
    assert_eq!(code, 1, "{report:#}");
    assert_eq!(problems(&report), want, "{report:#}");

    fs.reup(); // would fail to bind its ports if the check had left services running
    let (code, report) = fsck(&["--mount", &mnt]);
    assert_eq!(code, 1, "{report:#}");
    assert_eq!(problems(&report), want, "{report:#}");
    let by_kind = |k: &str, id: EntryId| {
        report["problems"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["kind"] == k && p["entry"] == id.to_string().as_str())
            .cloned()
            .unwrap()
    };
    assert_eq!(by_kind("dangling-dentry", dangle_id)["path"], "/dangle");
    assert_eq!(by_kind("size-mismatch", big_id)["path"], "/d/big");
    assert_eq!(by_kind("wrong-nlink", d_id)["path"], "/d");
    assert_eq!(by_kind("orphaned-chunk", unknown)["target"], t0);

    let (code, report) = fsck(&["--mount", &mnt, "--repair"]);
    assert_eq!(code, 0, "{report:#}");
    let repairs = report["repairs"].as_array().unwrap();
    assert_eq!(repairs.len(), want.len(), "{report:#}");
    assert!(repairs.iter().all(|r| r["done"] == true), "{report:#}");

    let (code, report) = fsck(&["--mount", &mnt]);
    assert_eq!((code, report["clean"].as_bool()), (0, Some(true)), "{report:#}");

    // What the repairs mean through the mount.
    assert_eq!(std::fs::read(fs.path(&format!("lost+found/{orphan_id}"))).unwrap(), b"orphan data");
    assert_eq!(std::fs::metadata(fs.path("d/big")).unwrap().len(), 3 * (64 << 10));
    assert_eq!(std::fs::read(fs.path("d/big")).unwrap(), &big[..3 * (64 << 10)]);
    assert!(!fs.path("dangle").exists());
    assert_eq!(std::fs::metadata(fs.path("keep")).unwrap().nlink(), 2);
    assert_eq!(std::fs::metadata(fs.path("d")).unwrap().nlink(), 3);
    assert!(!p.exists(), "stray chunk file removed");
}

#[test]
fn fsck_text_output_and_exit_status_on_error() {
    let fs = TestFs::up(&["--storage", "1", "--targets-per-storage", "1"]);
    std::fs::write(fs.path("a"), b"hello").unwrap();
    let o = hivefs(&["fsck", "--mount", fs.mnt_s()]);
    let out = String::from_utf8_lossy(&o.stdout);
    assert_eq!(o.status.code(), Some(0), "{out}");
    assert!(out.contains("clean:"), "{out}");
    // No mgmtd there: an error, exit status 2, naming the address.
    let o = hivefs(&["fsck", "--mgmtd", "127.0.0.1:1"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("127.0.0.1:1"), "{}", String::from_utf8_lossy(&o.stderr));
}
