//! Delivery semantics through a node over the memory adapter: the
//! subscribe barrier, retries, poison events, faults, resume, multiplicity
//! (Orleans §3 scenarios 32–37) and isolation of slow consumers.

use tailrace_testkit as common;

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use common::*;
use tailrace::StreamId;
use tailrace::adapters::memory::{MemoryAdapterFactory, MemoryOptions};
use tailrace::config::Config;
use tailrace::failure::MemoryDeadLetters;
use tailrace::pubsub::{
    ConsumerError, Delivery, DeliveryOutcome, ImplicitSubscriptions, StartPosition, StreamConsumer, SubscriptionInfo,
    SubscriptionState,
};

const WAIT: Duration = Duration::from_secs(15);

fn memory(options: MemoryOptions) -> Arc<MemoryAdapterFactory> {
    Arc::new(MemoryAdapterFactory::new(4, options))
}

async fn node(config: Config, implicit: ImplicitSubscriptions) -> TestNode {
    let node = TestNode::start(memory(MemoryOptions::default()), config, implicit).await;
    for q in 0..4 {
        node.agent(q).await;
    }
    node
}

/// Beyond Orleans #9501: `subscribe` returns only once attached, so an event
/// produced right after it returns is always delivered.
#[tokio::test]
async fn an_event_produced_after_subscribe_returns_is_always_delivered() {
    let node = node(quick_config(), ImplicitSubscriptions::new()).await;
    let recorder = Recorder::new();
    for i in 0..50 {
        let s = stream("sub", &format!("s{i}"));
        node.node.subscribe(&s, Arc::new(recorder.clone()), StartPosition::Latest).await.unwrap();
        node.node.produce(&s, events("e", i..i + 1)).await.unwrap();
    }
    assert!(eventually(WAIT, || recorder.total() == 50).await, "got {}", recorder.total());
    for i in 0..50 {
        assert_eq!(recorder.ids(&stream("sub", &format!("s{i}"))), ids("e", i..i + 1));
    }
}

/// Fails each listed (event, attempt budget) a number of times, then works.
struct Faulty {
    recorder: Recorder,
    failures: Mutex<Vec<(String, usize)>>,
    handshake_failures: AtomicUsize,
    always: Option<String>,
}

impl Faulty {
    fn new(failures: &[(&str, usize)], handshake_failures: usize, always: Option<&str>) -> Self {
        Self {
            recorder: Recorder::new(),
            failures: Mutex::new(failures.iter().map(|(id, n)| (id.to_string(), *n)).collect()),
            handshake_failures: AtomicUsize::new(handshake_failures),
            always: always.map(str::to_string),
        }
    }
}

#[async_trait]
impl StreamConsumer for Faulty {
    async fn handshake(&self, _: &SubscriptionInfo) -> Result<Option<StartPosition>, ConsumerError> {
        if self.handshake_failures.load(Ordering::SeqCst) > 0 {
            self.handshake_failures.fetch_sub(1, Ordering::SeqCst);
            return Err(ConsumerError::failed("injected handshake fault"));
        }
        Ok(None)
    }

    async fn deliver(&self, delivery: &Delivery) -> Result<DeliveryOutcome, ConsumerError> {
        for (event, _) in delivery.events() {
            let id = event.id.to_string();
            if self.always.as_deref() == Some(id.split('/').next_back().unwrap_or_default()) {
                return Err(ConsumerError::failed(format!("poison event {id}: cannot parse payload")));
            }
            let mut failures = self.failures.lock().unwrap();
            if let Some(entry) = failures.iter_mut().find(|(f, n)| id.ends_with(f.as_str()) && *n > 0) {
                entry.1 -= 1;
                return Err(ConsumerError::failed(format!("transient fault at {id}")));
            }
        }
        self.recorder.record(delivery);
        Ok(DeliveryOutcome::Continue)
    }

