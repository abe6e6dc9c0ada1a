//! Orleans scenario 25 (BestFitBalancerTests) and the ring's properties.

use std::collections::BTreeMap;

use super::BalancerKind;
use crate::stream::{NodeId, QueueId};

fn nodes(n: usize) -> Vec<NodeId> {
    (0..n).map(|i| NodeId::new(format!("node-{i:03}"))).collect()
}

fn queues(n: u32) -> Vec<QueueId> {
    (0..n).map(QueueId).collect()
}

fn check_exactly_once(assignment: &BTreeMap<NodeId, Vec<QueueId>>, q: u32) {
    let mut all: Vec<QueueId> = assignment.values().flatten().copied().collect();
    all.sort();
    assert_eq!(all, queues(q), "every queue exactly once");
}

#[test]
fn best_fit_gives_ideal_or_ideal_plus_one_in_every_shape() {
    for (r, b) in [(99, 10), (100, 30), (10, 99), (30, 100), (100, 100), (80, 8), (8, 3), (1, 1), (0, 4)] {
        let assignment = BalancerKind::BestFit.assign(&nodes(b), &queues(r));
        check_exactly_once(&assignment, r);
        let ideal = r as usize / b;
        for (node, qs) in &assignment {
            assert!(qs.len() == ideal || qs.len() == ideal + 1, "{r}/{b}: {node} got {}", qs.len());
        }
        let extra = assignment.values().filter(|qs| qs.len() == ideal + 1).count();
        assert_eq!(extra, r as usize % b, "{r}/{b}");
    }
}

#[test]
fn best_fit_ignores_input_order_and_duplicates() {
    let mut reversed = nodes(7);
    reversed.reverse();
    reversed.push(NodeId::new("node-003"));
    let mut qs = queues(50);
    qs.reverse();
    assert_eq!(BalancerKind::BestFit.assign(&reversed, &qs), BalancerKind::BestFit.assign(&nodes(7), &queues(50)));
}

#[test]
fn best_fit_over_half_the_nodes_active() {
    // "half the buckets active": the assignment over the live half is still ideal.
    let live: Vec<NodeId> = nodes(10).into_iter().step_by(2).collect();
    let assignment = BalancerKind::BestFit.assign(&live, &queues(99));
    check_exactly_once(&assignment, 99);
    assert_eq!(assignment.len(), 5);
    assert!(assignment.values().all(|qs| qs.len() == 19 || qs.len() == 20));
}

#[test]
fn no_nodes_assign_nothing() {
    assert!(BalancerKind::BestFit.assign(&[], &queues(8)).is_empty());
    assert!(BalancerKind::Ring { virtual_nodes: 64 }.assign(&[], &queues(8)).is_empty());
}

#[test]
fn ring_assigns_every_queue_once_and_deterministically() {
    let ring = BalancerKind::Ring { virtual_nodes: 64 };
    let a = ring.assign(&nodes(3), &queues(64));
    check_exactly_once(&a, 64);
    let mut shuffled = nodes(3);
    shuffled.rotate_left(1);
    assert_eq!(a, ring.assign(&shuffled, &queues(64)));
    for qs in a.values() {
        assert!((10..=35).contains(&qs.len()), "poor balance: {a:?}");
    }
}

#[test]
fn ring_moves_only_the_leavers_queues() {
    let ring = BalancerKind::Ring { virtual_nodes: 64 };
    let before = ring.assign(&nodes(4), &queues(64));
    let survivors: Vec<NodeId> = nodes(4).into_iter().filter(|n| n.as_str() != "node-002").collect();
    let after = ring.assign(&survivors, &queues(64));
    for node in &survivors {
        for q in &before[node] {
            assert!(after[node].contains(q), "{q} moved off surviving {node}");
        }
    }
}

#[test]
fn ring_golden_assignment() {
    // Pinned: nodes of different releases must agree. (With 8 queues a ring
    // balances poorly; that is why best-fit is the default.)
    let a = BalancerKind::Ring { virtual_nodes: 64 }.assign(&nodes(3), &queues(8));
    let got: Vec<(String, Vec<u32>)> =
        a.into_iter().map(|(n, qs)| (n.to_string(), qs.into_iter().map(|q| q.0).collect())).collect();
    let want: Vec<(String, Vec<u32>)> =
        vec![("node-000".into(), vec![0, 1, 6]), ("node-001".into(), vec![2, 3, 4, 5, 7]), ("node-002".into(), vec![])];
    assert_eq!(got, want);
}
