//! Several nodes in one process over shared memory queues: rebalancing on
//! crashes and joins loses nothing, a graceful move delivers nothing twice,
//! and a consumer on one node receives a stream pulled by another.

use tailrace_testkit as common;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use common::*;
use tailrace::adapters::memory::{MemoryAdapterFactory, MemoryOptions};
use tailrace::harness::InProcessCluster;
use tailrace::pubsub::{ConsumerError, Delivery, DeliveryOutcome, StartPosition, StreamConsumer};
use tailrace::queue::QueueAdapter;
use tailrace::{Event, QueueId, StreamId};

const WAIT: Duration = Duration::from_secs(20);

/// Produces one event at a time to `streams`, round robin, until stopped;
/// remembers every id it got an acknowledgement for.
struct Producer {
    stop: Arc<AtomicBool>,
    sent: Arc<Mutex<BTreeSet<String>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Producer {
    fn start(adapter: Arc<dyn QueueAdapter>, streams: Vec<StreamId>) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let sent = Arc::new(Mutex::new(BTreeSet::new()));
        let (flag, log) = (stop.clone(), sent.clone());
        let task = tokio::spawn(async move {
            let mut n = 0u64;
            while !flag.load(Ordering::SeqCst) {
                let stream = &streams[(n % streams.len() as u64) as usize];
                let id = format!("{}#{n}", stream.key());
                adapter.enqueue(stream, vec![Event::new(id.as_str(), "x")]).await.unwrap();
                log.lock().unwrap().insert(id);
                n += 1;
                if n.is_multiple_of(20) {
                    tokio::time::sleep(Duration::from_millis(2)).await;
                }
            }
        });
        Self { stop, sent, task }
    }

    async fn stop(self) -> BTreeSet<String> {
        self.stop.store(true, Ordering::SeqCst);
        self.task.await.unwrap();
        self.sent.lock().unwrap().clone()
    }

    fn count(&self) -> usize {
        self.sent.lock().unwrap().len()
    }
}

fn delivered(recorder: &Recorder) -> BTreeSet<String> {
    recorder.snapshot().events.values().flatten().cloned().collect()
}

fn assert_each_queue_once(assignment: &BTreeMap<tailrace::NodeId, Vec<QueueId>>) {
    let mut all: Vec<QueueId> = assignment.values().flatten().copied().collect();
    all.sort();
    assert_eq!(all, (0..8).map(QueueId).collect::<Vec<_>>(), "{assignment:?}");
}

/// 3 nodes, 8 queues, producing all along: kill one, then another, then add
/// one. After each step every queue is pulled by exactly one live node, and
/// at the end every acknowledged event was delivered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rebalancing_through_crashes_and_a_join_loses_no_event() {
    let factory = Arc::new(MemoryAdapterFactory::new(8, MemoryOptions::default()));
    let adapter = factory.adapter();
    let recorder = Recorder::new();
    let cluster = InProcessCluster::new(factory, quick_config()).with_implicit(implicit("c", &recorder));
    for name in ["n1", "n2", "n3"] {
        cluster.add_node(name).await.unwrap();
    }
    assert_each_queue_once(&cluster.wait_balanced(WAIT).await.unwrap());
    let streams: Vec<StreamId> = (0..40).map(|i| stream("c", &format!("s{i}"))).collect();
    let producer = Producer::start(adapter, streams);
    let progress = |p: &Producer, at_least: usize| {
        let c = p.count();
        c >= at_least
    };
    assert!(eventually(WAIT, || progress(&producer, 200)).await);

    cluster.kill_node("n2");
    let after_first = cluster.wait_balanced(WAIT).await.unwrap();
    assert_eq!(after_first.len(), 2);
    assert_each_queue_once(&after_first);
    let seen = producer.count();
    assert!(eventually(WAIT, || progress(&producer, seen + 200)).await);

    cluster.kill_node("n1");
    let after_second = cluster.wait_balanced(WAIT).await.unwrap();
    assert_eq!(after_second.keys().map(|n| n.as_str()).collect::<Vec<_>>(), ["n3"]);
    assert_each_queue_once(&after_second);
    let seen = producer.count();
    assert!(eventually(WAIT, || progress(&producer, seen + 200)).await);

    cluster.add_node("n4").await.unwrap();
    let after_join = cluster.wait_balanced(WAIT).await.unwrap();
    assert_eq!(after_join.len(), 2);
    assert_each_queue_once(&after_join);
    let seen = producer.count();
    assert!(eventually(WAIT, || progress(&producer, seen + 200)).await);

    let sent = producer.stop().await;
    assert!(
        eventually(WAIT, || delivered(&recorder).is_superset(&sent)).await,
        "lost: {:?}",
        sent.difference(&delivered(&recorder)).take(10).collect::<Vec<_>>()
    );
    // Per stream, the first delivery of each event respects production order.
    for (stream, ids) in recorder.snapshot().events {
        let mut firsts = Vec::new();
        let mut seen = BTreeSet::new();
        for id in ids {
            if seen.insert(id.clone()) {
                firsts.push(id.split('#').nth(1).unwrap().parse::<u64>().unwrap());
            }
        }
        assert!(firsts.windows(2).all(|w| w[0] < w[1]), "{stream}: out of order {firsts:?}");
    }
}

