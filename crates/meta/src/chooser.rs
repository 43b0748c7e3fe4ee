//! Storage target choosers: which targets a new file is striped over.
//!
//! A pure function of the candidates (online targets of the pool, with their
//! server and free space), the wanted stripe count, a round-robin cursor and a
//! random source. It must not read the cluster view or clocks itself: the
//! caller snapshots the view, so the policy is testable against oracles.

use hivefs_types::ids::{NodeId, TargetId};
use hivefs_types::pattern::Chooser;
use rand::Rng;
use std::cmp::Reverse;
use std::collections::BTreeMap;

/// `(target, its storage server, free bytes)`.
pub type Candidate = (TargetId, NodeId, u64);

/// Free-space differences smaller than this count as equal for `balanced`.
///
/// Why: free space is refreshed only every few seconds; without a granule,
/// every file created in a burst would go to the same (momentarily emptiest)
/// target. Servers and targets within one granule rotate instead.
pub const FREE_GRANULE_BYTES: u64 = 1 << 30;

/// Chooses `min(count, candidates)` distinct targets, in stripe order.
///
/// - `Random`: distinct targets drawn uniformly.
/// - `RoundRobin`: targets sorted by id; `count` consecutive ones starting at
///   `rr_state`, which then advances by `count` (BeeGFS-like, deterministic).
/// - `RandomizedRoundRobin`: the same rotation from a random start.
/// - `Balanced`: spreads over storage servers so that per-server counts differ
///   by at most one (unless a server has no more targets); servers with more
///   free space get the extra targets; inside a server, most free space first;
///   stripe order interleaves the servers. `rr_state` rotates among servers
///   and targets whose free space is within one [`FREE_GRANULE_BYTES`].
pub fn choose<R: Rng + ?Sized>(
    chooser: Chooser,
    candidates: &[Candidate],
    count: usize,
    rr_state: &mut u64,
    rng: &mut R,
) -> Vec<TargetId> {
    let mut sorted: Vec<Candidate> = candidates.to_vec();
    sorted.sort_by_key(|c| c.0);
    // Duplicates would make a pattern name one target twice.
    sorted.dedup_by_key(|c| c.0);
    let n = sorted.len();
    let count = count.min(n);
    if count == 0 {
        return Vec::new();
    }
    let out = match chooser {
        Chooser::Random => rand::seq::index::sample(rng, n, count).into_iter().map(|i| sorted[i].0).collect(),
        Chooser::RoundRobin => {
            let start = (*rr_state % n as u64) as usize;
            *rr_state = rr_state.wrapping_add(count as u64);
            rotation(&sorted, start, count)
        }
        Chooser::RandomizedRoundRobin => {
            let start = rng.gen_range(0..n);
            rotation(&sorted, start, count)
        }
        Chooser::Balanced => {
            let rr = *rr_state;
            *rr_state = rr_state.wrapping_add(1);
            balanced(&sorted, count, rr)
        }
    };
    debug_assert_eq!(out.len(), count);
    out
}

fn rotation(sorted: &[Candidate], start: usize, count: usize) -> Vec<TargetId> {
    (0..count).map(|k| sorted[(start + k) % sorted.len()].0).collect()
}

/// Orders `items` (already in a stable base order) by free granules, most
/// first, rotating the base order by `rr` among equal granules.
fn order_by_free<T: Clone>(items: &[(T, u64)], rr: u64) -> Vec<T> {
    let len = items.len();
    let shift = (rr % len as u64) as usize;
    let mut idx: Vec<usize> = (0..len).collect();
    idx.sort_by_key(|&i| (Reverse(items[i].1 / FREE_GRANULE_BYTES), (i + len - shift) % len));
    idx.into_iter().map(|i| items[i].0.clone()).collect()
}

