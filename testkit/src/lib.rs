//! tailrace's test kit (not published): one implementation of each
//! fixture the tests and the benches share. Here: a recording consumer, a
//! bounded eventually-check, small constructors, and where the `tailrace`
//! binary is; in the modules, private Redis servers and Redis Clusters, a
//! Kafka-wire broker, headless Chromium, node processes and the clients of
//! a cluster's life, fault proxies, and file systems that cut power or run
//! out of room.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use tailrace::pubsub::{
    ConsumerError, ConsumerFactory, Delivery, DeliveryOutcome, ImplicitSubscriptions, StreamConsumer,
};
use tailrace::{Event, EventId, NodeId, QueueId, StreamId};

/// The `tailrace` binary the process tests run: `TAILRACE_TEST_BIN` (a
/// build of another commit, a mutant), or the one cargo built beside the
/// running test (`target/<profile>/tailrace`: cargo builds it before the
/// tests of the server crate).
pub fn tailrace_bin() -> std::path::PathBuf {
    if let Some(path) = std::env::var_os("TAILRACE_TEST_BIN") {
        return path.into();
    }
    let test = std::env::current_exe().expect("the running test's path");
    // target/<profile>/deps/<test> -> target/<profile>/tailrace
    let dir = test.parent().and_then(|deps| deps.parent()).expect("the test runs from target/<profile>/deps");
    dir.join(format!("tailrace{}", std::env::consts::EXE_SUFFIX))
}

pub use tailrace::fixtures::recorder::{Recorder, RecordingFactory, Seen, eventually};

/// Enqueues `events` of `stream` after `delay`, in a task (a write that
/// comes while a reader waits).
pub fn enqueue_after<A: tailrace::queue::QueueAdapter + ?Sized + 'static>(
    adapter: &Arc<A>,
    stream: &StreamId,
    events: Vec<Event>,
    delay: Duration,
) -> tokio::task::JoinHandle<()> {
    let (adapter, stream) = (adapter.clone(), stream.clone());
    tokio::spawn(async move {
        tokio::time::sleep(delay).await;
        adapter.enqueue(&stream, events).await.unwrap();
    })
}

/// Enqueues `events` as a producer does through an outage: a transient
/// error is retried every 50 ms for at most `within`; any other error, or
/// an outage longer than that, fails the test.
pub async fn enqueue_retrying<A: tailrace::queue::QueueAdapter + ?Sized>(
    adapter: &A,
    stream: &StreamId,
    events: Vec<Event>,
    within: Duration,
) {
    let deadline = tokio::time::Instant::now() + within;
    loop {
        match adapter.enqueue(stream, events.clone()).await {
            Ok(_) => return,
            Err(error) if error.is_transient() && tokio::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(50)).await
            }
            Err(error) => panic!("{error}"),
        }
    }
}

/// Events with ids `{prefix}{i}` and payloads `payload {i}`, for `i` in
/// `range`.
pub fn events(prefix: &str, range: std::ops::Range<u64>) -> Vec<Event> {
    range.map(|i| Event::new(EventId::new(format!("{prefix}{i}")), format!("payload {i}"))).collect()
}

/// The ids `events` would produce.
pub fn ids(prefix: &str, range: std::ops::Range<u64>) -> Vec<String> {
    range.map(|i| format!("{prefix}{i}")).collect()
}

/// The ids of the events in containers a receiver read, in order.
pub fn read_ids(batches: &[Arc<tailrace::BatchContainer>]) -> Vec<String> {
    batches.iter().flat_map(|b| b.events.iter().map(|e| e.id.to_string())).collect()
}

pub fn stream(ns: &str, key: &str) -> StreamId {
    StreamId::new(ns, key)
}

pub mod browser;
pub mod certs;
#[cfg(all(feature = "redis", feature = "edge"))]
pub mod chaos;
#[cfg(feature = "redis")]
pub mod cluster;
pub mod crash;
#[cfg(feature = "redis")]
pub mod kafka_broker;
#[cfg(feature = "redis")]
pub mod life;
#[cfg(feature = "edge")]
pub mod logs;
pub mod powercut;
#[cfg(feature = "redis")]
pub mod redis_cluster;
#[cfg(feature = "redis")]
pub mod redis_server;
pub mod replay;
pub use tailrace::fixtures::{scripted, store};
pub mod tcp_proxy;
pub mod tls_tap;

use tailrace::AgentStatus;
use tailrace::Node;
use tailrace::config::Config;
use tailrace::queue::QueueAdapterFactory;

/// One node over a factory, with its pub-sub store exposed.
pub struct TestNode {
    pub node: Node,
    pub store: Arc<store::GatedStore>,
}

impl TestNode {
    pub async fn start(factory: Arc<dyn QueueAdapterFactory>, config: Config, implicit: ImplicitSubscriptions) -> Self {
        Self::start_with(factory, config, implicit, |b| b).await
    }

