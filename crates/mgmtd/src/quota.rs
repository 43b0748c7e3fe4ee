//! Quota usage as the namespaces report it, summed for every limit
//! (`docs/design-quota.md`).
//!
//! Each metadata namespace reports what its inodes hold for the limited
//! users and groups every `interval_ms`, in total and per first stripe unit
//! of their regular files; mgmtd keeps the last report of each (in memory:
//! they come again within one interval after a restart) and answers the
//! limits with the sums, per storage pool for pool limits (a unit's pool as
//! the registry has it now). A namespace that stops reporting (its node
//! down) keeps counting with its last report. Limits themselves are in the
//! registry. It must not enforce anything: metadata nodes refuse inodes,
//! clients refuse writes.

use crate::registry::Registry;
use hivefs_proto::{QuotaId, QuotaState, QuotaUse, Reply};
use hivefs_types::ids::NodeId;
use hivefs_types::pattern::StripeUnit;
use std::collections::HashMap;
use std::time::Instant;

/// Default of `quota_interval_ms`.
pub const DEFAULT_INTERVAL_MS: u64 = 2000;

struct Report {
    at: Instant,
    usage: HashMap<QuotaId, QuotaUse>,
    by_unit: Vec<(QuotaId, StripeUnit, QuotaUse)>,
}

pub struct Reports {
    pub interval_ms: u64,
    by_namespace: HashMap<NodeId, Report>,
}

impl Default for Reports {
    fn default() -> Self {
        Reports { interval_ms: DEFAULT_INTERVAL_MS, by_namespace: HashMap::new() }
    }
}

fn add(sum: &mut QuotaUse, u: &QuotaUse) {
    sum.inodes = sum.inodes.saturating_add(u.inodes);
    sum.bytes = sum.bytes.saturating_add(u.bytes);
}

impl Reports {
    pub fn report(
        &mut self,
        namespace: NodeId,
        usage: Vec<(QuotaId, QuotaUse)>,
        by_unit: Vec<(QuotaId, StripeUnit, QuotaUse)>,
        now: Instant,
    ) {
        self.by_namespace.insert(namespace, Report { at: now, usage: usage.into_iter().collect(), by_unit });
    }

    /// Every limit with its usage summed over the namespaces' last reports.
    pub fn answer(&self, reg: &Registry, now: Instant) -> Reply {
        let quotas = reg
            .quotas
            .iter()
            .map(|q| {
                let limit = q.limit();
                let mut used = QuotaUse::default();
                for r in self.by_namespace.values() {
                    match limit.pool {
                        None => r.usage.get(&limit.who).into_iter().for_each(|u| add(&mut used, u)),
                        Some(p) => r
                            .by_unit
                            .iter()
                            .filter(|(w, unit, _)| *w == limit.who && reg.pool_of_unit(*unit) == Some(p))
                            .for_each(|(_, _, u)| add(&mut used, u)),
                    }
                }
                QuotaState { limit, used }
            })
            .collect();
        let age_ms = self
            .by_namespace
            .values()
            .map(|r| now.saturating_duration_since(r.at).as_millis() as u64)
            .max()
            .unwrap_or(u64::MAX);
        Reply::Quotas { interval_ms: self.interval_ms, age_ms, quotas }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::registry::QuotaRecord;
    use hivefs_proto::QuotaKind;
    use hivefs_types::ids::{PoolId, TargetId};

    #[test]
    fn usage_is_summed_over_the_latest_report_of_each_namespace_and_per_pool() {
        let who = QuotaId { kind: QuotaKind::User, id: 1001 };
        let mut reg = Registry::default();
        let (node, _) = reg.register_node(hivefs_types::ids::NodeType::Storage, "s", "127.0.0.1:1", "h").unwrap();
        let (t1, _, _) = reg.register_target(node, "a").unwrap();
        let (t2, _, _) = reg.register_target(node, "b").unwrap();
        let ssd = reg.create_pool("ssd").unwrap();
        reg.move_target_to_pool(t2, ssd).unwrap();
        let rec = |pool| QuotaRecord { kind: QuotaKind::User, id: 1001, pool, bytes: Some(100), inodes: None };
        reg.quotas = vec![rec(None), rec(Some(PoolId::DEFAULT)), rec(Some(ssd))];
        let mut r = Reports::default();
        let now = Instant::now();
        let Reply::Quotas { age_ms, quotas, .. } = r.answer(&reg, now) else { panic!() };
        assert_eq!((age_ms, quotas[0].used), (u64::MAX, QuotaUse::default()));
        let u = |inodes, bytes| QuotaUse { inodes, bytes };
        let unit = |t: TargetId| StripeUnit::Target(t);
        r.report(NodeId(1), vec![(who, u(2, 60))], vec![(who, unit(t1), u(2, 60))], now);
        r.report(NodeId(2), vec![(who, u(1, 30))], vec![(who, unit(t2), u(1, 30))], now);
        // A newer report replaces the node's older one.
        r.report(NodeId(1), vec![(who, u(3, 80))], vec![(who, unit(t1), u(2, 80))], now);
        let Reply::Quotas { quotas, .. } = r.answer(&reg, now) else { panic!() };
        let used: Vec<QuotaUse> = quotas.iter().map(|q| q.used).collect();
        assert_eq!(used, [u(4, 110), u(2, 80), u(1, 30)]);
        assert!(quotas[0].exceeded_by(0, 0) && !quotas[1].exceeded_by(0, 0));
    }
}
