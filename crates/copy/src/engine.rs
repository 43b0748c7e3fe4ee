//! The workers and their queue. A copy runs in three phases on one pool of
//! threads that share a LIFO queue of tasks (listing a directory, copying one
//! entry, one range of a large file, setting one directory's attributes):
//!
//! 1. the walk: each directory is created and listed, its subdirectories
//!    queued, its entries queued (or copied by the listing worker itself when
//!    the queue holds [`QUEUE_MAX`] tasks, which bounds memory without a
//!    deadlock); files larger than the range size are split into ranges;
//!    entries with several links are only collected;
//! 2. hard links: each group of names of one inode (those under SRC) is
//!    copied once under its first name in sorted order and the others linked;
//! 3. directories' owners, modes and times, once nothing is written into
//!    them any more (setting them changes no other directory, so in any
//!    order). With `--part I/N`, N > 1, this is left to the final
//!    `--dir-attrs-only` run: other parts may still be writing.
//!
//! Files written by several parts (split into ranges owned by different
//! parts) get their attributes from that final run too, so an interrupted
//! part never leaves a file whose modification time `--update` would trust.

use crate::attrs::{self, finish_file, finish_path, set_times, Keep, Kind, Meta};
use crate::data::{copy_range, CfrPairs, Files, PROBE_MIN_BYTES};
use crate::plan::Job;
use crate::{Failure, OpContext, OpError, Options, Progress, Summary, MAX_FAILURES_KEPT};
use rustix::fs::{Mode, OFlags};
use rustix::io::Errno;
use std::collections::HashMap;
use std::fs::File;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, RwLock};
use std::time::Instant;

/// Tasks the queue holds before listing workers copy entries themselves.
pub const QUEUE_MAX: usize = 65_536;

/// One entry to copy: where from, where to, its path relative to DST.
#[derive(Clone, Debug)]
struct Entry {
    src: PathBuf,
    dst: PathBuf,
    rel: PathBuf,
    meta: Meta,
}

enum Task {
    /// Create (or check) the directory and list it.
    Dir(Entry),
    /// Copy one entry that is not a directory.
    Entry(Entry),
    /// Copy the first name of a hard-link group, then link the others.
    Group(Entry, Vec<PathBuf>),
    /// One range of a file split into ranges.
    Range(Arc<Split>, u64),
    /// Set a directory's attributes.
    DirAttrs(Entry),
}

/// A file copied in ranges by several workers; the last range to finish
/// sets its attributes and links its other names.
struct Split {
    entry: Entry,
    src: File,
    /// Taken (and closed) by the last range, before the times are set.
    dst: RwLock<Option<File>>,
    /// The destination's `fstat` when it was opened.
    st: rustix::fs::Stat,
    /// Other parts write ranges too: holes are punched, attributes are left
    /// to `--dir-attrs-only`.
    shared: bool,
    links: Vec<PathBuf>,
    left: AtomicU64,
    failed: AtomicBool,
}

#[derive(Default)]
struct Queue {
    state: Mutex<QueueState>,
    wake: Condvar,
}

#[derive(Default)]
struct QueueState {
    tasks: Vec<Task>,
    busy: usize,
}

impl Queue {
    fn push(&self, t: Task) {
        self.state.lock().expect("queue").tasks.push(t);
        self.wake.notify_one();
    }

    fn len(&self) -> usize {
        self.state.lock().expect("queue").tasks.len()
    }

    /// The next task, or None once the queue is empty and no worker is busy
    /// (nothing more can be queued).
    fn next(&self) -> Option<Task> {
        let mut s = self.state.lock().expect("queue");
        loop {
            if let Some(t) = s.tasks.pop() {
                s.busy += 1;
                return Some(t);
            }
            if s.busy == 0 {
                self.wake.notify_all();
                return None;
            }
            s = self.wake.wait(s).expect("queue");
        }
    }

    fn done(&self) {
        let mut s = self.state.lock().expect("queue");
        s.busy -= 1;
        if s.busy == 0 && s.tasks.is_empty() {
            self.wake.notify_all();
        }
    }
}

