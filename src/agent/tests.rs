//! The pulling agent, scenario by scenario: Orleans'
//! `PersistentStreamPullingAgentTests` (reference §3, 1–16) ported to
//! tailrace's semantics, driven through a scripted adapter.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use async_trait::async_trait;

use super::*;
use crate::fixtures::scripted::ScriptedFactory;
use crate::pubsub::{
    ConsumerError, Delivery, DeliveryOutcome, ImplicitSubscriptions, StartPosition, StreamConsumer, SubscriptionInfo,
};
use crate::queue::{CacheOptions, Checkpointer, Fence};
use crate::stream::{QueueId, SequenceToken};
use crate::testing::*;

const WAIT: Duration = Duration::from_secs(10);

fn t(n: u64) -> SequenceToken {
    SequenceToken::new(n, 0)
}

/// The manager's ordered stop of every agent (they stay stopped).
async fn shutdown(node: &TestNode) {
    node.node.stop_agents().await.unwrap();
}

/// 1. A cold stream's pub-sub lookup does not hold the queue: other streams
///    keep flowing while it is pending, and its own events arrive once it
///    resolves. (Orleans HEAD pauses every read meanwhile; we pin instead.)
#[tokio::test]
async fn a_pending_registration_does_not_block_other_streams() {
    let factory = ScriptedFactory::new();
    let recorder = Recorder::new();
    let node = TestNode::start(factory.clone(), quick_config(), implicit("t", &recorder)).await;
    let (a, b) = (stream("t", "a"), stream("t", "b"));
    factory.script.push(&b, 1, &["b1"]);
    assert!(eventually(WAIT, || recorder.ids(&b) == ["b1"]).await);
    node.store.hold();
    factory.script.push(&a, 2, &["a2"]);
    assert!(eventually(WAIT, || node.store.lookups.load(Ordering::SeqCst) == 2).await);
    factory.script.push(&b, 3, &["b3"]);
    assert!(eventually(WAIT, || recorder.ids(&b) == ["b1", "b3"]).await, "b must flow while a registers");
    let status = node.status(0).await;
    assert_eq!((status.streams, status.registering), (2, 1));
    assert!(recorder.ids(&a).is_empty());
    node.store.release();
    assert!(eventually(WAIT, || recorder.ids(&a) == ["a2"]).await);
    assert_eq!(node.status(0).await.registering, 0);
}

/// 2. A registration that resolves at once leaves the stream registered.
#[tokio::test]
async fn a_quick_registration_leaves_the_stream_registered() {
    let factory = ScriptedFactory::new();
    let node = TestNode::start(factory.clone(), quick_config(), ImplicitSubscriptions::new()).await;
    factory.script.push(&stream("t", "a"), 1, &["a1"]);
    let mut status = node.status(0).await;
    for _ in 0..500 {
        if status.streams == 1 && status.registering == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
        status = node.status(0).await;
    }
    assert_eq!((status.streams, status.registering, status.subscriptions), (1, 0, 0));
}

/// 3. Once shutdown starts, the receiver is never read again.
#[tokio::test(start_paused = true)]
async fn no_read_after_shutdown_starts() {
    let factory = ScriptedFactory::new();
    let node = TestNode::start(factory.clone(), quick_config(), ImplicitSubscriptions::new()).await;
    assert!(eventually(WAIT, || factory.script.read_calls() > 0).await);
    shutdown(&node).await;
    let reads = factory.script.read_calls();
    tokio::time::sleep(Duration::from_secs(30)).await;
    assert_eq!(factory.script.read_calls(), reads);
    assert_eq!(factory.script.shutdowns.load(Ordering::SeqCst), 1);
}

/// 4. Empty reads are just empty: each asks for one bucket, nothing is
///    registered.
#[tokio::test]
async fn empty_reads_ask_for_one_bucket_and_register_nothing() {
    let factory = ScriptedFactory::new();
    let node = TestNode::start(factory.clone(), quick_config(), ImplicitSubscriptions::new()).await;
    assert!(eventually(WAIT, || factory.script.read_calls() >= 3).await);
    let asked = factory.script.read_max.lock().unwrap().clone();
    assert!(asked.iter().all(|max| *max == 409), "4096 / 10 per read: {asked:?}");
    assert_eq!(node.status(0).await.streams, 0);
    assert_eq!(node.store.lookups.load(Ordering::SeqCst), 0);
}

