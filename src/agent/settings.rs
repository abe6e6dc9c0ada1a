//! What an agent is given: its settings ([`AgentOptions`], part of the
//! node's configuration) and the services every agent of a node shares
//! ([`AgentServices`]). Plain data; no rules live here.

use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;

use crate::checkpoint::CheckpointOptions;
use crate::failure::{DeadLetterSink, FailureHandler};
use crate::pubsub::{ConsumerResolver, ImplicitSubscriptions, PubSubStore};
use crate::queue::{CacheOptions, Checkpointer, QueueAdapter};
use crate::retry::Backoff;
use crate::stream::NodeId;
use crate::tasks::Tasks;

/// An agent's settings. Defaults are Orleans' unless noted.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AgentOptions {
    /// The longest wait after an empty read (Orleans' fixed 100 ms period;
    /// the first read waits a random part of it).
    #[serde(with = "humantime_serde")]
    pub poll_period: Duration,
    /// The shortest wait after an empty read. The wait doubles with every
    /// empty read up to `poll_period`, so a busy queue is read again within
    /// milliseconds and an idle one every `poll_period`; a receiver that
    /// can wake on a write is slept on after the fourth empty read instead.
    /// Set it equal to `poll_period` for Orleans' fixed period.
    #[serde(with = "humantime_serde")]
    pub min_poll_period: Duration,
    /// Limit of every receiver and checkpoint call: `initialize`, each
    /// read, ack and checkpoint write of the pump, and each step of the
    /// ordered shutdown (final ack, failed report, checkpoint update and
    /// flush, receiver `shutdown`).
    #[serde(with = "humantime_serde")]
    pub init_timeout: Duration,
    /// How long one batch (or handshake) is retried before the failure
    /// handler decides.
    #[serde(with = "humantime_serde")]
    pub max_delivery_time: Duration,
    /// Limit of one delivery attempt (Orleans' response timeout); a consumer
    /// that never answers fails the attempt.
    #[serde(with = "humantime_serde")]
    pub delivery_attempt_timeout: Duration,
    /// Backoff between delivery, handshake and pub-sub retries.
    pub delivery_backoff: Backoff,
    /// Backoff after a failed read.
    pub reader_backoff: Backoff,
    /// A stream with no event for this long and nothing in flight is
    /// forgotten (its subscriptions are found again on its next event).
    #[serde(with = "humantime_serde")]
    pub stream_inactivity: Duration,
    /// Most containers in one delivery (Orleans: 1; larger batches cost
    /// fewer round trips and keep per-subscription order).
    pub max_delivery_batch: usize,
    /// Most streams one agent tracks; past it, idle streams are forgotten
    /// early and reading pauses until some are.
    pub max_streams: usize,
    /// Most rewind reads per pump (catch-up of subscriptions that asked for
    /// positions older than the cache).
    pub max_rewinds_per_pump: usize,
    /// After three reads in a row that each brought less than a
    /// thirty-second of what they could (a dozen containers of a default
    /// cache bucket), the next read waits this long, so that it carries
    /// more: a busy queue read a container at a time spends its reads'
    /// fixed cost on every container. A pump wanted sooner (a delivery
    /// finished, a subscriber caught up, a rewind) comes at once. What
    /// arrives meanwhile reaches its subscribers up to this much later.
    /// `0s`: read again at once.
    #[serde(with = "humantime_serde")]
    pub read_linger: Duration,
}

impl Default for AgentOptions {
    fn default() -> Self {
        Self {
            poll_period: Duration::from_millis(100),
            min_poll_period: Duration::from_millis(1),
            init_timeout: Duration::from_secs(5),
            max_delivery_time: Duration::from_secs(60),
            delivery_attempt_timeout: Duration::from_secs(30),
            delivery_backoff: Backoff::new(Duration::from_secs(1), Duration::from_secs(30), Duration::from_secs(1)),
            reader_backoff: Backoff::new(Duration::from_secs(10), Duration::from_secs(20), Duration::from_secs(1)),
            stream_inactivity: Duration::from_secs(30 * 60),
            max_delivery_batch: 16,
            max_streams: 100_000,
            max_rewinds_per_pump: 4,
            read_linger: Duration::from_millis(10),
        }
    }
}

/// What every agent of a node uses.
#[derive(Clone)]
pub(crate) struct AgentServices {
    /// The node the agent runs on.
    pub node: NodeId,
    /// The queue adapter.
    pub adapter: Arc<dyn QueueAdapter>,
    /// Where checkpoints live.
    pub checkpointer: Arc<dyn Checkpointer>,
    /// Cache shape.
    pub cache: CacheOptions,
    /// Checkpoint throttling.
    pub checkpoint: CheckpointOptions,
    /// Agent settings.
    pub options: AgentOptions,
    /// Explicit subscriptions.
    pub store: Arc<dyn PubSubStore>,
    /// Implicit subscriptions.
    pub implicit: ImplicitSubscriptions,
    /// Finds consumers by address.
    pub consumers: Arc<dyn ConsumerResolver>,
    /// Decides about failed deliveries.
    pub failure: Arc<dyn FailureHandler>,
    /// Where skipped batches go.
    pub dead_letters: Arc<dyn DeadLetterSink>,
    /// Cancelled when the node crashes (tests): every task of every agent
    /// stops at once, with no handoff.
    pub kill: CancellationToken,
    /// The node's tasks: agents and the manager spawn theirs here (an
    /// agent's pump and work lane end with the agent, which waits for its
    /// in-flight work; the node waits for them all when it shuts down).
    pub tasks: Tasks,
    /// The fencing token of the queue lease the agent runs under: its
    /// receiver, checkpoint writes and the run log appends of its
    /// deliveries are fenced with it. `None` in the node's template, and
    /// when the lease store's tokens mean nothing to the queue stores
    /// (`QueueLeases::fences_queue_stores`): then nothing is fenced.
    pub lease_token: Option<u64>,
}
