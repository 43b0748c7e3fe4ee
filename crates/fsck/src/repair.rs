//! Repairs: each problem's fix sent to the metadata node that holds the
//! record (`FsckFix`, applied by its writer, refused when the record changed)
//! or to the storage target (`UnlinkChunk`).

use crate::checker::{Fix, Kind, Problem};
use crate::walk::Nodes;
use hivefs_proto::{Reply, Request};
use hivefs_types::pattern::StripeUnit;
use serde::Serialize;

/// What one repair did: `done` with the node's message, or why not.
#[derive(Clone, Debug, Serialize)]
pub struct Repair {
    pub kind: Kind,
    pub entry: String,
    pub done: bool,
    pub message: String,
}

/// Applies the fixes of `problems` (removals first, see [`Fix`]); a fix that
/// fails is reported in its [`Repair`], and the others still run.
pub async fn repair(nodes: &Nodes, problems: &[Problem]) -> Vec<Repair> {
    let mut order: Vec<&Problem> = problems.iter().collect();
    order.sort_by_key(|p| p.fix.order());
    let mut out = Vec::new();
    for p in order {
        let r = match &p.fix {
            Fix::None => Err("no automatic repair; inspect it by hand".to_string()),
            Fix::UnlinkChunk(StripeUnit::Target(t), id) => match nodes.targets.iter().find(|x| x.0 == *t) {
                Some((_, pool)) => pool
                    .rpc(&Request::UnlinkChunk { target: *t, entry: *id })
                    .await
                    .map(|_| format!("removed chunk file of {id} on target {t}"))
                    .map_err(|e| format!("target {t}: {e}")),
                None => Err(format!("target {t} is not registered")),
            },
            // Through the primary, which forwards the removal to the secondary.
            Fix::UnlinkChunk(StripeUnit::Group(g), id) => match nodes.groups.iter().find(|x| x.0 == *g) {
                Some((_, env, primary, pool)) => pool
                    .rpc_with(env, &Request::UnlinkChunk { target: *primary, entry: *id })
                    .await
                    .map(|_| format!("removed mirrored chunk file of {id} in buddy group {g}"))
                    .map_err(|e| format!("buddy group {g}: {e}")),
                None => Err(format!("buddy group {g} is not registered")),
            },
            // The primary's copy is the good one: a full resync copies it over the secondary's.
            Fix::ResyncGroup(g) => match nodes.mgmt_secondary(*g) {
                Some((mgmt, member)) => {
                    let state = hivefs_proto::Consistency::Bad;
                    mgmt.rpc(&Request::SetMemberState { group: *g, epoch: None, member, state })
                        .await
                        .map(|_| format!("full resync of buddy group {g} from its primary requested"))
                        .map_err(|e| format!("buddy group {g}: {e}"))
                }
                None => Err(format!("buddy group {g}: no secondary to resync")),
            },
            Fix::Meta(n, fix) => match nodes.metas.iter().find(|x| x.0 == *n) {
                Some((_, pool)) => match pool.rpc(&Request::FsckFix { fix: fix.clone() }).await {
                    Ok(Reply::FsckFixed(m)) => Ok(m),
                    Ok(other) => Err(format!("metadata node {n}: unexpected reply {other:?}")),
                    Err(e) => Err(format!("metadata node {n}: {e}")),
                },
                None => Err(format!("metadata node {n} is not registered")),
            },
        };
        let (done, message) = match r {
            Ok(m) => (true, m),
            Err(m) => (false, m),
        };
        tracing::info!(entry = %p.entry, done, "fsck repair: {message}");
        out.push(Repair { kind: p.kind, entry: p.entry.clone(), done, message });
    }
    out
}