/// Counters only the summary needs.
#[derive(Default)]
struct Counts {
    dirs: AtomicU64,
    symlinks: AtomicU64,
    hard_links: AtomicU64,
    specials: AtomicU64,
    hole_bytes: AtomicU64,
    skipped_bytes: AtomicU64,
}

struct Run<'a> {
    opts: &'a Options,
    progress: &'a Progress,
    on_failure: &'a (dyn Fn(&Failure) + Sync),
    keep: Keep,
    queue: Queue,
    failures: Mutex<Vec<Failure>>,
    dirs: Mutex<Vec<Entry>>,
    groups: Mutex<HashMap<(u64, u64), Vec<Entry>>>,
    counts: Counts,
    cfr: CfrPairs,
}

/// Runs the jobs (from [`crate::plan`]) with `opts`; `progress` is updated
/// as the copy goes and `on_failure` hears of each entry that failed.
pub fn copy(jobs: &[Job], opts: &Options, progress: &Progress, on_failure: &(dyn Fn(&Failure) + Sync)) -> Summary {
    let start = Instant::now();
    let run = Run {
        opts,
        progress,
        on_failure,
        keep: Keep { owner: attrs::is_root(), xattrs: opts.xattrs },
        queue: Queue::default(),
        failures: Mutex::new(Vec::new()),
        dirs: Mutex::new(Vec::new()),
        groups: Mutex::new(HashMap::new()),
        counts: Counts::default(),
        cfr: CfrPairs::default(),
    };
    let stop_count = AtomicBool::new(false);
    std::thread::scope(|s| {
        if opts.precount {
            s.spawn(|| precount(jobs, opts, progress, &stop_count));
        }
        for j in jobs {
            let e = Entry { src: j.src.clone(), dst: j.dst.clone(), rel: j.rel.clone(), meta: j.meta.clone() };
            run.queue.push(if e.meta.kind == Kind::Dir { Task::Dir(e) } else { Task::Entry(e) });
        }
        run.work();
        run.queue_groups();
        run.work();
        if !opts.part.is_split() || opts.dir_attrs_only {
            for d in std::mem::take(&mut *run.dirs.lock().expect("dirs")) {
                run.queue.push(Task::DirAttrs(d));
            }
            run.work();
        }
        stop_count.store(true, Ordering::Relaxed);
    });
    run.summary(start)
}

