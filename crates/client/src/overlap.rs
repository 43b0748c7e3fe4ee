//! Which of this client's changes overlapped: the rule behind keeping an
//! answer's attributes (`dirattrs` for directories, `leases` for files).
//!
//! An answer to a change of one entry may be kept only if no other change
//! of this client to the same entry, nor one whose entries are not known,
//! was in flight at any time between its sending and its answer: an
//! overlapping one may have been applied after the answer was read. This
//! module only counts; what is kept, and dropping it when a change begins,
//! is the caller's.

use hivefs_types::ids::EntryId;
use std::collections::HashMap;

/// Which entries a change may touch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Touches {
    /// None (a read).
    Nothing,
    /// This one.
    One(EntryId),
    /// Not known: any.
    Any,
}

/// Changes in flight, and started ever.
#[derive(Clone, Copy, Default)]
struct Busy {
    inflight: u32,
    started: u64,
}

/// This client's changes in flight: per entry, and of entries not known.
#[derive(Default)]
pub(crate) struct Changes {
    busy: HashMap<EntryId, Busy>,
    any: Busy,
}

/// A change in flight (from [`Changes::begin`] to [`Changes::end`]).
pub(crate) struct Ticket {
    pub(crate) touches: Touches,
    /// Whether it started with no other change of its entry (or of unknown
    /// ones) in flight, and the counts of started changes then.
    alone: bool,
    started: u64,
    any_started: u64,
}

impl Ticket {
    /// The ticket of a read (no [`Changes`] to count it in).
    pub(crate) fn read() -> Ticket {
        Ticket { touches: Touches::Nothing, alone: false, started: 0, any_started: 0 }
    }
}

impl Changes {
    /// A change touching `touches` is about to be sent.
    pub(crate) fn begin(&mut self, touches: Touches) -> Ticket {
        let mut t = Ticket { touches, alone: false, started: 0, any_started: 0 };
        match touches {
            Touches::Nothing => {}
            Touches::Any => {
                self.any.inflight += 1;
                self.any.started += 1;
            }
            Touches::One(id) => {
                t.alone = self.any.inflight == 0 && self.busy.get(&id).is_none_or(|x| x.inflight == 0);
                t.any_started = self.any.started;
                let x = self.busy.entry(id).or_default();
                x.inflight += 1;
                x.started += 1;
                t.started = x.started;
            }
        }
        t
    }

    /// [`Changes::begin`], dropping from `kept` what the change may touch.
    pub(crate) fn begin_dropping<V>(&mut self, touches: Touches, kept: &mut HashMap<EntryId, V>) -> Ticket {
        match touches {
            Touches::Nothing => {}
            Touches::Any => kept.clear(),
            Touches::One(id) => {
                kept.remove(&id);
            }
        }
        self.begin(touches)
    }

    /// The change of `t` ended: whether it touched one entry and no other
    /// change of that entry or of unknown ones overlapped it.
    pub(crate) fn end(&mut self, t: &Ticket) -> bool {
        match t.touches {
            Touches::Nothing => false,
            Touches::Any => {
                self.any.inflight -= 1;
                false
            }
            Touches::One(id) => {
                let mut alone_to_the_end = t.alone && self.any.started == t.any_started;
                if let Some(x) = self.busy.get_mut(&id) {
                    x.inflight -= 1;
                    alone_to_the_end &= x.started == t.started && x.inflight == 0;
                    if x.inflight == 0 {
                        self.busy.remove(&id);
                    }
                }
                alone_to_the_end
            }
        }
    }
}
