//! Cross-node exchange: the transactions of RENAME_EXCHANGE across metadata
//! nodes: the intent (this side held), the swap of the other side on the peer,
//! and the commit.

use super::*;

/// Coordinator: holds `parent/name` for a RENAME_EXCHANGE with `new_parent/new_name` on `new_owner`
/// (naming `b`) and records the intent.
#[derive(Clone, Debug)]
pub struct ExchangeIntent {
    pub intent: EntryId,
    pub parent: EntryId,
    pub name: Vec<u8>,
    pub new_parent: EntryId,
    pub new_owner: NodeId,
    pub new_name: Vec<u8>,
    pub b: Dentry,
    pub op: Option<OpId>,
}

/// Coordinator: the peer swapped its side: `parent/name` now names `b`.
#[derive(Clone, Debug)]
pub struct ExchangeCommit {
    pub intent: EntryId,
}

/// Peer: `new_parent/new_name` (naming `expect`) now names `put`, recorded under `intent`.
#[derive(Clone, Debug)]
pub struct PeerExchangeIn {
    pub intent: EntryId,
    pub new_parent: EntryId,
    pub new_name: Vec<u8>,
    pub expect: EntryId,
    pub put: Dentry,
}

impl ExchangeIntent {
    pub(super) fn apply(self, t: &mut Tables<'_>, _ctx: &mut Ctx<'_>) -> OpResult<Reply> {
        let ExchangeIntent { intent, parent, name, new_parent, new_owner, new_name, b, op } = self;
        check_name(&name)?;
        check_name(&new_name)?;
        dir_inode(&t.inodes, parent)?;
        let a = dentry(&t.dentries, parent, &name)?;
        check_unlocked(t, parent, &name)?;
        let step = IntentStep::Exchange { parent, name, new_parent, new_owner, new_name, a, b };
        put_intent(t, intent, &Intent { op, step })?;
        Ok(Reply::Ok)
    }
}

impl ExchangeCommit {
    pub(super) fn apply(self, t: &mut Tables<'_>, ctx: &mut Ctx<'_>) -> OpResult<Reply> {
        let ExchangeCommit { intent } = self;
        let Some(Intent { step: IntentStep::Exchange { parent, name, a, b, .. }, .. }) = clear_intent(t, intent)?
        else {
            return Ok(Reply::Ok);
        };
        t.peer_done.remove(id_key(intent).as_slice())?;
        if load_dentry(&t.dentries, parent, &name)?.is_some_and(|d| d.id == a.id) {
            t.put_dentry(parent, &name, &b)?;
            if let Some(mut p) = load_inode(&t.inodes, parent)? {
                if a.kind == FileKind::Dir {
                    p.nlink = p.nlink.saturating_sub(1);
                }
                if b.kind == FileKind::Dir {
                    p.nlink += 1;
                }
                touch_dir(&mut p, ctx.now);
                t.put_inode(parent, &p)?;
            }
        }
        Ok(Reply::Ok)
    }
}

impl PeerExchangeIn {
    pub(super) fn apply(self, t: &mut Tables<'_>, ctx: &mut Ctx<'_>) -> OpResult<Reply> {
        let PeerExchangeIn { intent, new_parent, new_name, expect, put } = self;
        if t.peer_done.get(id_key(intent).as_slice())?.is_some() {
            return Ok(Reply::Ok);
        }
        let mut pdir = dir_inode(&t.inodes, new_parent)?;
        let b = dentry(&t.dentries, new_parent, &new_name)?;
        if b.id != expect {
            return Err(fs_err!(Busy, "{} in {new_parent} changed during an exchange; try again", q(&new_name)).into());
        }
        check_unlocked(t, new_parent, &new_name)?;
        t.put_dentry(new_parent, &new_name, &put)?;
        if b.kind == FileKind::Dir {
            pdir.nlink = pdir.nlink.saturating_sub(1);
        }
        if put.kind == FileKind::Dir {
            pdir.nlink += 1;
        }
        touch_dir(&mut pdir, ctx.now);
        t.put_inode(new_parent, &pdir)?;
        t.peer_done.insert(id_key(intent).as_slice(), [].as_slice())?;
        Ok(Reply::Ok)
    }
}
