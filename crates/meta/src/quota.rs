//! Quota enforcement on a metadata node: new inodes of a user or group whose
//! quota is used up are refused with EDQUOT (`docs/design-quota.md`).
//!
//! Owns the limits this node last fetched from mgmtd (with the usage mgmtd
//! had gathered from every metadata node) and the check the creating
//! operations make. The usage of this node's own inodes moves on between
//! fetches; the check adds what changed here since the fetch, so on a file
//! system with one metadata node a limit is exact, and with several the
//! slack is what the other nodes created within one gathering interval.
//! It must not talk to mgmtd itself (`lib.rs` fetches) nor count usage
//! (`store::usage` does, with every inode write).

use crate::store::usage;
use crate::store::{Kv, OpResult};
use hivefs_proto::{QuotaId, QuotaKind, QuotaState, QuotaUse};
use hivefs_types::fs_err;
use hivefs_types::ids::PoolId;
use std::collections::HashMap;
use std::sync::{Arc, RwLock};

/// The limits in force on this node.
#[derive(Default)]
pub struct QuotaGate {
    fetched: RwLock<Option<Arc<Fetched>>>,
}

struct Fetched {
    /// By user or group and pool (`None`: the whole file system).
    quotas: HashMap<(QuotaId, Option<PoolId>), QuotaState>,
    /// This node's own usage of each limited user or group as mgmtd's sums
    /// include it.
    local: HashMap<QuotaId, QuotaUse>,
}

impl QuotaGate {
    /// Installs what mgmtd answered; `local` gives this node's usage of one
    /// user or group as mgmtd's sums count it (as reported with the request
    /// mgmtd answered): the checks add what changed here since.
    pub fn set(&self, quotas: Vec<QuotaState>, local: impl Fn(QuotaId) -> QuotaUse) {
        let fetched = (!quotas.is_empty()).then(|| {
            let local = quotas.iter().map(|q| (q.limit.who, local(q.limit.who))).collect();
            Arc::new(Fetched { quotas: quotas.into_iter().map(|q| ((q.limit.who, q.limit.pool), q)).collect(), local })
        });
        *self.fetched.write().expect("quota gate") = fetched;
    }

    /// Users and groups with a limit.
    pub fn limited(&self) -> Vec<QuotaId> {
        let f = self.fetched.read().expect("quota gate");
        let mut ids: Vec<QuotaId> = f.as_ref().map_or_else(Vec::new, |f| f.quotas.keys().map(|k| k.0).collect());
        ids.sort_unstable();
        ids.dedup();
        ids
    }

    /// Refuses a new inode of `uid`/`gid` when either's quota (inodes, or
    /// space already at its limit) leaves no room; a regular file in storage
    /// pool `pool` also needs room in that pool's quotas. `usage` is this
    /// node's usage table as the batch sees it.
    pub fn admit(&self, usage: &impl Kv, uid: u32, gid: u32, pool: Option<PoolId>) -> OpResult<()> {
        let owners = [QuotaId { kind: QuotaKind::User, id: uid }, QuotaId { kind: QuotaKind::Group, id: gid }];
        // A new inode needs room for itself and, at a space limit, for one byte.
        self.check(usage, &owners, 1, pool)
    }

    /// Refuses handing an existing inode of `bytes` bytes to the new owners
    /// `to` (chown, chgrp) when one of them has no room for it, as Linux's
    /// quota transfer does; the file-system-wide limits only (pool limits
    /// are summed by mgmtd alone).
    pub fn admit_transfer(&self, usage: &impl Kv, to: &[QuotaId], bytes: u64) -> OpResult<()> {
        self.check(usage, to, bytes, None)
    }

    /// Whether each of `owners` has room for one more inode of `bytes` bytes.
    fn check(&self, usage: &impl Kv, owners: &[QuotaId], bytes: u64, pool: Option<PoolId>) -> OpResult<()> {
        let Some(f) = self.fetched.read().expect("quota gate").clone() else { return Ok(()) };
        for &who in owners {
            if let Some(q) = pool.and_then(|p| f.quotas.get(&(who, Some(p)))) {
                // Summed by mgmtd alone: this node's own files per pool since are not added.
                if q.exceeded_by(1, 1) {
                    let p = q.limit.pool.map_or(0, |p| p.0);
                    return Err(fs_err!(
                        Quota,
                        "quota of {} {} in storage pool {p} used up: {} of {} files, {} of {} bytes",
                        who.kind.name(),
                        who.id,
                        q.used.inodes,
                        q.limit.inodes.map_or("unlimited".into(), |l| l.to_string()),
                        q.used.bytes,
                        q.limit.bytes.map_or("unlimited".into(), |l| l.to_string())
                    )
                    .into());
                }
            }
            let Some(q) = f.quotas.get(&(who, None)) else { continue };
            let then = f.local.get(&who).copied().unwrap_or_default();
            let now = usage::get(usage, who)?;
            let moved = |used: u64, a: u64, b: u64| (used as i128 + b as i128 - a as i128).max(0) as u64;
            let used = QuotaUse {
                inodes: moved(q.used.inodes, then.inodes, now.inodes),
                bytes: moved(q.used.bytes, then.bytes, now.bytes),
            };
            let cur = QuotaState { limit: q.limit, used };
            if cur.exceeded_by(1, bytes) {
                let what = match (q.limit.inodes, q.limit.bytes) {
                    (Some(l), _) if used.inodes >= l => format!("{} of {l} inodes", used.inodes),
                    (_, Some(l)) => format!("{} of {l} bytes, {bytes} more asked", used.bytes),
                    _ => String::new(),
                };
                return Err(fs_err!(Quota, "quota of {} {} used up: {what}", who.kind.name(), who.id).into());
            }
        }
        Ok(())
    }
}
