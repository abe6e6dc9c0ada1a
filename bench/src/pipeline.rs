//! `tailrace-bench pipeline`: one node, 8 queues, 1 000 streams with one
//! subscriber each, memory adapter — against a hand-written tokio pipeline of
//! the same shape (producers -> bounded channel per queue -> router ->
//! bounded channel per stream -> consumer task), same batch size, same
//! events, same order check, in the same run.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use async_trait::async_trait;
use bytes::Bytes;
use tailrace::Node;
use tailrace::adapters::memory::{MemoryAdapterFactory, MemoryOptions};
use tailrace::pubsub::{ConsumerError, Delivery, DeliveryOutcome, StartPosition, StreamConsumer};
use tailrace::queue::{QueueAdapterFactory, QueueMapper};
use tailrace::{Event, EventId, NodeId, StreamId};
use tokio::sync::{Notify, mpsc};

use super::Progress;

/// The shape of one run.
#[derive(Clone, Copy, Debug)]
pub struct Shape {
    pub streams: usize,
    pub queues: u32,
    pub batch: usize,
    pub events_per_stream: u64,
    pub producers: usize,
    pub queue_capacity_events: usize,
}

impl Shape {
    pub fn new(quick: bool) -> Self {
        Self {
            streams: 1_000,
            queues: 8,
            batch: 64,
            events_per_stream: if quick { 4_096 } else { 20_480 },
            producers: 4,
            queue_capacity_events: MemoryOptions::default().capacity_events,
        }
    }

    pub(super) fn total(&self) -> u64 {
        self.streams as u64 * self.events_per_stream
    }
}

pub async fn run(quick: bool) -> anyhow::Result<()> {
    let shape = Shape::new(quick);
    println!(
        "pipeline: {} streams over {} queues, {} events each ({} total), batches of {}, {} producers",
        shape.streams,
        shape.queues,
        shape.events_per_stream,
        shape.total(),
        shape.batch,
        shape.producers
    );
    // Rounds alternate tailrace and baseline so both see the same machine;
    // the ratio reported is the median of the rounds' ratios.
    let runs = if quick { 1 } else { 5 };
    // TAILRACE_BENCH_ONLY=tailrace|baseline runs one side (for profiling).
    let only = std::env::var("TAILRACE_BENCH_ONLY").unwrap_or_default();
    let mut rounds = Vec::new();
    for round in 1..=runs {
        let t = if only == "baseline" { 0.0 } else { tailrace_run(shape).await? };
        let b = if only == "tailrace" { 0.0 } else { baseline_run(shape).await? };
        println!(
            "  round {round}: tailrace {t:>12.0} events/s   baseline {b:>12.0} events/s   ratio {:.3}",
            if b > 0.0 { t / b } else { 0.0 }
        );
        rounds.push((t, b));
    }
    println!("{}", super::median_line("pipeline", &rounds, &[("events", shape.total().to_string())]));
    Ok(())
}

/// What every stream's counter adds to: events delivered, batches out of
/// order, and a wake-up once `total` events arrived.
#[derive(Clone)]
pub(super) struct Tally {
    pub(super) delivered: Arc<AtomicU64>,
    pub(super) disorder: Arc<AtomicU64>,
    pub(super) done: Arc<Notify>,
    total: u64,
}

impl Tally {
    pub(super) fn new(total: u64) -> Self {
        Self {
            delivered: Arc::new(AtomicU64::new(0)),
            disorder: Arc::new(AtomicU64::new(0)),
            done: Arc::new(Notify::new()),
            total,
        }
    }

    /// A counter for one more stream.
    pub(super) fn counter(&self) -> Counter {
        Counter { next: AtomicU64::new(0), tally: self.clone() }
    }

    /// Waits for the producers, then for every event (at most two minutes),
    /// then for the `consumers` of a raw loop; fails on disorder. Events
    /// per second since `started`.
    pub(super) async fn finish(
        &self,
        side: &str,
        producers: Vec<tokio::task::JoinHandle<bool>>,
        consumers: Vec<tokio::task::JoinHandle<anyhow::Result<()>>>,
        started: Instant,
        progress: Progress,
    ) -> anyhow::Result<f64> {
        for producer in producers {
            anyhow::ensure!(producer.await?, "a {side} producer failed to send");
        }
        let deadline = Instant::now() + Duration::from_secs(120);
        while self.delivered.load(Ordering::Relaxed) < self.total {
            anyhow::ensure!(Instant::now() < deadline, "{side} stalled");
            let _ = tokio::time::timeout(Duration::from_millis(100), self.done.notified()).await;
        }
        let elapsed = started.elapsed();
        progress.finish();
        for consumer in consumers {
            consumer.await??;
        }
        if self.disorder.load(Ordering::Relaxed) > 0 {
            bail!("{side} delivered {} batches out of order", self.disorder.load(Ordering::Relaxed));
        }
        Ok(self.total as f64 / elapsed.as_secs_f64())
    }
}

/// Counts a stream's events and checks they arrive in order.
pub(super) struct Counter {
    next: AtomicU64,
    tally: Tally,
}

impl Counter {
    pub(super) fn take(&self, first_id: &str, count: u64) {
        let expected = self.next.fetch_add(count, Ordering::Relaxed);
        if first_id.parse::<u64>().ok() != Some(expected) {
            self.tally.disorder.fetch_add(1, Ordering::Relaxed);
        }
        if self.tally.delivered.fetch_add(count, Ordering::Relaxed) + count >= self.tally.total {
            self.tally.done.notify_one();
        }
    }
}

