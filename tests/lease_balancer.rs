//! The lease balancer (Orleans' `LeaseBasedQueueBalancer`): nodes claim
//! free queue leases until each holds its fair share; a dead node's queues
//! are claimed by the others; a joining node gets the others' oldest extras
//! once they were handed over. In process (memory leases), then across
//! "processes" sharing only a Redis (leases that must expire).

use tailrace_testkit as common;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use common::redis_server::RedisServer;
use common::*;
use tailrace::Node;
use tailrace::adapters::memory::{MemoryAdapterFactory, MemoryOptions};
use tailrace::cluster::{Membership, QueueLeases, RedisLeases};
use tailrace::config::BalancerKind;
use tailrace::config::Config;
use tailrace::harness::InProcessCluster;
use tailrace::{NodeId, QueueId};

const WAIT: Duration = Duration::from_secs(30);

fn config() -> Config {
    let mut config = quick_config();
    config.balancer = Some(BalancerKind::Lease);
    config.lease.acquire = Duration::from_millis(50);
    config
}

fn sizes(running: &BTreeMap<NodeId, Vec<QueueId>>) -> Vec<usize> {
    running.values().map(Vec::len).collect()
}

#[tokio::test]
async fn nodes_claim_their_share_and_rebalance_on_join_and_crash() {
    let factory = Arc::new(MemoryAdapterFactory::new(8, MemoryOptions::default()));
    let cluster = InProcessCluster::new(factory, config());
    cluster.add_node("a").await.unwrap();
    assert_eq!(sizes(&cluster.wait_balanced(WAIT).await.unwrap()), [8]);
    cluster.add_node("b").await.unwrap();
    assert_eq!(sizes(&cluster.wait_balanced(WAIT).await.unwrap()), [4, 4]);
    cluster.add_node("c").await.unwrap();
    assert_eq!(sizes(&cluster.wait_balanced(WAIT).await.unwrap()), [3, 3, 2]);
    cluster.kill_node("b");
    assert_eq!(sizes(&cluster.wait_balanced(WAIT).await.unwrap()), [4, 4]);
    cluster.stop_node("a").await.unwrap();
    assert_eq!(sizes(&cluster.wait_balanced(WAIT).await.unwrap()), [8]);
}

/// Two nodes that share only the queues and a Redis for leases (and a
/// membership view, which the transport will carry later).
#[tokio::test]
async fn a_crashed_nodes_leases_expire_in_redis_and_are_claimed_under_higher_tokens() {
    let server = RedisServer::start();
    let factory = Arc::new(MemoryAdapterFactory::new(4, MemoryOptions::default()));
    let membership = Membership::new();
    let mut config = config();
    config.lease.ttl = Duration::from_millis(900);
    config.lease.renew = Duration::from_millis(300);
    let mut nodes = Vec::new();
    for name in ["a", "b"] {
        let leases = Arc::new(RedisLeases::connect(&server.url(), "tailrace", Duration::from_secs(5)).await.unwrap());
        let node = Node::builder(NodeId::new(name), factory.clone())
            .config(config.clone())
            .membership(membership.clone())
            .leases(leases)
            .start()
            .await
            .unwrap();
        nodes.push(node);
    }
    let observer = RedisLeases::connect(&server.url(), "tailrace", Duration::from_secs(5)).await.unwrap();
    let all: Vec<QueueId> = (0..4).map(QueueId).collect();
    let split = |held: &[tailrace::cluster::Lease]| {
        let mut by: BTreeMap<String, usize> = BTreeMap::new();
        for lease in held {
            *by.entry(lease.holder.to_string()).or_default() += 1;
        }
        by
    };
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let held = observer.holders(&all).await.unwrap();
        let a = nodes[0].status().await.unwrap().running.len();
        let b = nodes[1].status().await.unwrap().running.len();
        if split(&held) == BTreeMap::from([("a".into(), 2), ("b".into(), 2)]) && (a, b) == (2, 2) {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "never split 2/2: {held:?}, running {a}/{b}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let before = observer.holders(&all).await.unwrap();

    // b dies: nothing is released; its leases lapse in Redis and a claims them.
    nodes[1].crash();
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let held = observer.holders(&all).await.unwrap();
        let a = nodes[0].status().await.unwrap().running.len();
        if split(&held) == BTreeMap::from([("a".into(), 4)]) && a == 4 {
            for lease in &held {
                let old = before.iter().find(|l| l.queue == lease.queue).unwrap();
                if old.holder.as_str() == "b" {
                    assert!(lease.token > old.token, "{lease:?} after {old:?}");
                }
            }
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "a never took b's queues: {held:?}, running {a}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    nodes[0].shutdown().await.unwrap();
    assert_eq!(observer.holders(&all).await.unwrap(), [], "released on a graceful stop");
}

/// Orleans' scenario 27 at its root: a lease the store granted to a node
/// whose balancer stopped before it heard the answer (the node was told to
/// stop during the acquire) is released by the node's shutdown, not left
/// to lapse.
#[tokio::test]
async fn a_lease_granted_to_a_stopping_node_is_released_by_its_shutdown() {
    let factory = Arc::new(MemoryAdapterFactory::new(4, MemoryOptions::default()));
    let membership = Membership::new();
    // A second member that never runs: `a` takes its share, 2 of 4.
    membership.join(NodeId::new("ghost"));
    let leases = Arc::new(tailrace::cluster::MemoryLeases::new());
    let a = NodeId::new("a");
    let node = Node::builder(a.clone(), factory)
        .config(config())
        .membership(membership)
        .leases(leases.clone())
        .start()
        .await
        .unwrap();
    let all: Vec<QueueId> = (0..4).map(QueueId).collect();
    let deadline = tokio::time::Instant::now() + WAIT;
    while node.status().await.unwrap().running.len() != 2 {
        assert!(tokio::time::Instant::now() < deadline, "a never took its share");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let held = leases.holders(&all).await.unwrap();
    let free = all.iter().copied().find(|q| held.iter().all(|l| l.queue != *q)).unwrap();
    // The acquire whose answer the stopping balancer dropped.
    let orphan = leases.acquire(free, &a, Duration::from_secs(60)).await.unwrap();
    assert!(orphan.is_some());
    node.shutdown().await.unwrap();
    assert_eq!(leases.holders(&all).await.unwrap(), [], "every lease of `a` released, the orphan included");
}
