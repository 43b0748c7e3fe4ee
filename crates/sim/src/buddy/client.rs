//! A client of mirrored chunk files: the real client's routing
//! (`Cluster::call_unit`: to the group's current primary, retried across a
//! failover), a model of each of its chunk files, and the check of every
//! answer against it.
//!
//! A client sends through two mounts (two `Cluster`s, each with its own
//! view of the groups), picking one per operation: a change acknowledged
//! through one must be what a read through the other sees, even when that
//! one's view still names a former primary.
//!
//! Each client owns its chunk files (entries no other client touches), so
//! the model predicts every read exactly: a write, truncation or removal
//! that was acknowledged must be what the next read sees, whichever member
//! serves it after however many failovers. A change whose answer was lost
//! is sent again, unchanged, until one is acknowledged (all of them are
//! idempotent). A change that failed on a disk (`Io`, `NoSpace`) may have
//! landed in part, on one member or both: the client then reads the whole
//! file, and from then on the model is what that read returned, so a
//! member left different by the failure shows at a later read through it.

use crate::buddy::world::{self, Ep, StorageWorld as World, MGMTD};
use bytes::Bytes;
use hivefs_cluster::Cluster;
use hivefs_proto::Reply;
use hivefs_proto::Request;
use hivefs_types::error::{ErrorCode, FsError};
use hivefs_types::ids::{BuddyGroupId, EntryId, TargetId};
use hivefs_types::pattern::StripeUnit;
use rand::Rng;
use std::sync::Arc;
use std::time::Duration;

/// Bytes of the region the operations touch per file.
pub const SPAN: u64 = 48 << 10;
/// Time a client gives one attempt (`Cluster::call_unit`'s budget) before it
/// starts over.
const BUDGET: Duration = Duration::from_secs(20);

/// One chunk file of a client and what it holds (a missing file reads as empty).
pub struct File {
    pub group: BuddyGroupId,
    pub entry: EntryId,
    pub data: Vec<u8>,
}

pub struct Client {
    world: Arc<World>,
    k: usize,
    mounts: [Arc<Cluster>; 2],
    pub files: Vec<File>,
}

enum Op {
    Write { off: u64, data: Vec<u8> },
    Read { off: u64, len: u32 },
    Truncate { len: u64 },
    Unlink,
    Fsync,
}

impl Client {
    pub fn new(world: Arc<World>, k: usize, files: Vec<File>) -> Client {
        let mount = || Cluster::new(MGMTD, world::pools(&world, Ep::Client(k)));
        let mounts = [mount(), mount()];
        Client { world, k, mounts, files }
    }

    /// Runs `ops` operations on random files of this client.
    pub async fn run(mut self, ops: usize) -> Client {
        for i in 0..ops {
            let (mount, f, op) = self.draw();
            self.world.stat(|s| s.client_ops += 1);
            self.one(i, mount, f, op).await;
        }
        self
    }

    fn draw(&self) -> (usize, usize, Op) {
        let mut r = self.world.rng();
        let mount = r.gen_range(0..2);
        let f = r.gen_range(0..self.files.len());
        let roll = r.gen_range(0..100);
        let op = if roll < 45 {
            let off = r.gen_range(0..SPAN);
            let len = r.gen_range(1..=8192usize);
            let data = (0..len).map(|_| r.gen::<u8>()).collect();
            Op::Write { off, data }
        } else if roll < 75 {
            Op::Read { off: r.gen_range(0..SPAN), len: r.gen_range(1..=16384) }
        } else if roll < 88 {
            Op::Truncate { len: r.gen_range(0..SPAN) }
        } else if roll < 94 {
            Op::Unlink
        } else {
            Op::Fsync
        };
        (mount, f, op)
    }