/// 5 + 39. A failing pub-sub store is retried while the stream's events are
///    held; nothing is lost.
#[tokio::test]
async fn a_failing_subscription_lookup_is_retried_and_loses_nothing() {
    let factory = ScriptedFactory::new();
    let recorder = Recorder::new();
    let node = TestNode::start(factory.clone(), quick_config(), implicit("t", &recorder)).await;
    node.store.failures.store(2, Ordering::SeqCst);
    let a = stream("t", "a");
    factory.script.push(&a, 1, &["a1", "a2"]);
    factory.script.push(&a, 2, &["a3"]);
    assert!(eventually(WAIT, || recorder.ids(&a) == ["a1", "a2", "a3"]).await, "{:?}", recorder.snapshot());
    assert_eq!(node.store.lookups.load(Ordering::SeqCst), 3);
}

/// 6. A stream first seen by a read that finishes after shutdown began is
///    neither registered nor acked: the next owner reads it again.
#[tokio::test]
async fn no_registration_after_shutdown_starts() {
    let factory = ScriptedFactory::new();
    let recorder = Recorder::new();
    let node = TestNode::start(factory.clone(), quick_config(), implicit("t", &recorder)).await;
    assert!(eventually(WAIT, || factory.script.read_calls() > 0).await);
    factory.script.hold_reads();
    let before = factory.script.read_calls();
    assert!(eventually(WAIT, || factory.script.read_calls() > before).await, "a read is in flight");
    factory.script.push(&stream("t", "late"), 7, &["x"]);
    let agent = node.agent(0).await;
    let done = tokio::spawn(async move { ractor::call!(agent, |reply| AgentMsg::Shutdown(Some(reply))) });
    tokio::time::sleep(Duration::from_millis(50)).await;
    factory.script.release_reads();
    done.await.unwrap().unwrap();
    assert_eq!(node.store.lookups.load(Ordering::SeqCst), 0);
    assert!(!factory.script.acked().contains(&7));
    assert_eq!(recorder.total(), 0);
}

/// 7 + 36 (ResumeAfterInactivity). An idle stream is forgotten after the
///    inactivity period, and its next event is still delivered, once.
#[tokio::test(start_paused = true)]
async fn an_inactive_stream_is_forgotten_and_its_next_event_still_arrives() {
    let factory = ScriptedFactory::new();
    let recorder = Recorder::new();
    let node = TestNode::start(factory.clone(), quick_config(), implicit("t", &recorder)).await;
    let a = stream("t", "a");
    factory.script.push(&a, 1, &["a1"]);
    assert!(eventually(WAIT, || recorder.ids(&a) == ["a1"]).await);
    assert_eq!(node.status(0).await.streams, 1);
    // Streams are checked every inactivity/10: forgotten within 33 minutes.
    tokio::time::sleep(Duration::from_secs(34 * 60)).await;
    let mut streams = node.status(0).await.streams;
    for _ in 0..100 {
        if streams == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
        streams = node.status(0).await.streams;
    }
    assert_eq!(streams, 0, "the idle stream is forgotten");
    factory.script.push(&a, 2, &["a2"]);
    assert!(eventually(WAIT, || recorder.ids(&a) == ["a1", "a2"]).await, "{:?}", recorder.snapshot());
    assert!(recorder.snapshot().errors.is_empty());
}

