//! Queue leases seen from one node, on paused time: the keeper renews them;
//! a lease that is lost (taken over, or not renewed in time because the
//! store is down) kills its agent with no ordered shutdown, no ack and no
//! checkpoint; a fenced read is not restarted like a crash; a crashed agent
//! restarts only under a fresh lease.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use tokio::time::Instant;

use crate::cluster::{Lease, LeaseError, LeaseOptions, MemoryLeases, QueueLeases};
use crate::fixtures::scripted::ScriptedFactory;
use crate::manager::{ManagerMsg, ManagerStatus};
use crate::pubsub::{ConsumerError, ConsumerFactory, Delivery, DeliveryOutcome, ImplicitSubscriptions, StreamConsumer};
use crate::queue::QueueError;
use crate::stream::{NodeId, QueueId, StreamId};
use crate::testing::*;

const WAIT: Duration = Duration::from_secs(30);
const Q: QueueId = QueueId(0);

/// Memory leases whose store can be switched off (every call fails) or
/// slowed down (every renewal answers `slow` after it was sent, and counts
/// its expiry from the send, as a store on its own clock does).
#[derive(Default)]
struct SwitchedLeases {
    inner: MemoryLeases,
    down: AtomicBool,
    slow: std::sync::Mutex<Duration>,
}

impl SwitchedLeases {
    fn check(&self, operation: &'static str, queue: QueueId) -> Result<(), LeaseError> {
        if self.down.load(Ordering::SeqCst) {
            return Err(LeaseError::Backend { operation, queue, message: "connection refused".into() });
        }
        Ok(())
    }
}

#[async_trait]
impl QueueLeases for SwitchedLeases {
    async fn acquire(&self, queue: QueueId, node: &NodeId, ttl: Duration) -> Result<Option<Lease>, LeaseError> {
        self.check("acquire", queue)?;
        self.inner.acquire(queue, node, ttl).await
    }

    async fn renew(&self, lease: &Lease, ttl: Duration) -> Result<Option<Lease>, LeaseError> {
        self.check("renew", lease.queue)?;
        let (sent, slow) = (Instant::now(), *self.slow.lock().unwrap());
        tokio::time::sleep(slow).await;
        let renewed = self.inner.renew(lease, ttl).await?;
        Ok(renewed.map(|lease| Lease { expires_at: sent + ttl, ..lease }))
    }

    async fn release(&self, lease: &Lease) -> Result<bool, LeaseError> {
        self.check("release", lease.queue)?;
        self.inner.release(lease).await
    }

    async fn holders(&self, queues: &[QueueId]) -> Result<Vec<Lease>, LeaseError> {
        self.inner.holders(queues).await
    }
}

