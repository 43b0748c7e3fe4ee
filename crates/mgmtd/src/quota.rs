//! Quota usage as the namespaces report it, summed for every limit
//! (`docs/design-quota.md`).
//!
//! Each metadata namespace reports what its inodes hold for the limited
//! users and groups every `interval_ms`; mgmtd keeps the last report of
//! each (in memory: they come again within one interval after a restart)
//! and answers the limits with the sums. A namespace that stops reporting
//! (its node down) keeps counting with its last report. Limits themselves
//! are in the registry. It must not enforce anything: metadata nodes refuse
//! inodes, clients refuse writes.

use crate::registry::QuotaRecord;
use hivefs_proto::{QuotaId, QuotaState, QuotaUse, Reply};
use hivefs_types::ids::NodeId;
use std::collections::HashMap;
use std::time::Instant;

/// Default of `quota_interval_ms`.
pub const DEFAULT_INTERVAL_MS: u64 = 2000;

pub struct Reports {
    pub interval_ms: u64,
    by_namespace: HashMap<NodeId, (Instant, HashMap<QuotaId, QuotaUse>)>,
}

impl Default for Reports {
    fn default() -> Self {
        Reports { interval_ms: DEFAULT_INTERVAL_MS, by_namespace: HashMap::new() }
    }
}

impl Reports {
    pub fn report(&mut self, namespace: NodeId, usage: Vec<(QuotaId, QuotaUse)>, now: Instant) {
        self.by_namespace.insert(namespace, (now, usage.into_iter().collect()));
    }

    /// Every limit with its usage summed over the namespaces' last reports.
    pub fn answer(&self, limits: &[QuotaRecord], now: Instant) -> Reply {
        let quotas = limits
            .iter()
            .map(|q| {
                let limit = q.limit();
                let mut used = QuotaUse::default();
                for (_, u) in self.by_namespace.values() {
                    if let Some(u) = u.get(&limit.who) {
                        used.inodes = used.inodes.saturating_add(u.inodes);
                        used.bytes = used.bytes.saturating_add(u.bytes);
                    }
                }
                QuotaState { limit, used }
            })
            .collect();
        let age_ms = self
            .by_namespace
            .values()
            .map(|(at, _)| now.saturating_duration_since(*at).as_millis() as u64)
            .max()
            .unwrap_or(u64::MAX);
        Reply::Quotas { interval_ms: self.interval_ms, age_ms, quotas }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hivefs_proto::QuotaKind;

    #[test]
    fn usage_is_summed_over_the_latest_report_of_each_namespace() {
        let who = QuotaId { kind: QuotaKind::User, id: 1001 };
        let limits = [QuotaRecord { kind: QuotaKind::User, id: 1001, bytes: Some(100), inodes: None }];
        let mut r = Reports::default();
        let now = Instant::now();
        let Reply::Quotas { age_ms, quotas, .. } = r.answer(&limits, now) else { panic!() };
        assert_eq!((age_ms, quotas[0].used), (u64::MAX, QuotaUse::default()));
        r.report(NodeId(1), vec![(who, QuotaUse { inodes: 2, bytes: 60 })], now);
        r.report(NodeId(2), vec![(who, QuotaUse { inodes: 1, bytes: 30 })], now);
        // A newer report replaces the node's older one.
        r.report(NodeId(1), vec![(who, QuotaUse { inodes: 3, bytes: 80 })], now);
        let Reply::Quotas { quotas, .. } = r.answer(&limits, now) else { panic!() };
        assert_eq!(quotas[0].used, QuotaUse { inodes: 4, bytes: 110 });
        assert!(quotas[0].exceeded_by(0, 0));
    }
}