    async fn on_error(&self, info: &SubscriptionInfo, error: &str) {
        self.recorder.on_error(info, error).await;
    }
}

fn factory_of(consumer: Arc<Faulty>) -> ImplicitSubscriptions {
    bind(ImplicitSubscriptions::new(), "rec", "faulty", consumer)
}

async fn produce_streams(node: &TestNode, streams: &[StreamId], per_stream: u64, batch: u64) {
    for start in (0..per_stream).step_by(batch as usize) {
        for s in streams {
            let batch = (start..(start + batch).min(per_stream))
                .map(|i| tailrace::Event::new(tailrace::EventId::new(format!("{}/{i}", s.key())), "x"))
                .collect();
            node.node.produce(s, batch).await.unwrap();
        }
    }
}

/// 32. Transient faults (handshake, mid-stream, last event) are retried:
///     4 streams each end with exactly their 100 events, in order.
#[tokio::test]
async fn transient_faults_are_retried_and_every_stream_gets_exactly_100() {
    let faulty = Arc::new(Faulty::new(&[("/37", 2), ("/99", 1), ("/0", 1)], 1, None));
    let node = node(quick_config(), factory_of(faulty.clone())).await;
    let streams: Vec<StreamId> = (0..4).map(|i| stream("rec", &format!("r{i}"))).collect();
    produce_streams(&node, &streams, 100, 1).await;
    assert!(eventually(WAIT, || faulty.recorder.total() == 400).await, "{}", faulty.recorder.total());
    for s in &streams {
        let want: Vec<String> = (0..100).map(|i| format!("{}/{i}", s.key())).collect();
        assert_eq!(faulty.recorder.ids(s), want);
    }
}

/// 33 + dead letters. One event always fails: after the max delivery time
///     it is skipped to the dead-letter sink with the original error, the
///     consumer is told, and the stream goes on: 99 events.
#[tokio::test(start_paused = true)]
async fn a_poison_event_goes_to_the_dead_letter_sink_with_its_error() {
    let faulty = Arc::new(Faulty::new(&[], 0, Some("42")));
    let letters = Arc::new(MemoryDeadLetters::new(100));
    let mut config = quick_config();
    config.agent.max_delivery_batch = 1;
    let node = TestNode::start_with(memory(MemoryOptions::default()), config, factory_of(faulty.clone()), |b| {
        b.dead_letters(letters.clone())
    })
    .await;
    let s = stream("rec", "p");
    produce_streams(&node, std::slice::from_ref(&s), 100, 1).await;
    assert!(eventually(WAIT, || faulty.recorder.total() == 99).await, "{}", faulty.recorder.total());
    let ids = faulty.recorder.ids(&s);
    assert!(!ids.contains(&"p/42".to_string()) && ids.contains(&"p/43".to_string()));
    assert!(eventually(WAIT, || letters.letters().len() == 1).await);
    let letter = &letters.letters()[0];
    assert_eq!(letter.events[0].id.as_str(), "p/42");
    assert_eq!(letter.error, "poison event p/42: cannot parse payload");
    assert!(letter.attempts > 1, "it was retried first");
    assert_eq!(faulty.recorder.snapshot().errors, ["poison event p/42: cannot parse payload"]);
}

/// 34 + 41. Batched delivery (up to 10 containers at once) still gives each
///     stream exactly its events in order.
#[tokio::test]
async fn batched_delivery_keeps_each_stream_exact_and_ordered() {
    let recorder = Recorder::new();
    let mut config = quick_config();
    config.agent.max_delivery_batch = 10;
    let node = node(config, implicit("rec", &recorder)).await;
    let streams: Vec<StreamId> = (0..4).map(|i| stream("rec", &format!("b{i}"))).collect();
    produce_streams(&node, &streams, 100, 1).await;
    assert!(eventually(WAIT, || recorder.total() == 400).await);
    for s in &streams {
        let want: Vec<String> = (0..100).map(|i| format!("{}/{i}", s.key())).collect();
        assert_eq!(recorder.ids(s), want);
    }
    let seen = recorder.snapshot();
    assert!(seen.deliveries < 400, "some deliveries carried several containers ({} deliveries)", seen.deliveries);
}

