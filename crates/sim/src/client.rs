//! A simulated client: a seeded random sequence of namespace operations in
//! its own subtree, routed as `hivefs-client` routes them, each
//! non-idempotent one under an operation id that is sent again, unchanged,
//! after every transport failure until a definite answer comes; then the
//! answer is compared with the model's.
//!
//! Routing (as `crates/client/src/lib.rs`): to the owner of the parent
//! directory; a rename or exchange between parents on different nodes is
//! `RenameTo` to the old parent's owner; a hard link goes to the file's
//! owner (found by a lookup first, as the kernel's inode carries it), as
//! `LinkTo` when the new parent is elsewhere.

use crate::model::{Expect, Kind, Mid, Model, Op};
use crate::net::{call, Core, Endpoint, Stats, World};
use hivefs_proto::{Caller, Envelope, OpId, Reply, Request, Response, RENAME_EXCHANGE, RENAME_NOREPLACE};
use hivefs_types::attr::{EntryAttr, FileKind};
use hivefs_types::error::ErrorCode;
use hivefs_types::fs_err;
use hivefs_types::ids::NodeId;
use rand::Rng;
use std::sync::Arc;
use std::time::Duration;

/// Names drawn for new entries: few, so that operations collide.
const NAMES: [&str; 5] = ["a", "b", "c", "d", "e"];
/// A request with no answer after this long is sent again (as the
/// transport's request timeout).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// An operation without a definite answer after this long is a violation.
const ANSWER_DEADLINE: Duration = Duration::from_secs(600);

/// The world a client runs in: its randomness and trace, and the way its
/// requests reach the metadata node that owns what they name.
pub trait Route: std::ops::Deref<Target = Core> + Send + Sync + 'static {
    fn stat(&self, f: impl FnOnce(&mut Stats));

    /// Sends `req` from client `client` to the namespace of node `to`; one
    /// attempt (the caller retries transport failures).
    fn send(
        world: Arc<Self>,
        client: usize,
        to: NodeId,
        env: Envelope,
        req: Request,
    ) -> impl std::future::Future<Output = Response> + Send;
}

impl Route for World {
    fn stat(&self, f: impl FnOnce(&mut Stats)) {
        World::stat(self, f)
    }

    fn send(
        world: Arc<World>,
        client: usize,
        to: NodeId,
        env: Envelope,
        req: Request,
    ) -> impl std::future::Future<Output = Response> + Send {
        call(world, Endpoint::Client(client), to, env, req)
    }
}

pub struct Client<W> {
    world: Arc<W>,
    pub k: usize,
    id: u64,
    seq: u64,
    pub model: Model,
}

fn pick<T: Copy>(world: &Core, v: &[T]) -> Option<T> {
    if v.is_empty() {
        None
    } else {
        let i = world.rng().gen_range(0..v.len());
        Some(v[i])
    }
}

impl<W: Route> Client<W> {
    pub fn new(world: Arc<W>, k: usize, model: Model) -> Client<W> {
        Client { world, k, id: 0x5100 + k as u64, seq: 0, model }
    }

    fn name(&self) -> Vec<u8> {
        pick(&self.world, &NAMES).expect("names").as_bytes().to_vec()
    }

    /// An existing name in `dir` (of the wanted kind) most of the time, else any name.
    fn existing(&self, dir: Mid, kind: Option<Kind>, p: f64) -> Vec<u8> {
        let names: Vec<&Vec<u8>> = self.model.nodes[dir]
            .children
            .iter()
            .filter(|(_, &m)| kind.is_none_or(|k| self.model.nodes[m].kind == k))
            .map(|(n, _)| n)
            .collect();
        if !names.is_empty() && self.world.chance(p) {
            let i = self.world.rng().gen_range(0..names.len());
            return names[i].clone();
        }
        self.name()
    }

    /// A directory holding a file, if any.
    fn dir_with_file(&self, dirs: &[Mid]) -> Mid {
        let with: Vec<Mid> = dirs
            .iter()
            .copied()
            .filter(|&d| self.model.nodes[d].children.values().any(|&m| self.model.nodes[m].kind == Kind::File))
            .collect();
        pick(&self.world, &with).or_else(|| pick(&self.world, dirs)).expect("the root exists")
    }

