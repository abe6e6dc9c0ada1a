//! `GET /readyz`: whether this node should be sent traffic now (a load
//! balancer's or Kubernetes' readiness probe). Ready when it is not
//! stopping, its run log store and its queues' backend answer, its archiver
//! stores, and every check its runner added holds (a cluster node's
//! membership is fresh). `200 {"ready": true, "checks": {name: "ok", …}}`,
//! or `503` with the same body naming what is wrong. Each problem is a fixed
//! message, with an incident id where the cause is a backend error (logged
//! in full under it). Liveness (`GET /healthz`, `edge::router`) is only
//! "the process answers".

use std::sync::Arc;
use std::time::Duration;

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use parking_lot::Mutex;
use serde_json::{Map, Value, json};

use super::{LogEdge, incident};

/// How long one probe of a backend may take before it counts as down.
const PROBE_TIMEOUT: Duration = Duration::from_secs(2);

/// A check a runner adds (see [`LogEdge::ready_also`]): why the node is not
/// ready, or `None`.
pub(crate) type ReadyCheck = Arc<dyn Fn() -> Option<String> + Send + Sync>;

/// The checks added to the built-in ones.
#[derive(Default)]
pub(crate) struct Readiness {
    extra: Mutex<Vec<(String, ReadyCheck)>>,
}

impl LogEdge {
    /// Adds `check`, named `name`, to what `GET /readyz` asks.
    pub fn ready_also(&self, name: impl Into<String>, check: impl Fn() -> Option<String> + Send + Sync + 'static) {
        self.readiness.extra.lock().push((name.into(), Arc::new(check)));
    }
}

async fn probe<E: std::fmt::Display>(what: &str, call: impl Future<Output = Result<(), E>>) -> Option<String> {
    match tokio::time::timeout(PROBE_TIMEOUT, call).await {
        Ok(Ok(())) => None,
        Ok(Err(error)) => Some(incident::report(&format!("{what} does not answer"), &error)),
        Err(_) => Some(format!("{what} did not answer within {PROBE_TIMEOUT:?}")),
    }
}

pub(crate) async fn ready(State(edge): State<Arc<LogEdge>>) -> Response {
    let stopping = edge.tasks.token().is_cancelled().then(|| "the node is stopping".to_string());
    let store = probe("the run log store", async { edge.store.pipelines(1).await.map(drop) }).await;
    let queues = probe("the queues' backend", edge.node.adapter().health()).await;
    let archiver = edge.archiver.stuck().map(|(failing, error)| {
        let what = format!("the archiver's writes have failed for {} s", failing.as_secs());
        incident::report(&what, &error)
    });
    let mut checks = vec![("stopping".to_string(), stopping), ("run log store".into(), store)];
    checks.extend([("queues".to_string(), queues), ("archiver".into(), archiver)]);
    let extra: Vec<(String, ReadyCheck)> = edge.readiness.extra.lock().clone();
    checks.extend(extra.into_iter().map(|(name, check)| (name, check())));
    let ready = checks.iter().all(|(_, problem)| problem.is_none());
    let shown: Map<String, Value> =
        checks.into_iter().map(|(name, problem)| (name, Value::from(problem.unwrap_or_else(|| "ok".into())))).collect();
    let status = if ready { StatusCode::OK } else { StatusCode::SERVICE_UNAVAILABLE };
    (status, Json(json!({ "ready": ready, "checks": shown }))).into_response()
}