/// The failure handler faults an explicit subscription when configured:
/// marked in the store, told why, no more events; the batch is kept.
#[tokio::test(start_paused = true)]
async fn a_faulted_subscription_stops_and_is_marked_in_the_store() {
    let letters = Arc::new(MemoryDeadLetters::new(10));
    let mut config = quick_config();
    config.failure.fault_on_error = true;
    config.agent.max_delivery_batch = 1;
    let node = TestNode::start_with(memory(MemoryOptions::default()), config, ImplicitSubscriptions::new(), |b| {
        b.dead_letters(letters.clone())
    })
    .await;
    let s = stream("f", "a");
    node.agent(node.node.mapper().queue_for(&s).0).await;
    let faulty = Arc::new(Faulty::new(&[], 0, Some("2")));
    let handle = node.node.subscribe(&s, faulty.clone(), StartPosition::Latest).await.unwrap();
    for i in 0..4 {
        node.node.produce(&s, vec![tailrace::Event::new(format!("a/{i}").as_str(), "x")]).await.unwrap();
    }
    assert!(eventually(WAIT, || !faulty.recorder.snapshot().errors.is_empty()).await);
    assert!(eventually(WAIT, || letters.letters().len() == 1).await);
    let mut subs = node.node.subscriptions(&s).await.unwrap();
    for _ in 0..500 {
        if subs.iter().all(|s| s.state != SubscriptionState::Active) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
        subs = node.node.subscriptions(&s).await.unwrap();
    }
    assert_eq!(subs.len(), 1);
    assert_eq!(subs[0].id, handle.id);
    assert!(
        matches!(&subs[0].state, SubscriptionState::Faulted(reason) if reason.contains("poison event a/2")),
        "{:?} errors {:?} letters {:?}",
        subs[0].state,
        faulty.recorder.snapshot().errors,
        letters.letters().iter().map(|l| l.error.clone()).collect::<Vec<_>>()
    );
    assert_eq!(faulty.recorder.ids(&s), ["a/0", "a/1"]);
    assert!(faulty.recorder.snapshot().errors.iter().any(|e| e.starts_with("subscription faulted")));
    node.node.produce(&s, vec![tailrace::Event::new("a/9", "x")]).await.unwrap();
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(faulty.recorder.ids(&s), ["a/0", "a/1"], "a faulted subscription gets nothing more");
}

/// 36 (ResumeAfterDeactivation): a consumer goes away; resuming its
/// subscription with a new consumer that knows where it stopped delivers
/// exactly the rest.
#[tokio::test]
async fn resuming_a_subscription_continues_after_the_last_processed_event() {
    let node = node(quick_config(), ImplicitSubscriptions::new()).await;
    let s = stream("res", "a");
    let first = Recorder::new();
    let handle = node.node.subscribe(&s, Arc::new(first.clone()), StartPosition::Latest).await.unwrap();
    node.node.produce(&s, events("e", 0..3)).await.unwrap();
    assert!(eventually(WAIT, || first.total() == 3).await);
    let last = first.snapshot().tokens[&s].last().copied().unwrap();
    // The first consumer is gone; events keep coming meanwhile.
    node.node.produce(&s, events("e", 3..5)).await.unwrap();
    let second = Recorder::new();
    let resumed = node.node.resume(handle.id, &s, Arc::new(second.clone()), StartPosition::After(last)).await.unwrap();
    assert_eq!(resumed.id, handle.id, "the same subscription");
    node.node.produce(&s, events("e", 5..6)).await.unwrap();
    assert!(eventually(WAIT, || second.total() == 3).await, "{:?}", second.snapshot());
    assert_eq!(second.ids(&s), ids("e", 3..6), "exactly the events after the last processed one");
    assert_eq!(node.node.subscriptions(&s).await.unwrap().len(), 1);
}

