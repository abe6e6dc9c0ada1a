//! `tailrace serve`: one node on the embedded file adapter, with its HTTP
//! edge, until Ctrl-C or SIGTERM; then every queue is handed over in order and the
//! queue files are sealed.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;
use tailrace::archive::{Archiver, LOGS_NAMESPACE};
use tailrace::cluster::NodeId;
use tailrace::edge::LogEdge;
use tailrace::handoff::DataDirLock;
use tailrace::node::Node;
use tailrace::pubsub::ImplicitSubscriptions;
use tokio_util::sync::CancellationToken;

/// Options of `tailrace serve`.
#[derive(clap::Args, Debug)]
pub struct ServeArgs {
    /// A TOML config (defaults otherwise).
    #[arg(long)]
    config: Option<PathBuf>,
    /// Where the edge listens.
    #[arg(long, default_value = "127.0.0.1:8585")]
    listen: SocketAddr,
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
    let metrics = tailrace::edge::install_metrics()?;
    let store = tailrace::archive::open_store(&config.archive).await.context("opening the run log store")?;
    let backend = tailrace::backend::build(&config, Some(&owner)).await.context("opening the queues")?;
    let adapter = backend.factory.create_adapter().await?;
    let served = serve_node(&args, &config, store, backend, metrics, signals).await;
    // Sealed and given back on every way out: a failed start leaves no
    // writer lock behind.
    let closed = adapter.close().await;
    drop(owner);
    served?;
    closed?;
    Ok(())
}

/// Runs the node and its edge until Ctrl-C, then hands every queue over.
async fn serve_node(
    args: &ServeArgs,
    config: &tailrace::config::Config,
    store: Arc<dyn tailrace::archive::RunLogStore>,
    backend: tailrace::backend::Backend,
    metrics: metrics_exporter_prometheus::PrometheusHandle,
    mut signals: super::StopSignal,
) -> anyhow::Result<()> {
    let archiver = Archiver::new(store.clone());
    let implicit = ImplicitSubscriptions::new().bind(LOGS_NAMESPACE, archiver.clone());
    let mut builder =
        Node::builder(NodeId::new(config.node.name.clone()), backend.factory).config(config.clone()).implicit(implicit);
    if let Some(pubsub) = backend.store {
        builder = builder.store(pubsub);
    }
    let node = Arc::new(builder.start().await?);
    let stop = CancellationToken::new();
    let retention = tailrace::archive::Retention::spawn(store.clone(), config.archive.retention.clone(), stop.clone());
    let logs = LogEdge::new(node.clone(), archiver, config.edge.clone(), stop.clone());
    let (bound, server) = match logs.serve(args.listen, tailrace::edge::router(metrics), stop.clone()).await {
        Ok(served) => served,
        Err(error) => {
            stop.cancel();
            node.shutdown().await?;
            let _ = retention.await;
            return Err(error.into());
        }
    };
    println!(
        "tailrace serve: node {} on {} queues ({} adapter), run logs in {} ({} store)",
        node.id(),
        config.queues.count,
        config.queues.adapter,
        config.archive.dir.display(),
        config.archive.store
    );
    println!("  viewer:  http://{bound}/");
    println!(
        "  ingest:  curl -H 'content-type: text/plain' --data-binary @build.log http://{bound}/api/v1/logs/<pipeline>/runs/<run>/lines"
    );
    println!("  follow:  curl -N http://{bound}/api/v1/services/ingestionPipelines/logs/<pipeline>/stream/<run>");
    let signal = signals.recv().await;
    println!("{signal}: stopping, handing every queue over");
    stop.cancel();
    node.shutdown().await?;
    let _ = server.await;
    let _ = retention.await;
    Ok(())
}
