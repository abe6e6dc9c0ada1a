//! The HTTP edge of a node. Today it serves `GET /metrics` (Prometheus text
//! format) and `GET /healthz`; the log path (SSE tails, ingest, the viewer
//! page) and the admin API grow here.

use std::net::SocketAddr;
use std::sync::OnceLock;
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::header;
use axum::response::IntoResponse;
use axum::routing::get;
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use tokio_util::sync::CancellationToken;

/// The edge could not start.
#[derive(Debug, thiserror::Error)]
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
    Metrics(String),
}

static METRICS: OnceLock<PrometheusHandle> = OnceLock::new();

/// Installs the process-wide Prometheus recorder once and returns its
/// handle (later calls return the same handle).
pub fn install_metrics() -> Result<PrometheusHandle, EdgeError> {
    if let Some(handle) = METRICS.get() {
        return Ok(handle.clone());
    }
    let handle = PrometheusBuilder::new().install_recorder().map_err(|e| EdgeError::Metrics(e.to_string()))?;
    let handle = METRICS.get_or_init(|| handle).clone();
    // The recorder needs periodic upkeep (histogram buckets).
    let upkeep = handle.clone();
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(Duration::from_secs(5)).await;
            upkeep.run_upkeep();
        }
    });
    Ok(handle)
}

/// The edge's routes.
pub fn router(metrics: PrometheusHandle) -> Router {
    Router::new().route("/metrics", get(render_metrics)).route("/healthz", get(|| async { "ok\n" })).with_state(metrics)
}

async fn render_metrics(State(metrics): State<PrometheusHandle>) -> impl IntoResponse {
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], metrics.render())
}

/// Binds `addr` and serves `router` until `shutdown` fires. Returns the
/// bound address (useful with port 0) and the server task.
pub async fn serve(
    addr: SocketAddr,
    router: Router,
    shutdown: CancellationToken,
) -> Result<(SocketAddr, tokio::task::JoinHandle<Result<(), EdgeError>>), EdgeError> {
    let listener = tokio::net::TcpListener::bind(addr).await.map_err(|source| EdgeError::Bind { addr, source })?;
    let bound = listener.local_addr().map_err(|source| EdgeError::Bind { addr, source })?;
    let task = tokio::spawn(async move {
        axum::serve(listener, router)
            .with_graceful_shutdown(async move { shutdown.cancelled().await })
            .await
            .map_err(EdgeError::Serve)
    });
    Ok((bound, task))
}
