//! The pulling agent: one actor per owned queue.
//!
//! It reads its queue in batches, caches what it read ([`QueueCache`](crate::cache::QueueCache)), finds
//! each stream's subscribers (pub-sub + handshake), delivers to every
//! subscription in order and at least once, checkpoints delivery progress and,
//! when asked to stop, hands the queue over in strict order.
//!
//! The actor owns all of its state. Anything that waits (queue I/O, pub-sub
//! lookups, handshakes, deliveries, dead letters) runs in a spawned task that
//! reports back with a message, so a slow consumer never blocks the pump or
//! the other subscriptions:
//!
//! ```text
//! Pump ─▶ [task: ack purged, checkpoint, rewinds, read ≤ one bucket] ─▶ PumpDone
//! PumpDone ─▶ cache.add ─▶ new stream? register (store lookup) ─▶ handshake each subscription
//!          └▶ ready cursors ─▶ dispatch ─▶ [task: deliver with retries] ─▶ Delivered ─▶ dispatch …
//! ```
//!
//! The files under `agent/` hold the pieces: `pump.rs` (reading), `streams.rs`
//! (registration, attach, handshakes, cursors), `delivery.rs` (delivery and
//! failures), `shutdown.rs` (the ordered handoff).

mod delivery;
mod pump;
mod shutdown;
mod state;
mod streams;
mod worker;

use std::sync::Arc;
use std::time::Duration;

use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::cache::CacheOptions;
use crate::checkpoint::{CheckpointOptions, Checkpointer};
use crate::cluster::NodeId;
use crate::failure::{DeadLetterSink, FailureHandler};
use crate::pubsub::{
    ConsumerResolver, ImplicitSubscriptions, PubSubStore, StartPosition, Subscription, SubscriptionId,
};
use crate::queue::{QueueAdapter, QueueId};
use crate::retry::Backoff;
use crate::stream::StreamId;

pub(crate) use shutdown::HANDED_OVER;
pub(crate) use state::Agent;

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
    /// milliseconds and an idle one every `poll_period`. Set it equal to
    /// `poll_period` for Orleans' fixed period.
    #[serde(with = "humantime_serde")]
    pub min_poll_period: Duration,
    /// Limit for the receiver's `initialize` and `shutdown`.
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
        }
    }
}

/// What every agent of a node uses.
#[derive(Clone)]
pub struct AgentServices {
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
}

/// Why an attach did not happen.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AttachError {
    /// The agent is shutting down (the queue is moving); retry.
    #[error("queue {0} is being handed over; retry")]
    NotServing(QueueId),
    /// The consumer could not be reached.
    #[error("the consumer of subscription {id} is unavailable: {reason}")]
    ConsumerUnavailable {
        /// The subscription.
        id: SubscriptionId,
        /// Why.
        reason: String,
    },
    /// The requested start position cannot be served.
    #[error("subscription {id} cannot start at {requested}: {reason}")]
    CannotStart {
        /// The subscription.
        id: SubscriptionId,
        /// The position asked for.
        requested: String,
        /// Why.
        reason: String,
    },
    /// The failure handler faulted the subscription during its handshake.
    #[error("subscription {id} was faulted: {reason}")]
    Faulted {
        /// The subscription.
        id: SubscriptionId,
        /// The cause.
        reason: String,
    },
    /// It was removed before its handshake finished.
    #[error("subscription {0} was removed before it attached")]
    Removed(SubscriptionId),
}

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
}

/// Messages of the pulling agent.
pub enum AgentMsg {
    /// Attach a subscription (from `subscribe` or a re-attach); answers with
    /// the concrete start position once its cursor is in place.
    Attach {
        /// The stored subscription.
        subscription: Subscription,
        /// Where the answer goes.
        reply: RpcReplyPort<Result<StartPosition, AttachError>>,
    },
    /// Stop serving a subscription; its in-flight handshake and delivery are
    /// revoked.
    Detach {
        /// Its stream.
        stream: StreamId,
        /// The subscription.
        id: SubscriptionId,
        /// Answered once detached.
        reply: RpcReplyPort<()>,
    },
    /// Begin the ordered shutdown; answered when it is complete.
    Shutdown(Option<RpcReplyPort<()>>),
    /// Report status.
    GetStatus(RpcReplyPort<AgentStatus>),
    /// Internal bookkeeping (timers and task completions).
    Internal(Internal),
}

/// An internal message of the agent (not constructible outside the crate).
pub struct Internal(pub(crate) state::InternalMsg);

impl ractor::Message for AgentMsg {}

/// The pulling agent actor.
pub struct PullingAgent;

/// Spawn arguments of a pulling agent.
pub struct AgentArgs {
    /// The queue to pull.
    pub queue: QueueId,
    /// Shared services.
    pub services: Arc<AgentServices>,
}

impl Actor for PullingAgent {
    type Msg = AgentMsg;
    type State = Agent;
    type Arguments = AgentArgs;

    async fn pre_start(&self, myself: ActorRef<AgentMsg>, args: AgentArgs) -> Result<Agent, ActorProcessingErr> {
        let agent = Agent::start(myself, args.queue, args.services).await?;
        Ok(agent)
    }

    async fn handle(
        &self,
        _myself: ActorRef<AgentMsg>,
        msg: AgentMsg,
        agent: &mut Agent,
    ) -> Result<(), ActorProcessingErr> {
        let span = agent.span.clone();
        let entered = span.enter();
        match msg {
            AgentMsg::Attach { subscription, reply } => agent.attach(subscription, reply),
            AgentMsg::Detach { stream, id, reply } => {
                agent.detach(&stream, id);
                let _ = reply.send(());
            }
            AgentMsg::Shutdown(reply) => agent.begin_shutdown(reply),
            AgentMsg::GetStatus(reply) => {
                let _ = reply.send(agent.status());
            }
            AgentMsg::Internal(Internal(msg)) => agent.handle_internal(msg)?,
        }
        drop(entered);
        if agent.shutdown.is_some() {
            // Boxed: its large future is built only while shutting down, not
            // moved around for every message.
            Box::pin(agent.finish_shutdown_if_idle().instrument(span)).await;
        }
        Ok(())
    }
}