/// 36 (ResumeAfterSlowSubscriber): a slow subscriber lags while a fast one
/// on the same stream keeps receiving.
#[tokio::test]
async fn a_slow_subscriber_does_not_hold_back_a_fast_one() {
    let node = node(quick_config(), ImplicitSubscriptions::new()).await;
    let s = stream("slow", "a");
    let (fast, slow) = (Recorder::new(), GatedConsumer::new());
    node.node.subscribe(&s, Arc::new(fast.clone()), StartPosition::Latest).await.unwrap();
    node.node.subscribe(&s, Arc::new(slow.clone()), StartPosition::Latest).await.unwrap();
    node.node.produce(&s, events("e", 0..1)).await.unwrap();
    assert!(eventually(WAIT, || fast.total() == 1 && slow.entered() == 1).await);
    node.node.produce(&s, events("e", 1..2)).await.unwrap();
    assert!(eventually(WAIT, || fast.total() == 2).await);
    assert_eq!(slow.recorder.total(), 0);
    slow.open();
    assert!(eventually(WAIT, || slow.recorder.total() == 2).await);
    assert_eq!(slow.recorder.ids(&s), ids("e", 0..2));
}

/// A consumer that never returns does not stall the others: neither other
/// streams on its queue nor other subscriptions of its own stream.
#[tokio::test]
async fn a_consumer_that_never_returns_does_not_stall_the_others() {
    let factory = Arc::new(MemoryAdapterFactory::new(1, MemoryOptions::default()));
    let mut config = quick_config();
    config.agent.delivery_attempt_timeout = Duration::from_secs(3600);
    config.agent.max_delivery_time = Duration::from_secs(3600);
    let node = TestNode::start(factory, config, ImplicitSubscriptions::new()).await;
    node.agent(0).await;
    let (a, b) = (stream("stall", "a"), stream("stall", "b"));
    let stuck = GatedConsumer::new();
    let (peer, other) = (Recorder::new(), Recorder::new());
    node.node.subscribe(&a, Arc::new(stuck.clone()), StartPosition::Latest).await.unwrap();
    node.node.subscribe(&a, Arc::new(peer.clone()), StartPosition::Latest).await.unwrap();
    node.node.subscribe(&b, Arc::new(other.clone()), StartPosition::Latest).await.unwrap();
    for i in 0..50 {
        node.node.produce(&a, events("a", i..i + 1)).await.unwrap();
        node.node.produce(&b, events("b", i..i + 1)).await.unwrap();
    }
    assert!(eventually(WAIT, || peer.total() == 50 && other.total() == 50).await, "{} {}", peer.total(), other.total());
    assert_eq!(stuck.entered(), 1, "the stuck consumer holds only its own first delivery");
    assert_eq!(stuck.recorder.total(), 0);
}

