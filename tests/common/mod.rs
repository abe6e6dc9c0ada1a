//! Helpers shared by the integration tests: a recording consumer, a
//! bounded eventually-check, and small constructors.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use tailrace::pubsub::{ConsumerError, ConsumerFactory, Delivery, DeliveryOutcome, StreamConsumer, SubscriptionInfo};
use tailrace::stream::{Event, EventId, SequenceToken, StreamId};

/// Polls `check` every 10 ms until it holds or `timeout` passes; returns
/// whether it held. Use it instead of sleeping.
pub async fn eventually(timeout: Duration, mut check: impl FnMut() -> bool) -> bool {
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if check() {
            return true;
        }
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// What a recording consumer saw.
#[derive(Default, Clone, Debug)]
pub struct Seen {
    /// Event ids per stream, in delivery order.
    pub events: BTreeMap<StreamId, Vec<String>>,
    /// Tokens per stream, in delivery order (one per container).
    pub tokens: BTreeMap<StreamId, Vec<SequenceToken>>,
    /// Errors reported through `on_error`.
    pub errors: Vec<String>,
    /// Deliveries received.
    pub deliveries: usize,
}

impl Seen {
    pub fn ids(&self, stream: &StreamId) -> Vec<String> {
        self.events.get(stream).cloned().unwrap_or_default()
    }

    pub fn total(&self) -> usize {
        self.events.values().map(Vec::len).sum()
    }
}

/// Records every delivery; shared between clones.
#[derive(Clone, Default)]
pub struct Recorder {
    pub seen: Arc<Mutex<Seen>>,
}

impl Recorder {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn snapshot(&self) -> Seen {
        self.seen.lock().unwrap().clone()
    }

    pub fn ids(&self, stream: &StreamId) -> Vec<String> {
        self.seen.lock().unwrap().ids(stream)
    }

    pub fn total(&self) -> usize {
        self.seen.lock().unwrap().total()
    }

    pub fn record(&self, delivery: &Delivery) {
        let mut seen = self.seen.lock().unwrap();
        seen.deliveries += 1;
        for batch in &delivery.batches {
            seen.tokens.entry(delivery.stream.clone()).or_default().push(batch.token);
        }
        let ids = seen.events.entry(delivery.stream.clone()).or_default();
        for (event, _) in delivery.events() {
            ids.push(event.id.to_string());
        }
    }
}

#[async_trait]
impl StreamConsumer for Recorder {
    async fn deliver(&self, delivery: &Delivery) -> Result<DeliveryOutcome, ConsumerError> {
        self.record(delivery);
        Ok(DeliveryOutcome::Continue)
    }

    async fn on_error(&self, _: &SubscriptionInfo, error: &str) {
        self.seen.lock().unwrap().errors.push(error.to_string());
    }
}

/// An implicit-subscription factory whose consumers all record into one
/// recorder.
pub struct RecordingFactory {
    pub name: String,
    pub recorder: Recorder,
}

impl ConsumerFactory for RecordingFactory {
    fn name(&self) -> &str {
        &self.name
    }

    fn create(&self, _: &StreamId) -> Arc<dyn StreamConsumer> {
        Arc::new(self.recorder.clone())
    }
}

/// `n` events with ids `{prefix}{i}` for `i` in `range`.
pub fn events(prefix: &str, range: std::ops::Range<u64>) -> Vec<Event> {
    range.map(|i| Event::new(EventId::new(format!("{prefix}{i}")), format!("payload {i}"))).collect()
}

/// The ids `events` would produce.
pub fn ids(prefix: &str, range: std::ops::Range<u64>) -> Vec<String> {
    range.map(|i| format!("{prefix}{i}")).collect()
}

pub fn stream(ns: &str, key: &str) -> StreamId {
    StreamId::new(ns, key)
}
