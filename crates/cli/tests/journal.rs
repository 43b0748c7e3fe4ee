//! The metadata journal under crashes: the metadata service aborts (as
//! `kill -9`) with a batch in the journal but not answered, and in the
//! middle of a checkpoint; its journal's last record is torn. Each case ends
//! with every acknowledged create present exactly once (a create in flight
//! at the crash is retried by the mount and answered from the replayed
//! journal), nothing else, and `hivefs fsck` clean.

mod common;

use common::*;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const UP: &[&str] = &["--storage", "1", "--targets-per-storage", "1"];

/// Small checkpoints, so that a few hundred creates start one.
fn small_checkpoints(fs: &mut TestFs) {
    std::fs::create_dir_all(fs.dir.join("meta1")).unwrap();
    std::fs::write(fs.dir.join("meta1/meta.toml"), "checkpoint_bytes = 65536\n").unwrap();
}

/// Every name in `acked` exists with its content; besides them `dir` holds
/// at most the one create that was in flight (the next name).
fn assert_exactly(fs: &TestFs, dir: &str, acked: &[String]) {
    let mut listed: Vec<String> =
        std::fs::read_dir(fs.path(dir)).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    listed.sort();
    for name in acked {
        assert_eq!(std::fs::read(fs.path(&format!("{dir}/{name}"))).unwrap(), name.as_bytes(), "{dir}/{name}");
    }
    let extra: Vec<&String> = listed.iter().filter(|n| !acked.contains(n)).collect();
    let next = format!("f{:05}", acked.len());
    assert!(extra.is_empty() || extra == [&next], "{dir}: unacknowledged entries {extra:?} (next was {next})");
    assert!(listed.len() >= acked.len(), "{dir}: {} listed, {} acknowledged", listed.len(), acked.len());
}

/// Restarts the file system with the metadata service armed to abort at
/// `hook`, creates files in `dir` one by one until it has crashed and been
/// restarted, and returns the acknowledged names.
fn creates_across_crash(fs: &TestFs, hook: &str, dir: &str) -> Vec<String> {
    std::fs::create_dir(fs.path(dir)).unwrap();
    fs.arm(hook);
    let acked = Arc::new(Mutex::new(Vec::new()));
    let stop = Arc::new(AtomicBool::new(false));
    let t = {
        let (acked, stop, base) = (acked.clone(), stop.clone(), fs.path(dir));
        std::thread::spawn(move || {
            let mut i = 0;
            while !stop.load(Ordering::SeqCst) && i < 50_000 {
                let name = format!("f{i:05}");
                match std::fs::write(base.join(&name), name.as_bytes()) {
                    Ok(()) => acked.lock().unwrap().push(name),
                    Err(e) => return Some(format!("{name}: {e}")),
                }
                i += 1;
            }
            None
        })
    };
    let start = Instant::now();
    while fs.alive("meta1") {
        assert!(!t.is_finished(), "{hook}: the creates ended without a crash");
        assert!(start.elapsed() < Duration::from_secs(120), "{hook}: the metadata service never crashed");
        std::thread::sleep(Duration::from_millis(20));
    }
    let log = std::fs::read_to_string(fs.dir.join("meta1/meta1.log")).unwrap_or_default();
    assert!(log.contains("aborting"), "{hook}: not the hook that stopped it:\n{log}");
    fs.reup();
    // Some creates after the restart, then stop.
    let n = acked.lock().unwrap().len();
    while acked.lock().unwrap().len() < n + 20 && !t.is_finished() {
        std::thread::sleep(Duration::from_millis(10));
    }
    stop.store(true, Ordering::SeqCst);
    if let Some(e) = t.join().unwrap() {
        panic!("{hook}: a create failed across the crash (the mount should retry it): {e}");
    }
    let acked = acked.lock().unwrap().clone();
    assert!(acked.len() > n, "{hook}: creates went on after the restart");
    acked
}

#[test]
fn kill_mid_batch_and_mid_checkpoint_loses_nothing_acknowledged() {
    let fs = TestFs::up_with(UP, small_checkpoints);
    for (i, hook) in ["journal:appended", "checkpoint:commit", "checkpoint:committed"].iter().enumerate() {
        let dir = format!("d{i}");
        let acked = creates_across_crash(&fs, hook, &dir);
        assert_exactly(&fs, &dir, &acked);
        // And again after a clean restart, which replays the journal once more.
        fs.down();
        fs.reup();
        assert_exactly(&fs, &dir, &acked);
        fs.assert_fsck_clean();
    }
}

#[test]
fn a_torn_last_journal_record_is_cut_off_at_start() {
    let fs = TestFs::up(UP);
    std::fs::create_dir(fs.path("d")).unwrap();
    let acked: Vec<String> = (0..50).map(|i| format!("f{i:05}")).collect();
    for n in &acked {
        std::fs::write(fs.path(&format!("d/{n}")), n.as_bytes()).unwrap();
    }
    fs.kill9("meta1");
    // The newest segment gets a record cut short: a header promising 4 KiB.
    let jdir = fs.dir.join("meta1/journal");
    let mut segs: Vec<_> = std::fs::read_dir(&jdir).unwrap().map(|e| e.unwrap().path()).collect();
    segs.sort();
    let newest = segs.last().expect("a journal segment").clone();
    let before = std::fs::metadata(&newest).unwrap().len();
    let mut torn = 4096u32.to_le_bytes().to_vec();
    torn.extend_from_slice(&[0xa5; 40]);
    let mut f = std::fs::OpenOptions::new().append(true).open(&newest).unwrap();
    std::io::Write::write_all(&mut f, &torn).unwrap();
    drop(f);
    fs.reup();
    assert_exactly(&fs, "d", &acked);
    assert_eq!(std::fs::metadata(&newest).unwrap().len(), before, "the torn tail was cut off");
    let log = std::fs::read_to_string(fs.dir.join("meta1/meta1.log")).unwrap();
    assert!(log.contains("torn journal record cut off"), "no warning about the torn record:\n{log}");
    std::fs::write(fs.path("d/after"), b"after").unwrap();
    fs.assert_fsck_clean();
}