/// Memory stays bounded with a stalled consumer and a producer that keeps
/// going: the cache fills, reading pauses, the queue fills, the producer
/// waits. Nothing is dropped: releasing the consumer delivers everything.
#[tokio::test]
async fn a_stalled_consumer_back_pressures_the_producer_with_bounded_memory() {
    let mut config = quick_config();
    config.cache = tailrace::queue::CacheOptions { cache_size: 100, buckets: 10 };
    config.agent.max_delivery_batch = 1;
    config.agent.delivery_attempt_timeout = Duration::from_secs(3600);
    config.agent.max_delivery_time = Duration::from_secs(3600);
    let options = MemoryOptions { capacity_events: 50, ..MemoryOptions::default() };
    let factory = Arc::new(MemoryAdapterFactory::new(1, options).with_cache(config.cache.clone()));
    let adapter = factory.adapter();
    let node = TestNode::start(factory, config, ImplicitSubscriptions::new()).await;
    node.agent(0).await;
    let s = stream("bound", "a");
    let stalled = GatedConsumer::new();
    node.node.subscribe(&s, Arc::new(stalled.clone()), StartPosition::Latest).await.unwrap();
    let produced = Arc::new(AtomicUsize::new(0));
    let producer = {
        let (adapter, s, produced) = (adapter.clone(), s.clone(), produced.clone());
        tokio::spawn(async move {
            for i in 0..1_000u64 {
                tailrace::queue::QueueAdapter::enqueue(adapter.as_ref(), &s, events("e", i..i + 1)).await.unwrap();
                produced.fetch_add(1, Ordering::SeqCst);
            }
        })
    };
    // The producer gets exactly cache + queue ahead, then waits.
    assert!(eventually(WAIT, || produced.load(Ordering::SeqCst) == 150).await, "{}", produced.load(Ordering::SeqCst));
    let status = node.status(0).await;
    assert!(status.under_pressure, "{status:?}");
    assert_eq!(status.cached, 100);
    assert!(adapter.held_events(tailrace::QueueId(0)) <= 150);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(produced.load(Ordering::SeqCst), 150, "the producer is held back, nothing grows");
    assert!(!producer.is_finished());
    stalled.open();
    producer.await.unwrap();
    assert!(eventually(WAIT, || stalled.recorder.total() == 1_000).await, "{}", stalled.recorder.total());
    assert_eq!(stalled.recorder.ids(&s), ids("e", 0..1_000));
}

/// After `unsubscribe` returns, the consumer gets nothing more.
#[tokio::test]
async fn nothing_arrives_after_unsubscribe_returns() {
    let node = node(quick_config(), ImplicitSubscriptions::new()).await;
    let s = stream("unsub", "a");
    let recorder = Recorder::new();
    let handle = node.node.subscribe(&s, Arc::new(recorder.clone()), StartPosition::Latest).await.unwrap();
    node.node.produce(&s, events("e", 0..2)).await.unwrap();
    assert!(eventually(WAIT, || recorder.total() == 2).await);
    node.node.unsubscribe(&handle).await.unwrap();
    assert!(node.node.subscriptions(&s).await.unwrap().is_empty());
    node.node.produce(&s, events("e", 2..4)).await.unwrap();
    let keeper = Recorder::new();
    node.node.subscribe(&s, Arc::new(keeper.clone()), StartPosition::EarliestAvailable).await.unwrap();
    node.node.produce(&s, events("e", 4..5)).await.unwrap();
    assert!(eventually(WAIT, || keeper.ids(&s).contains(&"e4".to_string())).await);
    assert_eq!(recorder.ids(&s), ids("e", 0..2));
}

/// 37. Subscription multiplicity.
#[tokio::test]
async fn two_subscriptions_of_one_consumer_count_each_event_twice() {
    let node = node(quick_config(), ImplicitSubscriptions::new()).await;
    let s = stream("multi", "parallel");
    let recorder = Recorder::new();
    let a = node.node.subscribe(&s, Arc::new(recorder.clone()), StartPosition::Latest).await.unwrap();
    let b = node.node.subscribe(&s, Arc::new(recorder.clone()), StartPosition::Latest).await.unwrap();
    assert_ne!(a.id, b.id);
    node.node.produce(&s, events("e", 0..5)).await.unwrap();
    assert!(eventually(WAIT, || recorder.total() == 10).await);
    let listed: BTreeSet<_> = node.node.subscriptions(&s).await.unwrap().into_iter().map(|s| s.id).collect();
    assert_eq!(listed, [a.id, b.id].into_iter().collect(), "the active subscriptions are exactly those created");
}

