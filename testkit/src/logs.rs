//! A node with its log path over real HTTP on loopback: memory queues, a
//! run log store in a temporary directory (optionally wrapped to fail or
//! count), the archiver, and an SSE client that reads raw frames.
#![allow(dead_code)]

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use futures::StreamExt;
use serde_json::Value;
use tailrace::Node;
use tailrace::adapters::memory::{MemoryAdapterFactory, MemoryOptions};
use tailrace::archive::{
    Append, Archiver, FileRunLogStore, LOGS_NAMESPACE, PruneReport, RetentionPolicy, RunInfo, RunKey, RunLogStore,
    RunState, RunSummary, StoreError,
};
use tailrace::config::{Config, EdgeOptions, EdgeTls, LogStreamSettings, RunsStreamSettings};
use tailrace::edge::LogEdge;
use tailrace::pubsub::ImplicitSubscriptions;
use tailrace::{NodeId, SequenceToken};
use tokio_util::sync::CancellationToken;

/// Short limits for tests (seconds may be fractional).
pub fn quick_settings() -> LogStreamSettings {
    LogStreamSettings {
        poll_seconds: 0.05,
        finish_grace_seconds: 0.3,
        unknown_run_grace_seconds: 1.0,
        run_probe_seconds: 0.1,
        max_idle_seconds: 30.0,
        heartbeat_seconds: 30.0,
        resume_wait_seconds: 0.5,
        ..LogStreamSettings::default()
    }
}

/// Fast reads of watched pipelines' runs, for tests.
pub fn quick_runs_stream() -> RunsStreamSettings {
    RunsStreamSettings { poll_seconds: 0.05, ..RunsStreamSettings::default() }
}

/// Wraps the file store: counts status lookups, reads and run listings, and fails the
/// next `fail_info` lookups / `fail_reads` reads; each append takes
/// `append_delay_ms` longer (a slow archiver).
pub struct ProbeStore {
    inner: FileRunLogStore,
    pub append_delay_ms: std::sync::atomic::AtomicU64,
    pub infos: AtomicUsize,
    pub reads: AtomicUsize,
    /// Calls of `runs` (a pipeline's run listing).
    pub listings: AtomicUsize,
    pub fail_info: AtomicUsize,
    pub fail_reads: AtomicUsize,
}

impl ProbeStore {
    /// The file store in `dir`, counting nothing yet.
    fn new(dir: std::path::PathBuf) -> Arc<Self> {
        Arc::new(ProbeStore {
            inner: FileRunLogStore::open(dir, false).unwrap(),
            append_delay_ms: Default::default(),
            infos: AtomicUsize::new(0),
            reads: AtomicUsize::new(0),
            listings: AtomicUsize::new(0),
            fail_info: AtomicUsize::new(0),
            fail_reads: AtomicUsize::new(0),
        })
    }

    async fn slow_append(&self) {
        let delay = self.append_delay_ms.load(Ordering::SeqCst);
        if delay > 0 {
            tokio::time::sleep(Duration::from_millis(delay)).await;
        }
    }
}

fn take(counter: &AtomicUsize) -> bool {
    counter.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1)).is_ok()
}

