//! Cross-node exchange: the transactions of RENAME_EXCHANGE across metadata
//! nodes: the intent (this side held), the swap of the other side on the peer,
//! and the commit.

use super::*;

#[allow(clippy::too_many_arguments)]
pub(super) fn exchange_intent(
    t: &mut Tables<'_>,
    _ctx: &mut Ctx<'_>,
    intent: EntryId,
    parent: EntryId,
    name: Vec<u8>,
    new_parent: EntryId,
    new_owner: NodeId,
    new_name: Vec<u8>,
    b: Dentry,
    op: Option<OpId>,
) -> OpResult<Reply> {
    check_name(&name)?;
    check_name(&new_name)?;
    dir_inode(&t.inodes, parent)?;
    let a = dentry(&t.dentries, parent, &name)?;
    check_unlocked(t, parent, &name)?;
    let step = IntentStep::Exchange { parent, name, new_parent, new_owner, new_name, a, b };
    put_intent(t, intent, &Intent { op, step })?;
    Ok(Reply::Ok)
}

pub(super) fn exchange_commit(t: &mut Tables<'_>, ctx: &mut Ctx<'_>, intent: EntryId) -> OpResult<Reply> {
    let Some(Intent { step: IntentStep::Exchange { parent, name, a, b, .. }, .. }) = clear_intent(t, intent)? else {
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

pub(super) fn peer_exchange_in(
    t: &mut Tables<'_>,
    ctx: &mut Ctx<'_>,
    intent: EntryId,
    new_parent: EntryId,
    new_name: Vec<u8>,
    expect: EntryId,
    put: Dentry,
) -> OpResult<Reply> {
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
