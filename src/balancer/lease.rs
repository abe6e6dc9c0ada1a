//! The lease balancer's plan (Orleans' `LeaseBasedQueueBalancer`): unlike
//! the other balancers, nodes do not compute one shared assignment; each
//! claims leases until it holds its fair share.
//!
//! Every round (each `lease.acquire` period, and on membership changes) a
//! node looks at who holds which lease and decides which queues it wants:
//! - its responsibility is `Q / N`, +1 for the first `Q mod N` nodes in
//!   sorted order (the same counts as best-fit);
//! - it keeps the queues it holds (and those it is still taking);
//! - short of its share, it adds free queues round-robin, each node starting
//!   at its own place so that nodes rarely reach for the same queue;
//! - over its share, it gives up the oldest-acquired extras: the manager
//!   shuts their agents down in order, then releases the leases.
//!
//! The manager takes and waits for the leases of what is wanted, as with the
//! other balancers. This module owns the plan and its memory between rounds;
//! the node runs the rounds.

use std::collections::{BTreeMap, BTreeSet};
use std::hash::Hasher;

use crate::stream::{NodeId, QueueId};

/// How many of `queue_count` queues `me` should hold among `nodes` (sorted,
/// deduplicated): `Q / N`, +1 for the first `Q mod N` nodes. 0 if `me` is
/// not among them.
pub(crate) fn responsibility(me: &NodeId, nodes: &[NodeId], queue_count: usize) -> usize {
    let mut nodes = nodes.to_vec();
    nodes.sort();
    nodes.dedup();
    match nodes.iter().position(|n| n == me) {
        Some(i) => queue_count / nodes.len() + usize::from(i < queue_count % nodes.len()),
        None => 0,
    }
}

/// One node's lease balancer between rounds: when it took each queue (to
/// give up the oldest first) and where its round-robin goes on.
#[derive(Debug)]
pub(crate) struct LeasePlanner {
    me: NodeId,
    /// The order in which each wanted queue was first wanted (bounded by the
    /// queues: one entry per wanted queue).
    order: BTreeMap<QueueId, u64>,
    next_order: u64,
    cursor: usize,
}

impl LeasePlanner {
    /// A planner for node `me`; its round-robin starts at a place derived
    /// from its name.
    pub(crate) fn new(me: NodeId) -> Self {
        let mut hasher = xxhash_rust::xxh3::Xxh3::new();
        hasher.write(me.as_str().as_bytes());
        let cursor = usize::try_from(hasher.finish() % 1_000_003).unwrap_or(0);
        Self { me, order: BTreeMap::new(), next_order: 0, cursor }
    }

