//! Queue balancers: which node pulls which queue.
//!
//! Two balancers are pure functions of the *set* of live nodes and the
//! queues, so every node computes the same assignment without talking:
//! - [`BalancerKind::BestFit`] (what `serve` and `demo` run): perfect balance (Orleans'
//!   `BestFitBalancer` ideal split: the first `Q mod N` nodes in sorted order
//!   get one queue more);
//! - [`BalancerKind::Ring`]: consistent hashing on a `hashring` ring with
//!   virtual nodes, which moves fewer queues when a node joins or leaves.
//!
//! [`BalancerKind::Lease`] (what `tailrace node` runs) is not a function of the membership alone: each
//! node claims free queue leases until it holds its fair share (the same
//! counts as best-fit), see [`LeasePlanner`]. All three are gated by the
//! same queue leases.

use std::collections::BTreeMap;
use std::hash::{Hash, Hasher};

use hashring::HashRing;
use serde::{Deserialize, Serialize};

use crate::stream::{NodeId, QueueId};

mod lease;

pub(crate) use lease::{LeasePlanner, responsibility};

/// Which balancer a node runs (every node of a cluster must run the same).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", tag = "kind", try_from = "BalancerSection")]
pub enum BalancerKind {
    /// Perfect balance; reshuffles more on membership changes.
    #[default]
    BestFit,
    /// Consistent hashing with this many virtual nodes per node (>= 64).
    Ring {
        /// Virtual nodes per node.
        virtual_nodes: u32,
    },
    /// Each node claims free queue leases until it holds `Q/N` (+1 for the
    /// first `Q mod N` nodes) and gives up its oldest extras (Orleans'
    /// `LeaseBasedQueueBalancer`); rounds every `lease.acquire`.
    Lease,
}

/// `[balancer]` as written: every key known (serde lets an internally
/// tagged unit variant, `kind = "lease"`, take any other key silently).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct BalancerSection {
    kind: String,
    virtual_nodes: Option<u32>,
}

impl TryFrom<BalancerSection> for BalancerKind {
    type Error = String;

    fn try_from(section: BalancerSection) -> Result<Self, String> {
        match (section.kind.as_str(), section.virtual_nodes) {
            ("best-fit", None) => Ok(BalancerKind::BestFit),
            ("lease", None) => Ok(BalancerKind::Lease),
            ("ring", Some(virtual_nodes)) => Ok(BalancerKind::Ring { virtual_nodes }),
            ("ring", None) => Err("balancer kind \"ring\" needs virtual_nodes (64 or more)".into()),
            ("best-fit" | "lease", Some(_)) => Err(format!(
                "unknown field `virtual_nodes` for balancer kind \"{}\" (only \"ring\" has it)",
                section.kind
            )),
            (kind, _) => Err(format!("unknown balancer kind `{kind}`, expected `best-fit`, `ring` or `lease`")),
        }
    }
}

/// The minimum virtual nodes per node on the ring (fewer balance poorly).
pub(crate) const MIN_VIRTUAL_NODES: u32 = 64;

impl BalancerKind {
    /// Assigns every queue to exactly one live node. Input order and
    /// duplicates do not matter. No nodes: nothing is assigned. For
    /// [`BalancerKind::Lease`] this is best-fit's split: how many queues each
    /// node converges to, not which.
    pub fn assign(self, nodes: &[NodeId], queues: &[QueueId]) -> BTreeMap<NodeId, Vec<QueueId>> {
        let mut nodes = nodes.to_vec();
        nodes.sort();
        nodes.dedup();
        let mut queues = queues.to_vec();
        queues.sort();
        queues.dedup();
        let mut out: BTreeMap<NodeId, Vec<QueueId>> = nodes.iter().map(|n| (n.clone(), Vec::new())).collect();
        if nodes.is_empty() {
            return out;
        }
        match self {
            BalancerKind::BestFit | BalancerKind::Lease => {
                let (per, extra) = (queues.len() / nodes.len(), queues.len() % nodes.len());
                let mut next = queues.into_iter();
                for (i, node) in nodes.iter().enumerate() {
                    let take = per + usize::from(i < extra);
                    out.entry(node.clone()).or_default().extend(next.by_ref().take(take));
                }
            }
            BalancerKind::Ring { virtual_nodes } => {
                let mut ring = HashRing::new();
                ring.batch_add(
                    nodes
                        .iter()
                        .flat_map(|n| (0..virtual_nodes.max(MIN_VIRTUAL_NODES)).map(move |i| VirtualNode(n.clone(), i)))
                        .collect(),
                );
                for q in queues {
                    if let Some(VirtualNode(node, _)) = ring.get(&RingKey(q)) {
                        out.entry(node.clone()).or_default().push(q);
                    }
                }
            }
        }
        out
    }

    /// The queues `me` should pull.
    pub fn queues_for(self, me: &NodeId, nodes: &[NodeId], queues: &[QueueId]) -> Vec<QueueId> {
        self.assign(nodes, queues).remove(me).unwrap_or_default()
    }
}

/// One point of a node on the ring. Hashes explicit bytes so the ring does
/// not depend on how std hashes integers.
#[derive(Clone, Debug, PartialEq, Eq)]
struct VirtualNode(NodeId, u32);

impl Hash for VirtualNode {
    fn hash<H: Hasher>(&self, state: &mut H) {
        state.write(self.0.as_str().as_bytes());
        state.write(&self.1.to_le_bytes());
    }
}

struct RingKey(QueueId);

impl Hash for RingKey {
    fn hash<H: Hasher>(&self, state: &mut H) {
        state.write(b"queue");
        state.write(&self.0.0.to_le_bytes());
    }
}

#[cfg(test)]
mod tests;
