//! The admin API, under `/api/v1/admin/` and behind the `admin` scope:
//! `GET /api/v1/admin/cluster` answers the cluster as this node sees it:
//! its live members (from Redis membership, or only itself), a summary
//! (queues, how many each node holds, how many are free) and, per queue of
//! the page asked for (`?from=Q&limit=N`, 1 000 by default, `next` says
//! where the next page starts), who holds its lease, with which fencing
//! token, for how much longer, and the queue's stored checkpoint. `GET /api/v1/admin/agents` and `POST
//! /api/v1/admin/agents/start|stop` read and switch this node's agents
//! (`?node=` names another node: the call goes to it over the cluster
//! transport); stopped, the node is published as such in Redis and the
//! other nodes take its queues.

use std::sync::Arc;

use axum::Json;
use axum::Router;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::routing::{get, post};
use serde::{Deserialize, Serialize};
use tokio::time::Instant;

use super::auth;
use super::problem::{ApiError, problem};
use crate::cluster::wire::{AgentsCommand, Reply, Request};
use crate::cluster::{QueueLeases, RedisMembership};
use crate::config::AuthOptions;
use crate::node::Node;
use crate::queue::Checkpointer;
use crate::stream::{NodeId, QueueId};

/// What the admin API reads the cluster from.
pub(crate) struct ClusterView {
    /// This node.
    pub me: NodeId,
    /// Membership in Redis, when the node runs in a multi-process cluster;
    /// otherwise the node reports only itself.
    pub membership: Option<RedisMembership>,
    /// The queue leases the node's manager uses.
    pub leases: Arc<dyn QueueLeases>,
    /// Where the queues' checkpoints are stored.
    pub checkpointer: Arc<dyn Checkpointer>,
    /// Every queue of the cluster (`queues.count`).
    pub queues: Vec<QueueId>,
    /// The node whose agents `…/agents` reads and switches (none: those
    /// routes answer 503).
    pub node: Option<Arc<Node>>,
}

/// One member, as `GET /api/v1/admin/cluster` reports it.
#[derive(Serialize)]
struct MemberJson {
    name: String,
    incarnation: Option<String>,
    advertise: Option<String>,
    /// `started` or `stopped`.
    agents: &'static str,
}

/// One queue, as `GET /api/v1/admin/cluster` reports it.
#[derive(Serialize)]
struct QueueJson {
    queue: u32,
    holder: Option<String>,
    token: Option<u64>,
    expires_in_ms: Option<u64>,
    checkpoint: Option<String>,
}

#[derive(Serialize)]
struct ClusterJson {
    node: String,
    members: Vec<MemberJson>,
    /// Counts over every queue, whatever the page.
    summary: SummaryJson,
    /// The page of queues asked for (`?from`, `?limit`).
    queues: Vec<QueueJson>,
    /// Where the next page starts (`?from=`), if there are more queues.
    next: Option<u32>,
}

/// Every queue, counted: how many, how many each node holds, how many are free.
#[derive(Serialize)]
struct SummaryJson {
    queues: usize,
    held: std::collections::BTreeMap<String, usize>,
    free: usize,
}

/// The page of `GET /api/v1/admin/cluster`: queues from `from` (a queue
/// number), at most `limit` of them.
#[derive(Deserialize)]
struct Page {
    #[serde(default)]
    from: u32,
    #[serde(default = "default_page")]
    limit: usize,
}

/// Queues per page unless `?limit=` says otherwise.
const DEFAULT_PAGE: usize = 1_000;
/// The most queues one page holds.
const MAX_PAGE: usize = 10_000;
/// Checkpoints read at once for one page.
const CHECKPOINT_READS: usize = 64;

fn default_page() -> usize {
    DEFAULT_PAGE
}

/// The admin routes over `view`, behind the `admin` scope of `auth`.
pub(crate) fn admin_router(auth: &AuthOptions, view: ClusterView) -> Router {
    Router::new()
        .route("/api/v1/admin/cluster", get(cluster))
        .route("/api/v1/admin/agents", get(agents))
        .route("/api/v1/admin/agents/start", post(start_agents))
        .route("/api/v1/admin/agents/stop", post(stop_agents))
        .layer(axum::middleware::from_fn_with_state(auth::Auth::new(auth), auth::require_admin))
        .with_state(Arc::new(view))
}