impl Run<'_> {
    /// Runs the queue dry on the workers.
    fn work(&self) {
        std::thread::scope(|s| {
            for _ in 0..self.opts.workers {
                s.spawn(|| {
                    while let Some(t) = self.queue.next() {
                        self.task(t);
                        self.queue.done();
                    }
                });
            }
        });
    }

    fn task(&self, t: Task) {
        match t {
            Task::Dir(e) => self.dir(e),
            Task::Entry(e) => self.entry(e),
            Task::Group(e, links) => self.whole(e, links),
            Task::Range(s, i) => self.range(&s, i),
            Task::DirAttrs(e) => {
                if let Err(err) = finish_path(&e.src, &e.dst, &e.meta, self.keep) {
                    self.fail(err);
                }
            }
        }
    }

    fn fail(&self, e: OpError) {
        let f = Failure { path: e.path.display().to_string(), op: e.op, error: e.error.to_string() };
        Progress::add(&self.progress.errors, 1);
        (self.on_failure)(&f);
        let mut v = self.failures.lock().expect("failures");
        if v.len() < MAX_FAILURES_KEPT {
            v.push(f);
        }
    }

    fn other_done(&self, c: &AtomicU64) {
        Progress::add(c, 1);
        Progress::add(&self.progress.others, 1);
    }

    /// Creates (or, for `--dir-attrs-only`, checks) a directory and queues
    /// its entries.
    fn dir(&self, e: Entry) {
        if let Err(err) = self.make_dir(&e) {
            return self.fail(err);
        }
        let listed = attrs::list_dir(&e.src, |name, meta| {
            let src = e.src.join(&name);
            let meta = match meta {
                Ok(m) => m,
                Err(err) => return self.fail(OpError { path: src, op: "stat".into(), error: err }),
            };
            let c = Entry { src, dst: e.dst.join(&name), rel: e.rel.join(&name), meta };
            if c.meta.kind == Kind::Dir {
                self.queue.push(Task::Dir(c));
            } else if self.queue.len() >= QUEUE_MAX {
                self.entry(c);
            } else {
                self.queue.push(Task::Entry(c));
            }
        });
        if let Err(err) = listed {
            self.fail(OpError { path: e.src.clone(), op: "list directory".into(), error: err });
        }
        self.other_done(&self.counts.dirs);
        self.dirs.lock().expect("dirs").push(e);
    }

    fn make_dir(&self, e: &Entry) -> Result<(), OpError> {
        if !self.opts.dir_attrs_only {
            // Owner-only until its attributes are set, after its contents.
            match std::fs::DirBuilder::new().mode(0o700).create(&e.dst) {
                Ok(()) => return Ok(()),
                Err(err) if err.kind() == std::io::ErrorKind::AlreadyExists => {}
                Err(err) => return Err(err).op("create directory", &e.dst),
            }
        }
        match Meta::lstat(&e.dst) {
            Ok(m) if m.kind == Kind::Dir => Ok(()),
            Ok(_) => Err(Errno::NOTDIR).op("cannot overwrite non-directory with directory", &e.dst),
            Err(err) => Err(err).op("stat directory", &e.dst),
        }
    }

    /// An entry that is not a directory, met by the walk.
    fn entry(&self, e: Entry) {
        if self.opts.dir_attrs_only {
            // Only files that several parts wrote have attributes left to set.
            if e.meta.kind == Kind::File && e.meta.nlink == 1 && e.meta.size > self.opts.range_size {
                if let Err(err) = finish_path(&e.src, &e.dst, &e.meta, self.keep) {
                    self.fail(err);
                }
            }
            return;
        }
        if e.meta.nlink > 1 {
            let key = (e.meta.dev, e.meta.ino);
            self.groups.lock().expect("groups").entry(key).or_default().push(e);
            return;
        }
        let part = self.opts.part;
        let split_by_range = e.meta.kind == Kind::File && e.meta.size > self.opts.range_size && part.is_split();
        if split_by_range {
            self.file(e, Vec::new(), true);
        } else if part.owns(&e.rel) {
            self.whole(e, Vec::new());
        }
    }

    /// Queues each hard-link group whose first name (sorted) is this part's.
    fn queue_groups(&self) {
        for (_, mut names) in std::mem::take(&mut *self.groups.lock().expect("groups")) {
            names.sort_by(|a, b| a.rel.cmp(&b.rel));
            let first = names.remove(0);
            if self.opts.part.owns(&first.rel) {
                self.queue.push(Task::Group(first, names.into_iter().map(|n| n.dst).collect()));
            }
        }
    }

    /// Copies an entry (all of it: this part owns it), then links `links` to it.
    fn whole(&self, e: Entry, links: Vec<PathBuf>) {
        let r = match e.meta.kind {
            Kind::File => return self.file(e, links, false),
            Kind::Dir => unreachable!("directories are listed, not copied"),
            Kind::Symlink => self.symlink(&e),
            _ => self.special(&e),
        };
        match r {
            Ok(()) => self.link_all(&e.dst, &links),
            Err(err) => self.fail(err),
        }
    }

    /// A regular file: whole if small, else in ranges; `by_range`: only the
    /// ranges this part owns, into a file other parts write too.
    fn file(&self, e: Entry, links: Vec<PathBuf>, by_range: bool) {
        let size = e.meta.size;
        let count = size.div_ceil(self.opts.range_size);
        let mine: Vec<u64> =
            if by_range { (0..count).filter(|&i| self.opts.part.owns_range(&e.rel, i)).collect() } else { Vec::new() };
        if by_range && mine.is_empty() {
            return;
        }
        if self.opts.update && self.up_to_date(&e) {
            Progress::add(&self.progress.skipped, 1);
            Progress::add(&self.progress.skipped_bytes, size);
            Progress::add(&self.counts.skipped_bytes, size);
            return self.link_all(&e.dst, &links);
        }
        let opened = open_src(&e.src).and_then(|src| {
            let dst = open_dst(&e.dst, e.meta.perm, !by_range)?;
            let st = rustix::fs::fstat(&dst).op("stat", &e.dst)?;
            Ok((src, dst, st))
        });
        let (src, dst, st) = match opened {
            Ok(o) => o,
            Err(err) => return self.fail(err),
        };
        if size <= self.opts.range_size {
            let r = self.copy_small(&e, &src, &dst, &st).and_then(|()| {
                drop(dst);
                set_times(&e.dst, &e.meta)
            });
            return match r {
                Ok(()) => {
                    Progress::add(&self.progress.files, 1);
                    self.link_all(&e.dst, &links);
                }
                Err(err) => self.fail(err),
            };
        }
        // Its final length first: ranges land anywhere, trailing holes stay.
        if let Err(err) = dst.set_len(size).op("set length", &e.dst) {
            return self.fail(err);
        }
        let ranges = if by_range { mine } else { (0..count).collect() };
        let split = Arc::new(Split {
            entry: e,
            src,
            dst: RwLock::new(Some(dst)),
            st,
            shared: by_range,
            links,
            left: AtomicU64::new(ranges.len() as u64),
            failed: AtomicBool::new(false),
        });
        for i in ranges {
            self.queue.push(Task::Range(split.clone(), i));
        }
    }

    fn copy_small(&self, e: &Entry, src: &File, dst: &File, st: &rustix::fs::Stat) -> Result<(), OpError> {
        let copied = self.copy_part(&files(e, src, dst, st.st_dev, false), 0, e.meta.size)?;
        if copied.data_end < e.meta.size {
            dst.set_len(e.meta.size).op("set length", &e.dst)?;
        }
        finish_file(dst, st, &e.src, &e.dst, &e.meta, self.keep)
    }

    /// Copies `[off, end)` of a file, counting its holes.
    fn copy_part(&self, f: &Files, off: u64, end: u64) -> Result<crate::data::Copied, OpError> {
        let c = copy_range(f, &self.cfr, off, end, &self.progress.bytes)?;
        let holes = (end - off) - c.data;
        Progress::add(&self.counts.hole_bytes, holes);
        Progress::add(&self.progress.skipped_bytes, holes);
        Ok(c)
    }

    fn range(&self, s: &Split, i: u64) {
        let e = &s.entry;
        let off = i * self.opts.range_size;
        let end = (off + self.opts.range_size).min(e.meta.size);
        {
            let dst = s.dst.read().expect("split");
            let dst = dst.as_ref().expect("open until its last range is done");
            if let Err(err) = self.copy_part(&files(e, &s.src, dst, s.st.st_dev, s.shared), off, end) {
                s.failed.store(true, Ordering::Relaxed);
                self.fail(err);
            }
        }
        if s.left.fetch_sub(1, Ordering::AcqRel) != 1 || s.failed.load(Ordering::Relaxed) {
            return;
        }
        // The last range: every other one has finished writing.
        let dst = s.dst.write().expect("split").take().expect("the last range closes it");
        let r = if s.shared {
            Ok(())
        } else {
            finish_file(&dst, &s.st, &e.src, &e.dst, &e.meta, self.keep).and_then(|()| {
                drop(dst);
                set_times(&e.dst, &e.meta)
            })
        };
        match r {
            Ok(()) => {
                Progress::add(&self.progress.files, 1);
                self.link_all(&e.dst, &s.links);
            }
            Err(err) => self.fail(err),
        }
    }

    fn symlink(&self, e: &Entry) -> Result<(), OpError> {
        let target = std::fs::read_link(&e.src).op("read symlink", &e.src)?;
        if self.opts.update && self.up_to_date(e) {
            Progress::add(&self.progress.skipped, 1);
            return Ok(());
        }
        replace(&e.dst, |p| std::os::unix::fs::symlink(&target, p)).op("create symlink", &e.dst)?;
        finish_path(&e.src, &e.dst, &e.meta, self.keep)?;
        self.other_done(&self.counts.symlinks);
        Ok(())
    }

    /// FIFOs, sockets, character and block devices.
    fn special(&self, e: &Entry) -> Result<(), OpError> {
        if self.opts.update && self.up_to_date(e) {
            Progress::add(&self.progress.skipped, 1);
            return Ok(());
        }
        let ft = match e.meta.kind {
            Kind::Fifo => rustix::fs::FileType::Fifo,
            Kind::Socket => rustix::fs::FileType::Socket,
            Kind::Char => rustix::fs::FileType::CharacterDevice,
            Kind::Block => rustix::fs::FileType::BlockDevice,
            k => unreachable!("{k:?} is not special"),
        };
        let mode = Mode::from_raw_mode(e.meta.perm & 0o777);
        replace(&e.dst, |p| Ok(rustix::fs::mknodat(rustix::fs::CWD, p, ft, mode, e.meta.rdev)?))
            .op("create special file", &e.dst)?;
        finish_path(&e.src, &e.dst, &e.meta, self.keep)?;
        self.other_done(&self.counts.specials);
        Ok(())
    }

    /// Whether the destination is the same as the source for `--update`: the
    /// same type, modification time, and size (files), target (symlinks) or
    /// device number (devices).
    fn up_to_date(&self, e: &Entry) -> bool {
        let Ok(d) = Meta::lstat(&e.dst) else { return false };
        let same = d.kind == e.meta.kind && d.mtime == e.meta.mtime;
        same && match e.meta.kind {
            Kind::File => d.size == e.meta.size,
            Kind::Symlink => std::fs::read_link(&e.dst).ok() == std::fs::read_link(&e.src).ok(),
            Kind::Char | Kind::Block => d.rdev == e.meta.rdev,
            _ => true,
        }
    }

    /// Links each of `links` to `first` (a name already linked to it is left).
    fn link_all(&self, first: &Path, links: &[PathBuf]) {
        if links.is_empty() {
            return;
        }
        let target = match Meta::lstat(first).op("stat", first) {
            Ok(m) => m,
            Err(err) => return self.fail(err),
        };
        for l in links {
            if let Ok(m) = Meta::lstat(l) {
                if (m.dev, m.ino) == (target.dev, target.ino) {
                    Progress::add(&self.progress.skipped, 1);
                    continue;
                }
            }
            match replace(l, |p| std::fs::hard_link(first, p)).op(&format!("link to {}", first.display()), l) {
                Ok(()) => self.other_done(&self.counts.hard_links),
                Err(err) => self.fail(err),
            }
        }
    }

    fn summary(&self, start: Instant) -> Summary {
        let elapsed_s = start.elapsed().as_secs_f64();
        let c = &self.counts;
        let p = self.progress;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let bytes = get(&p.bytes);
        Summary {
            files: get(&p.files),
            dirs: get(&c.dirs),
            symlinks: get(&c.symlinks),
            hard_links: get(&c.hard_links),
            specials: get(&c.specials),
            bytes,
            hole_bytes: get(&c.hole_bytes),
            skipped: get(&p.skipped),
            skipped_bytes: get(&c.skipped_bytes),
            errors: get(&p.errors),
            failures: std::mem::take(&mut *self.failures.lock().expect("failures")),
            elapsed_s,
            bytes_per_s: if elapsed_s > 0.0 { bytes as f64 / elapsed_s } else { 0.0 },
            workers: self.opts.workers,
            range_size: self.opts.range_size,
            part: self.opts.part.is_split().then(|| self.opts.part.to_string()),
        }
    }
}