#[tokio::test]
async fn linear_and_add_remove_subscriptions_see_their_own_windows() {
    let node = node(quick_config(), ImplicitSubscriptions::new()).await;
    let s = stream("multi", "linear");
    let (one, two, three) = (Recorder::new(), Recorder::new(), Recorder::new());
    let h1 = node.node.subscribe(&s, Arc::new(one.clone()), StartPosition::Latest).await.unwrap();
    let h2 = node.node.subscribe(&s, Arc::new(two.clone()), StartPosition::Latest).await.unwrap();
    node.node.produce(&s, events("e", 0..2)).await.unwrap();
    assert!(eventually(WAIT, || one.total() == 2 && two.total() == 2).await);
    node.node.unsubscribe(&h1).await.unwrap();
    let h3 = node.node.subscribe(&s, Arc::new(three.clone()), StartPosition::Latest).await.unwrap();
    node.node.produce(&s, events("e", 2..4)).await.unwrap();
    assert!(eventually(WAIT, || two.total() == 4 && three.total() == 2).await);
    assert_eq!(one.ids(&s), ids("e", 0..2));
    assert_eq!(three.ids(&s), ids("e", 2..4));
    node.node.unsubscribe(&h2).await.unwrap();
    node.node.unsubscribe(&h3).await.unwrap();
    assert!(node.node.subscriptions(&s).await.unwrap().is_empty());
}

#[tokio::test]
async fn two_intermittent_streams_keep_their_events_apart() {
    let node = node(quick_config(), ImplicitSubscriptions::new()).await;
    let (a, b) = (stream("multi", "x"), stream("multi", "y"));
    let (ra, rb) = (Recorder::new(), Recorder::new());
    node.node.subscribe(&a, Arc::new(ra.clone()), StartPosition::Latest).await.unwrap();
    node.node.subscribe(&b, Arc::new(rb.clone()), StartPosition::Latest).await.unwrap();
    for round in 0..5 {
        let target = if round % 2 == 0 { &a } else { &b };
        node.node.produce(target, events(&format!("r{round}-"), 0..2)).await.unwrap();
    }
    assert!(eventually(WAIT, || ra.total() == 6 && rb.total() == 4).await);
    assert!(ra.ids(&a).iter().all(|id| id.starts_with("r0") || id.starts_with("r2") || id.starts_with("r4")));
    assert!(rb.ids(&b).iter().all(|id| id.starts_with("r1") || id.starts_with("r3")));
}

/// Beyond Orleans #8306: asking for a token older than the cache on a
/// rewindable adapter re-reads it from the queue, losing nothing.
#[tokio::test]
async fn a_start_older_than_the_cache_is_served_from_the_queue() {
    let node = node(quick_config(), ImplicitSubscriptions::new()).await;
    let s = stream("rewind", "a");
    let mut tokens = Vec::new();
    for i in 0..10 {
        tokens.push(node.node.produce(&s, events("e", i..i + 1)).await.unwrap());
    }
    // Nobody listened: everything was read, acked and purged.
    let queue = node.node.mapper().queue_for(&s).0;
    node.wait_status(queue, |s| s.acked >= 10).await;
    let recorder = Recorder::new();
    let handle = node.node.subscribe(&s, Arc::new(recorder.clone()), StartPosition::At(tokens[3])).await.unwrap();
    assert_eq!(handle.start, StartPosition::At(tokens[3]));
    node.node.produce(&s, events("e", 10..11)).await.unwrap();
    assert!(eventually(WAIT, || recorder.total() == 8).await, "{:?}", recorder.ids(&s));
    assert_eq!(recorder.ids(&s), ids("e", 3..11));
}

/// A non-rewindable adapter refuses a start it cannot serve, clearly.
#[tokio::test]
async fn a_non_rewindable_adapter_refuses_an_old_start_token() {
    let node = TestNode::start(
        memory(MemoryOptions { history: 0, ..MemoryOptions::default() }),
        quick_config(),
        ImplicitSubscriptions::new(),
    )
    .await;
    let s = stream("norewind", "a");
    node.agent(node.node.mapper().queue_for(&s).0).await;
    let first = node.node.produce(&s, events("e", 0..1)).await.unwrap();
    node.node.produce(&s, events("e", 1..2)).await.unwrap();
    node.wait_status(node.node.mapper().queue_for(&s).0, |s| s.acked >= 2).await;
    let err = node.node.subscribe(&s, Arc::new(Recorder::new()), StartPosition::At(first)).await.unwrap_err();
    assert!(err.to_string().contains("not rewindable"), "{err}");
    assert!(node.node.subscriptions(&s).await.unwrap().is_empty(), "a refused subscribe leaves nothing behind");
}

