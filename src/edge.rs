//! The HTTP edge of a node: `GET /metrics` (Prometheus text format),
//! `GET /healthz` (live), `GET /readyz` (ready: `edge/health.rs`), and the log path: ingest, the SSE live tail (one tailer
//! per watched run, shared by its viewers), the paginated and download
//! endpoints, listings, search and run diffs, a pipeline's runs live (one
//! store reader per watched pipeline, shared by its watchers) and the viewer page at `/`; the admin API
//! (`/api/v1/admin/`, the server's). `docs/sse.md` is the protocol. With `[edge.tls]`
//! every connection is HTTPS (`edge/https.rs`).
//!
//! Every task the edge spawns (one per accepted connection, one per tailer
//! and per tailer's unsubscribe, one per watched pipeline's run feed) is tracked; the server task returned by
//! [`serve`] and [`LogEdge::serve`] ends only once they all ended, or 2 s
//! after its stop.

// The server's (its agents across a cluster).
#[cfg(feature = "cluster")]
mod admin;
mod auth;
mod body;
mod diff;
mod direct;
mod failures;
mod fanout;
mod frames;
mod groups;
mod health;
mod https;
mod incident;
mod ingest;
mod normalise;
mod pages;
mod problem;
mod reads;
mod runs_feed;
mod runs_stream;
mod search;
mod sse;
mod tailer;
mod viewer;
mod window;
mod written;

use std::net::SocketAddr;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use axum::Router;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::header;
use axum::response::{Html, IntoResponse};
use axum::routing::{get, post, put};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use tokio_util::sync::CancellationToken;

#[cfg(feature = "cluster")]
pub(crate) use admin::{ClusterView, admin_router};
pub use auth::check_listen;
pub use https::check_tls;

use crate::archive::{Archiver, RunKey, RunLogReader};
use crate::config::{EdgeOptions, LogStreamSettings};
use crate::node::Node;
use crate::tasks::{STOP_TIMEOUT, Tasks};
use crate::telemetry;

/// The edge could not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EdgeError {
    /// The listen address could not be bound.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The server stopped with an error.
    #[error("HTTP server failed: {0}")]
    Serve(#[source] std::io::Error),
    /// The metrics recorder could not be installed.
    #[error("cannot install the metrics recorder: {0}")]
    Metrics(#[source] metrics_exporter_prometheus::BuildError),
    /// `[edge.tls]` names files that do not make a TLS configuration.
    #[error(transparent)]
    Tls(#[from] crate::tls::TlsError),
}

static METRICS: OnceLock<PrometheusHandle> = OnceLock::new();

/// How often a running server does the installed recorder's upkeep.
const METRICS_UPKEEP: Duration = Duration::from_secs(5);

/// Installs the process-wide Prometheus recorder once and returns its
/// handle (later calls return the same handle). Its periodic upkeep
/// (draining histogram samples) is done by every running server (see
/// [`serve`]), and by each render of `/metrics`; nothing else is spawned.
pub fn install_metrics() -> Result<PrometheusHandle, EdgeError> {
    if let Some(handle) = METRICS.get() {
        return Ok(handle.clone());
    }
    let handle = PrometheusBuilder::new().install_recorder().map_err(EdgeError::Metrics)?;
    let handle = METRICS.get_or_init(|| handle).clone();
    telemetry::describe();
    Ok(handle)
}

/// The installed recorder's upkeep, if one is installed.
fn metrics_upkeep() {
    if let Some(handle) = METRICS.get() {
        handle.run_upkeep();
    }
}

/// The edge's routes.
pub fn router(metrics: PrometheusHandle) -> Router {
    let live = || async { axum::Json(serde_json::json!({ "live": true })) };
    Router::new().route("/metrics", get(render_metrics)).route("/healthz", get(live)).with_state(metrics)
}

async fn render_metrics(State(metrics): State<PrometheusHandle>) -> impl IntoResponse {
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], metrics.render())
}

/// The log path of one node: its tailers, its SSE connections, and what
/// they read from.
pub struct LogEdge {
    node: Arc<Node>,
    /// The edge only reads the store: the archiver is its one writer.
    store: RunLogReader,
    options: EdgeOptions,
    settings: Arc<LogStreamSettings>,
    runs: Arc<tailer::Runs>,
    /// One reader of the run log store per watched pipeline.
    run_feeds: Arc<runs_feed::Feeds>,
    registry: Arc<viewer::Registry>,
    /// Generated event ids: `{id_prefix}-{n}`.
    id_prefix: String,
    next_id: AtomicU64,
    /// Every task of the edge; its token (a child of the `stop` given to
    /// [`LogEdge::new`]) ends the streams and tailers.
    tasks: Tasks,
    store_reads: AtomicU64,
    auth: Arc<auth::Auth>,
    /// Bytes of ingest bodies held now (`edge.max_total_body_bytes`).
    bodies: body::Budget,
    /// The last container this edge wrote to each run, for its own reads.
    written: written::Written,
    /// The run log store's one writer (its health, for `/readyz`).
    archiver: Arc<Archiver>,
    readiness: health::Readiness,
    /// Diffs running now (`edge.max_concurrent_diffs`).
    diffs: tokio::sync::Semaphore,
}

