//! Directories' attributes as this client's own changes left them.
//!
//! Directory attributes are not leased: a mount lets the kernel keep them
//! for a short TTL (1 s), so another client's change of a directory shows
//! within that time. But the kernel drops a directory's attributes after
//! each change it makes in it (a create, an unlink), and asks again before
//! the next one (its permission check): a second metadata request per
//! create and per remove. A metadata node answering a leasing client's
//! change of a directory's entries adds the directory's attributes as read
//! after the change (`Reply::WithParent`); they are kept here for the same
//! TTL, so the mount answers that question itself, with the same promise as
//! the kernel's cache: this client's own changes at once, others' within the
//! TTL.
//!
//! An answer is kept only when no other change of this client to the same
//! directory overlapped it (an overlapping one may have been applied after
//! the read); any change whose directories are not known drops everything.
//! It must not keep attributes of files (those are leased) nor outlive the TTL.

use crate::overlap::{Changes, Ticket, Touches};
use hivefs_proto::Request;
use hivefs_types::attr::{EntryAttr, Timespec};
use hivefs_types::ids::EntryId;
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// What a change of `req` (sent as a retryable operation or not) touches.
pub(crate) fn touches(req: &Request) -> Touches {
    if let Some(dir) = req.changed_dir() {
        return Touches::One(dir);
    }
    match req {
        // A directory's own attributes.
        Request::SetAttr { id, .. } | Request::SetXattr { id, .. } | Request::RemoveXattr { id, .. } => {
            Touches::One(*id)
        }
        // Renames change both parents and a moved directory's own entry.
        r if r.is_idempotent() || matches!(r, Request::Open { .. } | Request::Release { .. }) => Touches::Nothing,
        _ => Touches::Any,
    }
}

#[derive(Default)]
struct State {
    attrs: HashMap<EntryId, (EntryAttr, Instant)>,
    changes: Changes,
    swept: usize,
    /// The time of this client's latest file made ahead per directory:
    /// an answer read before it is raised to it.
    ahead: HashMap<EntryId, Timespec>,
}

pub(crate) struct DirAttrs {
    ttl: Duration,
    state: Mutex<State>,
}

impl DirAttrs {
    pub(crate) fn new(ttl: Duration) -> DirAttrs {
        DirAttrs { ttl, state: Mutex::default() }
    }

    /// A change is about to be sent: what it touches is no longer known.
    pub(crate) fn begin(&self, req: &Request) -> Ticket {
        let touches = touches(req);
        if touches == Touches::Nothing {
            // Reads (most requests) take no lock.
            return Ticket::read();
        }
        let mut s = self.state.lock().expect("dir attrs");
        let s = &mut *s;
        if matches!(req, Request::CreateMany { .. }) {
            // Files made ahead: what is kept already has their times.
            return s.changes.begin(touches);
        }
        s.changes.begin_dropping(touches, &mut s.attrs)
    }

    /// The change ended; `parent`: the directory's attributes its answer
    /// carried, `sent`: when it was sent.
    pub(crate) fn end(&self, t: Ticket, parent: Option<EntryAttr>, sent: Instant) {
        if t.touches == Touches::Nothing {
            return;
        }
        let mut s = self.state.lock().expect("dir attrs");
        let alone = s.changes.end(&t);
        if let (Touches::One(id), Some(mut p), true) = (t.touches, parent, alone) {
            if let Some(&at) = s.ahead.get(&id) {
                p.mtime = p.mtime.max(at);
                p.ctime = p.ctime.max(at);
            }
            if p.id == id {
                let now = Instant::now();
                if s.attrs.len() > 2 * s.swept + 1024 {
                    s.attrs.retain(|_, (_, until)| *until > now);
                    s.swept = s.attrs.len();
                }
                s.attrs.insert(id, (p, sent + self.ttl));
            }
        }
    }

