//! FUSE over io_uring (Linux 6.14 and later, `FUSE_OVER_IO_URING` granted
//! at INIT).
//!
//! The kernel keeps one queue per possible CPU and hands a request to an
//! entry of the queue of the CPU its caller runs on. Each entry is a
//! `IORING_OP_URING_CMD` this side registered with two buffers: a header
//! (`struct fuse_uring_req_header`: the in/out header, the operation's own
//! header, and the entry's sizes) and a payload buffer for names and data.
//! The command completes when a request has been placed in them; the
//! answer is written into the same buffers and goes back with
//! `COMMIT_AND_FETCH`, which also makes the entry wait for the next
//! request: one submission per request instead of a `read(2)` and a
//! `writev(2)`. Forgets and interrupts still come through `/dev/fuse`.
//!
//! One thread per queue (pinned to its CPU) waits for completions,
//! dispatches, and is the only one to submit on its ring: the kernel copies
//! the next request into an entry's buffers in the context of whoever
//! submitted the entry's last command, so a commit from another thread
//! would make the kernel wake that thread later. An answer made on the
//! queue's thread is committed with its next wait; one made on another
//! thread (a runtime worker) is written into the entry's buffers there, and
//! the queue's thread is woken through an eventfd to commit it.

use crate::request::{dispatch, Args, InHeader, IN_HEADER_LEN};
use crate::{out_header, Filesystem, Sink};
use io_uring::{cqueue, opcode, squeue, types, IoUring};
use std::fs::File;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use tracing::{debug, error, info, warn};

/// `enum fuse_uring_cmd`.
const FUSE_IO_URING_CMD_REGISTER: u32 = 1;
const FUSE_IO_URING_CMD_COMMIT_AND_FETCH: u32 = 2;
/// `struct fuse_uring_req_header`: `in_out[128]`, `op_in[128]`, then
/// `struct fuse_uring_ent_in_out` (flags, commit_id, payload_sz, padding, reserved).
const HEADER_LEN: usize = 288;
const OP_IN: usize = 128;
const OP_IN_LEN: usize = 128;
const ENT_COMMIT_ID: usize = 256 + 8;
const ENT_PAYLOAD_SZ: usize = 256 + 16;
/// `user_data` of the read of a queue's eventfd (answers waiting to be
/// committed, or the end).
const WAKE: u64 = u64::MAX;

/// How many requests each queue holds and how large they may be.
#[derive(Clone, Copy, Debug)]
pub struct UringConfig {
    /// Entries per queue (requests in flight per CPU).
    pub depth: usize,
    /// Payload buffer of each entry: the largest write or read (`max_write`).
    pub payload: usize,
}

impl UringConfig {
    /// `max_io`: the `max_write` and `max_read` negotiated at INIT.
    pub fn new(max_io: usize) -> UringConfig {
        UringConfig { depth: 16, payload: max_io.max(8192) }
    }
}

/// An entry's two buffers, shared with the kernel.
struct Slot {
    header: Box<[u8]>,
    payload: Box<[u8]>,
    /// The two `iovec`s registered for the entry (kept alive while registered).
    iov: Box<[libc::iovec; 2]>,
}

/// One CPU's queue: its ring and entries.
pub(crate) struct Queue {
    qid: u16,
    /// The connection's `/dev/fuse` (set when serving starts).
    dev: std::sync::atomic::AtomicI32,
    /// Submitted to by the queue's thread only (the ring is enabled there).
    ring: IoUring<squeue::Entry128, cqueue::Entry>,
    slots: Vec<std::cell::UnsafeCell<Slot>>,
    stop: AtomicBool,
    /// Entries whose answers are written and wait to be committed by the
    /// queue's thread.
    answered: Mutex<Vec<usize>>,
    /// The queue's thread is (about to be) waiting in the kernel: an answer
    /// made elsewhere wakes it through `wake`.
    sleeping: AtomicBool,
    /// An eventfd the queue's thread always has a read pending on.
    wake: File,
    /// Where that read puts the counter.
    wake_buf: std::cell::UnsafeCell<u64>,
    /// The queue's thread (set when it starts).
    owner: std::sync::OnceLock<std::thread::ThreadId>,
}