/// 8. While any subscription is still delivering a batch, none of its
///    containers is acked; once all are done, one ack covers both.
#[tokio::test]
async fn no_ack_while_a_batch_is_being_delivered() {
    let factory = ScriptedFactory::new();
    let (first, second) = (GatedConsumer::new(), GatedConsumer::new());
    let implicit = bind(
        bind(ImplicitSubscriptions::new(), "t", "one", Arc::new(first.clone())),
        "t",
        "two",
        Arc::new(second.clone()),
    );
    let mut config = quick_config();
    config.agent.max_delivery_batch = 2;
    let node = TestNode::start(factory.clone(), config, implicit).await;
    let a = stream("t", "a");
    factory.script.push(&a, 1, &["m1"]);
    factory.script.push(&a, 2, &["m2"]);
    assert!(eventually(WAIT, || first.entered() == 1 && second.entered() == 1).await);
    let reads = factory.script.read_calls();
    assert!(eventually(WAIT, || factory.script.read_calls() > reads + 3).await, "pumps keep running");
    assert!(factory.script.acked().is_empty());
    first.open();
    let reads = factory.script.read_calls();
    assert!(eventually(WAIT, || factory.script.read_calls() > reads + 3).await);
    assert!(factory.script.acked().is_empty(), "the second subscription still holds them");
    second.open();
    assert!(eventually(WAIT, || factory.script.acked() == [1, 2]).await);
    assert_eq!(factory.script.acks.lock().unwrap().iter().filter(|a| !a.is_empty()).count(), 1);
    drop(node);
}

/// 9 + 20/21. A caught-up cursor whose stream was purged from the cache gets
///    exactly the next event when it arrives.
#[tokio::test]
async fn a_drained_cursor_gets_exactly_the_next_event_after_a_purge() {
    let factory = ScriptedFactory::with_cache(CacheOptions { cache_size: 20, buckets: 10 });
    let recorder = Recorder::new();
    let node = TestNode::start(factory.clone(), quick_config(), implicit("t", &recorder)).await;
    let (a, b) = (stream("t", "a"), stream("t", "b"));
    factory.script.push(&a, 1, &["a1"]);
    assert!(eventually(WAIT, || recorder.ids(&a) == ["a1"]).await);
    for n in 2..=41 {
        factory.script.push(&b, n, &[&format!("b{n}")]);
    }
    assert!(eventually(WAIT, || recorder.ids(&b).len() == 40).await);
    assert!(eventually(WAIT, || factory.script.acked().contains(&41)).await, "everything purged");
    factory.script.push(&a, 42, &["a42"]);
    assert!(eventually(WAIT, || recorder.ids(&a) == ["a1", "a42"]).await, "{:?}", recorder.ids(&a));
    assert_eq!(node.status(0).await.acked, 42, "every container was acked once");
}

/// A consumer that asks, once, to continue after an earlier token.
struct Rewinder {
    recorder: Recorder,
    rewound: std::sync::atomic::AtomicBool,
}

#[async_trait]
impl StreamConsumer for Rewinder {
    async fn deliver(&self, delivery: &Delivery) -> Result<DeliveryOutcome, ConsumerError> {
        self.recorder.record(delivery);
        if delivery.last_token() == Some(t(2)) && !self.rewound.swap(true, Ordering::SeqCst) {
            return Ok(DeliveryOutcome::SeekAfter(t(1)));
        }
        Ok(DeliveryOutcome::Continue)
    }
}

/// 10. A consumer's rewind is honoured: it gets the batch again, and the
///    checkpoint follows what it acknowledged.
#[tokio::test]
async fn a_consumer_rewind_is_honoured() {
    let factory = ScriptedFactory::new();
    let rewinder = Arc::new(Rewinder { recorder: Recorder::new(), rewound: Default::default() });
    let mut config = quick_config();
    config.agent.max_delivery_batch = 1;
    let node =
        TestNode::start(factory.clone(), config, bind(ImplicitSubscriptions::new(), "t", "rw", rewinder.clone())).await;
    let a = stream("t", "a");
    factory.script.push(&a, 1, &["e1"]);
    factory.script.push(&a, 2, &["e2"]);
    factory.script.push(&a, 3, &["e3"]);
    assert!(
        eventually(WAIT, || rewinder.recorder.ids(&a) == ["e1", "e2", "e2", "e3"]).await,
        "{:?}",
        rewinder.recorder.ids(&a)
    );
    shutdown(&node).await;
    assert_eq!(factory.checkpoints.get(QueueId(0)), Some(t(3)));
}

/// A consumer whose handshake always fails.
struct NoHandshake(Recorder);

