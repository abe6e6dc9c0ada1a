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

mod ownership;
mod remote;
mod tracked;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use ractor::rpc::CallResult;
use ractor::{Actor, ActorRef};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::agent::{AgentMsg, AgentServices, AttachError};
use crate::balancer::BalancerKind;
use crate::cluster::{ClusterTransport, Membership, MemoryLeases, NodeId, QueueLeases};
use crate::config::Config;
use crate::failure::{DeadLetterSink, DefaultFailureHandler, FailureHandler, LogDeadLetters};
pub use crate::manager::AgentDirectory;
use crate::manager::{ManagerArgs, ManagerMsg, ManagerStatus, PullingManager, RunState};
use crate::pubsub::{
    ConsumerDirectory, ConsumerResolver, ImplicitSubscriptions, LocalConsumers, MemoryPubSubStore, PubSubError,
    PubSubStore, StartPosition, StreamConsumer, Subscription, SubscriptionId, SubscriptionState,
};
use crate::queue::{QueueAdapter, QueueAdapterFactory, QueueError, QueueMapper};
use crate::stream::{Event, SequenceToken, StreamId};
use crate::tasks::{STOP_TIMEOUT, Tasks};
use tracked::TrackedConsumer;

/// How long a call to the pulling manager may take.
const MANAGER_CALL_TIMEOUT: Duration = Duration::from_secs(30);

/// A node could not start or answer.
#[derive(Debug, thiserror::Error)]
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
    /// The message could not reach the manager.
    #[error("the pulling manager could not be reached: {0}")]
    Manager(#[source] ractor::MessagingErr<ManagerMsg>),
}