/// What [`copy_range`] needs of an entry being copied.
fn files<'a>(e: &'a Entry, src: &'a File, dst: &'a File, dst_dev: u64, punch: bool) -> Files<'a> {
    let m = &e.meta;
    let probe = m.blocks * 512 < m.size || m.size >= PROBE_MIN_BYTES;
    Files { src, dst, src_path: &e.src, dst_path: &e.dst, devs: (m.dev, dst_dev), probe, punch }
}

/// Opens a source file for reading, without moving its access time where
/// the kernel lets us (owner or root).
fn open_src(p: &Path) -> Result<File, OpError> {
    let flags = OFlags::RDONLY | OFlags::CLOEXEC | OFlags::NOFOLLOW;
    let fd = match rustix::fs::open(p, flags | OFlags::NOATIME, Mode::empty()) {
        Err(Errno::PERM) => rustix::fs::open(p, flags, Mode::empty()),
        r => r,
    };
    fd.map(File::from).op("open source", p)
}

/// Opens the destination file for writing: a new file (created with the
/// source's permission bits, less the umask), or an existing regular file
/// (emptied if `truncate`); anything else in the way is replaced, and a file
/// we may not write is replaced too.
fn open_dst(p: &Path, perm: u32, truncate: bool) -> Result<File, OpError> {
    let create = OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::CLOEXEC;
    let mode = Mode::from_raw_mode(perm & 0o777);
    let existing = match rustix::fs::open(p, create, mode) {
        Ok(fd) => return Ok(File::from(fd)),
        Err(Errno::EXIST) => Meta::lstat(p).op("stat", p)?,
        Err(e) => return Err(e).op("create", p),
    };
    if existing.kind == Kind::Dir {
        return Err(Errno::ISDIR).op("cannot overwrite directory with non-directory", p);
    }
    if existing.kind == Kind::File {
        let flags = OFlags::WRONLY | OFlags::CLOEXEC | OFlags::NOFOLLOW;
        match rustix::fs::open(p, if truncate { flags | OFlags::TRUNC } else { flags }, Mode::empty()) {
            Ok(fd) => return Ok(File::from(fd)),
            Err(Errno::ACCESS) => {}
            Err(e) => return Err(e).op("open", p),
        }
    }
    std::fs::remove_file(p).op("remove", p)?;
    rustix::fs::open(p, create, mode).map(File::from).op("create", p)
}

