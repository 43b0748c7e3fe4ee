//! Quota limits on the client side: a write that grows a file of a user or
//! group whose space quota has no room for it is refused with EDQUOT
//! (`docs/design-quota.md`).
//!
//! Owns the limits and summed usage fetched from mgmtd, refreshed as often
//! as mgmtd says namespaces report (`quota_interval_ms`). The usage counts
//! file lengths the metadata nodes know; growth this client reported since
//! the sums were made is kept here and added ([`Quotas::unsummed`]); growth
//! written and not yet reported (open files) is the caller's to add, because
//! only the mount knows it. It must not count usage itself.

use crate::Client;
use hivefs_proto::{QuotaId, QuotaKind, QuotaState, Reply, Request};
use hivefs_types::error::{ErrorCode, FsError, FsResult};
use hivefs_types::ids::PoolId;
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock, Weak};
use std::time::{Duration, Instant};

/// A limit's user or group and pool (`None`: the whole file system).
pub type QuotaKey = (QuotaId, Option<PoolId>);

/// Growth of a file this client reported to its metadata node.
struct Reported {
    owner: (u32, u32),
    pool: Option<PoolId>,
    bytes: u64,
    at: Instant,
}

/// Most reports kept while waiting for mgmtd's sums to include them.
const REPORTED_MAX: usize = 65_536;

/// The limits in force (empty: none), and growth this client reported that
/// mgmtd's sums may not include yet.
#[derive(Default)]
pub struct Quotas {
    state: RwLock<Arc<HashMap<QuotaKey, QuotaState>>>,
    /// `state` is not empty: read without a lock by every write.
    any: AtomicBool,
    /// Every namespace report in `state` is newer than this.
    as_of: Mutex<Option<Instant>>,
    reported: Mutex<VecDeque<Reported>>,
}

impl Quotas {
    /// Whether any limit is in force (no lock: checked before every growing write).
    pub fn any(&self) -> bool {
        self.any.load(Ordering::Relaxed)
    }

    pub fn get(&self) -> Arc<HashMap<QuotaKey, QuotaState>> {
        self.state.read().expect("quotas").clone()
    }

    fn set(&self, q: Vec<QuotaState>, as_of: Option<Instant>) {
        self.any.store(!q.is_empty(), Ordering::Relaxed);
        *self.state.write().expect("quotas") =
            Arc::new(q.into_iter().map(|s| ((s.limit.who, s.limit.pool), s)).collect());
        *self.as_of.lock().expect("quotas") = as_of;
    }

    /// Notes `bytes` of growth of a file of `owner` (uid, gid) in `pool`
    /// that the metadata node now knows (while any limit is in force).
    pub fn note_reported(&self, owner: (u32, u32), pool: Option<PoolId>, bytes: u64) {
        if bytes == 0 || !self.any() {
            return;
        }
        let mut r = self.reported.lock().expect("quotas");
        if r.len() >= REPORTED_MAX {
            r.pop_front();
        }
        r.push_back(Reported { owner, pool, bytes, at: Instant::now() });
    }

    /// Reported growth of files for which `owner` (uid, gid) and `pool`
    /// match that mgmtd's sums may not include yet.
    pub fn unsummed(&self, owner: impl Fn((u32, u32)) -> bool, pool: Option<PoolId>) -> u64 {
        let as_of = *self.as_of.lock().expect("quotas");
        let mut r = self.reported.lock().expect("quotas");
        if let Some(t) = as_of {
            while r.front().is_some_and(|x| x.at < t) {
                r.pop_front();
            }
        }
        r.iter().filter(|x| owner(x.owner) && (pool.is_none() || x.pool == pool)).map(|x| x.bytes).sum()
    }
}

/// Refuses `extra` more bytes of limit `key` (with `pending` bytes already
/// written and not yet reported) when its space limit has no room.
pub fn check_space(q: &HashMap<QuotaKey, QuotaState>, key: QuotaKey, pending: u64, extra: u64) -> FsResult<()> {
    let who = key.0;
    let pool = key.1.map_or(String::new(), |p| format!(" in storage pool {p}"));
    match q.get(&key) {
        Some(s) if s.exceeded_by(0, pending.saturating_add(extra)) => Err(FsError::new(
            ErrorCode::Quota,
            format!(
                "space quota of {} {}{pool} has no room for {extra} more bytes: {} of {} bytes used",
                who.kind.name(),
                who.id,
                s.used.bytes.saturating_add(pending),
                s.limit.bytes.unwrap_or(u64::MAX)
            ),
        )),
        _ => Ok(()),
    }
}

/// The user and the group a file of `uid`/`gid` counts for.
pub fn owners(uid: u32, gid: u32) -> [QuotaId; 2] {
    [QuotaId { kind: QuotaKind::User, id: uid }, QuotaId { kind: QuotaKind::Group, id: gid }]
}

/// See the use in [`refresh`].
const SUM_MARGIN_MS: u64 = 250;

/// Refreshes `client`'s limits until the client is gone.
pub(crate) async fn refresh(client: Weak<Client>) {
    let mut every = Duration::from_secs(2);
    loop {
        let Some(c) = client.upgrade() else { return };
        let mgmt = c.cluster.mgmt();
        drop(c);
        let sent = Instant::now();
        match mgmt.rpc(&Request::GetQuotas).await {
            Ok(Reply::Quotas { interval_ms, age_ms, quotas }) => {
                let Some(c) = client.upgrade() else { return };
                // A namespace reads its usage a moment before mgmtd receives
                // its report: count growth reported shortly before as not summed.
                let as_of = sent.checked_sub(Duration::from_millis(age_ms.saturating_add(SUM_MARGIN_MS)));
                c.quotas.set(quotas, as_of);
                every = Duration::from_millis(interval_ms.clamp(100, 60_000));
            }
            Ok(r) => tracing::debug!("mgmtd answered GetQuotas with {r:?}"),
            Err(e) => tracing::debug!("quota limits from mgmtd {}: {e}", mgmt.addr()),
        }
        tokio::time::sleep(every).await;
    }
}