/// `subscribe`, `resume` or `unsubscribe` failed; nothing is left behind.
#[derive(Debug, thiserror::Error)]
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
/// multi-process node publishes it in its member key).
pub type AgentsHook = Arc<dyn Fn(bool) + Send + Sync>;

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
    pub fn agents(mut self, agents: Arc<AgentDirectory>) -> Self {
        self.agents = Some(agents);
        self
    }

    /// Reaches consumers on other nodes.
    pub fn remote_consumers(mut self, resolver: Arc<dyn ConsumerResolver>) -> Self {
        self.remote = Some(resolver);
        self
    }

    /// The transport to the other processes of a cluster: it reaches their
    /// consumers, and attaches subscriptions on the queue's lease holder.
    pub fn transport(mut self, transport: Arc<dyn ClusterTransport>) -> Self {
        self.remote = Some(transport.clone());
        self.transport = Some(transport);
        self
    }

    /// Called with `true` before the agents start and `false` before they
    /// stop.
    pub fn on_agents_switched(mut self, hook: AgentsHook) -> Self {
        self.on_agents = Some(hook);
        self
    }

    /// This node's consumer directory (to share it with a transport).
    pub fn local_consumers(mut self, consumers: Arc<LocalConsumers>) -> Self {
        self.consumers = Some(consumers);
        self
    }

    /// Cancelled to crash the node (tests).
    pub fn kill_switch(mut self, kill: CancellationToken) -> Self {
        self.kill = kill;
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
        let (manager, manager_task) = Actor::spawn(
            None,
            PullingManager,
            ManagerArgs {
                services,
                leases: leases.clone(),
                agents: agents.clone(),
                options: config.manager.clone(),
                lease: config.lease.clone(),
            },
        )
        .await
        .map_err(NodeError::Spawn)?;
        let driver = match config.balancer {
            BalancerKind::Lease => tasks.spawn(
                "ownership driver",
                ownership::drive_leases(ownership::LeaseDriver {
                    me: self.id.clone(),
                    mapper,
                    membership: membership.clone(),
                    leases: leases.clone(),
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
    /// Starts building node `id` over the queues of `factory`.
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

    /// The pulling manager.
    pub fn manager(&self) -> &ActorRef<ManagerMsg> {
        &self.manager
    }

    /// Appends events to a stream (waits while its queue is full).
    pub async fn produce(&self, stream: &StreamId, events: Vec<Event>) -> Result<SequenceToken, QueueError> {
        self.adapter.enqueue(stream, events).await
    }

    /// Subscribes `consumer` to `stream`. Returns once the queue's agent has
    /// attached it: every event enqueued after this returns is delivered.
    pub async fn subscribe(
        &self,
        stream: &StreamId,
        consumer: Arc<dyn StreamConsumer>,
        start: StartPosition,
    ) -> Result<SubscriptionHandle, SubscribeError> {
        self.bind(SubscriptionId::random(), stream, consumer, start).await
    }

    /// Re-binds a consumer to an existing subscription (after a restart);
    /// the newest handshake wins.
    pub async fn resume(
        &self,
        id: SubscriptionId,
        stream: &StreamId,
        consumer: Arc<dyn StreamConsumer>,
        start: StartPosition,
    ) -> Result<SubscriptionHandle, SubscribeError> {
        self.bind(id, stream, consumer, start).await
    }

    async fn bind(
        &self,
        id: SubscriptionId,
        stream: &StreamId,
        consumer: Arc<dyn StreamConsumer>,
        start: StartPosition,
    ) -> Result<SubscriptionHandle, SubscribeError> {
        // A resume that fails must leave the subscription as it was.
        let previous = self.store.subscriptions(stream).await?.into_iter().find(|s| s.id == id);
        let previous_local = (self.tracked.lock().get(&id).cloned(), self.consumers.get(&id.to_string()));
        let tracked = Arc::new(TrackedConsumer::new(consumer));
        let address = self.consumers.register(id.to_string(), tracked.clone())?;
        self.tracked.lock().insert(id, tracked.clone());
        let mut subscription =
            Subscription { id, stream: stream.clone(), consumer: address, start, state: SubscriptionState::Active };
        let outcome = async {
            self.store.upsert(subscription.clone()).await?;
            let concrete = self.attach(subscription.clone()).await?;
            if concrete != start {
                subscription.start = concrete;
                self.store.upsert(subscription.clone()).await?;
            }
            Ok::<_, SubscribeError>(concrete)
        }
        .await;
        match (outcome, previous) {
            (Ok(start), _) => Ok(SubscriptionHandle { id, stream: stream.clone(), start }),
            (Err(error), None) => {
                self.forget(id, stream).await;
                Err(error)
            }
            (Err(error), Some(previous)) => {
                tracked.close();
                match previous_local {
                    (Some(old_tracked), Some(old_consumer)) => {
                        self.tracked.lock().insert(id, old_tracked);
                        let _ = self.consumers.register(id.to_string(), old_consumer);
                    }
                    _ => {
                        self.tracked.lock().remove(&id);
                        self.consumers.unregister(&id.to_string());
                    }
                }
                let _ = self.store.upsert(previous).await;
                Err(error)
            }
        }
    }

    async fn attach(&self, subscription: Subscription) -> Result<StartPosition, SubscribeError> {
        let queue = self.mapper.queue_for(&subscription.stream);
        let timeout = self.config.pubsub.attach_timeout;
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let remaining = deadline.saturating_duration_since(tokio::time::Instant::now());
            if let Some(agent) = self.agents.get(queue) {
                let sub = subscription.clone();
                let answer = agent.call(|reply| AgentMsg::Attach { subscription: sub, reply }, Some(remaining)).await;
                match answer {
                    Ok(CallResult::Success(Ok(start))) => return Ok(start),
                    Ok(CallResult::Success(Err(AttachError::NotServing(_)))) => {}
                    Ok(CallResult::Success(Err(error))) => return Err(error.into()),
                    Ok(CallResult::Timeout | CallResult::SenderError) | Err(_) => {}
                }
            } else if let Some(attached) = self.attach_on_holder(&subscription, queue).await {
                return attached;
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(SubscribeError::NotAttached { id: subscription.id, stream: subscription.stream, timeout });
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Ends a subscription: removed from the store, detached from its agent
    /// (in-flight work revoked); its consumer gets nothing after this returns.
    pub async fn unsubscribe(&self, handle: &SubscriptionHandle) -> Result<(), SubscribeError> {
        self.store.remove(&handle.stream, handle.id).await?;
        self.forget(handle.id, &handle.stream).await;
        Ok(())
    }

    async fn forget(&self, id: SubscriptionId, stream: &StreamId) {
        if let Some(tracked) = self.tracked.lock().remove(&id) {
            tracked.close();
        }
        self.consumers.unregister(&id.to_string());
        let _ = self.store.remove(stream, id).await;
        if let Some(agent) = self.agents.get(self.mapper.queue_for(stream)) {
            let stream = stream.clone();
            let _ = agent
                .call(|reply| AgentMsg::Detach { stream, id, reply }, Some(self.config.pubsub.attach_timeout))
                .await;
        } else {
            self.detach_on_holder(stream, id).await;
        }
    }

    /// The stored subscriptions of `stream`.
    pub async fn subscriptions(&self, stream: &StreamId) -> Result<Vec<Subscription>, PubSubError> {
        self.store.subscriptions(stream).await
    }

    async fn ask<T: Send + 'static>(
        &self,
        msg: impl FnOnce(ractor::RpcReplyPort<T>) -> ManagerMsg,
    ) -> Result<T, NodeError> {
        match self.manager.call(msg, Some(MANAGER_CALL_TIMEOUT)).await {
            Ok(CallResult::Success(value)) => Ok(value),
            Ok(CallResult::Timeout) => Err(NodeError::ManagerTimeout(MANAGER_CALL_TIMEOUT)),
            Ok(CallResult::SenderError) => Err(NodeError::ManagerGone),
            Err(e) => Err(NodeError::Manager(e)),
        }
    }

    /// `StartAgents`.
    pub async fn start_agents(&self) -> Result<(), NodeError> {
        if let Some(hook) = &self.on_agents {
            hook(true);
        }
        self.ask(|r| ManagerMsg::StartAgents(Some(r))).await
    }

    /// `StopAgents`: returns when every agent finished its ordered shutdown.
    pub async fn stop_agents(&self) -> Result<(), NodeError> {
        if let Some(hook) = &self.on_agents {
            hook(false);
        }
        self.ask(|r| ManagerMsg::StopAgents(Some(r))).await
    }

    /// The transport to the other processes, if the node has one.
    pub fn cluster_transport(&self) -> Option<&Arc<dyn ClusterTransport>> {
        self.transport.as_ref()
    }

    /// `GetAgentsState`.
    pub async fn agents_state(&self) -> Result<RunState, NodeError> {
        self.ask(ManagerMsg::GetAgentsState).await
    }

    /// `GetNumberRunningAgents`.
    pub async fn running_agents(&self) -> Result<usize, NodeError> {
        self.ask(ManagerMsg::GetNumberRunningAgents).await
    }

    /// The manager's queues and counters.
    pub async fn status(&self) -> Result<ManagerStatus, NodeError> {
        self.ask(ManagerMsg::GetStatus).await
    }

    /// Leaves the cluster gracefully: other nodes take the queues over as
    /// this node's agents finish their ordered shutdown. Returns once the
    /// manager stopped and every task of the node ended, or
    /// [`STOP_TIMEOUT`] after the manager stopped (what still runs then is
    /// logged and left behind). The tasks are waited for even if the
    /// manager did not answer.
    pub async fn shutdown(&self) -> Result<(), NodeError> {
        self.membership.leave(&self.id);
        self.tasks.token().cancel();
        let stopped = self.ask(ManagerMsg::Stop).await;
        if stopped.is_ok() {
            let task = self.manager_task.lock().take();
            if let Some(task) = task {
                let _ = task.await;
            }
        }
        self.tasks.stop(self.id.as_str(), STOP_TIMEOUT).await;
        if stopped.is_ok() {
            ownership::release_leftovers(self.leases.as_ref(), self.mapper, &self.id).await;
        }
        stopped
    }

    /// Tasks of this node running now (the ownership driver, the manager's
    /// helpers, the agents' pumps and work lanes); none once
    /// [`Node::shutdown`] returned in time.
    pub fn tracked_tasks(&self) -> usize {
        self.tasks.len()
    }

    /// Dies at once, as with `kill -9`: no handoff, no checkpoint flush, no
    /// ack. Its leases stay held until the cluster drops them.
    pub fn crash(&self) {
        self.kill.cancel();
        self.driver.abort();
        self.manager.kill();
        self.membership.leave(&self.id);
    }
}