impl LogEdge {
    /// The log path on `node`, whose runs `archiver` (the implicit
    /// subscriber of `logs` on `node`) stores. Its streams, tailers and
    /// viewers stop with `stop` (or when a server of this edge stops,
    /// see [`LogEdge::serve`]).
    pub fn new(node: Arc<Node>, archiver: Arc<Archiver>, options: EdgeOptions, stop: CancellationToken) -> Arc<Self> {
        let tasks = Tasks::new(stop.child_token());
        let settings = Arc::new(options.log_stream.clone());
        let registry = viewer::Registry::new(settings.max_active_connections);
        let store = archiver.reader();
        let runs = tailer::Runs::new(node.clone(), store.clone(), settings.clone(), tasks.clone());
        let run_feeds = runs_feed::Feeds::new(store.clone(), options.runs_stream.clone(), tasks.clone());
        let id_prefix = format!("{}-{:08x}", node.id(), rand::random::<u32>());
        let auth = auth::Auth::new(&options.auth);
        let bodies = body::Budget::new(options.max_total_body_bytes);
        let written = written::Written::new(options.max_written_runs);
        let diffs = tokio::sync::Semaphore::new(options.max_concurrent_diffs.min(tokio::sync::Semaphore::MAX_PERMITS));
        Arc::new(Self {
            node,
            store,
            options,
            settings,
            runs,
            run_feeds,
            registry,
            id_prefix,
            next_id: AtomicU64::new(1),
            tasks,
            store_reads: AtomicU64::new(0),
            auth,
            bodies,
            written,
            archiver,
            readiness: health::Readiness::default(),
            diffs,
        })
    }

    /// Waits until the store holds the last write this edge accepted for
    /// `run` (at most `edge.status_wait_seconds`); at once if it remembers
    /// none. Whether that write is stored.
    async fn caught_up(&self, run: &RunKey) -> bool {
        match self.written.last(run) {
            Some(token) => {
                self.store.wait_stored(run, token, crate::config::secs(self.options.status_wait_seconds)).await
            }
            None => true,
        }
    }

    /// Runs tailed now (each holds one subscription, however many viewers).
    pub fn active_runs(&self) -> usize {
        self.runs.len()
    }

    /// Pipelines whose runs this node watches now (one store reader each).
    pub fn watched_pipelines(&self) -> usize {
        self.run_feeds.len()
    }

    /// SSE connections open now.
    pub fn active_connections(&self) -> usize {
        self.registry.len()
    }