fn unavailable(what: &str, error: impl std::fmt::Display) -> ApiError {
    problem(StatusCode::SERVICE_UNAVAILABLE, format!("cannot read {what}: {error}"))
}

/// `?node=`: which node an agents call is for.
#[derive(Deserialize)]
struct Target {
    node: Option<String>,
}

/// A node's agents, as `…/agents` reports them.
#[derive(Serialize)]
struct AgentsJson {
    node: String,
    /// `initialized`, `agents_started` or `agents_stopped`.
    state: String,
    /// Agents running now.
    running: usize,
}

/// Runs `command` on this node's agents, or on `?node=`'s through the
/// cluster transport.
async fn agents_call(view: &ClusterView, target: Target, command: AgentsCommand) -> Result<Json<AgentsJson>, ApiError> {
    let node =
        view.node.as_ref().ok_or_else(|| problem(StatusCode::SERVICE_UNAVAILABLE, "no node behind this edge"))?;
    match target.node {
        Some(other) if other != view.me.as_str() => forward(node, NodeId::new(other), command).await,
        _ => local_agents(view, node, command).await,
    }
}

async fn local_agents(view: &ClusterView, node: &Node, command: AgentsCommand) -> Result<Json<AgentsJson>, ApiError> {
    match command {
        AgentsCommand::Start => node.start_agents().await.map_err(|e| unavailable("the agents (start)", e))?,
        AgentsCommand::Stop => node.stop_agents().await.map_err(|e| unavailable("the agents (stop)", e))?,
        AgentsCommand::State => {}
    }
    if command != AgentsCommand::State {
        tracing::info!(node = %view.me, ?command, "agents switched by the admin API");
    }
    let state = node.agents_state().await.map_err(|e| unavailable("the agents' state", e))?;
    let running = node.running_agents().await.map_err(|e| unavailable("the running agents", e))?;
    let state = serde_json::to_value(state).ok().and_then(|v| v.as_str().map(str::to_string)).unwrap_or_default();
    Ok(Json(AgentsJson { node: view.me.to_string(), state, running }))
}

/// Another node's agents, through the cluster transport.
async fn forward(node: &Node, other: NodeId, command: AgentsCommand) -> Result<Json<AgentsJson>, ApiError> {
    let Some(transport) = node.cluster_transport() else {
        return Err(problem(
            StatusCode::BAD_REQUEST,
            format!(
                "this edge is node `{}` and reaches no other node; send the call to node `{other}`'s own edge",
                node.id()
            ),
        ));
    };
    if !transport.is_live(&other) {
        return Err(problem(StatusCode::NOT_FOUND, format!("node `{other}` is not a live member of the cluster")));
    }
    match transport.call(&other, Request::Agents { command }).await {
        Ok(Reply::Agents { result: Ok(report) }) => {
            Ok(Json(AgentsJson { node: other.to_string(), state: report.state, running: report.running }))
        }
        Ok(Reply::Agents { result: Err(error) }) => Err(unavailable(&format!("node `{other}`'s agents"), error)),
        Ok(reply) => Err(unavailable(&format!("node `{other}`'s agents"), format!("unexpected reply {reply:?}"))),
        Err(error) => Err(unavailable(&format!("node `{other}`'s agents"), error)),
    }
}

async fn agents(
    State(view): State<Arc<ClusterView>>,
    Query(target): Query<Target>,
) -> Result<Json<AgentsJson>, ApiError> {
    agents_call(&view, target, AgentsCommand::State).await
}

/// Starts the agents; the node publishes it so the others balance queues
/// to it.
async fn start_agents(
    State(view): State<Arc<ClusterView>>,
    Query(target): Query<Target>,
) -> Result<Json<AgentsJson>, ApiError> {
    agents_call(&view, target, AgentsCommand::Start).await
}

/// Stops the agents (each hands its queue over in order); the node
/// publishes it so the others take the queues.
async fn stop_agents(
    State(view): State<Arc<ClusterView>>,
    Query(target): Query<Target>,
) -> Result<Json<AgentsJson>, ApiError> {
    agents_call(&view, target, AgentsCommand::Stop).await
}

