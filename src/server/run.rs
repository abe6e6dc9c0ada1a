//! A node and its edge from start to stop: the queues' backend, the run log
//! store and its archiver, the node, its membership heartbeat (a member's),
//! the edge with the admin API and the probes, retention; then, on a stop
//! or a lost membership, the ordered leave: out of the others' balancing,
//! every queue handed over, the edge and retention stopped, the queues
//! closed (sealed), the member record deleted.

use std::sync::Arc;

use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::{ServerError, StopOn, failed};
use crate::archive::{Archiver, LOGS_NAMESPACE};
use crate::backend::Backend;
use crate::cluster::{Membership, QueueLeases, RedisMembership, TcpTransport};
use crate::config::Config;
use crate::edge::{ClusterView, LogEdge};
use crate::handoff::DataDirLock;
use crate::node::Node;
use crate::pubsub::ImplicitSubscriptions;
use crate::stream::NodeId;

/// How a node process runs, besides its config.
pub(super) struct Plan {
    /// `serve` or `node`, for what it prints.
    pub command: &'static str,
    /// The queue leases the manager takes.
    pub leases: Arc<dyn QueueLeases>,
    /// The membership view the balancer follows (a node's own otherwise).
    pub view: Option<Membership>,
    /// This process's member record in Redis, if it has one: kept alive while
    /// the node runs, reported by the admin API.
    pub membership: Option<RedisMembership>,
    /// The transport to the other nodes (a member's).
    pub transport: Option<TcpTransport>,
}

/// The given adapter, or the one `[queues] adapter` names.
pub(super) async fn backend(
    config: &Config,
    adapter: Option<Backend>,
    data_dir: Option<&DataDirLock>,
) -> Result<Backend, ServerError> {
    match adapter {
        Some(backend) => Ok(backend),
        None => crate::backend::build(config, data_dir).await.map_err(failed("opening the queues")),
    }
}

/// Runs the node and its edge until `stop` (or until its member key is
/// taken over), then hands every queue over in order and closes the
/// queues. The caller deletes the member record (again) once this returns.
pub(super) async fn run_node(config: &Config, backend: Backend, stop: StopOn, plan: Plan) -> Result<(), ServerError> {
    let metrics = crate::edge::install_metrics().map_err(failed("installing the metrics recorder"))?;
    let store =
        crate::archive::open_store(&config.archive, &config.adapters.redis.access(), config.adapters.redis.wait())
            .await
            .map_err(failed("opening the run log store"))?;
    let adapter = backend.factory.create_adapter().await.map_err(failed("opening the queues"))?;
    let served = serve(config, store, backend, stop, plan, metrics).await;
    // Sealed and given back on every way out: a failed start leaves no
    // writer lock behind.
    let closed = adapter.close().await.map_err(failed("closing the queues"));
    served.and(closed)
}