    /// Pages read from the run log store so far (catch-up, paginated and
    /// download endpoints).
    pub fn store_reads(&self) -> u64 {
        self.store_reads.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Tasks of the edge running now (connections, tailers and their
    /// unsubscribes); none once its server task ended
    /// in time.
    pub fn tracked_tasks(&self) -> usize {
        self.tasks.len()
    }

    /// Binds `addr` and serves the log path (see [`LogEdge::router`]) and
    /// `extra` routes until `shutdown` fires. Log streams opened by a
    /// connection's first request are written straight on the socket.
    /// With `[edge.tls]` every connection is HTTPS (both paths); its files
    /// are read before anything is bound.
    ///
    /// When `shutdown` fires the edge stops as a whole: its streams end,
    /// its tailers end and give their subscriptions back, and the returned
    /// server task ends once every task of the edge ended, or 2 s after
    /// the connections closed (what still runs then is logged and left
    /// behind).
    pub async fn serve(
        self: &Arc<Self>,
        addr: SocketAddr,
        extra: Router,
        shutdown: CancellationToken,
    ) -> Result<(SocketAddr, tokio::task::JoinHandle<Result<(), EdgeError>>), EdgeError> {
        serve_with(addr, self.router().merge(extra), Some(self.clone()), shutdown).await
    }

    fn count_read(&self) {
        self.store_reads.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        metrics::counter!(telemetry::EDGE_STORE_READS).increment(1);
    }

    /// The routes of the log path, behind bearer-token auth, and the viewer
    /// page at `/`.
    pub fn router(self: &Arc<Self>) -> Router {
        let auth = self.auth.clone();
        let api = Router::new()
            .route("/api/v1/logs/{fqn}/runs/{run}/lines", post(ingest::post_lines).get(reads::lines))
            .route("/api/v1/logs/{fqn}/runs/{run}/failures", get(failures::failures))
            .route("/api/v1/logs/{fqn}/runs/{run}/status", put(ingest::put_status))
            .route("/api/v1/logs/pipelines", get(pages::pipelines))
            .route("/api/v1/logs/{fqn}/runs", get(pages::runs))
            // Before `runs/{run}` (a static segment wins over a name).
            .route("/api/v1/logs/{fqn}/runs/stream", get(runs_stream::stream))
            .route("/api/v1/logs/{fqn}/runs/{run}", get(search::run_info))
            .route("/api/v1/logs/{fqn}/runs/{run}/search", get(search::search))
            .route("/api/v1/logs/{fqn}/runs/{run}/times", get(search::times))
            .route("/api/v1/logs/{fqn}/runs/{run}/diff", get(diff::diff))
            .route("/api/v1/services/ingestionPipelines/logs/{fqn}/stream/{run}", get(sse::stream))
            .route("/api/v1/services/ingestionPipelines/logs/{fqn}/last", get(pages::last))
            .route("/api/v1/services/ingestionPipelines/logs/{fqn}/last/download", get(pages::download))
            .layer(DefaultBodyLimit::max(self.options.max_body_bytes))
            .layer(axum::middleware::from_fn_with_state(auth, auth::require))
            .with_state(self.clone());
        let probes = Router::new().route("/readyz", get(health::ready)).with_state(self.clone());
        api.route("/", get(|| async { Html(viewer_page()) })).merge(probes)
    }
}

/// The viewer page, one self-contained file (no build step: it is part of
/// the binary), put together once from `edge/page/`: its style and its
/// script (the parts, in order, in one scope) inlined, with the search rules it shares with the server (what an error,
/// a warning and a group marker are).
fn viewer_page() -> &'static str {
    static PAGE: OnceLock<String> = OnceLock::new();
    PAGE.get_or_init(|| {
        let rules = serde_json::json!({
            "error": search::ERROR_PATTERN,
            "warning": search::WARNING_PATTERN,
            "group": search::GROUP_PATTERN,
        });
        let script = [
            include_str!("edge/page/core.js"),
            include_str!("edge/page/ansi.js"),
            include_str!("edge/page/lines.js"),
            include_str!("edge/page/render.js"),
            include_str!("edge/page/search.js"),
            include_str!("edge/page/runs.js"),
            include_str!("edge/page/compare.js"),
            include_str!("edge/page/stream.js"),
        ]
        .concat()
        .replace("/*RULES*/", &rules.to_string());
        include_str!("edge/page/index.html")
            .replace("/*STYLE*/", include_str!("edge/page/style.css"))
            .replace("/*SCRIPT*/", &script)
    })
}

/// Binds `addr` and serves `router` until `shutdown` fires. Returns the
/// bound address (useful with port 0) and the server task, which owns the
/// connections' tasks and ends once they ended (open connections are given
/// a graceful close), or 2 s after that. While it runs it also
/// does the upkeep of the recorder [`install_metrics`] installed.
pub async fn serve(
    addr: SocketAddr,
    router: Router,
    shutdown: CancellationToken,
) -> Result<(SocketAddr, tokio::task::JoinHandle<Result<(), EdgeError>>), EdgeError> {
    serve_with(addr, router, None, shutdown).await
}

async fn serve_with(
    addr: SocketAddr,
    router: Router,
    logs: Option<Arc<LogEdge>>,
    shutdown: CancellationToken,
) -> Result<(SocketAddr, tokio::task::JoinHandle<Result<(), EdgeError>>), EdgeError> {
    let tls = match &logs {
        Some(edge) => https::acceptor(&edge.options)?,
        None => None,
    };
    let listener = tokio::net::TcpListener::bind(addr).await.map_err(|source| EdgeError::Bind { addr, source })?;
    let bound = listener.local_addr().map_err(|source| EdgeError::Bind { addr, source })?;
    // The edge's tasks, or the connections' own when there is no log path.
    let tasks = match &logs {
        Some(edge) => edge.tasks.clone(),
        None => Tasks::new(shutdown.child_token()),
    };
    // The server task is the owner of `tasks`: the caller holds its handle.
    let task = tokio::spawn(async move {
        direct::accept_loop(listener, tls, router, logs, shutdown, &tasks).await;
        tasks.stop(&format!("edge on {bound}"), STOP_TIMEOUT).await;
        Ok(())
    });
    Ok((bound, task))
}