    pub async fn start_with(
        factory: Arc<dyn QueueAdapterFactory>,
        config: Config,
        implicit: ImplicitSubscriptions,
        extra: impl FnOnce(tailrace::NodeBuilder) -> tailrace::NodeBuilder,
    ) -> Self {
        let store = store::GatedStore::new();
        let builder =
            Node::builder(NodeId::new("test"), factory).config(config).implicit(implicit).store(store.clone());
        let node = extra(builder).start().await.unwrap();
        Self { node, store }
    }

    /// The status of the agent of `queue`, once it runs (panics after 10 s).
    pub async fn agent(&self, queue: u32) -> AgentStatus {
        for _ in 0..2_000 {
            if let Some(status) = self.node.agent_status(QueueId(queue)).await {
                return status;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        panic!("no agent for queue {queue}");
    }

    /// Polls the agent's status until `done` holds (panics after 10 s).
    pub async fn wait_status(&self, queue: u32, done: impl Fn(&AgentStatus) -> bool) -> AgentStatus {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        loop {
            let status = self.status(queue).await;
            if done(&status) {
                return status;
            }
            assert!(tokio::time::Instant::now() < deadline, "agent status never matched: {status:?}");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// The status of the agent of `queue` (waits for it to run, as
    /// [`TestNode::agent`]).
    pub async fn status(&self, queue: u32) -> AgentStatus {
        self.agent(queue).await
    }
}

/// Test settings: quick retries, quick polls.
pub fn quick_config() -> Config {
    let mut config = Config::default();
    config.agent.delivery_backoff = tailrace::config::Backoff::fixed(Duration::from_millis(10));
    config.agent.reader_backoff = tailrace::config::Backoff::fixed(Duration::from_millis(10));
    config.agent.max_delivery_time = Duration::from_secs(2);
    config.agent.delivery_attempt_timeout = Duration::from_secs(1);
    config.checkpoint.persist_interval = Duration::ZERO;
    config.pubsub.attach_timeout = Duration::from_secs(5);
    config
}

/// Implicit subscriptions of namespace `ns` recording into `recorder`.
pub fn implicit(ns: &str, recorder: &Recorder) -> ImplicitSubscriptions {
    ImplicitSubscriptions::new()
        .bind(ns, Arc::new(RecordingFactory { name: "recorder".into(), recorder: recorder.clone() }))
}

/// A consumer whose deliveries wait for a permit each; counts arrivals.
#[derive(Clone)]
pub struct GatedConsumer {
    pub recorder: Recorder,
    pub gate: Arc<tokio::sync::Semaphore>,
    pub entered: Arc<std::sync::atomic::AtomicUsize>,
}

impl Default for GatedConsumer {
    fn default() -> Self {
        Self::new()
    }
}

impl GatedConsumer {
    pub fn new() -> Self {
        Self { recorder: Recorder::new(), gate: Arc::new(tokio::sync::Semaphore::new(0)), entered: Default::default() }
    }

    pub fn entered(&self) -> usize {
        self.entered.load(std::sync::atomic::Ordering::SeqCst)
    }

    pub fn open(&self) {
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

/// An implicit factory handing out one shared consumer.
pub struct SharedFactory {
    pub name: String,
    pub consumer: Arc<dyn StreamConsumer>,
}

impl ConsumerFactory for SharedFactory {
    fn name(&self) -> &str {
        &self.name
    }

    fn create(&self, _: &StreamId) -> Arc<dyn StreamConsumer> {
        self.consumer.clone()
    }
}

pub fn bind(
    implicit: ImplicitSubscriptions,
    ns: &str,
    name: &str,
    consumer: Arc<dyn StreamConsumer>,
) -> ImplicitSubscriptions {
    implicit.bind(ns, Arc::new(SharedFactory { name: name.into(), consumer }))
}

/// An HTTP client builder: ring is made the process's TLS provider first
/// (reqwest builds its TLS from the process default, and panics without).
pub fn http() -> reqwest::ClientBuilder {
    tailrace::tls::use_ring_by_default();
    reqwest::Client::builder()
}

/// An HTTP client with the defaults (see [`http`]).
pub fn http_client() -> reqwest::Client {
    http().build().unwrap()
}

/// A free loopback port, never the same twice in one test binary: the
/// tests of a binary run at once, and the kernel may hand a port that was
/// just released to the next `bind(0)`. Two servers on one port would
/// have the second fail to bind while its test talks to the first.
pub fn free_port() -> u16 {
    static HANDED_OUT: Mutex<std::collections::BTreeSet<u16>> = Mutex::new(std::collections::BTreeSet::new());
    loop {
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        if HANDED_OUT.lock().unwrap().insert(port) {
            return port;
        }
    }
}

/// Copies the directory tree `from` into `to` (which exists): files,
/// empty ones included, and folders.
pub fn copy_tree(from: &std::path::Path, to: &std::path::Path) {
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            std::fs::create_dir_all(&target).unwrap();
            copy_tree(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), &target).unwrap();
        }
    }
}