/// Counts how many times each event arrived.
#[derive(Clone, Default)]
struct Counts(Arc<Mutex<BTreeMap<String, u32>>>);

#[async_trait]
impl StreamConsumer for Counts {
    async fn deliver(&self, delivery: &Delivery) -> Result<DeliveryOutcome, ConsumerError> {
        let mut counts = self.0.lock().unwrap();
        for (event, _) in delivery.events() {
            *counts.entry(event.id.to_string()).or_default() += 1;
        }
        Ok(DeliveryOutcome::Continue)
    }
}

/// Beyond Orleans #11242: a node leaving gracefully hands its queues over
/// after its final flush; nothing is delivered twice, nothing is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_graceful_move_delivers_nothing_twice() {
    let factory = Arc::new(MemoryAdapterFactory::new(8, MemoryOptions::default()));
    let adapter = factory.adapter();
    let counts = Counts::default();
    let implicit = bind(tailrace::pubsub::ImplicitSubscriptions::new(), "g", "counts", Arc::new(counts.clone()));
    let cluster = InProcessCluster::new(factory, quick_config()).with_implicit(implicit);
    for name in ["n1", "n2", "n3"] {
        cluster.add_node(name).await.unwrap();
    }
    cluster.wait_balanced(WAIT).await.unwrap();
    let streams: Vec<StreamId> = (0..24).map(|i| stream("g", &format!("s{i}"))).collect();
    let producer = Producer::start(adapter, streams);
    assert!(eventually(WAIT, || producer.count() >= 300).await);
    cluster.stop_node("n2").await.unwrap();
    cluster.wait_balanced(WAIT).await.unwrap();
    let seen = producer.count();
    assert!(eventually(WAIT, || producer.count() >= seen + 300).await);
    let sent = producer.stop().await;
    assert!(eventually(WAIT, || counts.0.lock().unwrap().len() >= sent.len()).await);
    let counts = counts.0.lock().unwrap().clone();
    let twice: Vec<_> = counts.iter().filter(|(_, n)| **n > 1).take(10).collect();
    assert!(twice.is_empty(), "delivered more than once: {twice:?}");
    assert_eq!(counts.keys().cloned().collect::<BTreeSet<_>>(), sent);
}

/// A consumer on one node receives a stream whose queue another node pulls;
/// when the consumer's node dies, the others are unaffected.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consumer_on_another_node_receives_the_stream() {
    let factory = Arc::new(MemoryAdapterFactory::new(2, MemoryOptions::default()));
    let cluster = InProcessCluster::new(factory, quick_config());
    let (a, b) = (cluster.add_node("a").await.unwrap(), cluster.add_node("b").await.unwrap());
    let assignment = cluster.wait_balanced(WAIT).await.unwrap();
    // A stream pulled by b, subscribed from a.
    let b_queues = &assignment[b.id()];
    let s =
        (0..100).map(|i| stream("x", &format!("k{i}"))).find(|s| b_queues.contains(&a.mapper().queue_for(s))).unwrap();
    let (remote, local) = (Recorder::new(), Recorder::new());
    a.subscribe(&s, Arc::new(remote.clone()), StartPosition::Latest).await.unwrap();
    b.subscribe(&s, Arc::new(local.clone()), StartPosition::Latest).await.unwrap();
    a.produce(&s, events("e", 0..5)).await.unwrap();
    assert!(eventually(WAIT, || remote.total() == 5 && local.total() == 5).await);
    assert_eq!(remote.ids(&s), ids("e", 0..5));
    cluster.kill_node("a");
    cluster.wait_balanced(WAIT).await.unwrap();
    b.produce(&s, events("e", 5..8)).await.unwrap();
    assert!(eventually(WAIT, || local.total() == 8).await, "{}", local.total());
    assert_eq!(remote.total(), 5);
}