#[async_trait]
impl StreamConsumer for Counter {
    async fn deliver(&self, delivery: &Delivery) -> Result<DeliveryOutcome, ConsumerError> {
        for batch in &delivery.batches {
            if let Some(first) = batch.events.first() {
                self.take(first.id.as_str(), batch.events.len() as u64);
            }
        }
        Ok(DeliveryOutcome::Continue)
    }
}

fn batch_of(first: u64, len: usize, payload: &Bytes, now: u64) -> Vec<Event> {
    (first..first + len as u64)
        .map(|i| Event { id: EventId::from_u64(i), timestamp_ms: now, payload: payload.clone() })
        .collect()
}

/// Producer `p`: writes its share of the streams (every `producers`-th),
/// one batch each in turn, through `send(stream index, events)`. Both sides
/// use this, so both do exactly the same production work. False if a send
/// failed.
pub(super) async fn produce<F, Fut>(shape: Shape, p: usize, mut send: F) -> bool
where
    F: FnMut(usize, Vec<Event>) -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let payload = Bytes::from_static(b"0123456789abcdef0123456789abcdef");
    let now = crate::now_ms();
    let mut sent = 0;
    while sent < shape.events_per_stream {
        for stream in (p..shape.streams).step_by(shape.producers) {
            if !send(stream, batch_of(sent, shape.batch, &payload, now)).await {
                return false;
            }
        }
        sent += shape.batch as u64;
    }
    true
}

pub(super) fn stream_ids(shape: Shape) -> Vec<StreamId> {
    (0..shape.streams).map(|i| StreamId::new("bench", format!("stream-{i}"))).collect()
}

async fn tailrace_run(shape: Shape) -> anyhow::Result<f64> {
    let factory = Arc::new(MemoryAdapterFactory::new(
        shape.queues,
        MemoryOptions { capacity_events: shape.queue_capacity_events, history: 0, ..MemoryOptions::default() },
    ));
    run_node(shape, factory).await
}

/// Events per second through one node on `factory`'s queues: every stream
/// subscribed, the producers enqueueing, until every event is delivered.
pub(super) async fn run_node(shape: Shape, factory: Arc<dyn QueueAdapterFactory>) -> anyhow::Result<f64> {
    let adapter = factory.create_adapter().await?;
    let node = Node::builder(NodeId::new("bench"), factory).config(super::node_config()?).start().await?;
    let deadline = Instant::now() + Duration::from_secs(30);
    while node.running_agents().await? < shape.queues as usize {
        if Instant::now() > deadline {
            bail!("agents did not start");
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let streams = stream_ids(shape);
    let tally = Tally::new(shape.total());
    for stream in &streams {
        node.subscribe(stream, Arc::new(tally.counter()), StartPosition::Latest).await.context("subscribe")?;
    }
    let progress = Progress::start("tailrace", shape.total(), tally.delivered.clone());
    let started = Instant::now();
    let streams = Arc::new(streams);
    let mut producers = Vec::new();
    for p in 0..shape.producers {
        let (adapter, streams) = (adapter.clone(), streams.clone());
        producers.push(tokio::spawn(produce(shape, p, move |stream, events| {
            let (adapter, streams) = (adapter.clone(), streams.clone());
            async move { tailrace::queue::QueueAdapter::enqueue(adapter.as_ref(), &streams[stream], events).await.is_ok() }
        })));
    }
    let rate = tally.finish("tailrace", producers, Vec::new(), started, progress).await?;
    node.shutdown().await?;
    Ok(rate)
}

async fn baseline_run(shape: Shape) -> anyhow::Result<f64> {
    let streams = stream_ids(shape);
    let mapper = QueueMapper::new(shape.queues);
    let tally = Tally::new(shape.total());
    // Per stream: a bounded channel and a consumer task with the same check.
    let mut stream_tx = Vec::new();
    for _ in &streams {
        let (tx, mut rx) = mpsc::channel::<Vec<Event>>(16);
        let counter = tally.counter();
        tokio::spawn(async move {
            while let Some(batch) = rx.recv().await {
                if let Some(first) = batch.first() {
                    counter.take(first.id.as_str(), batch.len() as u64);
                }
            }
        });
        stream_tx.push(tx);
    }
    // Per queue: a bounded channel and a router to the stream channels.
    let stream_tx = Arc::new(stream_tx);
    let mut queue_tx = Vec::new();
    for _ in 0..shape.queues {
        let (tx, mut rx) = mpsc::channel::<(usize, Vec<Event>)>(shape.queue_capacity_events / shape.batch);
        let stream_tx = stream_tx.clone();
        tokio::spawn(async move {
            while let Some((stream, batch)) = rx.recv().await {
                if stream_tx[stream].send(batch).await.is_err() {
                    return;
                }
            }
        });
        queue_tx.push(tx);
    }
    let routes: Arc<Vec<usize>> = Arc::new(streams.iter().map(|s| mapper.queue_for(s).0 as usize).collect());
    let queue_tx = Arc::new(queue_tx);
    let progress = Progress::start("baseline", shape.total(), tally.delivered.clone());
    let started = Instant::now();
    let mut producers = Vec::new();
    for p in 0..shape.producers {
        let (queue_tx, routes) = (queue_tx.clone(), routes.clone());
        producers.push(tokio::spawn(produce(shape, p, move |stream, events| {
            let (queue_tx, routes) = (queue_tx.clone(), routes.clone());
            async move {
                // Like the memory queue: room now is taken without awaiting
                // (measured: the baseline's speed is the same either way).
                let tx = &queue_tx[routes[stream]];
                match tx.try_send((stream, events)) {
                    Ok(()) => true,
                    Err(mpsc::error::TrySendError::Full(item)) => tx.send(item).await.is_ok(),
                    Err(mpsc::error::TrySendError::Closed(_)) => false,
                }
            }
        })));
    }
    tally.finish("baseline", producers, Vec::new(), started, progress).await
}