// SAFETY: a slot's buffers are written by the kernel only while its command
// waits for a request, read by the queue's thread when that command has
// completed, and written by the one `Reply` that owns the request until it
// commits; both the submission and the completion queue are used by the
// queue's thread only (other threads push to `answered` and write `wake`).
#[allow(unsafe_code)]
unsafe impl Sync for Queue {}
#[allow(unsafe_code)]
unsafe impl Send for Queue {}

impl Queue {
    /// The command of `cmd_op` for `slot`: `struct fuse_uring_cmd_req`
    /// (flags, commit_id, qid) in the SQE's command area.
    fn command(&self, cmd_op: u32, slot: usize, commit_id: u64) -> squeue::Entry128 {
        let mut cmd = [0u8; 80];
        cmd[8..16].copy_from_slice(&commit_id.to_ne_bytes());
        cmd[16..18].copy_from_slice(&self.qid.to_ne_bytes());
        let mut op = opcode::UringCmd80::new(types::Fd(self.dev.load(Ordering::Relaxed)), cmd_op).cmd(cmd);
        if cmd_op == FUSE_IO_URING_CMD_REGISTER {
            // SAFETY: only the address of the slot's iovecs is taken.
            #[allow(unsafe_code)]
            let iov = unsafe { (*self.slots[slot].get()).iov.as_ptr() };
            op = op.addr(Some(iov as u64));
        }
        let e = op.build().user_data(slot as u64);
        if cmd_op != FUSE_IO_URING_CMD_REGISTER {
            return e;
        }
        // REGISTER also needs `sqe->len` = 2 (the number of iovecs), which
        // the builder has no field for: set in the SQE's bytes (offset 24).
        // SAFETY: `Entry128` is `repr(C)` over the 128 bytes of an SQE128.
        #[allow(unsafe_code)]
        let mut raw: [u8; 128] = unsafe { std::mem::transmute(e) };
        raw[24..28].copy_from_slice(&2u32.to_ne_bytes());
        #[allow(unsafe_code)]
        unsafe {
            std::mem::transmute::<[u8; 128], squeue::Entry128>(raw)
        }
    }

    /// Pushes `entries` for the next `io_uring_enter` (queue's thread),
    /// submitting at once only when the ring is full.
    fn push(&self, entries: &[squeue::Entry128]) -> std::io::Result<()> {
        let mut rest = entries;
        while !rest.is_empty() {
            // SAFETY: only the queue's thread touches the submission queue.
            #[allow(unsafe_code)]
            let mut sq = unsafe { self.ring.submission_shared() };
            let n = (sq.capacity() - sq.len()).min(rest.len());
            for e in &rest[..n] {
                // SAFETY: every entry points at buffers that live as long as the queue.
                #[allow(unsafe_code)]
                unsafe {
                    sq.push(e).expect("room checked")
                };
            }
            sq.sync();
            let full = sq.is_full();
            drop(sq);
            rest = &rest[n..];
            if full {
                self.ring.submitter().submit()?;
            }
        }
        Ok(())
    }

    /// Writes the answer to the request in `slot` and commits it, which
    /// also makes the entry wait for the next request.
    pub(crate) fn commit(&self, slot: usize, unique: u64, error: i32, args: &[&[u8]]) {
        let total: usize = args.iter().map(|a| a.len()).sum();
        // SAFETY: the slot's request is owned by this answer (see `Sync`).
        #[allow(unsafe_code)]
        let s = unsafe { &mut *self.slots[slot].get() };
        let (error, total) = if total > s.payload.len() {
            error!("answer to FUSE request {unique} ({total} bytes) exceeds the io_uring payload buffer");
            (-libc::EIO, 0)
        } else {
            (error, total)
        };
        if error == 0 {
            let mut at = 0;
            for a in args {
                s.payload[at..at + a.len()].copy_from_slice(a);
                at += a.len();
            }
        }
        let total = if error == 0 { total } else { 0 };
        s.header[..16].copy_from_slice(&out_header(16 + total, error, unique));
        s.header[ENT_PAYLOAD_SZ..ENT_PAYLOAD_SZ + 4].copy_from_slice(&(total as u32).to_ne_bytes());
        self.answered.lock().expect("answered").push(slot);
        if self.owner.get() != Some(&std::thread::current().id()) && self.sleeping.load(Ordering::SeqCst) {
            self.wake();
        }
    }