/// Events of streams nobody subscribes to are counted, not silently lost.
#[tokio::test]
async fn events_nobody_subscribes_to_are_counted() {
    let node = node(quick_config(), ImplicitSubscriptions::new()).await;
    let s = stream("nobody", "listens");
    node.node.produce(&s, events("e", 0..3)).await.unwrap();
    node.node.produce(&s, events("e", 3..5)).await.unwrap();
    let status = node.wait_status(node.node.mapper().queue_for(&s).0, |s| s.events_unsubscribed == 5).await;
    assert_eq!(status.events_delivered, 0);
}

/// Handshakes of one subscription may overlap; the newest one wins.
struct SlowFirstHandshake {
    recorder: Recorder,
    calls: AtomicUsize,
    first_may_answer: Arc<tokio::sync::Notify>,
    stale: tailrace::SequenceToken,
}

#[async_trait]
impl StreamConsumer for SlowFirstHandshake {
    async fn handshake(&self, _: &SubscriptionInfo) -> Result<Option<StartPosition>, ConsumerError> {
        if self.calls.fetch_add(1, Ordering::SeqCst) == 0 {
            self.first_may_answer.notified().await;
            // A stale answer: far in the past.
            return Ok(Some(StartPosition::At(self.stale)));
        }
        Ok(None)
    }

    async fn deliver(&self, delivery: &Delivery) -> Result<DeliveryOutcome, ConsumerError> {
        self.recorder.deliver(delivery).await
    }
}

#[tokio::test]
async fn the_newest_handshake_wins() {
    let node = node(quick_config(), ImplicitSubscriptions::new()).await;
    let s = stream("hs", "a");
    let old = node.node.produce(&s, events("old", 0..1)).await.unwrap();
    // Once the agent read it, `Latest` means after it.
    node.wait_status(node.node.mapper().queue_for(&s).0, |s| s.containers_read >= 1).await;
    let consumer = Arc::new(SlowFirstHandshake {
        recorder: Recorder::new(),
        calls: AtomicUsize::new(0),
        first_may_answer: Arc::new(tokio::sync::Notify::new()),
        stale: old,
    });
    let id = tailrace::pubsub::SubscriptionId::random();
    let first = {
        let (node_ref, s, consumer) = (&node.node, s.clone(), consumer.clone());
        async move { node_ref.resume(id, &s, consumer, StartPosition::Latest).await }
    };
    let second = async {
        assert!(eventually(WAIT, || consumer.calls.load(Ordering::SeqCst) == 1).await);
        let handle = node.node.resume(id, &s, consumer.clone(), StartPosition::Latest).await.unwrap();
        consumer.first_may_answer.notify_one();
        handle
    };
    let (first, second) = tokio::join!(first, second);
    assert_eq!(second.id, id);
    // The first caller is answered by the newest handshake too.
    assert_eq!(first.unwrap().id, id);
    node.node.produce(&s, events("new", 0..2)).await.unwrap();
    assert!(eventually(WAIT, || consumer.recorder.total() == 2).await);
    assert_eq!(consumer.recorder.ids(&s), ids("new", 0..2), "the stale rewind to `old` was ignored");
}

/// Records whether its delivery future was dropped before finishing.
struct Hangs {
    entered: AtomicUsize,
    dropped: Arc<AtomicUsize>,
}

struct DropFlag(Arc<AtomicUsize>);

