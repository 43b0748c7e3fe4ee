//! Signals to processes blocked in the mount on a server that does not
//! answer: a process being killed dies at once (its request is answered
//! early), one that handles a signal is not interrupted and gets its data
//! once the server answers again.

// A signal handler and a raw read(2) in a thread that gets the signal.
#![allow(unsafe_code)]

mod common;
use common::*;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

extern "C" fn on_signal(_: libc::c_int) {}

#[test]
fn a_process_killed_while_its_server_does_not_answer_dies_at_once() {
    let fs = TestFs::up(&["--storage", "1", "--targets-per-storage", "1"]);
    let data = random_bytes(31, 1 << 20);
    std::fs::write(fs.path("f"), &data).unwrap();
    std::fs::write(fs.path("g"), b"").unwrap();
    // Chunk I/O over TCP, and an I/O timeout far beyond what this test waits.
    let m2 = fs.extra_mount("m2", &["--no-short-circuit", "--io-timeout-ms", "600000"]);
    let stopped = Stopped::new(fs.pid("storage1"));

    let mut cat = Command::new("cat");
    cat.arg(m2.mnt.join("f")).stdout(Stdio::null());
    // A shell's background job (a CI run) starts with SIGINT ignored, and
    // its children inherit that: Ctrl-C's default action, as in a terminal.
    // SAFETY: signal(2) is async-signal-safe, as pre_exec requires.
    unsafe {
        cat.pre_exec(|| {
            libc::signal(libc::SIGINT, libc::SIG_DFL);
            Ok(())
        })
    };
    let reader = cat.spawn().unwrap();
    let writer = Command::new("dd")
        .args(["if=/dev/zero", "bs=64k", "count=16", "conv=notrunc"])
        .arg(format!("of={}", m2.mnt.join("g").display()))
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_secs(1));
    for (mut child, what, sig) in [(reader, "cat", libc::SIGINT), (writer, "dd", libc::SIGKILL)] {
        assert!(child.try_wait().unwrap().is_none(), "{what} ended while the storage service was stopped");
        // SAFETY: kill(2) of a child this test started and has not reaped.
        assert_eq!(unsafe { libc::kill(child.id() as i32, sig) }, 0);
        let st = wait_child(&mut child, Duration::from_secs(30), &format!("{what} killed by signal {sig}"));
        assert_eq!(st.signal(), Some(sig), "{what}: {st:?}");
    }
    drop(stopped);
    assert!(std::fs::read(m2.mnt.join("f")).unwrap() == data, "the file read through the mount afterwards");
    let log = std::fs::read_to_string(&m2.log).unwrap();
    assert!(!log.contains("panicked"), "{log}");
}

#[test]
fn a_process_that_handles_a_signal_is_not_interrupted() {
    let fs = TestFs::up(&["--storage", "1", "--targets-per-storage", "1"]);
    let data = random_bytes(32, 256 << 10);
    std::fs::write(fs.path("f"), &data).unwrap();
    let m2 = fs.extra_mount("m2", &["--no-short-circuit", "--io-timeout-ms", "600000"]);
    let f = std::fs::File::open(m2.mnt.join("f")).unwrap();
    // SAFETY: installs a handler that does nothing, for SIGUSR1, which nothing else here uses.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = on_signal as *const () as usize;
        // No SA_RESTART: an interrupted read would return EINTR.
        assert_eq!(libc::sigaction(libc::SIGUSR1, &sa, std::ptr::null_mut()), 0);
    }
    let stopped = Stopped::new(fs.pid("storage1"));
    let (tx, rx) = mpsc::channel();
    let reader = std::thread::spawn(move || {
        use std::os::fd::AsRawFd;
        // SAFETY: returns the calling thread's id.
        tx.send(unsafe { libc::pthread_self() }).unwrap();
        let mut buf = vec![0u8; 256 << 10];
        // SAFETY: read(2) into a live buffer of its length.
        let n = unsafe { libc::read(f.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
        let e = std::io::Error::last_os_error().raw_os_error().unwrap_or(0);
        (n, e, buf)
    });
    let tid = rx.recv().unwrap();
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(2) {
        assert!(!reader.is_finished(), "the read returned while the storage service was stopped");
        // SAFETY: the reader thread runs until `is_finished`, so `tid` is live.
        unsafe { libc::pthread_kill(tid, libc::SIGUSR1) };
        std::thread::sleep(Duration::from_millis(200));
    }
    drop(stopped);
    let (n, e, buf) = reader.join().unwrap();
    assert_eq!(n, data.len() as isize, "read(2) with a handled signal: errno {e}");
    assert!(buf == data, "contents differ");
}
