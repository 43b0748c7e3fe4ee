//! Quota limits on the client side: a write that grows a file of a user or
//! group whose space quota has no room for it is refused with EDQUOT
//! (`docs/design-quota.md`).
//!
//! Owns the limits and summed usage fetched from mgmtd, refreshed as often
//! as mgmtd says namespaces report (`quota_interval_ms`). The usage counts
//! file lengths the metadata nodes know; growth this client has written
//! and not yet reported (open files) is the caller's to add, because only
//! the mount knows it. It must not count usage itself.

use crate::Client;
use hivefs_proto::{QuotaId, QuotaKind, QuotaState, Reply, Request};
use hivefs_types::error::{ErrorCode, FsError, FsResult};
use std::collections::HashMap;
use std::sync::{Arc, RwLock, Weak};
use std::time::Duration;

/// The limits in force, by user and group (empty: none).
#[derive(Default)]
pub struct Quotas(RwLock<Arc<HashMap<QuotaId, QuotaState>>>);

impl Quotas {
    pub fn get(&self) -> Arc<HashMap<QuotaId, QuotaState>> {
        self.0.read().expect("quotas").clone()
    }

    fn set(&self, q: Vec<QuotaState>) {
        *self.0.write().expect("quotas") = Arc::new(q.into_iter().map(|s| (s.limit.who, s)).collect());
    }
}

/// Refuses `extra` more bytes of `who` (with `pending` bytes already
/// written and not yet reported) when its space limit has no room.
pub fn check_space(q: &HashMap<QuotaId, QuotaState>, who: QuotaId, pending: u64, extra: u64) -> FsResult<()> {
    match q.get(&who) {
        Some(s) if s.exceeded_by(0, pending.saturating_add(extra)) => Err(FsError::new(
            ErrorCode::Quota,
            format!(
                "space quota of {} {} has no room for {extra} more bytes: {} of {} bytes used",
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

/// Refreshes `client`'s limits until the client is gone.
pub(crate) async fn refresh(client: Weak<Client>) {
    let mut every = Duration::from_secs(2);
    loop {
        let Some(c) = client.upgrade() else { return };
        let mgmt = c.cluster.mgmt();
        drop(c);
        match mgmt.rpc(&Request::GetQuotas).await {
            Ok(Reply::Quotas { interval_ms, quotas, .. }) => {
                let Some(c) = client.upgrade() else { return };
                c.quotas.set(quotas);
                every = Duration::from_millis(interval_ms.clamp(100, 60_000));
            }
            Ok(r) => tracing::debug!("mgmtd answered GetQuotas with {r:?}"),
            Err(e) => tracing::debug!("quota limits from mgmtd {}: {e}", mgmt.addr()),
        }
        tokio::time::sleep(every).await;
    }
}