    /// Wakes the queue's thread (its eventfd).
    fn wake(&self) {
        use std::io::Write;
        if let Err(e) = (&self.wake).write_all(&1u64.to_ne_bytes()) {
            warn!("waking io_uring queue {}: {e}", self.qid);
        }
    }

    /// Adds to `into` the commands that commit the answered entries
    /// (queue's thread); `spare` is swapped with the list of answered
    /// entries, so neither allocates once grown.
    fn take_commits(&self, spare: &mut Vec<usize>, into: &mut Vec<squeue::Entry128>) {
        std::mem::swap(&mut *self.answered.lock().expect("answered"), spare);
        for slot in spare.drain(..) {
            // SAFETY: the answer is written; the kernel does not touch the
            // entry until the commit.
            #[allow(unsafe_code)]
            let h = unsafe { &(*self.slots[slot].get()).header };
            let commit_id = u64::from_ne_bytes(h[ENT_COMMIT_ID..ENT_COMMIT_ID + 8].try_into().expect("8 bytes"));
            into.push(self.command(FUSE_IO_URING_CMD_COMMIT_AND_FETCH, slot, commit_id));
        }
    }

    /// The read of the eventfd that wakes the queue's thread.
    fn wake_read(&self) -> squeue::Entry128 {
        squeue::Entry128::from(
            opcode::Read::new(types::Fd(self.wake.as_raw_fd()), self.wake_buf.get().cast(), 8).build().user_data(WAKE),
        )
    }
}