    fn next_op(&self) -> Op {
        let dirs = self.model.dirs();
        let dir = pick(&self.world, &dirs).expect("the root exists");
        let to = pick(&self.world, &dirs).expect("the root exists");
        let roll = self.world.rng().gen_range(0..100);
        match roll {
            0..=17 => Op::Mkdir { dir, name: self.name() },
            18..=35 => Op::Create { dir, name: self.name() },
            36..=45 => Op::Unlink { dir, name: self.existing(dir, Some(Kind::File), 0.8) },
            46..=55 => Op::Rmdir { dir, name: self.existing(dir, Some(Kind::Dir), 0.8) },
            56..=75 => Op::Rename {
                dir,
                name: self.existing(dir, None, 0.85),
                to,
                to_name: self.existing(to, None, 0.4),
                noreplace: self.world.chance(0.15),
            },
            76..=85 => {
                let dir = self.dir_with_file(&dirs);
                Op::Link {
                    dir,
                    name: self.existing(dir, Some(Kind::File), 0.9),
                    to,
                    to_name: self.existing(to, None, 0.2),
                }
            }
            86..=94 => {
                Op::Exchange { dir, name: self.existing(dir, None, 0.9), to, to_name: self.existing(to, None, 0.8) }
            }
            _ => Op::Lookup { dir, name: self.existing(dir, None, 0.7) },
        }
    }

    /// Runs `ops` operations; stops at the first wrong answer (a violation).
    pub async fn run(mut self, ops: usize) -> Client<W> {
        for i in 0..ops {
            let op = self.next_op();
            let expect = self.model.expect(&op);
            let what = self.model.describe(&op);
            self.world.trace(format_args!("c{} #{i} {what} (expect {expect})", self.k));
            let r = self.perform(&op).await;
            self.world.stat(|s| s.client_ops += 1);
            if let Err(why) = self.check(&op, &expect, &r) {
                self.world.violation(format!("client c{} operation #{i} `{what}`: {why}", self.k));
                break;
            }
            self.world.trace(format_args!("c{} #{i} done", self.k));
            if let (Expect::Ok, Ok(reply)) = (&expect, &r) {
                self.model.apply(&op, reply);
            }
            let think = self.world.ms((0, 20));
            tokio::time::sleep(think).await;
        }
        self
    }

    /// Sends `req` to `to` until an answer other than a transport failure
    /// comes; `retryable` requests carry this client's next operation id.
    async fn send(&mut self, to: NodeId, req: Request, retryable: bool) -> Response {
        let env = if retryable {
            self.seq += 1;
            Envelope {
                op: Some(OpId { client: self.id, seq: self.seq, done_below: self.seq }),
                lease_client: None,
                mirror: None,
            }
        } else {
            Envelope::default()
        };
        let started = tokio::time::Instant::now();
        let mut backoff = Duration::from_millis(50);
        loop {
            let c = W::send(self.world.clone(), self.k, to, env, req.clone());
            let r = tokio::time::timeout(REQUEST_TIMEOUT, c)
                .await
                .unwrap_or_else(|_| Err(fs_err!(TimedOut, "no answer within {REQUEST_TIMEOUT:?}")));
            match r {
                Err(e) if matches!(e.code, ErrorCode::Unavailable | ErrorCode::TimedOut) => {
                    if started.elapsed() > ANSWER_DEADLINE {
                        return Err(fs_err!(Internal, "no definite answer within {ANSWER_DEADLINE:?}: {e}"));
                    }
                    self.world.stat(|s| s.client_retries += 1);
                    let jitter = self.world.ms((0, 50));
                    tokio::time::sleep(backoff + jitter).await;
                    backoff = (backoff * 2).min(Duration::from_secs(1));
                }
                r => return r,
            }
        }
    }

    fn dir(&self, m: Mid) -> (hivefs_types::ids::EntryId, NodeId) {
        let e = &self.model.nodes[m];
        (e.id, e.owner)
    }

