//! The pulling manager: ownership in sequence order, stale notifications,
//! start/stop commands (Orleans scenario 30), handoff on this node, and
//! restarts of crashed agents.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use super::*;
use crate::adapters::memory::{MemoryAdapterFactory, MemoryOptions};
use crate::fixtures::scripted::ScriptedFactory;
use crate::harness::InProcessCluster;
use crate::node::Node;
use crate::pubsub::ImplicitSubscriptions;
use crate::retry::Backoff;
use crate::testing::*;

const WAIT: Duration = Duration::from_secs(10);

async fn running(node: &Node) -> Vec<QueueId> {
    node.status().await.unwrap().running
}

async fn wait_running(node: &Node, want: &[u32]) {
    let want: Vec<QueueId> = want.iter().map(|q| QueueId(*q)).collect();
    for _ in 0..1_000 {
        if running(node).await == want {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("running {:?}, wanted {want:?}", running(node).await);
}

/// 30. Two nodes, 8 queues: started, start again (no change), stop (0),
///     start (8 again).
#[tokio::test]
async fn start_and_stop_commands_across_two_nodes() {
    let factory = Arc::new(MemoryAdapterFactory::new(8, MemoryOptions::default()));
    let cluster = InProcessCluster::new(factory, quick_config());
    let (a, b) = (cluster.add_node("a").await.unwrap(), cluster.add_node("b").await.unwrap());
    cluster.wait_balanced(WAIT).await.unwrap();
    let total = |a: usize, b: usize| a + b;
    assert_eq!(a.agents_state().await.unwrap(), AgentsState::AgentsStarted);
    assert_eq!(b.agents_state().await.unwrap(), AgentsState::AgentsStarted);
    assert_eq!(total(a.running_agents().await.unwrap(), b.running_agents().await.unwrap()), 8);
    a.start_agents().await.unwrap();
    b.start_agents().await.unwrap();
    assert_eq!(total(a.running_agents().await.unwrap(), b.running_agents().await.unwrap()), 8);
    a.stop_agents().await.unwrap();
    b.stop_agents().await.unwrap();
    assert_eq!(a.agents_state().await.unwrap(), AgentsState::AgentsStopped);
    assert_eq!(total(a.running_agents().await.unwrap(), b.running_agents().await.unwrap()), 0);
    a.start_agents().await.unwrap();
    b.start_agents().await.unwrap();
    cluster.wait_balanced(WAIT).await.unwrap();
    assert_eq!(total(a.running_agents().await.unwrap(), b.running_agents().await.unwrap()), 8);
}

/// A notification older than the last applied one is dropped.
#[tokio::test]
async fn a_stale_ownership_notification_is_ignored() {
    let factory = Arc::new(MemoryAdapterFactory::new(4, MemoryOptions::default()));
    let node = TestNode::start(factory, quick_config(), ImplicitSubscriptions::new()).await;
    wait_running(&node.node, &[0, 1, 2, 3]).await;
    node.node.manager().cast(ManagerMsg::Ownership { seq: 100, queues: vec![QueueId(1)] }).unwrap();
    wait_running(&node.node, &[1]).await;
    node.node.manager().cast(ManagerMsg::Ownership { seq: 50, queues: vec![QueueId(0), QueueId(2)] }).unwrap();
    node.node.manager().cast(ManagerMsg::Ownership { seq: 100, queues: vec![QueueId(3)] }).unwrap();
    let status = node.node.status().await.unwrap();
    assert_eq!(status.stale_dropped, 2, "both older-or-equal notifications dropped");
    assert_eq!(status.last_seq, 100);
    assert_eq!(status.owned, [QueueId(1)]);
    assert_eq!(running(&node.node).await, [QueueId(1)]);
}

/// Stopped means stopped: ownership changes are recorded, nothing starts
/// until `StartAgents` (Orleans #10093 starts agents anyway).
#[tokio::test]
async fn stopped_agents_stay_stopped_when_ownership_changes() {
    let factory = Arc::new(MemoryAdapterFactory::new(4, MemoryOptions::default()));
    let node = TestNode::start(factory, quick_config(), ImplicitSubscriptions::new()).await;
    wait_running(&node.node, &[0, 1, 2, 3]).await;
    node.node.stop_agents().await.unwrap();
    node.node.manager().cast(ManagerMsg::Ownership { seq: 10, queues: vec![QueueId(2), QueueId(3)] }).unwrap();
    let status = node.node.status().await.unwrap();
    assert_eq!(status.owned, [QueueId(2), QueueId(3)]);
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(running(&node.node).await.is_empty());
    assert_eq!(node.node.agents_state().await.unwrap(), AgentsState::AgentsStopped);
    node.node.start_agents().await.unwrap();
    wait_running(&node.node, &[2, 3]).await;
}

/// A manager configured not to start agents waits for `StartAgents`.
#[tokio::test]
async fn a_node_can_start_with_agents_stopped() {
    let factory = Arc::new(MemoryAdapterFactory::new(2, MemoryOptions::default()));
    let mut config = quick_config();
    config.manager.start_agents = false;
    let node = TestNode::start(factory, config, ImplicitSubscriptions::new()).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(node.node.agents_state().await.unwrap(), AgentsState::Initialized);
    assert!(running(&node.node).await.is_empty());
    node.node.start_agents().await.unwrap();
    wait_running(&node.node, &[0, 1]).await;
}

/// A queue moved off and straight back gets a fresh agent, and only after
/// the old one finished its ordered shutdown.
#[tokio::test]
async fn a_queue_moved_off_and_back_gets_a_fresh_agent_after_the_old_one_stopped() {
    let factory = ScriptedFactory::new();
    let script = factory.script.clone();
    let node = TestNode::start(factory, quick_config(), ImplicitSubscriptions::new()).await;
    wait_running(&node.node, &[0]).await;
    assert!(eventually(WAIT, || script.read_calls() > 0).await);
    script.hold_reads();
    let before = script.read_calls();
    assert!(eventually(WAIT, || script.read_calls() > before).await, "a read is in flight");
    let manager = node.node.manager();
    manager.cast(ManagerMsg::Ownership { seq: 10, queues: vec![] }).unwrap();
    manager.cast(ManagerMsg::Ownership { seq: 11, queues: vec![QueueId(0)] }).unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    let status = node.node.status().await.unwrap();
    assert_eq!(status.stopping, [QueueId(0)], "the old agent is still handing over");
    assert_eq!(script.receivers.load(Ordering::SeqCst), 1, "no second agent meanwhile");
    script.release_reads();
    assert!(eventually(WAIT, || script.receivers.load(Ordering::SeqCst) == 2).await);
    assert_eq!(script.shutdowns.load(Ordering::SeqCst), 1, "the old receiver shut down first");
    assert!(eventually(WAIT, || script.reads_by_receiver.lock().unwrap()[1] > 0).await, "the fresh agent reads");
    wait_running(&node.node, &[0]).await;
}

/// 14. A crashed agent is restarted with backoff while its queue is owned,
///     and the new one reads again.
#[tokio::test(start_paused = true)]
async fn a_crashed_agent_is_restarted_with_backoff() {
    let factory = ScriptedFactory::new();
    let script = factory.script.clone();
    let mut config = quick_config();
    config.manager.restart_backoff = Backoff::fixed(Duration::from_secs(5));
    let node = TestNode::start(factory, config, ImplicitSubscriptions::new()).await;
    assert!(eventually(WAIT, || script.read_calls() > 0).await);
    script.panics.store(1, Ordering::SeqCst);
    let status = loop {
        let status = node.node.status().await.unwrap();
        if status.restarts == 1 {
            break status;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    };
    assert_eq!(status.restarting, [QueueId(0)]);
    assert_eq!(script.receivers.load(Ordering::SeqCst), 1);
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert_eq!(script.receivers.load(Ordering::SeqCst), 1, "not before the backoff");
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(eventually(WAIT, || script.reads_by_receiver.lock().unwrap().get(1).is_some_and(|r| *r > 0)).await);
    assert_eq!(node.node.status().await.unwrap().running, [QueueId(0)]);
}
