//! The classic transport: threads blocked in `read(2)` on `/dev/fuse`
//! (each on its own clone of the session's descriptor, so requests are
//! spread over them), answers written with one `writev(2)` to the
//! descriptor the request came from.

use crate::request::{dispatch, Args, Handled, InHeader, IN_HEADER_LEN};
use crate::{out_header, Filesystem, Sink};
use std::fs::File;
use std::io::{IoSlice, Read, Write};
use std::os::fd::AsRawFd;
use std::sync::Arc;
use tracing::{debug, error, warn};

/// `FUSE_DEV_IOC_CLONE`: `_IOR(229, 0, uint32_t)`.
const FUSE_DEV_IOC_CLONE: u64 = 0x8004_e500;

pub(crate) fn write_reply(f: &File, unique: u64, error: i32, args: &[&[u8]]) {
    let len = 16 + args.iter().map(|a| a.len()).sum::<usize>();
    let h = out_header(len, error, unique);
    // Answers carry at most two argument parts: the vector stays on the stack.
    let mut iov = [IoSlice::new(&h), IoSlice::new(&[]), IoSlice::new(&[])];
    let mut n = 1;
    for a in args.iter().filter(|a| !a.is_empty()) {
        iov[n] = IoSlice::new(a);
        n += 1;
    }
    match (&*f).write_vectored(&iov[..n]) {
        Ok(n) if n == len => {}
        Ok(n) => error!("answer to FUSE request {unique}: {n} of {len} bytes written"),
        // The request was interrupted or the connection ended meanwhile.
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => debug!("answer to FUSE request {unique}: {e}"),
        Err(e) => warn!("answer to FUSE request {unique} failed: {e}"),
    }
}

/// A second descriptor of the same FUSE connection, with its own queue of
/// requests being processed.
fn clone_dev(dev: &File) -> std::io::Result<File> {
    let f = std::fs::OpenOptions::new().read(true).write(true).open("/dev/fuse")?;
    let fd = dev.as_raw_fd() as u32;
    // SAFETY: FUSE_DEV_IOC_CLONE reads one u32 (the descriptor to clone)
    // from the pointer, which points at a live local.
    #[allow(unsafe_code)]
    let r = unsafe { libc::ioctl(f.as_raw_fd(), FUSE_DEV_IOC_CLONE as _, &fd as *const u32) };
    if r != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(f)
}

/// Serves requests from `dev` (the session's `/dev/fuse`, INIT already
/// answered) on `threads` threads until the connection ends. `bufsize`
/// must hold the largest request: `max_write` and a page.
pub fn serve_dev<F: Filesystem + ?Sized>(
    fs: Arc<F>,
    dev: &File,
    threads: usize,
    bufsize: usize,
) -> std::io::Result<()> {
    let mut devs = vec![Arc::new(dev.try_clone()?)];
    for _ in 1..threads.max(1) {
        match clone_dev(dev) {
            Ok(f) => devs.push(Arc::new(f)),
            Err(e) => {
                warn!("cloning /dev/fuse failed ({e}): the threads share one descriptor");
                devs.push(devs[0].clone());
            }
        }
    }
    std::thread::scope(|s| {
        let handles: Vec<_> = devs
            .into_iter()
            .enumerate()
            .map(|(i, d)| {
                let fs = fs.clone();
                std::thread::Builder::new()
                    .name(format!("fuse-{i}"))
                    .spawn_scoped(s, move || read_loop(&*fs, d, bufsize))
                    .expect("spawning a FUSE thread")
            })
            .collect();
        let mut r = Ok(());
        for h in handles {
            if let Err(e) = h.join().expect("FUSE thread") {
                r = Err(e);
            }
        }
        r
    })
}

fn read_loop<F: Filesystem + ?Sized>(fs: &F, dev: Arc<File>, bufsize: usize) -> std::io::Result<()> {
    let mut buf = vec![0u8; bufsize];
    let sink = Sink::Dev(dev.clone());
    loop {
        let n = match (&*dev).read(&mut buf) {
            Ok(n) => n,
            Err(e) => match e.raw_os_error() {
                // ENOENT: the request was interrupted before it was read.
                Some(libc::ENOENT | libc::EINTR | libc::EAGAIN) => continue,
                // The file system was unmounted or the connection aborted.
                Some(libc::ENODEV) => return Ok(()),
                _ => return Err(e),
            },
        };
        let Some(h) = InHeader::parse(&buf[..n.min(IN_HEADER_LEN)]) else {
            error!("short FUSE request ({n} bytes)");
            continue;
        };
        let end = (h.len as usize).clamp(IN_HEADER_LEN, n);
        if dispatch(fs, h, Args::new(&buf[IN_HEADER_LEN..end], &[]), &sink) == Handled::Destroyed {
            return Ok(());
        }
    }
}
