//! `tailrace serve`: one node on the embedded file adapter, with its HTTP
//! edge, until Ctrl-C or SIGTERM; then every queue is handed over in order and the
//! queue files are sealed. On Redis queues it runs alone: it refuses to
//! start next to another live process on the same Redis key prefix
//! (several processes share the queues as `tailrace node`).
//!
//! [`run_node`] is the part `tailrace node` shares: the node, its edge and
//! the admin API until a stop signal, then the ordered leave.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;
use tailrace::archive::{Archiver, LOGS_NAMESPACE};
use tailrace::cluster::{Membership, MemoryLeases, QueueLeases, RactorTransport, RedisMembership};
use tailrace::edge::{ClusterView, LogEdge};
use tailrace::handoff::DataDirLock;
use tailrace::node::Node;
use tailrace::pubsub::ImplicitSubscriptions;
use tailrace::stream::NodeId;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::cluster::{self, SERVE_ADVERTISE};

/// Options of `tailrace serve`.
#[derive(clap::Args, Debug)]
pub struct ServeArgs {
    /// A TOML config (defaults otherwise).
    #[arg(long)]
    config: Option<PathBuf>,
    /// Where the edge listens (default: `[edge] listen`, 127.0.0.1:8585).
    #[arg(long)]
    listen: Option<SocketAddr>,
    /// Where the file adapter keeps its queues and checkpoints.
    #[arg(long, default_value = "data")]
    data_dir: PathBuf,
}

pub async fn run(args: ServeArgs) -> anyhow::Result<()> {
    let config = super::node_config(args.config.as_ref(), &args.data_dir, args.listen)?;
    let signals = super::StopSignal::install()?;
    // Held until the process ends: no other process writes here, so what a
    // crash left in the queues is ours to recover.
    let owner = DataDirLock::acquire(&args.data_dir)?;
    // Alone on its Redis: claimed before anything is pulled, given back on
    // every way out.
    let alone = match config.queues.adapter.as_str() {
        "redis" => Some(join_alone(&config).await?),
        _ => None,
    };
    let metrics = tailrace::edge::install_metrics()?;
    let served = async {
        let store = tailrace::archive::open_store(
            &config.archive,
            &config.adapters.redis.access(),
            config.adapters.redis.wait(),
        )
        .await
        .context("opening the run log store")?;
        let backend = tailrace::backend::build(&config, Some(&owner)).await.context("opening the queues")?;
        let adapter = backend.factory.create_adapter().await?;
        let plan = Plan {
            command: "serve",
            leases: Arc::new(MemoryLeases::new()),
            view: None,
            membership: alone.clone(),
            transport: None,
        };
        let served = run_node(&config, store, backend, metrics, signals, plan).await;
        // Sealed and given back on every way out: a failed start leaves no
        // writer lock behind.
        let closed = adapter.close().await;
        served?;
        closed?;
        anyhow::Ok(())
    }
    .await;
    if let Some(alone) = alone {
        cluster::leave(&alone).await;
    }
    drop(owner);
    served
}

/// Claims the node's member record on the queues' Redis (advertising `serve`,
/// agents published as stopped so no node balances queues to it) and
/// refuses to go on while another process is a live member there.
async fn join_alone(config: &tailrace::config::Config) -> anyhow::Result<RedisMembership> {
    let joined = cluster::join(config, SERVE_ADVERTISE, Membership::new(), false).await?;
    let others = cluster::others_after_ttl(config, &joined.membership, |_| true).await?;
    if others.is_empty() {
        return Ok(joined.membership);
    }
    cluster::leave(&joined.membership).await;
    anyhow::bail!(
        "another process is a live member on Redis {} under the key prefix `{}`: {}; `tailrace serve` pulls every \
         queue and must run alone on its Redis; run every process as `tailrace node --config FILE` to share the queues",
        tailrace::redis_conn::redact(&config.adapters.redis.url),
        config.adapters.redis.key_prefix,
        cluster::names(&others)
    )
}

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
    /// The transport to the other nodes (`tailrace node`).
    pub transport: Option<RactorTransport>,
}