#[async_trait]
impl RunLogStore for ProbeStore {
    async fn append(
        &self,
        run: &RunKey,
        token: SequenceToken,
        lines: &[&str],
        how: Append,
    ) -> Result<bool, StoreError> {
        self.slow_append().await;
        self.inner.append(run, token, lines, how).await
    }
    async fn set_state(&self, run: &RunKey, state: RunState) -> Result<(), StoreError> {
        self.inner.set_state(run, state).await
    }
    async fn info(&self, run: &RunKey) -> Result<Option<RunInfo>, StoreError> {
        self.infos.fetch_add(1, Ordering::SeqCst);
        if take(&self.fail_info) {
            return Err(StoreError::Backend("injected lookup failure".into()));
        }
        self.inner.info(run).await
    }
    /// Counted and failed as `info` (it is the tailer's lookup).
    async fn info_and_recent(&self, run: &RunKey) -> Result<Option<(RunInfo, Vec<u64>)>, StoreError> {
        self.infos.fetch_add(1, Ordering::SeqCst);
        if take(&self.fail_info) {
            return Err(StoreError::Backend("injected lookup failure".into()));
        }
        self.inner.info_and_recent(run).await
    }
    async fn times(&self, run: &RunKey, from: u64, to: u64) -> Result<Vec<(u64, u64)>, StoreError> {
        self.inner.times(run, from, to).await
    }
    async fn wait_stored(&self, run: &RunKey, token: SequenceToken, within: Duration) -> bool {
        self.inner.wait_stored(run, token, within).await
    }
    async fn read(&self, run: &RunKey, from: u64, lines: usize, bytes: usize) -> Result<Vec<String>, StoreError> {
        self.reads.fetch_add(1, Ordering::SeqCst);
        if take(&self.fail_reads) {
            return Err(StoreError::Backend("injected read failure".into()));
        }
        self.inner.read(run, from, lines, bytes).await
    }
    async fn pipeline_exists(&self, fqn: &str) -> Result<bool, StoreError> {
        self.inner.pipeline_exists(fqn).await
    }
    async fn pipelines(&self, limit: usize) -> Result<Vec<String>, StoreError> {
        self.inner.pipelines(limit).await
    }
    async fn runs(&self, fqn: &str, limit: usize) -> Result<Vec<RunSummary>, StoreError> {
        self.listings.fetch_add(1, Ordering::SeqCst);
        self.inner.runs(fqn, limit).await
    }
    async fn prune(&self, policy: &RetentionPolicy, now_ms: u64) -> Result<PruneReport, StoreError> {
        self.inner.prune(policy, now_ms).await
    }
}

pub struct LogServer {
    pub base: String,
    pub edge: Arc<LogEdge>,
    pub node: Arc<Node>,
    pub store: Arc<ProbeStore>,
    pub client: reqwest::Client,
    stop: CancellationToken,
    /// The store's directory (shared by the nodes [`LogServer::beside`] it).
    dir: Arc<tempfile::TempDir>,
}

impl LogServer {
    pub async fn start(settings: LogStreamSettings) -> Self {
        let options = EdgeOptions { log_stream: settings, runs_stream: quick_runs_stream(), ..EdgeOptions::default() };
        Self::start_with(options, super::quick_config()).await
    }

    pub async fn start_with(options: EdgeOptions, config: Config) -> Self {
        Self::start_on(options, config, MemoryOptions::default()).await
    }

