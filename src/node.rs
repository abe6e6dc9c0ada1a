//! A node: everything one member of a cluster runs, assembled, with the API
//! users call: `produce`, `subscribe`, `resume`, `unsubscribe`, and the agent
//! commands.
//!
//! A node owns a pulling manager, a balancer driver (membership changes ->
//! ownership notifications with increasing sequence numbers), the directory
//! of its local consumers, and its tasks ([`Tasks`]): the driver, the
//! manager's helpers and its agents' pumps and work lanes are all spawned
//! there, and [`Node::shutdown`] returns only once they ended (or
//! [`STOP_TIMEOUT`] passed). Several nodes may share one process
//! (the in-process cluster, the demo): they share the adapter's store, the
//! membership, the leases and the agent directory they are given.
//!
//! The parts: `builder.rs` assembles a node; `subscribe.rs` is the
//! subscribe, resume and unsubscribe path (and the attach to the queue's
//! agent, here or on its lease holder); `commands.rs` is the agent
//! commands and the node's end (graceful shutdown, crash); `ownership.rs`,
//! `remote.rs` and `tracked.rs` are the balancer drivers, the attach on
//! another node of a cluster, and an explicit subscription's consumer-side
//! handle. The server's (features `edge` and `cluster`): `serving.rs`
//! answers the other nodes and purges departed ones' subscriptions;
//! `rejoin.rs` attaches this node's subscriptions again after its member
//! record lapsed.
//!
//! [`STOP_TIMEOUT`]: crate::tasks::STOP_TIMEOUT

mod builder;
mod commands;
mod ownership;
#[cfg(all(feature = "edge", feature = "cluster"))]
mod rejoin;
mod remote;
#[cfg(all(feature = "edge", feature = "cluster"))]
mod serving;
mod subscribe;
mod tracked;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use ractor::ActorRef;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::agent::AttachError;
use crate::cluster::{ClusterTransport, Membership, QueueLeases};
use crate::config::Config;
use crate::manager::{AgentDirectory, ManagerMsg};
use crate::pubsub::{LocalConsumers, PubSubError, PubSubStore, StartPosition, SubscriptionId};
use crate::queue::{QueueAdapter, QueueError, QueueMapper};
use crate::stream::{Event, NodeId, SequenceToken, StreamId};
use crate::tasks::Tasks;
pub(crate) use builder::AgentsHook;
pub use builder::NodeBuilder;
use tracked::TrackedConsumer;