impl Drop for DropFlag {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

#[async_trait]
impl StreamConsumer for Hangs {
    async fn deliver(&self, _: &Delivery) -> Result<DeliveryOutcome, ConsumerError> {
        self.entered.fetch_add(1, Ordering::SeqCst);
        let _flag = DropFlag(self.dropped.clone());
        std::future::pending::<()>().await;
        Ok(DeliveryOutcome::Continue)
    }
}

/// Removing a subscription revokes its in-flight delivery at once.
#[tokio::test]
async fn unsubscribe_revokes_an_in_flight_delivery() {
    let mut config = quick_config();
    config.agent.delivery_attempt_timeout = Duration::from_secs(3600);
    config.agent.max_delivery_time = Duration::from_secs(3600);
    let node = node(config, ImplicitSubscriptions::new()).await;
    let s = stream("revoke", "a");
    let hangs = Arc::new(Hangs { entered: AtomicUsize::new(0), dropped: Arc::new(AtomicUsize::new(0)) });
    let handle = node.node.subscribe(&s, hangs.clone(), StartPosition::Latest).await.unwrap();
    node.node.produce(&s, events("e", 0..1)).await.unwrap();
    assert!(eventually(WAIT, || hangs.entered.load(Ordering::SeqCst) == 1).await);
    node.node.unsubscribe(&handle).await.unwrap();
    assert!(eventually(WAIT, || hangs.dropped.load(Ordering::SeqCst) == 1).await, "the hanging call was cancelled");
    let status = node.wait_status(node.node.mapper().queue_for(&s).0, |s| s.subscriptions == 0).await;
    assert_eq!(status.events_delivered, 0);
}

/// A strict start the queue turns out not to hold any more is refused
/// clearly, and nothing is left behind.
#[tokio::test]
async fn a_start_the_queue_no_longer_holds_is_refused() {
    let node = TestNode::start(
        memory(MemoryOptions { history: 2, ..MemoryOptions::default() }),
        quick_config(),
        ImplicitSubscriptions::new(),
    )
    .await;
    let s = stream("gone", "a");
    node.agent(node.node.mapper().queue_for(&s).0).await;
    let mut tokens = Vec::new();
    for i in 0..10 {
        tokens.push(node.node.produce(&s, events("e", i..i + 1)).await.unwrap());
    }
    node.wait_status(node.node.mapper().queue_for(&s).0, |s| s.acked >= 10).await;
    let err = node.node.subscribe(&s, Arc::new(Recorder::new()), StartPosition::At(tokens[0])).await.unwrap_err();
    assert!(err.to_string().contains("no longer held"), "{err}");
    assert!(node.node.subscriptions(&s).await.unwrap().is_empty());
    // A recent token is still served.
    let recorder = Recorder::new();
    node.node.subscribe(&s, Arc::new(recorder.clone()), StartPosition::At(tokens[8])).await.unwrap();
    assert!(eventually(WAIT, || recorder.total() == 2).await);
    assert_eq!(recorder.ids(&s), ids("e", 8..10));
}

/// A resume that cannot attach leaves the stored subscription as it was.
#[tokio::test]
async fn a_failed_resume_keeps_the_subscription() {
    let mut config = quick_config();
    config.pubsub.attach_timeout = Duration::from_millis(300);
    let node = node(config, ImplicitSubscriptions::new()).await;
    let s = stream("keep", "a");
    let handle = node.node.subscribe(&s, Arc::new(Recorder::new()), StartPosition::Latest).await.unwrap();
    node.node.stop_agents().await.unwrap();
    let err = node.node.resume(handle.id, &s, Arc::new(Recorder::new()), StartPosition::Latest).await.unwrap_err();
    assert!(err.to_string().contains("no pulling agent attached"), "{err}");
    let subs = node.node.subscriptions(&s).await.unwrap();
    assert_eq!(subs.len(), 1);
    assert_eq!(subs[0].id, handle.id);
    assert_eq!(subs[0].start, handle.start, "the record is the one before the resume");
}