    /// Like [`LogServer::start_with`], on memory queues set up as `memory`.
    pub async fn start_on(options: EdgeOptions, config: Config, memory: MemoryOptions) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let store = ProbeStore::new(dir.path().join("runs"));
        Self::node_on("edge", store, options, config, memory, Arc::new(dir)).await
    }

    /// Like [`LogServer::start_with`], serving HTTPS (`[edge.tls]`) with a
    /// certificate for 127.0.0.1 from a new authority (made with `openssl`,
    /// see [`super::certs`]): `base` is `https://…`, `client` trusts that
    /// authority only, and [`LogServer::ca`] names its file.
    pub async fn start_tls(mut options: EdgeOptions, config: Config) -> Self {
        let dir = tempfile::tempdir().unwrap();
        super::certs::authority(dir.path(), "ca", &["edge"]);
        options.tls = Some(EdgeTls { cert: dir.path().join("edge.pem"), key: dir.path().join("edge.key") });
        let store = ProbeStore::new(dir.path().join("runs"));
        let ca = dir.path().join("ca.pem");
        let mut server = Self::node_on("edge", store, options, config, MemoryOptions::default(), Arc::new(dir)).await;
        server.base = server.base.replacen("http://", "https://", 1);
        let certs = reqwest::Certificate::from_pem_bundle(&std::fs::read(&ca).unwrap()).unwrap();
        server.client = super::http().tls_certs_only(certs).build().unwrap();
        server
    }

    /// The authority's certificate (PEM) that a server started with
    /// [`LogServer::start_tls`] is trusted by.
    pub fn ca(&self) -> std::path::PathBuf {
        self.dir.path().join("ca.pem")
    }

    /// The address it listens on.
    pub fn address(&self) -> std::net::SocketAddr {
        let host = self.base.split_once("://").map_or(self.base.as_str(), |(_, host)| host);
        host.parse().unwrap()
    }

    /// Another node with its own queues, archiver and edge, on this
    /// server's run log store (as the nodes of a cluster share one Redis
    /// store), with `options`.
    pub async fn beside(&self, options: EdgeOptions) -> Self {
        let memory = MemoryOptions::default();
        Self::node_on("edge-2", self.store.clone(), options, super::quick_config(), memory, self.dir.clone()).await
    }

    async fn node_on(
        name: &str,
        store: Arc<ProbeStore>,
        options: EdgeOptions,
        config: Config,
        memory: MemoryOptions,
        dir: Arc<tempfile::TempDir>,
    ) -> Self {
        let factory = Arc::new(MemoryAdapterFactory::new(2, memory));
        let archiver = Archiver::new(store.clone());
        let implicit = ImplicitSubscriptions::new().bind(LOGS_NAMESPACE, archiver.clone());
        let node = Arc::new(
            Node::builder(NodeId::new(name), factory).config(config).implicit(implicit).start().await.unwrap(),
        );
        let stop = CancellationToken::new();
        let edge = LogEdge::new(node.clone(), archiver, options, stop.clone());
        let (bound, _server) =
            edge.serve("127.0.0.1:0".parse().unwrap(), axum::Router::new(), stop.clone()).await.unwrap();
        Self { base: format!("http://{bound}"), edge, node, store, client: super::http_client(), stop, dir }
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    pub fn stream_url(&self, fqn: &str, run: &str, after: Option<&str>) -> String {
        let mut url = self.url(&format!("/api/v1/services/ingestionPipelines/logs/{fqn}/stream/{run}"));
        if let Some(after) = after {
            url.push_str(&format!("?after={after}"));
        }
        url
    }

    /// Posts `body` as text/plain lines; panics unless 202.
    pub async fn lines(&self, fqn: &str, run: &str, body: &str) {
        let response = self.post(fqn, run, body).await;
        assert_eq!(response.status(), 202, "{:?}", response.text().await);
    }

    pub async fn post(&self, fqn: &str, run: &str, body: &str) -> reqwest::Response {
        self.client
            .post(self.url(&format!("/api/v1/logs/{fqn}/runs/{run}/lines")))
            .header("content-type", "text/plain")
            .body(body.to_string())
            .send()
            .await
            .unwrap()
    }

    pub async fn state(&self, fqn: &str, run: &str, state: &str) {
        let response = self
            .client
            .put(self.url(&format!("/api/v1/logs/{fqn}/runs/{run}/status")))
            .json(&serde_json::json!({ "state": state }))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200, "{:?}", response.text().await);
    }

    /// Waits until the store holds `lines` lines of the run.
    pub async fn archived(&self, fqn: &str, run: &str, lines: u64) {
        let key = RunKey::new(fqn, run).unwrap();
        let store = self.store.clone();
        for _ in 0..1_000 {
            if store.inner.info(&key).await.unwrap().is_some_and(|i| i.lines >= lines) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        panic!("{fqn}/{run} never reached {lines} archived lines");
    }

    pub async fn store_has_pipeline(&self, fqn: &str) -> bool {
        self.store.inner.pipeline_exists(fqn).await.unwrap()
    }

    /// A client that asks for the run's stream and never reads, with a
    /// tiny receive window.
    pub async fn stalled_viewer(&self, fqn: &str, run: &str) -> tokio::net::TcpStream {
        use tokio::io::AsyncWriteExt;
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.set_recv_buffer_size(4096).unwrap();
        let address = self.address();
        let mut stalled = socket.connect(address).await.unwrap();
        let path = format!("/api/v1/services/ingestionPipelines/logs/{fqn}/stream/{run}");
        let request = format!("GET {path} HTTP/1.1\r\nhost: {address}\r\n\r\n");
        stalled.write_all(request.as_bytes()).await.unwrap();
        stalled
    }

    pub async fn open(&self, fqn: &str, run: &str, after: Option<&str>) -> Sse {
        Sse::open(&self.client, &self.stream_url(fqn, run, after)).await
    }
}

impl Drop for LogServer {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// An SSE response read frame by frame (raw, so the exact bytes can be
/// checked).
pub struct Sse {
    pub status: u16,
    pub content_type: String,
    /// The `connection` header (`close` on the direct path).
    pub connection: String,
    body: std::pin::Pin<Box<dyn futures::Stream<Item = reqwest::Result<bytes::Bytes>> + Send>>,
    buffer: Vec<u8>,
    ended: bool,
}

/// How long a test waits for the next frame.
pub const FRAME_WAIT: Duration = Duration::from_secs(10);

impl Sse {
    pub async fn open(client: &reqwest::Client, url: &str) -> Self {
        Self::from(client.get(url).send().await.unwrap())
    }