async fn serve(
    config: &Config,
    store: Arc<dyn crate::archive::RunLogStore>,
    backend: Backend,
    stop_on: StopOn,
    plan: Plan,
    metrics: metrics_exporter_prometheus::PrometheusHandle,
) -> Result<(), ServerError> {
    let me = NodeId::new(config.node.name.clone());
    let archiver = Archiver::new(store.clone());
    let mut implicit = ImplicitSubscriptions::new().bind(LOGS_NAMESPACE, archiver.clone());
    if let Some((namespace, path)) = config.diagnostics.audit() {
        let audit = crate::archive::AuditLog::open(path, me.as_str()).map_err(failed("opening the audit log"))?;
        implicit = implicit.bind(namespace, audit);
    }
    let checkpointer = backend.factory.create_checkpointer().await.map_err(failed("opening the checkpoints"))?;
    let queues = backend.factory.queue_mapper().all_queues();
    let mut builder = Node::builder(me.clone(), backend.factory)
        .config(config.clone())
        .implicit(implicit)
        .leases(plan.leases.clone());
    if let Some(pubsub) = backend.store {
        builder = builder.store(pubsub);
    }
    if let Some(view) = plan.view.clone() {
        builder = builder.membership(view);
    }
    if let Some(transport) = &plan.transport {
        builder = builder.transport(Arc::new(transport.clone()));
    }
    if let Some(membership) = plan.membership.clone() {
        builder = builder.on_agents_switched(Arc::new(move |started| membership.set_agents_started(started)));
    }
    // The member record lives from before the first lease until after the last
    // is released.
    let member_stop = CancellationToken::new();
    let mut heartbeat = plan.membership.clone().map(|membership| {
        let stop = member_stop.clone();
        tokio::spawn(membership.run(stop).instrument(tracing::info_span!("membership", node = %me)))
    });
    let node = Arc::new(builder.start().await.map_err(failed("starting the node"))?);
    if let (Some(transport), Some(membership)) = (&plan.transport, &plan.membership) {
        transport.serve_with(node.remote_calls());
        node.purge_departed(membership.everyone(), config.cluster.purge_after);
        node.reattach_on_rejoin(membership.rejoins(), 2 * config.membership.heartbeat);
    }
    let view = ClusterView {
        me: me.clone(),
        membership: plan.membership.clone(),
        leases: plan.leases.clone(),
        checkpointer,
        queues,
        node: Some(node.clone()),
    };
    let stop = CancellationToken::new();
    let retention = crate::archive::Retention::spawn(store.clone(), config.archive.retention.clone(), stop.clone());
    let logs = LogEdge::new(node.clone(), archiver, config.edge.clone(), stop.clone());
    if let Some(membership) = plan.membership.clone() {
        logs.ready_also("membership", move || membership.stale());
    }
    let routes = crate::edge::router(metrics).merge(crate::edge::admin_router(&config.edge.auth, view));
    let (bound, server) = match logs.serve(config.edge.listen, routes, stop.clone()).await {
        Ok(served) => served,
        Err(error) => {
            stop.cancel();
            node.shutdown().await.map_err(failed("stopping the node"))?;
            let _ = retention.await;
            member_stop.cancel();
            if let Some(task) = heartbeat {
                let _ = task.await;
            }
            return Err(failed(format!("serving the edge on {}", config.edge.listen))(error));
        }
    };
    announce(config, &plan, &node, bound);
    let replaced = async {
        match heartbeat.as_mut() {
            Some(task) => task.await,
            None => std::future::pending().await,
        }
    };
    let mut outcome = Ok(());
    tokio::select! {
        signal = stop_on => println!("{signal}: stopping, handing every queue over"),
        ended = replaced => {
            heartbeat = None;
            outcome = Err(match ended {
                Ok(Err(error)) => failed("this node lost its membership")(error),
                Ok(Ok(())) => ServerError::Refused("the membership heartbeat ended".into()),
                Err(error) => failed("the membership heartbeat failed")(error),
            });
            println!("membership lost: stopping, handing every queue over");
        }
    }
    // Out of the other nodes' balancing at their next heartbeat, while this
    // one still holds its name: they plan without it as its agents hand
    // their queues over.
    if let Some(membership) = &plan.membership {
        membership.set_agents_started(false);
    }
    stop.cancel();
    node.shutdown().await.map_err(failed("stopping the node"))?;
    let _ = server.await;
    let _ = retention.await;
    member_stop.cancel();
    // Its leave may fail (Redis restarting): the caller leaves again.
    if let Some(task) = heartbeat {
        match task.await {
            Ok(Ok(())) => {}
            Ok(Err(error)) => tracing::warn!(%error, "the membership heartbeat could not leave"),
            Err(error) => tracing::warn!(%error, "the membership heartbeat failed"),
        }
    }
    outcome
}

/// What a user needs to start using the node, on standard output (the
/// `viewer:` line also tells a supervisor that the node serves).
fn announce(config: &Config, plan: &Plan, node: &Node, bound: std::net::SocketAddr) {
    println!(
        "tailrace {}: node {} on {} queues ({} adapter, {:?} balancer), run logs in the {} store",
        plan.command,
        node.id(),
        config.queues.count,
        node.adapter().name(),
        config.balancer_kind(),
        config.archive.store
    );
    let scheme = if config.edge.tls.is_some() { "https" } else { "http" };
    let base = format!("{scheme}://{bound}");
    println!("  viewer:  {base}/");
    println!(
        "  ingest:  curl -H 'content-type: text/plain' --data-binary @build.log {base}/api/v1/logs/<pipeline>/runs/<run>/lines"
    );
    println!("  follow:  curl -N {base}/api/v1/services/ingestionPipelines/logs/<pipeline>/stream/<run>");
    println!("  cluster: curl {base}/api/v1/admin/cluster");
}