async fn wait_status(node: &TestNode, what: &str, done: impl Fn(&ManagerStatus) -> bool) -> ManagerStatus {
    let deadline = Instant::now() + WAIT;
    loop {
        let status = node.node.status().await.unwrap();
        if done(&status) {
            return status;
        }
        assert!(Instant::now() < deadline, "never {what}: {status:?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn running(status: &ManagerStatus) -> bool {
    status.running == [Q]
}

fn waiting(status: &ManagerStatus) -> bool {
    status.running.is_empty() && status.stopping.is_empty() && status.waiting == [Q]
}

async fn start(leases: Arc<dyn QueueLeases>) -> (TestNode, Arc<ScriptedFactory>) {
    let factory = ScriptedFactory::new();
    let node =
        TestNode::start_with(factory.clone(), quick_config(), ImplicitSubscriptions::new(), |b| b.leases(leases)).await;
    wait_status(&node, "running", running).await;
    (node, factory)
}

#[tokio::test(start_paused = true)]
async fn the_keeper_renews_a_held_lease_past_its_ttl() {
    let leases = Arc::new(MemoryLeases::new());
    let (node, factory) = start(leases.clone()).await;
    let first = leases.holder(Q).await.unwrap().unwrap();
    tokio::time::sleep(first.expires_at - Instant::now() + Duration::from_secs(30)).await;
    let now = leases.holder(Q).await.unwrap().expect("still held, renewed");
    assert_eq!(now.token, first.token);
    assert!(now.expires_at > first.expires_at);
    assert!(running(&node.node.status().await.unwrap()));
    assert_eq!(factory.script.receivers.load(Ordering::SeqCst), 1);
}

/// A renewal that takes a little longer than the renew period (a 2 s round
/// trip on the defaults) still fits the TTL: renewals go out every period
/// counted from the send, not from the answer (which would land each answer
/// past its deadline).
#[tokio::test(start_paused = true)]
async fn a_store_answering_slower_than_the_renew_period_loses_no_lease() {
    let leases = Arc::new(SwitchedLeases::default());
    let (node, factory) = start(leases.clone()).await;
    let first = leases.inner.holder(Q).await.unwrap().unwrap();
    *leases.slow.lock().unwrap() = LeaseOptions::default().renew + Duration::from_millis(250);
    tokio::time::sleep(Duration::from_secs(60)).await;
    let now = leases.inner.holder(Q).await.unwrap().expect("still held");
    assert_eq!(now.token, first.token, "never lost and granted again");
    assert!(running(&node.node.status().await.unwrap()));
    assert_eq!(factory.script.receivers.load(Ordering::SeqCst), 1, "its agent was never stopped");
}

#[tokio::test(start_paused = true)]
async fn a_lease_that_cannot_be_renewed_kills_its_agent_before_it_lapses() {
    let leases = Arc::new(SwitchedLeases::default());
    let (node, factory) = start(leases.clone()).await;
    let (script, checkpoints) = (factory.script.clone(), factory.checkpoints.clone());
    assert!(eventually(WAIT, || script.read_calls() > 0).await);
    leases.down.store(true, Ordering::SeqCst);
    let lapses_at = leases.inner.holder(Q).await.unwrap().unwrap().expires_at;
    wait_status(&node, "stopped pulling", waiting).await;
    assert!(Instant::now() < lapses_at, "the agent must be gone before another node may take its queue");
    let (writes, acks, reads) = (checkpoints.writes(Q), script.acks.lock().unwrap().len(), script.read_calls());
    assert_eq!(script.shutdowns.load(Ordering::SeqCst), 0, "killed, not handed over");
    tokio::time::sleep(Duration::from_secs(20)).await;
    assert_eq!(checkpoints.writes(Q), writes, "no checkpoint after the loss");
    assert_eq!(script.acks.lock().unwrap().len(), acks, "no ack after the loss");
    assert_eq!(script.read_calls(), reads, "no read after the loss");
    assert!(waiting(&node.node.status().await.unwrap()));

    // The store is back: the queue is taken again, under a newer token.
    let old = leases.inner.holders(&[Q]).await.unwrap();
    assert!(old.is_empty(), "lapsed meanwhile: {old:?}");
    leases.down.store(false, Ordering::SeqCst);
    wait_status(&node, "running again", running).await;
    assert_eq!(script.receivers.load(Ordering::SeqCst), 2);
}

#[tokio::test(start_paused = true)]
async fn a_queue_taken_over_stops_its_agent_and_waits_for_the_lease() {
    let leases = Arc::new(MemoryLeases::new());
    let (node, factory) = start(leases.clone()).await;
    let ours = leases.holder(Q).await.unwrap().unwrap();
    // Another node takes it (as if ours had lapsed).
    leases.release_node(&ours.holder);
    let theirs = leases.acquire(Q, &NodeId::new("other"), Duration::from_secs(3600)).await.unwrap().unwrap();
    assert!(theirs.token > ours.token);
    wait_status(&node, "stopped pulling", waiting).await;
    assert_eq!(factory.script.shutdowns.load(Ordering::SeqCst), 0, "killed, not handed over");
    tokio::time::sleep(Duration::from_secs(20)).await;
    assert!(waiting(&node.node.status().await.unwrap()), "waits while the other holds it");
    assert_eq!(factory.script.receivers.load(Ordering::SeqCst), 1);

    assert!(leases.release(&theirs).await.unwrap());
    wait_status(&node, "running again", running).await;
    let again = leases.holder(Q).await.unwrap().unwrap();
    assert_eq!(again.holder, ours.holder);
    assert!(again.token > theirs.token, "tokens never go back");
}

#[tokio::test(start_paused = true)]
async fn a_fenced_read_is_not_restarted_like_a_crash() {
    let leases = Arc::new(MemoryLeases::new());
    let (node, factory) = start(leases.clone()).await;
    let before = leases.holder(Q).await.unwrap().unwrap();
    factory.script.read_errors.lock().unwrap().push_back(QueueError::Fenced(Q));
    assert!(eventually(WAIT, || factory.script.receivers.load(Ordering::SeqCst) == 2).await);
    let status = wait_status(&node, "running again", running).await;
    assert_eq!(status.restarts, 0, "not counted as a crash");
    assert!(status.restarting.is_empty());
    let after = leases.holder(Q).await.unwrap().unwrap();
    assert!(after.token > before.token, "runs again only under a fresh lease");
}

#[tokio::test(start_paused = true)]
async fn a_refused_ack_stops_the_agent_like_a_lost_lease_with_no_checkpoint() {
    let leases = Arc::new(MemoryLeases::new());
    let (node, factory) = start(leases.clone()).await;
    let before = leases.holder(Q).await.unwrap().unwrap();
    factory.script.ack_errors.lock().unwrap().push_back(QueueError::Fenced(Q));
    factory.script.push(&stream("t", "a"), 1, &["a1"]);
    assert!(eventually(WAIT, || factory.script.receivers.load(Ordering::SeqCst) == 2).await, "the agent stopped");
    let status = wait_status(&node, "running again", running).await;
    assert_eq!(status.restarts, 0, "not counted as a crash");
    assert_eq!(factory.checkpoints.writes(Q), 0, "no checkpoint after the refused ack");
    let after = leases.holder(Q).await.unwrap().unwrap();
    assert!(after.token > before.token, "runs again only under a fresh lease");
}

#[tokio::test(start_paused = true)]
async fn a_crashed_agent_restarts_only_under_a_fresh_lease() {
    let leases = Arc::new(MemoryLeases::new());
    let (node, factory) = start(leases.clone()).await;
    let before = leases.holder(Q).await.unwrap().unwrap();
    factory.script.panics.store(1, Ordering::SeqCst);
    wait_status(&node, "restarted", |s| s.restarts == 1 && running(s)).await;
    let after = leases.holder(Q).await.unwrap().unwrap();
    assert!(after.token > before.token, "the restart took the lease again");
    assert_eq!(after.holder, before.holder);
}

#[tokio::test(start_paused = true)]
async fn a_lease_stays_held_through_an_ordered_shutdown_longer_than_its_ttl() {
    let leases = Arc::new(MemoryLeases::new());
    let factory = ScriptedFactory::new();
    let mut config = quick_config();
    // The receiver's shutdown hangs until this bound: 20 s, over the 8 s ttl.
    config.agent.init_timeout = Duration::from_secs(20);
    let node =
        TestNode::start_with(factory.clone(), config, ImplicitSubscriptions::new(), |b| b.leases(leases.clone())).await;
    wait_status(&node, "running", running).await;
    let lease = leases.holder(Q).await.unwrap().unwrap();
    factory.script.hang.store(true, Ordering::SeqCst);
    node.node.manager().cast(ManagerMsg::StopAgents(None)).unwrap();
    wait_status(&node, "stopping", |s| s.stopping == [Q]).await;
    tokio::time::sleep(Duration::from_secs(12)).await;
    assert_eq!(node.node.status().await.unwrap().stopping, [Q], "still handing over");
    let still = leases.holder(Q).await.unwrap().expect("renewed while the agent stops");
    assert_eq!(still.token, lease.token);
    wait_status(&node, "stopped", |s| s.stopping.is_empty() && s.running.is_empty()).await;
    assert_eq!(leases.holder(Q).await.unwrap(), None, "released once the handoff ended");
}

/// A consumer on another node whose node saw a newer owner's token.
struct RefusesAsStale {
    refused: AtomicBool,
}

#[async_trait]
impl StreamConsumer for RefusesAsStale {
    async fn deliver(&self, _: &Delivery) -> Result<DeliveryOutcome, ConsumerError> {
        if !self.refused.swap(true, Ordering::SeqCst) {
            return Err(ConsumerError::Fenced("queue 0: token 1 is older than 2".into()));
        }
        Ok(DeliveryOutcome::Continue)
    }
}

struct RefusingFactory(Arc<RefusesAsStale>);

impl ConsumerFactory for RefusingFactory {
    fn name(&self) -> &str {
        "refuses-as-stale"
    }

    fn create(&self, _: &StreamId) -> Arc<dyn StreamConsumer> {
        self.0.clone()
    }
}

#[tokio::test(start_paused = true)]
async fn a_consumer_node_refusing_the_token_stops_the_agent_like_a_lost_lease() {
    let leases = Arc::new(MemoryLeases::new());
    let factory = ScriptedFactory::new();
    let consumer = Arc::new(RefusesAsStale { refused: AtomicBool::new(false) });
    let implicit = ImplicitSubscriptions::new().bind("t", Arc::new(RefusingFactory(consumer.clone())));
    let node = TestNode::start_with(factory.clone(), quick_config(), implicit, |b| {
        b.leases(leases.clone() as Arc<dyn QueueLeases>)
    })
    .await;
    wait_status(&node, "running", running).await;
    let before = leases.holder(Q).await.unwrap().unwrap();
    factory.script.push(&stream("t", "a"), 1, &["a1"]);
    assert!(eventually(WAIT, || factory.script.receivers.load(Ordering::SeqCst) == 2).await, "the agent stopped");
    assert!(consumer.refused.load(Ordering::SeqCst));
    let status = wait_status(&node, "running again", running).await;
    assert_eq!(status.restarts, 0, "not counted as a crash");
    assert_eq!(factory.checkpoints.writes(Q), 0, "no checkpoint after the refusal");
    assert_eq!(factory.script.acked(), Vec::<u64>::new(), "nothing acked after the refusal");
    let after = leases.holder(Q).await.unwrap().unwrap();
    assert!(after.token > before.token, "runs again only under a fresh lease");
}