fn balanced(sorted: &[Candidate], count: usize, rr: u64) -> Vec<TargetId> {
    let mut by_server: BTreeMap<NodeId, Vec<(TargetId, u64)>> = BTreeMap::new();
    for &(t, node, free) in sorted {
        by_server.entry(node).or_default().push((t, free));
    }
    let servers: Vec<(Vec<TargetId>, u64)> = by_server
        .into_values()
        .map(|ts| {
            let total = ts.iter().map(|t| t.1).fold(0u64, u64::saturating_add);
            (order_by_free(&ts, rr), total)
        })
        .collect();
    let servers = order_by_free(&servers, rr);
    // Round by round, one more target from every server that has one left:
    // counts stay within one of each other, and the stripe interleaves servers.
    let mut out = Vec::with_capacity(count);
    let mut round = 0;
    while out.len() < count {
        let before = out.len();
        for s in &servers {
            if out.len() == count {
                break;
            }
            if let Some(&t) = s.get(round) {
                out.push(t);
            }
        }
        assert!(out.len() > before, "balanced chooser ran out of targets before `count`");
        round += 1;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use rand::rngs::StdRng;
    use rand::SeedableRng;
    use std::collections::{HashMap, HashSet};

    const GIB: u64 = 1 << 30;

    fn cands(per_server: &[usize]) -> Vec<Candidate> {
        let mut v = Vec::new();
        let mut t = 1;
        for (s, &k) in per_server.iter().enumerate() {
            for j in 0..k {
                v.push((TargetId(t), NodeId(s as u32 + 1), (10 + j as u64) * GIB));
                t += 1;
            }
        }
        v
    }

    fn per_server(c: &[Candidate], chosen: &[TargetId]) -> HashMap<NodeId, usize> {
        let node: HashMap<TargetId, NodeId> = c.iter().map(|x| (x.0, x.1)).collect();
        let mut m = HashMap::new();
        for t in chosen {
            *m.entry(node[t]).or_insert(0) += 1;
        }
        m
    }

    /// Every server either is within one of the busiest server, or has all its targets used.
    fn assert_balanced(c: &[Candidate], chosen: &[TargetId]) {
        let counts = per_server(c, chosen);
        let max = counts.values().copied().max().unwrap_or(0);
        let mut size: HashMap<NodeId, usize> = HashMap::new();
        for x in c {
            *size.entry(x.1).or_insert(0) += 1;
        }
        for (node, &total) in &size {
            let got = counts.get(node).copied().unwrap_or(0);
            assert!(got + 1 >= max || got == total, "server {node}: {got} of {total}, max {max}: {chosen:?}");
        }
    }

    #[test]
    fn balanced_uneven_servers_every_count() {
        let c = cands(&[3, 5]);
        for count in 1..=8 {
            let mut rr = 0;
            let chosen = choose(Chooser::Balanced, &c, count, &mut rr, &mut StdRng::seed_from_u64(1));
            assert_eq!(chosen.len(), count);
            assert_balanced(&c, &chosen);
            let counts = per_server(&c, &chosen);
            let a = counts.get(&NodeId(1)).copied().unwrap_or(0);
            let b = counts.get(&NodeId(2)).copied().unwrap_or(0);
            // Until server 1 is exhausted the split is even (within one).
            assert!(a.abs_diff(b) <= 1 || a == 3, "count {count}: {a}+{b}");
        }
    }

    #[test]
    fn balanced_prefers_free_servers_and_targets_and_interleaves() {
        // Server 1: 2 targets, little space; server 2: 2 targets, much space.
        let c = vec![
            (TargetId(1), NodeId(1), GIB),
            (TargetId(2), NodeId(1), 2 * GIB),
            (TargetId(3), NodeId(2), 50 * GIB),
            (TargetId(4), NodeId(2), 80 * GIB),
        ];
        let mut rr = 0;
        let mut rng = StdRng::seed_from_u64(7);
        assert_eq!(choose(Chooser::Balanced, &c, 1, &mut rr, &mut rng), vec![TargetId(4)]);
        // Server 2 first, its emptier target first, then server 1's emptier target.
        assert_eq!(choose(Chooser::Balanced, &c, 3, &mut rr, &mut rng), vec![TargetId(4), TargetId(2), TargetId(3)]);
        assert_eq!(
            choose(Chooser::Balanced, &c, 4, &mut rr, &mut rng),
            vec![TargetId(4), TargetId(2), TargetId(3), TargetId(1)]
        );
    }

    #[test]
    fn balanced_rotates_among_equal_servers() {
        // Equal free space: successive single-target files go to different servers.
        let c: Vec<Candidate> = (1..=4).map(|i| (TargetId(i), NodeId(i), 100 * GIB)).collect();
        let mut rr = 0;
        let mut rng = StdRng::seed_from_u64(3);
        let picks: HashSet<TargetId> = (0..4).map(|_| choose(Chooser::Balanced, &c, 1, &mut rr, &mut rng)[0]).collect();
        assert_eq!(picks.len(), 4);
    }

    #[test]
    fn roundrobin_is_a_deterministic_rotation() {
        let c: Vec<Candidate> = [5, 2, 9].iter().map(|&t| (TargetId(t), NodeId(1), 0)).collect();
        let mut rr = 0;
        let mut rng = StdRng::seed_from_u64(0);
        let mut pick = |n| choose(Chooser::RoundRobin, &c, n, &mut rr, &mut rng);
        assert_eq!(pick(1), vec![TargetId(2)]);
        assert_eq!(pick(1), vec![TargetId(5)]);
        assert_eq!(pick(2), vec![TargetId(9), TargetId(2)]);
        assert_eq!(pick(3), vec![TargetId(5), TargetId(9), TargetId(2)]);
    }

    #[test]
    fn randomized_roundrobin_is_consecutive_in_id_order() {
        let c: Vec<Candidate> = (1..=6).map(|t| (TargetId(t), NodeId(1), 0)).collect();
        let mut rr = 0;
        let mut rng = StdRng::seed_from_u64(11);
        for _ in 0..50 {
            let v = choose(Chooser::RandomizedRoundRobin, &c, 3, &mut rr, &mut rng);
            for w in v.windows(2) {
                assert_eq!(w[1].0, w[0].0 % 6 + 1);
            }
        }
        assert_eq!(rr, 0, "randomized round-robin leaves the cursor alone");
    }

    #[test]
    fn no_candidates_or_zero_count_give_nothing() {
        let mut rr = 0;
        let mut rng = StdRng::seed_from_u64(0);
        for ch in Chooser::ALL {
            assert!(choose(ch, &[], 4, &mut rr, &mut rng).is_empty());
            assert!(choose(ch, &cands(&[2]), 0, &mut rr, &mut rng).is_empty());
        }
    }

    fn arb_candidates() -> impl Strategy<Value = Vec<Candidate>> {
        proptest::collection::vec((1u32..8, 0u64..(200 * GIB)), 1..24).prop_map(|v| {
            v.into_iter().enumerate().map(|(i, (node, free))| (TargetId(i as u32 + 1), NodeId(node), free)).collect()
        })
    }

    proptest! {
        #[test]
        fn every_chooser_returns_distinct_valid_targets(
            c in arb_candidates(),
            count in 0usize..30,
            rr0 in any::<u64>(),
            seed in any::<u64>(),
            which in 0usize..4,
        ) {
            let ch = Chooser::ALL[which];
            let mut rr = rr0;
            let chosen = choose(ch, &c, count, &mut rr, &mut StdRng::seed_from_u64(seed));
            prop_assert_eq!(chosen.len(), count.min(c.len()));
            let set: HashSet<_> = chosen.iter().collect();
            prop_assert_eq!(set.len(), chosen.len());
            let valid: HashSet<_> = c.iter().map(|x| x.0).collect();
            prop_assert!(chosen.iter().all(|t| valid.contains(t)));
        }

        #[test]
        fn balanced_counts_differ_by_at_most_one(
            c in arb_candidates(),
            rr0 in any::<u64>(),
        ) {
            for count in 1..=c.len() {
                let mut rr = rr0;
                let chosen = choose(Chooser::Balanced, &c, count, &mut rr, &mut StdRng::seed_from_u64(0));
                assert_balanced(&c, &chosen);
            }
        }

        #[test]
        fn balanced_uses_emptier_targets_within_a_server(
            frees in proptest::collection::vec(0u64..100, 2..8),
        ) {
            // One server: the chosen targets are the ones with the most free granules.
            let c: Vec<Candidate> =
                frees.iter().enumerate().map(|(i, &f)| (TargetId(i as u32 + 1), NodeId(1), f * GIB)).collect();
            let mut rr = 0;
            let chosen = choose(Chooser::Balanced, &c, 1, &mut rr, &mut StdRng::seed_from_u64(0));
            let best = frees.iter().max().copied().unwrap_or(0);
            let free_of = |t: TargetId| frees[(t.0 - 1) as usize];
            prop_assert_eq!(free_of(chosen[0]), best);
        }
    }
}
