//! Fixtures of the unit tests that drive a pulling agent or the pulling
//! manager through their messages (`agent/tests.rs`, `manager/tests.rs`,
//! `manager/keeper/tests.rs`): a node whose agent directory the test
//! reads, a scripted adapter, a gated pub-sub store, recording consumers.
//!
//! The adapter and the store are the test kit's too (`crate::fixtures`);
//! these few helpers stay here because they reach the agents' messages,
//! which are not part of the API the kit sees.

pub(crate) use crate::fixtures::recorder::{Recorder, RecordingFactory, eventually};
use crate::fixtures::store;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use ractor::ActorRef;

use crate::agent::{AgentMsg, AgentStatus};
use crate::config::Config;
use crate::manager::AgentDirectory;
use crate::node::{Node, NodeBuilder};
use crate::pubsub::{ConsumerError, ConsumerFactory, Delivery, DeliveryOutcome, ImplicitSubscriptions, StreamConsumer};
use crate::queue::QueueAdapterFactory;
use crate::retry::Backoff;
use crate::stream::{NodeId, QueueId, StreamId};

pub(crate) fn stream(ns: &str, key: &str) -> StreamId {
    StreamId::new(ns, key)
}

/// Test settings: quick retries, quick polls.
pub(crate) fn quick_config() -> Config {
    let mut config = Config::default();
    config.agent.delivery_backoff = Backoff::fixed(Duration::from_millis(10));
    config.agent.reader_backoff = Backoff::fixed(Duration::from_millis(10));
    config.agent.max_delivery_time = Duration::from_secs(2);
    config.agent.delivery_attempt_timeout = Duration::from_secs(1);
    config.checkpoint.persist_interval = Duration::ZERO;
    config.pubsub.attach_timeout = Duration::from_secs(5);
    config
}

/// An implicit factory handing out one shared consumer.
struct SharedFactory {
    name: String,
    consumer: Arc<dyn StreamConsumer>,
}

impl ConsumerFactory for SharedFactory {
    fn name(&self) -> &str {
        &self.name
    }

    fn create(&self, _: &StreamId) -> Arc<dyn StreamConsumer> {
        self.consumer.clone()
    }
}

/// `implicit` with namespace `ns` bound to `consumer`, named `name`.
pub(crate) fn bind(
    implicit: ImplicitSubscriptions,
    ns: &str,
    name: &str,
    consumer: Arc<dyn StreamConsumer>,
) -> ImplicitSubscriptions {
    implicit.bind(ns, Arc::new(SharedFactory { name: name.into(), consumer }))
}

/// Implicit subscriptions of namespace `ns` recording into `recorder`.
pub(crate) fn implicit(ns: &str, recorder: &Recorder) -> ImplicitSubscriptions {
    ImplicitSubscriptions::new()
        .bind(ns, Arc::new(RecordingFactory { name: "recorder".into(), recorder: recorder.clone() }))
}

/// A consumer whose deliveries wait for a permit each; counts arrivals.
#[derive(Clone)]
pub(crate) struct GatedConsumer {
    recorder: Recorder,
    pub(crate) gate: Arc<tokio::sync::Semaphore>,
    pub(crate) entered: Arc<std::sync::atomic::AtomicUsize>,
}

impl GatedConsumer {
    pub(crate) fn new() -> Self {
        Self { recorder: Recorder::new(), gate: Arc::new(tokio::sync::Semaphore::new(0)), entered: Default::default() }
    }

    pub(crate) fn entered(&self) -> usize {
        self.entered.load(std::sync::atomic::Ordering::SeqCst)
    }

    pub(crate) fn open(&self) {
        self.gate.add_permits(1_000_000);
    }
}

#[async_trait]
impl StreamConsumer for GatedConsumer {
    async fn deliver(&self, delivery: &Delivery) -> Result<DeliveryOutcome, ConsumerError> {
        self.entered.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        if let Ok(permit) = self.gate.acquire().await {
            permit.forget();
        }
        self.recorder.record(delivery);
        Ok(DeliveryOutcome::Continue)
    }
}

/// One node over a factory, with its agent directory and store exposed.
pub(crate) struct TestNode {
    pub(crate) node: Node,
    agents: Arc<AgentDirectory>,
    pub(crate) store: Arc<store::GatedStore>,
}

impl TestNode {
    pub(crate) async fn start(
        factory: Arc<dyn QueueAdapterFactory>,
        config: Config,
        implicit: ImplicitSubscriptions,
    ) -> Self {
        Self::start_with(factory, config, implicit, |b| b).await
    }

    pub(crate) async fn start_with(
        factory: Arc<dyn QueueAdapterFactory>,
        config: Config,
        implicit: ImplicitSubscriptions,
        extra: impl FnOnce(NodeBuilder) -> NodeBuilder,
    ) -> Self {
        let agents = Arc::new(AgentDirectory::new());
        let store = store::GatedStore::new();
        let builder = Node::builder(NodeId::new("test"), factory)
            .config(config)
            .implicit(implicit)
            .agents(agents.clone())
            .store(store.clone());
        let node = extra(builder).start().await.unwrap();
        Self { node, agents, store }
    }

    /// The agent of `queue`, once it runs.
    pub(crate) async fn agent(&self, queue: u32) -> ActorRef<AgentMsg> {
        for _ in 0..2_000 {
            if let Some(agent) = self.agents.get(QueueId(queue)) {
                return agent;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        panic!("no agent for queue {queue}");
    }

    pub(crate) async fn status(&self, queue: u32) -> AgentStatus {
        let agent = self.agent(queue).await;
        ractor::call!(agent, AgentMsg::GetStatus).unwrap()
    }
}
