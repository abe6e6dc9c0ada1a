//! The in-process multi-node harness: N nodes in one process sharing a
//! queue store (one adapter factory), a membership view, queue leases, the
//! agent directory and a pub-sub store, so that joins, graceful leaves and
//! crashes can be tested without OS processes.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use parking_lot::Mutex;

use crate::cluster::{Membership, MemoryLeases};

use crate::config::Config;
use crate::failure::{DeadLetterSink, LogDeadLetters};
use crate::manager::AgentDirectory;
use crate::node::{Node, NodeError};
use crate::pubsub::{
    ConsumerAddress, ConsumerError, ConsumerResolver, Delivery, DeliveryOutcome, ImplicitSubscriptions, LocalConsumers,
    MemoryPubSubStore, PubSubStore, StartPosition, StreamConsumer, SubscriptionInfo,
};
use crate::queue::QueueAdapterFactory;
use crate::stream::{NodeId, QueueId};

/// The consumer directories of the nodes of this process, by node.
type NodeTable = Arc<Mutex<HashMap<NodeId, Arc<LocalConsumers>>>>;

/// Reaches the consumers of the other nodes of this process.
#[derive(Default)]
pub(crate) struct InProcessTransport {
    nodes: NodeTable,
}

impl InProcessTransport {
    /// No node yet.
    pub(crate) fn new() -> Self {
        Self::default()
    }

    /// Makes `consumers` reachable.
    pub(crate) fn add_node(&self, consumers: Arc<LocalConsumers>) {
        self.nodes.lock().insert(consumers.node().clone(), consumers);
    }

    /// Makes a node's consumers unreachable (it died).
    pub(crate) fn remove_node(&self, node: &NodeId) {
        self.nodes.lock().remove(node);
    }
}

impl ConsumerResolver for InProcessTransport {
    /// A proxy that looks its consumer up on every call, as a network proxy
    /// reaches it: once the node is gone, calls fail as unavailable.
    fn resolve(&self, address: &ConsumerAddress) -> Option<Arc<dyn StreamConsumer>> {
        self.nodes.lock().get(&address.node)?.get(&address.name)?;
        Some(Arc::new(Proxy { nodes: self.nodes.clone(), address: address.clone() }))
    }
}

/// Calls a consumer of another in-process node through the transport.
struct Proxy {
    nodes: NodeTable,
    address: ConsumerAddress,
}

impl Proxy {
    fn target(&self) -> Result<Arc<dyn StreamConsumer>, ConsumerError> {
        let node = self.nodes.lock().get(&self.address.node).cloned();
        node.and_then(|n| n.get(&self.address.name)).ok_or_else(|| {
            ConsumerError::Unavailable(format!("node {} does not answer for {}", self.address.node, self.address.name))
        })
    }
}

#[async_trait]
impl StreamConsumer for Proxy {
    async fn handshake(&self, subscription: &SubscriptionInfo) -> Result<Option<StartPosition>, ConsumerError> {
        self.target()?.handshake(subscription).await
    }

    async fn deliver(&self, delivery: &Delivery) -> Result<DeliveryOutcome, ConsumerError> {
        self.target()?.deliver(delivery).await
    }

    async fn on_error(&self, subscription: &SubscriptionInfo, error: &str) {
        if let Ok(target) = self.target() {
            target.on_error(subscription, error).await;
        }
    }
}

/// Several nodes in one process over shared queues.
pub struct InProcessCluster {
    factory: Arc<dyn QueueAdapterFactory>,
    config: Config,
    membership: Membership,
    leases: Arc<MemoryLeases>,
    agents: Arc<AgentDirectory>,
    transport: Arc<InProcessTransport>,
    store: Arc<dyn PubSubStore>,
    implicit: ImplicitSubscriptions,
    dead_letters: Arc<dyn DeadLetterSink>,
    nodes: Mutex<BTreeMap<NodeId, Arc<Node>>>,
}

impl InProcessCluster {
    /// An empty cluster over `factory`'s queues, every node using `config`.
    pub fn new(factory: Arc<dyn QueueAdapterFactory>, config: Config) -> Self {
        Self {
            store: Arc::new(MemoryPubSubStore::new(config.pubsub.max_subscriptions)),
            factory,
            config,
            membership: Membership::new(),
            leases: Arc::new(MemoryLeases::new()),
            agents: Arc::new(AgentDirectory::new()),
            transport: Arc::new(InProcessTransport::new()),
            implicit: ImplicitSubscriptions::new(),
            dead_letters: Arc::new(LogDeadLetters),
            nodes: Mutex::new(BTreeMap::new()),
        }
    }