    /// Sends `req` until an answer other than "try again" comes.
    async fn send(
        &self,
        mount: usize,
        group: BuddyGroupId,
        req: Request,
        payload: Bytes,
    ) -> Result<(Reply, Vec<u8>), FsError> {
        loop {
            let r = self.mounts[mount].call_unit(StripeUnit::Group(group), req.clone(), payload.clone(), BUDGET).await;
            match r {
                Err(e) if matches!(e.code, ErrorCode::Unavailable | ErrorCode::TimedOut) => {
                    self.world.stat(|s| s.client_retries += 1);
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                r => return r,
            }
        }
    }

    async fn one(&mut self, i: usize, mount: usize, f: usize, op: Op) {
        let (group, entry) = (self.files[f].group, self.files[f].entry);
        let target = TargetId(0); // routing names the primary
        let c = self.k;
        let what = match &op {
            Op::Write { off, data } => format!("write {}+{}", off, data.len()),
            Op::Read { off, len } => format!("read {off}+{len}"),
            Op::Truncate { len } => format!("truncate {len}"),
            Op::Unlink => "unlink".into(),
            Op::Fsync => "fsync".into(),
        };
        self.world.trace(format_args!("c{c} #{i} {what} of {entry} (group {group}) through mount {mount}"));
        let (req, payload) = match &op {
            Op::Write { off, data } => {
                (Request::WriteChunk { target, entry, offset: *off }, Bytes::copy_from_slice(data))
            }
            Op::Read { off, len } => (Request::ReadChunk { target, entry, offset: *off, len: *len }, Bytes::new()),
            Op::Truncate { len } => (Request::TruncateChunk { target, entry, len: *len }, Bytes::new()),
            Op::Unlink => (Request::UnlinkChunk { target, entry }, Bytes::new()),
            Op::Fsync => (Request::FsyncChunk { target, entry }, Bytes::new()),
        };
        let r = self.send(mount, group, req, payload).await;
        let model = &mut self.files[f].data;
        let bad = |w: &World, m: String| w.violation(format!("c{c} #{i} {what} of {entry} (group {group}): {m}"));
        match (op, r) {
            (Op::Write { off, data }, Ok((Reply::Written(n), _))) if n as usize == data.len() => {
                let end = off as usize + data.len();
                if model.len() < end {
                    model.resize(end, 0);
                }
                model[off as usize..end].copy_from_slice(&data);
            }
            (Op::Read { off, len }, Ok((Reply::Data, got))) => {
                let from = (off as usize).min(model.len());
                let to = (off as usize + len as usize).min(model.len());
                let want = &model[from..to];
                if got != want {
                    let first = got.iter().zip(want).position(|(a, b)| a != b);
                    bad(
                        &self.world,
                        format!(
                            "read {} bytes, the model has {} (first difference at byte {first:?}; file length {})",
                            got.len(),
                            want.len(),
                            model.len()
                        ),
                    );
                }
            }
            (Op::Truncate { len }, Ok((Reply::Ok, _))) => model.resize(len as usize, 0),
            (Op::Unlink, Ok((Reply::Ok, _))) => model.clear(),
            (Op::Fsync, Ok((Reply::Ok, _))) => {}
            // A disk failed: a change may have landed in part; a read or an
            // fsync changed nothing.
            (op, Err(e)) if disk_failure(&self.world, &e) => {
                self.world.trace(format_args!("c{c} #{i} failed on a disk: {e}"));
                if matches!(op, Op::Write { .. } | Op::Truncate { .. } | Op::Unlink) {
                    self.learn(i, mount, f).await;
                }
            }
            (_, r) => {
                let got = match r {
                    Ok((reply, _)) => format!("{reply:?}"),
                    Err(e) => format!("error {e}"),
                };
                bad(&self.world, format!("unexpected answer: {got}"));
            }
        }
        self.world.trace(format_args!("c{c} #{i} done"));
    }

    /// Reads file `f` whole (until a read succeeds) and makes that its model.
    async fn learn(&mut self, i: usize, mount: usize, f: usize) {
        let (group, entry, c) = (self.files[f].group, self.files[f].entry, self.k);
        loop {
            let req = Request::ReadChunk { target: TargetId(0), entry, offset: 0, len: WHOLE };
            match self.send(mount, group, req, Bytes::new()).await {
                Ok((Reply::Data, got)) => {
                    self.world.trace(format_args!("c{c} #{i} {entry} holds {} bytes now", got.len()));
                    self.files[f].data = got;
                    return;
                }
                Err(e) if disk_failure(&self.world, &e) => {}
                r => {
                    let what = format!("c{c} #{i} reading {entry} (group {group}) whole: unexpected answer {r:?}");
                    self.world.violation(what);
                    return;
                }
            }
        }
    }
}

/// A read of this many bytes at 0 returns a whole file of a client.
const WHOLE: u32 = (SPAN + 8192) as u32;

/// `e` is what a failing disk answers (and the run has failing disks).
fn disk_failure(world: &World, e: &FsError) -> bool {
    matches!(e.code, ErrorCode::Io | ErrorCode::NoSpace) && world.faults.disk_error > 0.0
}
