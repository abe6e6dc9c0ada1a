//! What an agent tells about itself: its status (tests and the admin API
//! assert on it) and its metric handles, created once per agent and
//! labelled with its queue.

use crate::telemetry;
use serde::Serialize;

use super::pump::Pump;
use super::streams::Streams;
use crate::cache::QueueCache;
use crate::stream::QueueId;

/// What an agent reports about itself (tests and the admin API assert on it).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct AgentStatus {
    /// Its queue.
    pub queue: Option<QueueId>,
    /// Streams it tracks.
    pub streams: usize,
    /// Streams whose subscriptions are still being looked up.
    pub registering: usize,
    /// Subscriptions it serves.
    pub subscriptions: usize,
    /// Containers cached.
    pub cached: usize,
    /// Pressure buckets alive.
    pub buckets: usize,
    /// Whether reading is paused by pressure.
    pub under_pressure: bool,
    /// Reads that returned at least one container.
    pub reads: u64,
    /// Read calls made.
    pub read_calls: u64,
    /// Containers read.
    pub containers_read: u64,
    /// Events delivered (counting each subscription).
    pub events_delivered: u64,
    /// Events of streams nobody subscribes to (acked, not delivered).
    pub events_unsubscribed: u64,
    /// Containers acknowledged to the receiver.
    pub acked: u64,
    /// The checkpoint recorded.
    pub checkpoint: Option<String>,
    /// Whether an ordered shutdown has begun.
    pub shutting_down: bool,
    /// Idle: it sleeps until its receiver says the queue was written.
    pub asleep: bool,
}

impl AgentStatus {
    /// A read that returned `containers` containers.
    pub(crate) fn read(&mut self, containers: usize) {
        self.reads += 1;
        self.containers_read += containers as u64;
    }

    /// These counters, with what the agent's parts hold now.
    pub(crate) fn now(&self, streams: &Streams, cache: &QueueCache, pump: &Pump, shutting_down: bool) -> Self {
        let (streams, registering, subscriptions) = streams.counts();
        AgentStatus {
            streams,
            registering,
            subscriptions,
            cached: cache.len(),
            buckets: cache.bucket_count(),
            under_pressure: cache.is_under_pressure(),
            checkpoint: pump.checkpoint().map(|t| t.to_string()),
            shutting_down,
            asleep: pump.asleep(),
            ..self.clone()
        }
    }
}

/// Metric handles, created once per agent.
pub(crate) struct AgentMetrics {
    pub events_read: metrics::Counter,
    pub events_delivered: metrics::Counter,
    pub events_unsubscribed: metrics::Counter,
    pub delivery_failures: metrics::Counter,
    pub dead_letters: metrics::Counter,
    pub read_errors: metrics::Counter,
    pub cache_misses: metrics::Counter,
    pub cached: metrics::Gauge,
    pub pressure: metrics::Gauge,
}

impl AgentMetrics {
    pub(crate) fn new(queue: QueueId) -> Self {
        let q = queue.to_string();
        Self {
            events_read: metrics::counter!(telemetry::AGENT_EVENTS_READ, "queue" => q.clone()),
            events_delivered: metrics::counter!(telemetry::AGENT_EVENTS_DELIVERED, "queue" => q.clone()),
            events_unsubscribed: metrics::counter!(telemetry::AGENT_EVENTS_UNSUBSCRIBED, "queue" => q.clone()),
            delivery_failures: metrics::counter!(telemetry::AGENT_DELIVERY_FAILURES, "queue" => q.clone()),
            dead_letters: metrics::counter!(telemetry::AGENT_DEAD_LETTERS, "queue" => q.clone()),
            read_errors: metrics::counter!(telemetry::AGENT_READ_ERRORS, "queue" => q.clone()),
            cache_misses: metrics::counter!(telemetry::AGENT_CACHE_MISSES, "queue" => q.clone()),
            cached: metrics::gauge!(telemetry::CACHE_CONTAINERS, "queue" => q.clone()),
            pressure: metrics::gauge!(telemetry::CACHE_UNDER_PRESSURE, "queue" => q),
        }
    }
}