#[async_trait]
impl StreamConsumer for NoHandshake {
    async fn handshake(&self, _: &SubscriptionInfo) -> Result<Option<StartPosition>, ConsumerError> {
        Err(ConsumerError::failed("handshake store unreachable"))
    }

    async fn deliver(&self, delivery: &Delivery) -> Result<DeliveryOutcome, ConsumerError> {
        self.0.deliver(delivery).await
    }
}

/// 11. A handshake that keeps failing leaves the stream registered; with
///     the default handler the subscription starts at its own position.
#[tokio::test(start_paused = true)]
async fn a_failed_handshake_keeps_the_stream_and_starts_at_the_subscription_start() {
    let factory = ScriptedFactory::new();
    let recorder = Recorder::new();
    let node = TestNode::start(factory.clone(), quick_config(), ImplicitSubscriptions::new()).await;
    let a = stream("t", "a");
    node.agent(0).await;
    let handle = node
        .node
        .subscribe(&a, Arc::new(NoHandshake(recorder.clone())), StartPosition::EarliestAvailable)
        .await
        .unwrap();
    assert_eq!(handle.start, StartPosition::EarliestAvailable);
    factory.script.push(&a, 1, &["a1"]);
    assert!(eventually(WAIT, || recorder.ids(&a) == ["a1"]).await);
    let status = node.status(0).await;
    assert_eq!((status.streams, status.registering, status.subscriptions), (1, 0, 1));
}

/// 12. Shutdown waits for the read in flight.
#[tokio::test]
async fn shutdown_waits_for_the_read_in_flight() {
    let factory = ScriptedFactory::new();
    let node = TestNode::start(factory.clone(), quick_config(), ImplicitSubscriptions::new()).await;
    assert!(eventually(WAIT, || factory.script.read_calls() > 0).await);
    factory.script.hold_reads();
    let before = factory.script.read_calls();
    assert!(eventually(WAIT, || factory.script.read_calls() > before).await);
    let agent = node.agent(0).await;
    let done = tokio::spawn(async move { ractor::call!(agent, |reply| AgentMsg::Shutdown(Some(reply))) });
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!done.is_finished(), "shutdown completed while a read was still in flight");
    assert_eq!(factory.script.shutdowns.load(Ordering::SeqCst), 0);
    factory.script.release_reads();
    done.await.unwrap().unwrap();
    assert_eq!(factory.script.shutdowns.load(Ordering::SeqCst), 1);
}

/// 13. Shutdown twice: both callers are answered; the receiver shuts once.
#[tokio::test]
async fn shutdown_is_idempotent() {
    let factory = ScriptedFactory::new();
    let node = TestNode::start(factory.clone(), quick_config(), ImplicitSubscriptions::new()).await;
    let agent = node.agent(0).await;
    let (first, second) = (agent.clone(), agent.clone());
    let a = tokio::spawn(async move { ractor::call!(first, |reply| AgentMsg::Shutdown(Some(reply))) });
    let b = tokio::spawn(async move { ractor::call!(second, |reply| AgentMsg::Shutdown(Some(reply))) });
    a.await.unwrap().unwrap();
    // The second call may reach an agent that already stopped: then it is
    // refused, which also means nothing ran twice.
    let _ = b.await.unwrap();
    assert_eq!(factory.script.shutdowns.load(Ordering::SeqCst), 1);
}

/// Blocks each delivery until released, then fails it.
#[derive(Clone)]
struct BlockThenFail(GatedConsumer);

#[async_trait]
impl StreamConsumer for BlockThenFail {
    async fn deliver(&self, _: &Delivery) -> Result<DeliveryOutcome, ConsumerError> {
        self.0.entered.fetch_add(1, Ordering::SeqCst);
        let _ = self.0.gate.acquire().await.map(|p| p.forget());
        Err(ConsumerError::failed("consumer is going away"))
    }
}