/// The running io_uring queues; dropping it stops their threads (after
/// the connection has ended).
pub struct UringSession {
    queues: Vec<Arc<Queue>>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl Drop for UringSession {
    fn drop(&mut self) {
        for q in &self.queues {
            q.stop.store(true, Ordering::Release);
            q.wake();
        }
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// The CPUs the kernel may ever run a caller on (`/sys/devices/system/cpu/possible`, "0-3,8").
fn possible_cpus() -> std::io::Result<usize> {
    let s = std::fs::read_to_string("/sys/devices/system/cpu/possible")?;
    let mut max = 0;
    for part in s.trim().split(',') {
        let last = part.rsplit('-').next().unwrap_or(part);
        let n: usize = last.parse().map_err(|_| std::io::Error::other(format!("possible CPUs {s:?}")))?;
        max = max.max(n + 1);
    }
    Ok(max)
}

/// Rings and buffers made before INIT is answered: once the kernel has
/// granted `FUSE_OVER_IO_URING` it holds every request until all queues
/// have entries (or a registration failed), so nothing that can fail for
/// lack of memory may come between the grant and the registrations.
pub struct UringQueues {
    queues: Vec<Arc<Queue>>,
    c: UringConfig,
}

impl UringQueues {
    /// One queue per possible CPU, `c.depth` entries each.
    pub fn prepare(c: UringConfig) -> std::io::Result<UringQueues> {
        let n = possible_cpus()?;
        let queues = (0..n).map(|qid| new_queue(qid as u16, c).map(Arc::new)).collect::<std::io::Result<_>>()?;
        Ok(UringQueues { queues, c })
    }

    /// Tells the kernel this side will not use the rings after all (a
    /// registration it refuses makes it send requests through /dev/fuse).
    /// (The queues' rings accept submissions from their own threads only.)
    fn give_up(dev: &File) {
        // No iovecs (`len` 0): refused with EINVAL.
        let e = opcode::UringCmd80::new(types::Fd(dev.as_raw_fd()), FUSE_IO_URING_CMD_REGISTER).cmd([0; 80]).build();
        let r = IoUring::<squeue::Entry128, cqueue::Entry>::builder().build(2).and_then(|ring| {
            // SAFETY: the entry points at nothing.
            #[allow(unsafe_code)]
            unsafe {
                ring.submission_shared().push(&e).map_err(std::io::Error::other)?
            };
            ring.submit_and_wait(1).map(drop)
        });
        if let Err(e) = r {
            error!("telling the kernel to keep FUSE requests on /dev/fuse failed: {e}; the mount may hang");
        }
    }
}

/// Registers the entries of every queue on `dev` (the session's
/// `/dev/fuse`, INIT answered with `FUSE_OVER_IO_URING`) and serves their
/// requests with `fs` on one thread per queue. The kernel moves requests
/// to the rings once every queue has entries; forgets and interrupts
/// always come through `/dev/fuse`. On an error the kernel is told to
/// keep using `/dev/fuse`.
pub fn serve_uring<F: Filesystem + ?Sized>(
    fs: Arc<F>,
    dev: &File,
    prepared: UringQueues,
) -> std::io::Result<UringSession> {
    let c = prepared.c;
    let mut session = UringSession { queues: Vec::new(), threads: Vec::new() };
    for q in &prepared.queues {
        q.dev.store(dev.as_raw_fd(), Ordering::Relaxed);
        let (tx, rx) = std::sync::mpsc::channel();
        let (fs, q2) = (fs.clone(), q.clone());
        let started = std::thread::Builder::new().name(format!("fuse-ring-{}", q.qid)).spawn(move || {
            pin_to_cpu(q2.qid as usize);
            let _ = q2.owner.set(std::thread::current().id());
            let r = q2.ring.submitter().register_enable_rings().and_then(|()| register(&q2));
            let ok = r.is_ok();
            let _ = tx.send(r);
            if ok {
                run_queue(&*fs, &q2);
            }
        });
        let registered = match started {
            Ok(t) => {
                session.threads.push(t);
                session.queues.push(q.clone());
                rx.recv().unwrap_or_else(|_| Err(std::io::Error::other("io_uring queue thread ended")))
            }
            Err(e) => Err(e),
        };
        if let Err(e) = registered {
            UringQueues::give_up(dev);
            return Err(e);
        }
    }
    info!("FUSE over io_uring: {} queues of {} entries registered", prepared.queues.len(), c.depth);
    Ok(session)
}

fn new_queue(qid: u16, c: UringConfig) -> std::io::Result<Queue> {
    // Registrations and commits: at most one per entry at a time, and a wake.
    // Submitted from the queue's thread only (enabled there), which also
    // runs the kernel's deliveries into the entries' buffers when it waits.
    let ring = IoUring::<squeue::Entry128, cqueue::Entry>::builder()
        .setup_r_disabled()
        .setup_single_issuer()
        .setup_defer_taskrun()
        .build((c.depth as u32 + 1).next_power_of_two())?;
    let slots = (0..c.depth)
        .map(|_| {
            let mut header = vec![0u8; HEADER_LEN].into_boxed_slice();
            let mut payload = vec![0u8; c.payload].into_boxed_slice();
            let iov = Box::new([
                libc::iovec { iov_base: header.as_mut_ptr().cast(), iov_len: header.len() },
                libc::iovec { iov_base: payload.as_mut_ptr().cast(), iov_len: payload.len() },
            ]);
            std::cell::UnsafeCell::new(Slot { header, payload, iov })
        })
        .collect();
    // SAFETY: eventfd(2) with valid flags; the descriptor is owned by the File.
    #[allow(unsafe_code)]
    let wake = unsafe {
        let fd = libc::eventfd(0, libc::EFD_CLOEXEC);
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        <File as std::os::fd::FromRawFd>::from_raw_fd(fd)
    };
    Ok(Queue {
        qid,
        dev: std::sync::atomic::AtomicI32::new(-1),
        ring,
        slots,
        stop: AtomicBool::new(false),
        answered: Mutex::new(Vec::new()),
        sleeping: AtomicBool::new(false),
        wake,
        wake_buf: std::cell::UnsafeCell::new(0),
        owner: std::sync::OnceLock::new(),
    })
}

fn pin_to_cpu(cpu: usize) {
    // SAFETY: a zeroed cpu_set_t is valid; CPU_SET writes within it.
    #[allow(unsafe_code)]
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) != 0 {
            debug!("pinning the io_uring thread of queue {cpu}: {}", std::io::Error::last_os_error());
        }
    }
}

/// Registers every entry of `q`; an error the kernel answers at once (a
/// registration refused) fails the transport.
fn register(q: &Queue) -> std::io::Result<()> {
    let mut entries: Vec<_> = (0..q.slots.len()).map(|i| q.command(FUSE_IO_URING_CMD_REGISTER, i, 0)).collect();
    entries.push(q.wake_read());
    q.push(&entries)?;
    q.ring.submitter().submit()?;
    // SAFETY: only this queue's thread reads its completions.
    #[allow(unsafe_code)]
    let cq = unsafe { q.ring.completion_shared() };
    for cqe in cq {
        if cqe.result() < 0 {
            let e = std::io::Error::from_raw_os_error(-cqe.result());
            return Err(std::io::Error::other(format!("registering io_uring queue {}: {e}", q.qid)));
        }
        warn!("io_uring queue {}: request {} before registration ended", q.qid, cqe.user_data());
    }
    Ok(())
}

fn run_queue<F: Filesystem + ?Sized>(fs: &F, q: &Arc<Queue>) {
    let mut live = q.slots.len();
    let mut pending: Vec<squeue::Entry128> = Vec::new();
    let (mut spare, mut done) = (Vec::new(), Vec::new());
    while live > 0 && !q.stop.load(Ordering::Acquire) {
        q.take_commits(&mut spare, &mut pending);
        if let Err(e) = q.push(&pending) {
            error!("io_uring queue {} stopped: {e}", q.qid);
            return;
        }
        pending.clear();
        // Answers made elsewhere from here on wake this thread.
        q.sleeping.store(true, Ordering::SeqCst);
        let more = !q.answered.lock().expect("answered").is_empty();
        let waited = if more { Ok(0) } else { q.ring.submitter().submit_and_wait(1) };
        q.sleeping.store(false, Ordering::SeqCst);
        if let Err(e) = waited {
            if e.raw_os_error() == Some(libc::EINTR) {
                continue;
            }
            error!("io_uring queue {} stopped: {e}", q.qid);
            return;
        }
        // SAFETY: only this queue's thread reads its completions.
        #[allow(unsafe_code)]
        done.extend(unsafe { q.ring.completion_shared() }.map(|c| (c.user_data(), c.result())));
        for (slot, res) in done.drain(..) {
            if slot == WAKE {
                pending.push(q.wake_read());
                continue;
            }
            if res < 0 {
                // The connection ended (or the entry was cancelled): the entry is gone.
                debug!("io_uring queue {} entry {slot}: {}", q.qid, std::io::Error::from_raw_os_error(-res));
                live -= 1;
                continue;
            }
            serve_one(fs, q, slot as usize);
        }
    }
    debug!("io_uring queue {} ends", q.qid);
}

/// Decodes the request in `slot` and hands it to `fs`.
fn serve_one<F: Filesystem + ?Sized>(fs: &F, q: &Arc<Queue>, slot: usize) {
    // SAFETY: the entry's command completed: the kernel has placed a
    // request and no answer exists yet (see `Sync`).
    #[allow(unsafe_code)]
    let s = unsafe { &*q.slots[slot].get() };
    let Some(h) = InHeader::parse(&s.header[..IN_HEADER_LEN]) else { return };
    let payload_sz = u32::from_ne_bytes(s.header[ENT_PAYLOAD_SZ..ENT_PAYLOAD_SZ + 4].try_into().expect("4 bytes"));
    let payload_sz = (payload_sz as usize).min(s.payload.len());
    // The operation's header is what the length counts beyond the header and the payload.
    let op_len = (h.len as usize).saturating_sub(IN_HEADER_LEN + payload_sz).min(OP_IN_LEN);
    let args = Args::new(&s.header[OP_IN..OP_IN + op_len], &s.payload[..payload_sz]);
    dispatch(fs, h, args, &Sink::Ring(q.clone(), slot));
}