    /// The queues this node wants now, sorted. `wanted` is what it wanted
    /// last round; `holders` are the holders of the live leases of `queues`.
    pub(crate) fn plan(
        &mut self,
        nodes: &[NodeId],
        queues: &[QueueId],
        holders: &[(QueueId, NodeId)],
        wanted: &[QueueId],
    ) -> Vec<QueueId> {
        let mut queues = queues.to_vec();
        queues.sort();
        queues.dedup();
        let share = responsibility(&self.me, nodes, queues.len());
        let holder: BTreeMap<QueueId, &NodeId> = holders.iter().map(|(q, h)| (*q, h)).collect();
        let wanted: BTreeSet<QueueId> = wanted.iter().copied().collect();
        // Mine: leases held, and wanted queues nobody holds yet (being taken).
        let mut mine: Vec<QueueId> = queues
            .iter()
            .copied()
            .filter(|q| match holder.get(q) {
                Some(h) => *h == &self.me,
                None => wanted.contains(q),
            })
            .collect();
        self.order.retain(|q, _| mine.contains(q));
        for q in &mine {
            if !self.order.contains_key(q) {
                self.order.insert(*q, self.next_order);
                self.next_order += 1;
            }
        }
        if mine.len() > share {
            // Newest first; the oldest extras go.
            mine.sort_by_key(|q| std::cmp::Reverse(self.order.get(q).copied().unwrap_or(0)));
            mine.truncate(share);
        } else if mine.len() < share && !queues.is_empty() {
            let start = self.cursor % queues.len();
            let free: Vec<QueueId> = queues[start..]
                .iter()
                .chain(&queues[..start])
                .copied()
                .filter(|q| !holder.contains_key(q) && !mine.contains(q))
                .take(share - mine.len())
                .collect();
            self.cursor = self.cursor.wrapping_add(free.len());
            for q in free {
                self.order.insert(q, self.next_order);
                self.next_order += 1;
                mine.push(q);
            }
        }
        mine.sort();
        self.order.retain(|q, _| mine.contains(q));
        mine
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lease(q: u32, holder: &str) -> (QueueId, NodeId) {
        (QueueId(q), NodeId::new(holder))
    }

    fn ids(qs: &[u32]) -> Vec<QueueId> {
        qs.iter().map(|q| QueueId(*q)).collect()
    }

    fn nodes(names: &[&str]) -> Vec<NodeId> {
        names.iter().map(|n| NodeId::new(*n)).collect()
    }

    #[test]
    fn the_share_is_q_over_n_plus_one_for_the_first_q_mod_n() {
        let n = nodes(&["c", "a", "b"]);
        let shares: Vec<usize> = ["a", "b", "c"].iter().map(|m| responsibility(&NodeId::new(*m), &n, 8)).collect();
        assert_eq!(shares, [3, 3, 2]);
        assert_eq!(responsibility(&NodeId::new("z"), &n, 8), 0);
    }

    #[test]
    fn takes_free_queues_up_to_its_share_and_keeps_what_it_holds() {
        let all = ids(&[0, 1, 2, 3, 4, 5, 6, 7]);
        let mut a = LeasePlanner::new(NodeId::new("a"));
        let n = nodes(&["a", "b"]);
        let held = [lease(0, "a"), lease(1, "b"), lease(2, "b")];
        let plan = a.plan(&n, &all, &held, &[]);
        assert_eq!(plan.len(), 4);
        assert!(plan.contains(&QueueId(0)));
        assert!(!plan.contains(&QueueId(1)) && !plan.contains(&QueueId(2)));
        // Being taken: still wanted while free, dropped once another holds it.
        let taken_by_b = lease(plan[1].0, "b");
        let next = a.plan(&n, &all, &[lease(0, "a"), lease(1, "b"), lease(2, "b"), taken_by_b], &plan);
        assert_eq!(next.len(), 4);
        assert!(!next.contains(&QueueId(plan[1].0)));
    }

    #[test]
    fn over_its_share_it_gives_up_the_oldest_first() {
        let all = ids(&[0, 1, 2, 3]);
        let mut a = LeasePlanner::new(NodeId::new("a"));
        // Alone: takes all four, in rounds, 3 then 1 (held in that order).
        let alone = nodes(&["a"]);
        let first = a.plan(&alone, &all, &[lease(2, "a"), lease(0, "a"), lease(1, "a")], &[]);
        assert_eq!(first, ids(&[0, 1, 2, 3]));
        let held: Vec<(QueueId, NodeId)> = [0, 1, 2, 3].iter().map(|q| lease(*q, "a")).collect();
        assert_eq!(a.plan(&alone, &all, &held, &first), first);
        // b joins: a keeps 2, giving up the two it took first (0, 1, 2 in
        // the first round, ordered by queue; 3 after them).
        let plan = a.plan(&nodes(&["a", "b"]), &all, &held, &first);
        assert_eq!(plan.len(), 2);
        assert!(plan.contains(&QueueId(3)), "the newest is kept: {plan:?}");
    }

    #[test]
    fn a_node_not_in_the_view_wants_nothing() {
        let mut a = LeasePlanner::new(NodeId::new("a"));
        assert_eq!(a.plan(&nodes(&["b"]), &ids(&[0, 1]), &[lease(0, "a")], &ids(&[0])), []);
    }
}