/// Runs the node and its edge until Ctrl-C or SIGTERM (or until its member
/// key is taken over), then hands every queue over in order. The caller
/// deletes the member record (again) once this returns.
pub(super) async fn run_node(
    config: &tailrace::config::Config,
    store: Arc<dyn tailrace::archive::RunLogStore>,
    backend: tailrace::backend::Backend,
    metrics: metrics_exporter_prometheus::PrometheusHandle,
    mut signals: super::StopSignal,
    plan: Plan,
) -> anyhow::Result<()> {
    let me = NodeId::new(config.node.name.clone());
    let archiver = Archiver::new(store.clone());
    let mut implicit = ImplicitSubscriptions::new().bind(LOGS_NAMESPACE, archiver.clone());
    if let Some((namespace, path)) = config.diagnostics.audit() {
        let audit = tailrace::archive::AuditLog::open(path, me.as_str()).context("opening the audit log")?;
        implicit = implicit.bind(namespace, audit);
    }
    let checkpointer = backend.factory.create_checkpointer().await?;
    let queues = backend.factory.queue_mapper().all_queues();
    let mut builder = Node::builder(me.clone(), backend.factory)
        .config(config.clone())
        .implicit(implicit)
        .leases(plan.leases.clone());
    if let Some(pubsub) = backend.store {
        builder = builder.store(pubsub);
    }
    if let Some(view) = plan.view {
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
    let node = Arc::new(builder.start().await?);
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
    let retention = tailrace::archive::Retention::spawn(store.clone(), config.archive.retention.clone(), stop.clone());
    let logs = LogEdge::new(node.clone(), archiver, config.edge.clone(), stop.clone());
    if let Some(membership) = plan.membership.clone() {
        logs.ready_also("membership", move || membership.stale());
    }
    let routes = tailrace::edge::router(metrics).merge(tailrace::edge::admin_router(&config.edge.auth, view));
    let listen = config.edge.listen;
    let (bound, server) = match logs.serve(listen, routes, stop.clone()).await {
        Ok(served) => served,
        Err(error) => {
            stop.cancel();
            node.shutdown().await?;
            let _ = retention.await;
            member_stop.cancel();
            if let Some(task) = heartbeat {
                let _ = task.await;
            }
            return Err(error.into());
        }
    };
    println!(
        "tailrace {}: node {} on {} queues ({} adapter, {:?} balancer), run logs in the {} store",
        plan.command,
        node.id(),
        config.queues.count,
        config.queues.adapter,
        config.balancer_kind(),
        config.archive.store
    );
    let base = format!("{}://{bound}", super::edge_scheme(config));
    println!("  viewer:  {base}/");
    println!(
        "  ingest:  curl -H 'content-type: text/plain' --data-binary @build.log {base}/api/v1/logs/<pipeline>/runs/<run>/lines"
    );
    println!("  follow:  curl -N {base}/api/v1/services/ingestionPipelines/logs/<pipeline>/stream/<run>");
    println!("  cluster: curl {base}/api/v1/admin/cluster");
    let replaced = async {
        match heartbeat.as_mut() {
            Some(task) => task.await,
            None => std::future::pending().await,
        }
    };
    let mut outcome = Ok(());
    tokio::select! {
        signal = signals.recv() => println!("{signal}: stopping, handing every queue over"),
        ended = replaced => {
            heartbeat = None;
            outcome = match ended {
                Ok(Err(error)) => Err(anyhow::Error::new(error).context("this node lost its membership")),
                Ok(Ok(())) => Err(anyhow::anyhow!("the membership heartbeat ended")),
                Err(error) => Err(anyhow::Error::new(error).context("the membership heartbeat failed")),
            };
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
    node.shutdown().await?;
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
