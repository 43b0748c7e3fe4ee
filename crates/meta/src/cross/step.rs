//! A peer's steps applied at most once ever (`Request::PeerStep`).
//!
//! Every step is idempotent while its intent is unfinished, but a delivery
//! that arrives after the intent finished (a request the coordinator gave
//! up on, read late off its connection or held up behind a lock) would
//! apply it again: a removed directory or link would come back. So the peer
//! records each step's answer in `peer_done` under
//! `intent ++ tag ++ subject` ([`step_key`]) and answers a repeat with it,
//! and each step carries the coordinator's *floor*, its lowest unfinished
//! intent: the peer keeps the highest floor of each coordinating namespace
//! (key: the namespace's node id, 4 bytes), drops the records below it and
//! refuses steps below it, which can only be late. The records of a
//! namespace thus hold only the intents it had unfinished when it last
//! sent a step here; no `Forget` is needed.

use super::*;
use crate::replies;
use crate::store::mem::TableW;
use crate::store::OpError;
use hivefs_proto::Response;

/// One delivery of a step: what keys its record.
#[derive(Clone, Copy, Debug)]
pub struct StepId {
    pub intent: EntryId,
    /// The coordinator's lowest unfinished intent when it sent the step.
    pub floor: EntryId,
    /// The kind of step (one intent may send several kinds to one node).
    pub tag: u8,
    /// The entry the step is about (one intent may send two steps of one
    /// kind to one node: an exchange's two parent pointers).
    pub subject: EntryId,
}

/// Peer: `inner`, once per `step`.
#[derive(Clone, Debug)]
pub struct PeerStep {
    pub step: StepId,
    pub inner: Box<MultiMut>,
}

/// The `peer_done` key of `step`'s answer.
fn step_key(s: &StepId) -> [u8; 2 * EntryId::LEN + 1] {
    let mut k = [0u8; 2 * EntryId::LEN + 1];
    k[..EntryId::LEN].copy_from_slice(&s.intent.to_bytes());
    k[EntryId::LEN] = s.tag;
    k[EntryId::LEN + 1..].copy_from_slice(&s.subject.to_bytes());
    k
}

/// The `peer_done` key of namespace `node`'s floor.
fn floor_key(node: u32) -> [u8; 4] {
    node.to_be_bytes()
}

fn stored_floor(t: &impl Kv, node: u32) -> OpResult<Option<EntryId>> {
    match t.get(&floor_key(node))? {
        None => Ok(None),
        Some(v) => EntryId::from_bytes(&v)
            .map(Some)
            .ok_or_else(|| OpError::Fatal(format!("peer_done: floor of namespace {node} has {} bytes", v.len()))),
    }
}

/// Names a step in messages (formatted only when one is written).
struct Who<'a>(&'a StepId);

impl std::fmt::Display for Who<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "step {} of cross-node operation {}", self.0.tag, self.0.intent)
    }
}

/// What a delivery of `s` is answered without being applied: a refusal
/// when its intent is below the floor (finished), the first answer when it
/// was applied; `None` when it is to be applied.
pub(crate) fn settled(t: &impl Kv, s: &StepId) -> OpResult<Option<Response>> {
    let floor = stored_floor(t, s.intent.node)?.map_or(s.floor, |f| f.max(s.floor));
    if s.intent < floor {
        return Ok(Some(Err(fs_err!(
            Invalid,
            "{} arrived after the operation finished (its coordinator's unfinished operations begin at {floor}): \
             not applied",
            Who(s)
        ))));
    }
    match t.get(&step_key(s))? {
        None => Ok(None),
        Some(v) => replies::recorded(&v, Who(s)).map(Some).map_err(OpError::Fatal),
    }
}

/// Raises namespace `node`'s floor to `floor` and drops its records below.
fn raise_floor(t: &mut TableW<'_>, floor: EntryId) -> OpResult<()> {
    if stored_floor(t, floor.node)?.is_some_and(|f| f >= floor) {
        return Ok(());
    }
    t.insert(&floor_key(floor.node), &floor.to_bytes())?;
    // Keys of the namespace's intents (16 bytes) and steps (33) below the
    // floor; its floor's own key (4 bytes) sorts before them.
    let lo = EntryId { node: floor.node, epoch: 0, counter: 0 };
    t.remove_range(&lo.to_bytes(), &floor.to_bytes())
}

impl PeerStep {
    pub(super) fn apply(self, t: &mut Tables<'_>, ctx: &mut Ctx<'_>) -> OpResult<Reply> {
        let PeerStep { step, inner } = self;
        if step.floor.node != step.intent.node || step.floor > step.intent {
            return Err(fs_err!(Protocol, "{}: floor {} is not at or below it", Who(&step), step.floor).into());
        }
        raise_floor(&mut t.peer_done, step.floor)?;
        if let Some(r) = settled(&t.peer_done, &step)? {
            return r.map_err(OpError::Fs);
        }
        let r = match apply(t, ctx, *inner) {
            Ok(reply) => Ok(reply),
            Err(OpError::Fs(e)) => Err(e),
            Err(fatal) => return Err(fatal),
        };
        let now_ms = (ctx.now.sec.max(0) as u64).saturating_mul(1000) + u64::from(ctx.now.nsec / 1_000_000);
        t.peer_done.insert(&step_key(&step), &replies::record(now_ms, &r, Who(&step)))?;
        r.map_err(OpError::Fs)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(node: u32, counter: u64) -> EntryId {
        EntryId { node, epoch: 1, counter }
    }

    #[test]
    fn step_keys_sort_with_their_intent_and_above_the_floor_key() {
        let s = StepId { intent: id(3, 7), floor: id(3, 5), tag: 4, subject: id(9, 1) };
        let k = step_key(&s);
        assert!(k[..] > id(3, 7).to_bytes()[..] && k[..] < id(3, 8).to_bytes()[..]);
        assert!(floor_key(3)[..] < EntryId { node: 3, epoch: 0, counter: 0 }.to_bytes()[..]);
        assert!(floor_key(3)[..] > id(2, u64::MAX).to_bytes()[..]);
    }
}