/// A node could not start or answer.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum NodeError {
    /// The adapter could not be built.
    #[error("queue adapter: {0}")]
    Queue(#[from] QueueError),
    /// The manager actor could not start.
    #[error("could not start the pulling manager: {0}")]
    Spawn(#[source] ractor::SpawnErr),
    /// The manager did not answer in time.
    #[error("the pulling manager did not answer within {0:?}")]
    ManagerTimeout(Duration),
    /// The manager stopped before it answered.
    #[error("the pulling manager stopped before it answered")]
    ManagerGone,
    /// The message could not reach the manager (why).
    #[error("the pulling manager could not be reached: {0}")]
    Manager(String),
}

/// `subscribe`, `resume` or `unsubscribe` failed; nothing is left behind.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SubscribeError {
    /// The pub-sub store or the consumer directory refused.
    #[error(transparent)]
    PubSub(#[from] PubSubError),
    /// The queue's agent refused the subscription.
    #[error(transparent)]
    Attach(#[from] AttachError),
    /// The queue's lease holder (another node) refused the attach.
    #[error("node {node} refused to attach the subscription: {message}")]
    Remote {
        /// The lease holder.
        node: NodeId,
        /// What its agent said.
        message: String,
        /// The oldest position the queue still holds, when the start asked
        /// for is older than its retention.
        oldest: Option<SequenceToken>,
    },
    /// No agent attached it in time (no node pulls the queue, or agents are
    /// stopped).
    #[error("no pulling agent attached subscription {id} to {stream} within {timeout:?} (are agents running?)")]
    NotAttached {
        /// The subscription.
        id: SubscriptionId,
        /// Its stream.
        stream: StreamId,
        /// How long it waited.
        timeout: Duration,
    },
}

impl SubscribeError {
    /// When the start asked for is older than what the queue still holds
    /// (its retention passed it): the oldest position it holds, where a
    /// subscription can start instead (`StartPosition::At`).
    pub fn oldest_held(&self) -> Option<SequenceToken> {
        match self {
            SubscribeError::Attach(AttachError::CannotStart { oldest, .. }) | SubscribeError::Remote { oldest, .. } => {
                *oldest
            }
            _ => None,
        }
    }
}

/// An explicit subscription, as `subscribe` returns it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SubscriptionHandle {
    /// Its id (use it to resume after a restart).
    pub id: SubscriptionId,
    /// Its stream.
    pub stream: StreamId,
    /// Where it actually starts (`Latest` resolved to a token).
    pub start: StartPosition,
}
/// One running node.
pub struct Node {
    id: NodeId,
    config: Config,
    adapter: Arc<dyn QueueAdapter>,
    mapper: QueueMapper,
    store: Arc<dyn PubSubStore>,
    consumers: Arc<LocalConsumers>,
    tracked: Mutex<HashMap<SubscriptionId, Arc<TrackedConsumer>>>,
    agents: Arc<AgentDirectory>,
    leases: Arc<dyn QueueLeases>,
    transport: Option<Arc<dyn ClusterTransport>>,
    on_agents: Option<AgentsHook>,
    membership: Membership,
    manager: ActorRef<ManagerMsg>,
    manager_task: Mutex<Option<JoinHandle<()>>>,
    driver: JoinHandle<()>,
    /// Every task the node spawns; its token stops the ownership driver.
    tasks: Tasks,
    kill: CancellationToken,
}

impl Node {
    /// This node's id.
    pub fn id(&self) -> &NodeId {
        &self.id
    }

    /// The queue mapper.
    pub fn mapper(&self) -> QueueMapper {
        self.mapper
    }

    /// The adapter (producers may use it directly).
    pub fn adapter(&self) -> &Arc<dyn QueueAdapter> {
        &self.adapter
    }

    /// The pulling manager (for tests; the node's own methods are the API).
    #[cfg(test)]
    pub(crate) fn manager(&self) -> &ActorRef<ManagerMsg> {
        &self.manager
    }

    /// Appends events to a stream (waits while its queue is full) as one
    /// batch, and answers its token once the adapter holds it.
    ///
    /// ```
    /// # use std::sync::Arc;
    /// # use tailrace::adapters::memory::{MemoryAdapterFactory, MemoryOptions};
    /// # use tailrace::Node;
    /// use tailrace::{Event, NodeId, StreamId};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let node = Node::builder(NodeId::new("n1"), Arc::new(MemoryAdapterFactory::new(4, MemoryOptions::default()))).start().await?;
    /// let stream = StreamId::new("logs", "etl.daily/run-7");
    /// let first = node.produce(&stream, vec![Event::new("e-1", "starting")]).await?;
    /// let second = node.produce(&stream, vec![Event::new("e-2", "done")]).await?;
    /// assert!(first < second, "tokens grow in enqueue order");
    /// # node.shutdown().await?;
    /// # Ok(()) }
    /// ```
    pub async fn produce(&self, stream: &StreamId, events: Vec<Event>) -> Result<SequenceToken, QueueError> {
        self.adapter.enqueue(stream, events).await
    }

    /// The transport to the other processes, if the node has one.
    #[cfg(all(feature = "edge", feature = "cluster"))]
    pub(crate) fn cluster_transport(&self) -> Option<&Arc<dyn ClusterTransport>> {
        self.transport.as_ref()
    }
}
