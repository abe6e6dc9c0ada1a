//! Building a node: the builder's settings and defaults, and `start`, which
//! assembles the manager, the ownership driver and the services its agents
//! share.

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::Mutex;
use ractor::Actor;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::{Node, NodeError, ownership};
use crate::agent::AgentServices;
use crate::balancer::BalancerKind;
use crate::cluster::{ClusterTransport, Membership, MemoryLeases, QueueLeases};
use crate::config::Config;
use crate::failure::{DeadLetterSink, DefaultFailureHandler, FailureHandler, LogDeadLetters};
use crate::manager::{AgentDirectory, HeldLeases, ManagerArgs, PullingManager};
use crate::pubsub::{
    ConsumerDirectory, ConsumerResolver, ImplicitSubscriptions, LocalConsumers, MemoryPubSubStore, PubSubStore,
};
use crate::queue::QueueAdapterFactory;
use crate::stream::NodeId;
use crate::tasks::Tasks;

/// Builds a node. Defaults make a standalone node: its own membership
/// (itself), leases, agent directory and in-memory pub-sub store.
pub struct NodeBuilder {
    id: NodeId,
    factory: Arc<dyn QueueAdapterFactory>,
    config: Config,
    store: Option<Arc<dyn PubSubStore>>,
    implicit: ImplicitSubscriptions,
    failure: Option<Arc<dyn FailureHandler>>,
    dead_letters: Arc<dyn DeadLetterSink>,
    membership: Option<Membership>,
    leases: Option<Arc<dyn QueueLeases>>,
    agents: Option<Arc<AgentDirectory>>,
    remote: Option<Arc<dyn ConsumerResolver>>,
    transport: Option<Arc<dyn ClusterTransport>>,
    consumers: Option<Arc<LocalConsumers>>,
    on_agents: Option<AgentsHook>,
    kill: CancellationToken,
}

/// Told whether the agents run after `start_agents`/`stop_agents` (a
/// multi-process node publishes it in its member record).
pub(crate) type AgentsHook = Arc<dyn Fn(bool) + Send + Sync>;

impl NodeBuilder {
    /// The settings (agents, cache, checkpoints, balancer…).
    pub fn config(mut self, config: Config) -> Self {
        self.config = config;
        self
    }

    /// Where explicit subscriptions are kept (share it between nodes).
    pub fn store(mut self, store: Arc<dyn PubSubStore>) -> Self {
        self.store = Some(store);
        self
    }

    /// Namespaces bound to consumer factories.
    pub fn implicit(mut self, implicit: ImplicitSubscriptions) -> Self {
        self.implicit = implicit;
        self
    }

    /// The failure handler (default: skip, or fault if configured).
    pub fn failure_handler(mut self, handler: Arc<dyn FailureHandler>) -> Self {
        self.failure = Some(handler);
        self
    }

    /// Where skipped batches go (default: the log).
    pub fn dead_letters(mut self, sink: Arc<dyn DeadLetterSink>) -> Self {
        self.dead_letters = sink;
        self
    }

    /// The cluster's membership view.
    pub fn membership(mut self, membership: Membership) -> Self {
        self.membership = Some(membership);
        self
    }

    /// The cluster's queue leases.
    pub fn leases(mut self, leases: Arc<dyn QueueLeases>) -> Self {
        self.leases = Some(leases);
        self
    }

    /// Where running agents are published.
    pub(crate) fn agents(mut self, agents: Arc<AgentDirectory>) -> Self {
        self.agents = Some(agents);
        self
    }

    /// Reaches consumers on other nodes.
    pub(crate) fn remote_consumers(mut self, resolver: Arc<dyn ConsumerResolver>) -> Self {
        self.remote = Some(resolver);
        self
    }

    /// The transport to the other processes of a cluster: it reaches their
    /// consumers, and attaches subscriptions on the queue's lease holder.
    #[cfg(all(feature = "edge", feature = "cluster"))]
    pub(crate) fn transport(mut self, transport: Arc<dyn ClusterTransport>) -> Self {
        self.remote = Some(transport.clone());
        self.transport = Some(transport);
        self
    }

    /// Called with `true` before the agents start and `false` before they
    /// stop.
    #[cfg(all(feature = "edge", feature = "cluster"))]
    pub(crate) fn on_agents_switched(mut self, hook: AgentsHook) -> Self {
        self.on_agents = Some(hook);
        self
    }