/// 15. The final checkpoint is the earliest progress over subscriptions:
///     just below the oldest container any of them still needs. The drain
///     delivers what is cached; a delivery that fails during it is left,
///     unacked and not dead-lettered, for the next owner.
#[tokio::test]
async fn shutdown_records_the_earliest_delivery_progress() {
    let factory = ScriptedFactory::new();
    let (fast, slow) = (Recorder::new(), BlockThenFail(GatedConsumer::new()));
    let implicit = bind(implicit("fast", &fast), "slow", "slow", Arc::new(slow.clone()));
    let mut config = quick_config();
    config.agent.max_delivery_batch = 1;
    let node = TestNode::start(factory.clone(), config, implicit).await;
    let (a, b) = (stream("fast", "a"), stream("slow", "b"));
    for n in 1..=200 {
        match n {
            90 | 95 => factory.script.push(&b, n, &[&format!("b{n}")]),
            _ => factory.script.push(&a, n, &[&format!("a{n}")]),
        }
    }
    assert!(eventually(WAIT, || fast.ids(&a).len() == 198 && slow.0.entered() == 1).await);
    let agent = node.agent(0).await;
    let done = tokio::spawn(async move { ractor::call!(agent, |reply| AgentMsg::Shutdown(Some(reply))) });
    tokio::time::sleep(Duration::from_millis(50)).await;
    slow.0.open();
    done.await.unwrap().unwrap();
    assert_eq!(slow.0.entered(), 1, "the failed subscription is not tried again while handing over");
    assert_eq!(factory.checkpoints.get(QueueId(0)), Some(t(89)));
    assert!(factory.script.failed.lock().unwrap().iter().all(|f| f.is_empty()), "nothing was dead-lettered");
}

/// 16. A registration still unresolved at shutdown keeps the old
///     checkpoint; its containers are not acked.
#[tokio::test(start_paused = true)]
async fn an_unresolved_registration_keeps_the_old_checkpoint() {
    let factory = ScriptedFactory::new();
    factory.checkpoints.save(QueueId(0), t(5), Fence::NONE).await.unwrap();
    let recorder = Recorder::new();
    let node = TestNode::start(factory.clone(), quick_config(), implicit("t", &recorder)).await;
    node.store.hold();
    factory.script.push(&stream("t", "a"), 10, &["a10"]);
    assert!(eventually(WAIT, || node.store.lookups.load(Ordering::SeqCst) == 1).await);
    shutdown(&node).await;
    assert_eq!(factory.checkpoints.get(QueueId(0)), Some(t(5)));
    assert!(!factory.script.acked().contains(&10));
}

/// 16 (no streams). Containers nobody subscribes to are acked and the
///     checkpoint passes them.
#[tokio::test]
async fn shutdown_with_no_subscribers_checkpoints_past_everything() {
    let factory = ScriptedFactory::new();
    let node = TestNode::start(factory.clone(), quick_config(), ImplicitSubscriptions::new()).await;
    for n in 1..=3 {
        factory.script.push(&stream("nobody", "x"), n, &["x"]);
    }
    assert!(eventually(WAIT, || factory.script.pending.lock().unwrap().is_empty()).await);
    // The agent must have found that nobody subscribes (the lookups done,
    // the containers purged and acked) before it shuts down: a loaded
    // machine may take longer than a second to get there.
    assert!(eventually(WAIT, || factory.script.acked().len() == 3).await, "the agent never acked the three containers");
    shutdown(&node).await;
    assert_eq!(factory.checkpoints.get(QueueId(0)), Some(t(3)));
    assert_eq!(factory.script.acked(), [1, 2, 3]);
}

/// Containers read again at or below the checkpoint (a new owner re-reading
/// what the old one never acked) are acked, not dropped silently.
#[tokio::test]
async fn containers_at_or_below_the_checkpoint_are_acked_when_read_again() {
    let factory = ScriptedFactory::new();
    factory.checkpoints.save(QueueId(0), t(5), Fence::NONE).await.unwrap();
    let recorder = Recorder::new();
    let node = TestNode::start(factory.clone(), quick_config(), implicit("t", &recorder)).await;
    let a = stream("t", "a");
    for n in 3..=7 {
        factory.script.push(&a, n, &[&format!("a{n}")]);
    }
    assert!(eventually(WAIT, || recorder.ids(&a) == ["a6", "a7"]).await, "{:?}", recorder.ids(&a));
    assert!(eventually(WAIT, || factory.script.acked() == [3, 4, 5, 6, 7]).await, "{:?}", factory.script.acked());
    drop(node);
}