/// Runs `make(p)`; if something is in the way (not a directory), removes it
/// and runs `make` again.
fn replace(p: &Path, make: impl Fn(&Path) -> std::io::Result<()>) -> std::io::Result<()> {
    match make(p) {
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            if Meta::lstat(p)?.kind == Kind::Dir {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::IsADirectory,
                    "cannot overwrite directory with non-directory",
                ));
            }
            std::fs::remove_file(p)?;
            make(p)
        }
        r => r,
    }
}

/// Counts what this run has to copy, beside the copy (one thread), for an
/// ETA; stops early if the copy ends first. Approximate with `--part`: a
/// hard-link group is counted under each of its names.
fn precount(jobs: &[Job], opts: &Options, p: &Progress, stop: &AtomicBool) {
    let mut stack: Vec<(PathBuf, PathBuf, Meta)> =
        jobs.iter().map(|j| (j.src.clone(), j.rel.clone(), j.meta.clone())).collect();
    while let Some((src, rel, m)) = stack.pop() {
        if stop.load(Ordering::Relaxed) {
            return;
        }
        match m.kind {
            Kind::Dir => {
                Progress::add(&p.total_others, 1);
                let _ = attrs::list_dir(&src, |name, meta| {
                    if let Ok(m) = meta {
                        stack.push((src.join(&name), rel.join(&name), m));
                    }
                });
            }
            Kind::File if m.size > opts.range_size && opts.part.is_split() => {
                let count = m.size.div_ceil(opts.range_size);
                let mine = (0..count).filter(|&i| opts.part.owns_range(&rel, i)).count() as u64;
                if mine > 0 {
                    Progress::add(&p.total_files, 1);
                    Progress::add(&p.total_bytes, (mine * opts.range_size).min(m.size));
                }
            }
            Kind::File if opts.part.owns(&rel) => {
                Progress::add(&p.total_files, 1);
                Progress::add(&p.total_bytes, m.size);
            }
            Kind::File => {}
            _ if opts.part.owns(&rel) => Progress::add(&p.total_others, 1),
            _ => {}
        }
    }
    p.counted.store(true, Ordering::Relaxed);
}