    /// Binds namespaces to consumer factories on every node added later.
    pub fn with_implicit(mut self, implicit: ImplicitSubscriptions) -> Self {
        self.implicit = implicit;
        self
    }

    /// Where every node sends dead letters.
    pub fn with_dead_letters(mut self, sink: Arc<dyn DeadLetterSink>) -> Self {
        self.dead_letters = sink;
        self
    }

    /// Starts a node named `name` and joins it.
    pub async fn add_node(&self, name: &str) -> Result<Arc<Node>, NodeError> {
        let id = NodeId::new(name);
        let consumers = Arc::new(LocalConsumers::new(id.clone(), self.config.pubsub.max_local_consumers));
        self.transport.add_node(consumers.clone());
        let node = Node::builder(id.clone(), self.factory.clone())
            .config(Config { node: crate::config::NodeSection { name: name.into() }, ..self.config.clone() })
            .store(self.store.clone())
            .implicit(self.implicit.clone())
            .dead_letters(self.dead_letters.clone())
            .membership(self.membership.clone())
            .leases(self.leases.clone())
            .agents(self.agents.clone())
            .remote_consumers(self.transport.clone())
            .local_consumers(consumers)
            .start()
            .await?;
        let node = Arc::new(node);
        self.nodes.lock().insert(id, node.clone());
        Ok(node)
    }

    /// The node named `name`, if live.
    pub fn node(&self, name: &str) -> Option<Arc<Node>> {
        self.nodes.lock().get(&NodeId::new(name)).cloned()
    }

    /// Every live node.
    pub fn nodes(&self) -> Vec<Arc<Node>> {
        self.nodes.lock().values().cloned().collect()
    }

    /// Stops a node gracefully (ordered handoff of its queues).
    pub async fn stop_node(&self, name: &str) -> Result<(), NodeError> {
        let node = self.nodes.lock().remove(&NodeId::new(name));
        if let Some(node) = node {
            node.shutdown().await?;
            self.transport.remove_node(node.id());
        }
        Ok(())
    }

    /// Crashes a node: its actors and tasks die at once; its leases are
    /// dropped as if they expired; its consumers become unreachable.
    pub fn kill_node(&self, name: &str) {
        let node = self.nodes.lock().remove(&NodeId::new(name));
        if let Some(node) = node {
            node.crash();
            self.transport.remove_node(node.id());
            self.leases.release_node(node.id());
        }
    }

    /// Closes the shared adapter (seals and releases what it writes) once
    /// every node has stopped.
    pub async fn adapter_close(&self) -> Result<(), crate::queue::QueueError> {
        self.factory.create_adapter().await?.close().await
    }

    /// Which queues each live node runs an agent for now.
    pub async fn running(&self) -> Result<BTreeMap<NodeId, Vec<QueueId>>, NodeError> {
        let mut out = BTreeMap::new();
        for node in self.nodes() {
            out.insert(node.id().clone(), node.status().await?.running);
        }
        Ok(out)
    }

    /// Waits until every queue runs on exactly one live node, as the
    /// balancer says (for the lease balancer: in its fair split); returns
    /// the assignment, or what it last saw.
    pub async fn wait_balanced(&self, timeout: Duration) -> Result<BTreeMap<NodeId, Vec<QueueId>>, String> {
        let deadline = tokio::time::Instant::now() + timeout;
        let all = self.factory.queue_mapper().all_queues();
        loop {
            let running = self.running().await.map_err(|e| e.to_string())?;
            let live: Vec<NodeId> = running.keys().cloned().collect();
            let want = self.config.balancer_kind().assign(&live, &all);
            let balanced = match self.config.balancer_kind() {
                // Which queues a node claims is not computed: check the
                // split, and that every queue runs exactly once.
                crate::balancer::BalancerKind::Lease => {
                    let mut ran: Vec<QueueId> = running.values().flatten().copied().collect();
                    ran.sort();
                    let sizes = |m: &BTreeMap<NodeId, Vec<QueueId>>| m.values().map(Vec::len).collect::<Vec<_>>();
                    ran == all && sizes(&running) == sizes(&want)
                }
                _ => running == want,
            };
            if balanced {
                return Ok(running);
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(format!("not balanced after {timeout:?}: running {running:?}, want {want:?}"));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}