    /// This client made a file in `dir` at `at` without asking (the
    /// client's `ahead`): kept attributes of `dir` take its times.
    pub(crate) fn made_ahead(&self, dir: EntryId, at: Timespec) {
        let mut s = self.state.lock().expect("dir attrs");
        if s.ahead.len() >= 1024 && !s.ahead.contains_key(&dir) {
            s.ahead.clear();
        }
        let latest = s.ahead.entry(dir).or_insert(at);
        *latest = (*latest).max(at);
        if let Some((a, _)) = s.attrs.get_mut(&dir) {
            a.mtime = a.mtime.max(at);
            a.ctime = a.ctime.max(at);
        }
    }

    /// `id`'s attributes and for how much longer they may be used.
    pub(crate) fn get(&self, id: EntryId) -> Option<(EntryAttr, Duration)> {
        let s = self.state.lock().expect("dir attrs");
        let (a, until) = s.attrs.get(&id)?;
        let left = until.saturating_duration_since(Instant::now());
        (!left.is_zero()).then(|| (a.clone(), left))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hivefs_types::attr::FileKind;

    fn dir(counter: u64, nlink: u32) -> EntryAttr {
        EntryAttr {
            id: EntryId { node: 1, epoch: 1, counter },
            kind: FileKind::Dir,
            mode: 0o755,
            uid: 0,
            gid: 0,
            size: 0,
            nlink,
            atime: Default::default(),
            mtime: Default::default(),
            ctime: Default::default(),
            rdev: 0,
            owner: hivefs_types::ids::NodeId(1),
            pattern: None,
            dir_pattern: None,
        }
    }

    fn unlink(p: &EntryAttr) -> Request {
        Request::Unlink { parent: p.id, name: b"f".to_vec() }
    }

    #[test]
    fn a_lone_change_keeps_the_answer_until_the_ttl() {
        let c = DirAttrs::new(Duration::from_millis(200));
        let d = dir(1, 3);
        let t = c.begin(&unlink(&d));
        c.end(t, Some(d.clone()), Instant::now());
        let (a, left) = c.get(d.id).unwrap();
        assert_eq!(a, d);
        assert!(left <= Duration::from_millis(200) && !left.is_zero());
        // A read changes nothing; an answer without attributes drops them.
        c.end(c.begin(&Request::GetAttr { id: d.id }), None, Instant::now());
        assert!(c.get(d.id).is_some());
        c.end(c.begin(&unlink(&d)), None, Instant::now());
        assert!(c.get(d.id).is_none());
        // Expired.
        c.end(c.begin(&unlink(&d)), Some(d.clone()), Instant::now() - Duration::from_millis(300));
        assert!(c.get(d.id).is_none());
    }

    #[test]
    fn overlapping_changes_keep_nothing() {
        let c = DirAttrs::new(Duration::from_secs(1));
        let d = dir(1, 3);
        // Two changes of one directory overlap: neither answer is kept,
        // whatever order they end in.
        let (t1, t2) = (c.begin(&unlink(&d)), c.begin(&unlink(&d)));
        c.end(t2, Some(dir(1, 2)), Instant::now());
        c.end(t1, Some(dir(1, 3)), Instant::now());
        assert!(c.get(d.id).is_none());
        // One started and ended while another was in flight.
        let t1 = c.begin(&unlink(&d));
        c.end(c.begin(&unlink(&d)), Some(dir(1, 2)), Instant::now());
        c.end(t1, Some(dir(1, 3)), Instant::now());
        assert!(c.get(d.id).is_none());
        // A change of another directory does not matter; an unknown one does.
        let e = dir(2, 2);
        let t = c.begin(&unlink(&d));
        c.end(c.begin(&unlink(&e)), Some(e.clone()), Instant::now());
        c.end(t, Some(d.clone()), Instant::now());
        assert_eq!(c.get(d.id).map(|x| x.0), Some(d.clone()));
        assert_eq!(c.get(e.id).map(|x| x.0), Some(e.clone()));
        let rename =
            Request::Rename { parent: d.id, name: b"a".to_vec(), new_parent: e.id, new_name: b"b".to_vec(), flags: 0 };
        let t = c.begin(&unlink(&d));
        let r = c.begin(&rename);
        assert!(c.get(e.id).is_none(), "an unknown change drops everything");
        c.end(r, None, Instant::now());
        c.end(t, Some(d.clone()), Instant::now());
        assert!(c.get(d.id).is_none());
    }
}