    /// This node's consumer directory (to share it with a transport).
    pub(crate) fn local_consumers(mut self, consumers: Arc<LocalConsumers>) -> Self {
        self.consumers = Some(consumers);
        self
    }

    /// Starts the manager and the balancer driver, then joins membership.
    pub async fn start(self) -> Result<Node, NodeError> {
        let config = self.config;
        let adapter = self.factory.create_adapter().await?;
        let checkpointer = self.factory.create_checkpointer().await?;
        let mapper = self.factory.queue_mapper();
        let store = self.store.unwrap_or_else(|| Arc::new(MemoryPubSubStore::new(config.pubsub.max_subscriptions)));
        let consumers = self
            .consumers
            .unwrap_or_else(|| Arc::new(LocalConsumers::new(self.id.clone(), config.pubsub.max_local_consumers)));
        let directory = ConsumerDirectory::new(consumers.clone(), self.remote);
        let tasks = Tasks::new(CancellationToken::new());
        let failure = self
            .failure
            .unwrap_or_else(|| Arc::new(DefaultFailureHandler { fault_on_error: config.failure.fault_on_error }));
        let services = Arc::new(AgentServices {
            node: self.id.clone(),
            adapter: adapter.clone(),
            checkpointer,
            cache: self.factory.cache_options(),
            checkpoint: config.checkpoint.clone(),
            options: config.agent.clone(),
            store: store.clone(),
            implicit: self.implicit,
            consumers: Arc::new(directory),
            failure,
            dead_letters: self.dead_letters,
            kill: self.kill.clone(),
            tasks: tasks.clone(),
            lease_token: None,
        });
        let membership = self.membership.unwrap_or_default();
        let leases = self.leases.unwrap_or_else(|| Arc::new(MemoryLeases::new()));
        let agents = self.agents.unwrap_or_default();
        let held = Arc::new(HeldLeases::default());
        let (manager, manager_task) = Actor::spawn(
            None,
            PullingManager,
            ManagerArgs {
                services,
                leases: leases.clone(),
                agents: agents.clone(),
                options: config.manager.clone(),
                lease: config.lease.clone(),
                held: held.clone(),
            },
        )
        .await
        .map_err(NodeError::Spawn)?;
        let driver = match config.balancer_kind() {
            BalancerKind::Lease => tasks.spawn(
                "ownership driver",
                ownership::drive_leases(ownership::LeaseDriver {
                    me: self.id.clone(),
                    mapper,
                    membership: membership.clone(),
                    leases: leases.clone(),
                    held,
                    manager: manager.clone(),
                    period: config.lease.acquire,
                    stop: tasks.token().clone(),
                })
                .instrument(tracing::info_span!("lease_balancer", node = %self.id)),
            ),
            balancer => tasks.spawn(
                "ownership driver",
                ownership::drive_ownership(
                    self.id.clone(),
                    balancer,
                    mapper,
                    membership.clone(),
                    manager.clone(),
                    tasks.token().clone(),
                ),
            ),
        };
        membership.join(self.id.clone());
        Ok(Node {
            id: self.id,
            config,
            adapter,
            mapper,
            store,
            consumers,
            tracked: Mutex::new(HashMap::new()),
            agents,
            leases,
            transport: self.transport,
            on_agents: self.on_agents,
            membership,
            manager,
            manager_task: Mutex::new(Some(manager_task)),
            driver,
            tasks,
            kill: self.kill,
        })
    }
}

impl Node {
    /// Starts building node `id` over the queues of `factory`.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use tailrace::adapters::memory::{MemoryAdapterFactory, MemoryOptions};
    /// use tailrace::Node;
    /// use tailrace::NodeId;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let queues = Arc::new(MemoryAdapterFactory::new(4, MemoryOptions::default()));
    /// let node = Node::builder(NodeId::new("n1"), queues).start().await?;
    /// assert_eq!(node.id(), &NodeId::new("n1"));
    /// node.shutdown().await?;
    /// # Ok(()) }
    /// ```
    pub fn builder(id: NodeId, factory: Arc<dyn QueueAdapterFactory>) -> NodeBuilder {
        NodeBuilder {
            id,
            factory,
            config: Config::default(),
            store: None,
            implicit: ImplicitSubscriptions::new(),
            failure: None,
            dead_letters: Arc::new(LogDeadLetters),
            membership: None,
            leases: None,
            agents: None,
            remote: None,
            transport: None,
            consumers: None,
            on_agents: None,
            kill: CancellationToken::new(),
        }
    }
}