async fn cluster(
    State(view): State<Arc<ClusterView>>,
    Query(page): Query<Page>,
) -> Result<Json<ClusterJson>, ApiError> {
    use futures::StreamExt;
    let members = match &view.membership {
        Some(membership) => membership
            .members()
            .await
            .map_err(|e| unavailable("the members", e))?
            .into_iter()
            .map(|m| MemberJson {
                name: m.name.to_string(),
                incarnation: Some(m.incarnation),
                advertise: Some(m.advertise),
                agents: if m.agents_started { "started" } else { "stopped" },
            })
            .collect(),
        None => vec![MemberJson { name: view.me.to_string(), incarnation: None, advertise: None, agents: "started" }],
    };
    let leases = view.leases.holders(&view.queues).await.map_err(|e| unavailable("the queue leases", e))?;
    let mut summary = SummaryJson { queues: view.queues.len(), held: Default::default(), free: 0 };
    for lease in &leases {
        *summary.held.entry(lease.holder.to_string()).or_default() += 1;
    }
    summary.free = view.queues.len().saturating_sub(leases.len());
    let by_queue: std::collections::HashMap<QueueId, &crate::cluster::Lease> =
        leases.iter().map(|l| (l.queue, l)).collect();
    let limit = page.limit.clamp(1, MAX_PAGE);
    let shown: Vec<QueueId> = view.queues.iter().copied().filter(|q| q.0 >= page.from).take(limit + 1).collect();
    let next = shown.get(limit).map(|q| q.0);
    let shown = &shown[..shown.len().min(limit)];
    let loads = shown.iter().copied().map(|queue| {
        let checkpointer = view.checkpointer.clone();
        async move { checkpointer.load(queue).await }
    });
    let checkpoints: Vec<_> = futures::stream::iter(loads).buffered(CHECKPOINT_READS).collect().await;
    let now = Instant::now();
    let mut queues = Vec::with_capacity(shown.len());
    for (queue, checkpoint) in shown.iter().zip(checkpoints) {
        let lease = by_queue.get(queue);
        let checkpoint = checkpoint.map_err(|e| unavailable("a checkpoint", e))?;
        queues.push(QueueJson {
            queue: queue.0,
            holder: lease.map(|l| l.holder.to_string()),
            token: lease.map(|l| l.token),
            expires_in_ms: lease
                .map(|l| u64::try_from(l.expires_at.saturating_duration_since(now).as_millis()).unwrap_or(u64::MAX)),
            checkpoint: checkpoint.map(|token| token.to_string()),
        });
    }
    Ok(Json(ClusterJson { node: view.me.to_string(), members, summary, queues, next }))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use axum::body::Body;
    use axum::http::Request;
    use tower::ServiceExt;

    use super::*;
    use crate::checkpoint::MemoryCheckpointer;
    use crate::cluster::MemoryLeases;
    use crate::config::{Scope, TokenEntry};
    use crate::queue::Fence;
    use crate::stream::SequenceToken;

    const ADMIN: &str = "admin-token-0123456789";
    const READER: &str = "read-token-0123456789";

    async fn view() -> ClusterView {
        let leases = Arc::new(MemoryLeases::new());
        leases.acquire(QueueId(1), &NodeId::new("n2"), Duration::from_secs(8)).await.unwrap();
        let checkpointer = Arc::new(MemoryCheckpointer::new());
        checkpointer.save(QueueId(1), SequenceToken { major: 7, minor: 0 }, Fence::NONE).await.unwrap();
        ClusterView {
            me: NodeId::new("n1"),
            membership: None,
            leases,
            checkpointer,
            queues: vec![QueueId(0), QueueId(1)],
            node: None,
        }
    }

    async fn get(router: Router, token: Option<&str>) -> (StatusCode, serde_json::Value) {
        get_path(router, "/api/v1/admin/cluster", token).await
    }

    async fn get_path(router: Router, path: &str, token: Option<&str>) -> (StatusCode, serde_json::Value) {
        let mut request = Request::get(path);
        if let Some(token) = token {
            request = request.header("authorization", format!("Bearer {token}"));
        }
        let response = router.oneshot(request.body(Body::empty()).unwrap()).await.unwrap();
        let status = response.status();
        let bytes = axum::body::to_bytes(response.into_body(), 1 << 20).await.unwrap();
        (status, serde_json::from_slice(&bytes).unwrap())
    }

    #[tokio::test]
    async fn the_cluster_needs_the_admin_scope_once_tokens_are_configured() {
        let auth = AuthOptions {
            tokens: vec![
                TokenEntry { token: ADMIN.into(), scopes: vec![Scope::Admin] },
                TokenEntry { token: READER.into(), scopes: vec![Scope::Read, Scope::Write] },
            ],
        };
        assert_eq!(get(admin_router(&auth, view().await), None).await.0, StatusCode::UNAUTHORIZED);
        let (status, body) = get(admin_router(&auth, view().await), Some(READER)).await;
        assert_eq!(status, StatusCode::FORBIDDEN);
        assert!(body["message"].as_str().unwrap().contains("admin"), "{body}");
        let (status, body) = get(admin_router(&auth, view().await), Some(ADMIN)).await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(body["members"][0]["name"], "n1");
        assert_eq!(body["queues"][0]["holder"], serde_json::Value::Null);
        assert_eq!(body["queues"][1]["holder"], "n2");
        assert_eq!(body["queues"][1]["token"], 1);
        assert!(body["queues"][1]["expires_in_ms"].as_u64().unwrap() <= 8000);
        assert!(body["queues"][1]["checkpoint"].is_string(), "{body}");
    }

    /// 10 000 queues: every page is bounded, the pages cover each queue
    /// once, and the summary counts all of them whatever the page.
    #[tokio::test]
    async fn ten_thousand_queues_come_in_pages_with_a_summary() {
        let leases = Arc::new(MemoryLeases::new());
        for q in 0..3_000 {
            let node = NodeId::new(if q % 2 == 0 { "n1" } else { "n2" });
            leases.acquire(QueueId(q), &node, Duration::from_secs(60)).await.unwrap();
        }
        let view = ClusterView {
            me: NodeId::new("n1"),
            membership: None,
            leases,
            checkpointer: Arc::new(MemoryCheckpointer::new()),
            queues: (0..10_000).map(QueueId).collect(),
            node: None,
        };
        let router = admin_router(&AuthOptions::default(), view);
        let (status, first) = get_path(router.clone(), "/api/v1/admin/cluster", None).await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(first["queues"].as_array().unwrap().len(), 1_000, "the default page");
        assert_eq!(first["summary"]["queues"], 10_000);
        assert_eq!(
            (first["summary"]["held"]["n1"].clone(), first["summary"]["held"]["n2"].clone()),
            (1_500.into(), 1_500.into())
        );
        assert_eq!(first["summary"]["free"], 7_000);
        let (mut from, mut seen) = (Some(0u64), Vec::new());
        while let Some(start) = from {
            let (_, page) =
                get_path(router.clone(), &format!("/api/v1/admin/cluster?from={start}&limit=4000"), None).await;
            let queues = page["queues"].as_array().unwrap();
            assert!(queues.len() <= 4_000);
            seen.extend(queues.iter().map(|q| q["queue"].as_u64().unwrap()));
            from = page["next"].as_u64();
        }
        assert_eq!(seen, (0..10_000).collect::<Vec<u64>>(), "every queue once, in order");
    }

    #[tokio::test]
    async fn without_tokens_the_cluster_is_open() {
        let (status, body) = get(admin_router(&AuthOptions::default(), view().await), None).await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(body["node"], "n1");
    }

    #[tokio::test]
    async fn agents_calls_need_a_node_behind_the_edge() {
        let router = admin_router(&AuthOptions::default(), view().await);
        let request = Request::post("/api/v1/admin/agents/stop?node=n2").body(Body::empty()).unwrap();
        let response = router.clone().oneshot(request).await.unwrap();
        assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
        let request = Request::get("/api/v1/admin/agents").body(Body::empty()).unwrap();
        assert_eq!(router.oneshot(request).await.unwrap().status(), StatusCode::SERVICE_UNAVAILABLE);
    }
}