/// A receiver whose acks and shutdown never return (its backend hangs)
/// does not hold the queue: the node's agents stop all the same.
#[tokio::test(start_paused = true)]
async fn a_receiver_that_hangs_at_the_handoff_does_not_hold_the_shutdown() {
    let factory = ScriptedFactory::new();
    let recorder = Recorder::new();
    let node = TestNode::start(factory.clone(), quick_config(), implicit("t", &recorder)).await;
    let s = stream("t", "hang");
    factory.script.hang.store(true, Ordering::SeqCst);
    factory.script.push(&s, 1, &["h1"]);
    assert!(eventually(WAIT, || recorder.ids(&s) == ["h1"]).await);
    let stopped = tokio::time::timeout(Duration::from_secs(300), node.node.stop_agents()).await;
    assert!(stopped.is_ok(), "the ordered shutdown waited on a hanging receiver");
    assert_eq!(node.node.running_agents().await.unwrap_or(usize::MAX), 0);
}

/// A busy queue that yields one container per read, of streams no one
/// watches: after a few such thin reads the next waits `agent.read_linger`,
/// so each read carries more (a read costs the same for one container as
/// for dozens); with `0s` every container is read on its own. Every
/// container is acked once, in order, either way.
#[tokio::test(start_paused = true)]
async fn thin_reads_of_a_busy_queue_linger_so_that_each_carries_more() {
    for (linger, reads_within) in [(Duration::from_millis(10), 5..=40), (Duration::ZERO, 80..=200)] {
        let factory = ScriptedFactory::new();
        let recorder = Recorder::new();
        let mut config = quick_config();
        config.agent.read_linger = linger;
        let node = TestNode::start(factory.clone(), config, implicit("t", &recorder)).await;
        let unwatched = stream("u", "busy");
        node.agent(0).await;
        // One container a millisecond for 200 ms.
        for n in 1..=200 {
            factory.script.push(&unwatched, n, &[&format!("u{n}")]);
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        assert!(eventually(WAIT, || factory.script.acked().len() == 200).await, "{:?}", factory.script.acked().len());
        assert_eq!(factory.script.acked(), (1..=200).collect::<Vec<u64>>(), "every container acked once, in order");
        let reads = node.status(0).await.reads as usize;
        assert!(reads_within.contains(&reads), "read_linger {linger:?}: {reads} reads that found containers");
        assert_eq!(recorder.total(), 0);
        drop(node);
    }
}

/// A queue that hands out again containers already read and acked (a
/// backend redelivering after a lost ack) in one read with new ones: the
/// agent acks them again, and every ack call lists its tokens in token
/// order, as the adapter contract says, old ones first.
#[tokio::test(start_paused = true)]
async fn containers_read_again_are_acked_in_token_order_with_new_ones() {
    let factory = ScriptedFactory::new();
    let recorder = Recorder::new();
    let node = TestNode::start(factory.clone(), quick_config(), implicit("t", &recorder)).await;
    let unwatched = stream("u", "again");
    node.agent(0).await;
    for n in 1..=5 {
        factory.script.push(&unwatched, n, &[&format!("u{n}")]);
    }
    assert!(eventually(WAIT, || factory.script.acked().len() == 5).await);
    for n in [3, 4, 5, 6, 7] {
        factory.script.push(&unwatched, n, &[&format!("u{n}")]);
    }
    assert!(eventually(WAIT, || factory.script.acked().len() == 10).await, "{:?}", factory.script.acked());
    let calls: Vec<Vec<u64>> =
        factory.script.acks.lock().unwrap().iter().map(|call| call.iter().map(|t| t.major).collect()).collect();
    for call in &calls {
        assert!(call.is_sorted(), "an ack out of token order: {calls:?}");
    }
    let mut acked = factory.script.acked();
    acked.sort_unstable();
    assert_eq!(acked, vec![1, 2, 3, 3, 4, 4, 5, 5, 6, 7]);
}