    async fn perform(&mut self, op: &Op) -> Response {
        let caller = Caller::default();
        match op.clone() {
            Op::Mkdir { dir, name } => {
                let (parent, owner) = self.dir(dir);
                self.send(owner, Request::Mkdir { parent, name, mode: 0o755, caller }, true).await
            }
            Op::Create { dir, name } => {
                let (parent, owner) = self.dir(dir);
                let req =
                    Request::Create { parent, name, kind: FileKind::File, mode: 0o644, rdev: 0, excl: true, caller };
                self.send(owner, req, true).await
            }
            Op::Unlink { dir, name } => {
                let (parent, owner) = self.dir(dir);
                self.send(owner, Request::Unlink { parent, name }, true).await
            }
            Op::Rmdir { dir, name } => {
                let (parent, owner) = self.dir(dir);
                self.send(owner, Request::Rmdir { parent, name }, true).await
            }
            Op::Rename { dir, name, to, to_name, noreplace } => {
                let flags = if noreplace { RENAME_NOREPLACE } else { 0 };
                self.rename(dir, name, to, to_name, flags).await
            }
            Op::Exchange { dir, name, to, to_name } => self.rename(dir, name, to, to_name, RENAME_EXCHANGE).await,
            Op::Lookup { dir, name } => {
                let (parent, owner) = self.dir(dir);
                self.send(owner, Request::Lookup { parent, name }, false).await
            }
            Op::Link { dir, name, to, to_name } => {
                let (parent, owner) = self.dir(dir);
                let a = match self.send(owner, Request::Lookup { parent, name: name.clone() }, false).await? {
                    Reply::Entry(a) => a,
                    r => return Err(fs_err!(Protocol, "lookup answered {r:?}")),
                };
                self.check_entry(dir, &name, &a).map_err(|m| fs_err!(Protocol, "lookup before link: {m}"))?;
                let (new_parent, new_owner) = self.dir(to);
                let req = if a.owner != new_owner {
                    Request::LinkTo { id: a.id, new_parent, new_parent_owner: new_owner, new_name: to_name }
                } else {
                    Request::Link { id: a.id, new_parent, new_name: to_name }
                };
                self.send(a.owner, req, true).await
            }
        }
    }

    async fn rename(&mut self, dir: Mid, name: Vec<u8>, to: Mid, new_name: Vec<u8>, flags: u32) -> Response {
        let (parent, owner) = self.dir(dir);
        let (new_parent, new_owner) = self.dir(to);
        let req = if owner != new_owner {
            Request::RenameTo { parent, name, new_parent, new_parent_owner: new_owner, new_name, flags }
        } else {
            Request::Rename { parent, name, new_parent, new_name, flags }
        };
        self.send(owner, req, true).await
    }

    /// An entry the nodes answered for `dir/name` against the model's.
    fn check_entry(&self, dir: Mid, name: &[u8], a: &EntryAttr) -> Result<(), String> {
        let Some(m) = self.model.child(dir, name) else {
            return Err(format!("found {} ({:?}), the model has no such entry", a.id, a.kind));
        };
        let e = &self.model.nodes[m];
        let kind = if e.kind == Kind::Dir { FileKind::Dir } else { FileKind::File };
        if a.kind != kind || a.id != e.id {
            return Err(format!("found {} ({:?}), the model has {} ({kind:?})", a.id, a.kind, e.id));
        }
        if e.kind == Kind::File && a.nlink != e.links {
            return Err(format!("{} has link count {}, the model {}", a.id, a.nlink, e.links));
        }
        Ok(())
    }

    fn check(&self, op: &Op, expect: &Expect, r: &Response) -> Result<(), String> {
        match (expect, r) {
            (Expect::Err(codes), Err(e)) if codes.contains(&e.code) => Ok(()),
            (Expect::Err(_), Err(e)) | (Expect::Ok, Err(e)) => {
                Err(format!("answered {:?} ({e}), expected {expect}", e.code))
            }
            (Expect::Err(_), Ok(reply)) => Err(format!("answered {reply:?}, expected {expect}")),
            (Expect::Ok, Ok(reply)) => match (op, reply) {
                (Op::Mkdir { .. } | Op::Create { .. }, Reply::Entry(a)) => {
                    let kind = if matches!(op, Op::Mkdir { .. }) { FileKind::Dir } else { FileKind::File };
                    if a.kind != kind {
                        return Err(format!("answered a {:?}", a.kind));
                    }
                    if self.model.nodes.iter().any(|e| e.id == a.id) {
                        return Err(format!("answered {}, an id the model has already", a.id));
                    }
                    Ok(())
                }
                (Op::Lookup { dir, name }, Reply::Entry(a)) => self.check_entry(*dir, name, a),
                (Op::Link { dir, name, .. }, Reply::Entry(a)) => {
                    let m = self.model.child(*dir, name).expect("expected ok");
                    let e = &self.model.nodes[m];
                    if a.id != e.id || a.nlink != e.links + 1 {
                        return Err(format!(
                            "answered {} with link count {}, expected {} with {}",
                            a.id,
                            a.nlink,
                            e.id,
                            e.links + 1
                        ));
                    }
                    Ok(())
                }
                (Op::Unlink { .. } | Op::Rmdir { .. } | Op::Rename { .. } | Op::Exchange { .. }, Reply::Ok) => Ok(()),
                (_, reply) => Err(format!("answered {reply:?}")),
            },
        }
    }
}