    /// As [`Sse::open`], or the error if the request fails (a node that
    /// just died, a refused connection).
    pub async fn try_open(client: &reqwest::Client, url: &str) -> reqwest::Result<Self> {
        Ok(Self::from(client.get(url).send().await?))
    }

    pub async fn open_with(client: &reqwest::Client, url: &str, token: &str) -> Self {
        Self::from(client.get(url).bearer_auth(token).send().await.unwrap())
    }

    fn from(response: reqwest::Response) -> Self {
        let status = response.status().as_u16();
        let content_type =
            response.headers().get("content-type").and_then(|v| v.to_str().ok()).unwrap_or_default().to_string();
        let connection =
            response.headers().get("connection").and_then(|v| v.to_str().ok()).unwrap_or_default().to_string();
        Self {
            status,
            content_type,
            connection,
            body: Box::pin(response.bytes_stream()),
            buffer: Vec::new(),
            ended: false,
        }
    }

    /// The next raw frame (without its blank line), `None` at the end of
    /// the stream; panics after `wait`.
    pub async fn frame_within(&mut self, wait: Duration) -> Option<String> {
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            if let Some(at) = self.buffer.windows(2).position(|w| w == b"\n\n") {
                let frame: Vec<u8> = self.buffer.drain(..at + 2).collect();
                return Some(String::from_utf8(frame[..at].to_vec()).unwrap());
            }
            if self.ended {
                assert!(
                    self.buffer.is_empty(),
                    "a partial frame at the end: {:?}",
                    String::from_utf8_lossy(&self.buffer)
                );
                return None;
            }
            match tokio::time::timeout_at(deadline, self.body.next()).await {
                Ok(Some(Ok(chunk))) => self.buffer.extend_from_slice(&chunk),
                Ok(Some(Err(_))) | Ok(None) => self.ended = true,
                Err(_) => panic!("no frame within {wait:?}; buffered: {:?}", String::from_utf8_lossy(&self.buffer)),
            }
        }
    }

    /// The next event (heartbeats skipped), parsed.
    pub async fn event(&mut self) -> Option<Value> {
        self.event_within(FRAME_WAIT).await
    }

    /// The next event (heartbeats skipped), parsed; panics if no frame
    /// comes within `wait`.
    pub async fn event_within(&mut self, wait: Duration) -> Option<Value> {
        loop {
            let frame = self.frame_within(wait).await?;
            if frame.starts_with(':') {
                continue;
            }
            let data = frame.strip_prefix("data: ").unwrap_or_else(|| panic!("not a data frame: {frame:?}"));
            assert!(!data.contains('\n'), "one data line per frame: {frame:?}");
            return Some(serde_json::from_str(data).unwrap());
        }
    }

    /// Events until they carry at least `count` lines in all; panics if
    /// the stream ends first.
    pub async fn lines(&mut self, count: usize) -> Vec<Value> {
        let mut out: Vec<Value> = Vec::new();
        while out.iter().filter_map(|e| e["logs"].as_str()).map(|l| l.lines().count()).sum::<usize>() < count {
            match self.event().await {
                Some(event) => out.push(event),
                None => panic!("the stream ended after {out:?}, before {count} lines"),
            }
        }
        out
    }

    /// Events until the stream ends.
    pub async fn rest(&mut self) -> Vec<Value> {
        let mut out = Vec::new();
        while let Some(event) = self.event().await {
            out.push(event);
        }
        out
    }

    /// Whether any frame (heartbeats included) arrives within `wait`.
    pub async fn quiet_for(&mut self, wait: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + wait;
        if self.buffer.windows(2).any(|w| w == b"\n\n") {
            return false;
        }
        match tokio::time::timeout_at(deadline, self.body.next()).await {
            Err(_) => true,
            Ok(Some(Ok(chunk))) => {
                self.buffer.extend_from_slice(&chunk);
                false
            }
            Ok(_) => {
                self.ended = true;
                false
            }
        }
    }
}

/// The `logs` text of a series of events, joined by newlines.
pub fn text(events: &[Value]) -> String {
    events
        .iter()
        .filter(|e| e["eventType"] == "logs")
        .map(|e| e["logs"].as_str().unwrap())
        .collect::<Vec<_>>()
        .join("\n")
}
