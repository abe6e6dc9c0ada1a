//! `tailrace serve`: one node on the embedded file adapter, with its HTTP
//! edge, until Ctrl-C; then every queue is handed over in order and the
//! queue files are sealed.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;
use tailrace::cluster::NodeId;
use tailrace::config::Config;
use tailrace::node::Node;
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
    let mut config = match &args.config {
        Some(path) => Config::load(path)?,
        None => Config::default(),
    };
    config.adapters.file.dir = args.data_dir.join("queues");
    let backend = tailrace::adapters::build(&config).await.context("opening the queues")?;
    let adapter = backend.factory.create_adapter().await?;
    let mut builder = Node::builder(NodeId::new(config.node.name.clone()), backend.factory).config(config.clone());
    if let Some(store) = backend.store {
        builder = builder.store(store);
    }
    let node = Arc::new(builder.start().await?);
    let stop = CancellationToken::new();
    let metrics = tailrace::edge::install_metrics()?;
    let (bound, server) = tailrace::edge::serve(args.listen, tailrace::edge::router(metrics), stop.clone()).await?;
    println!(
        "tailrace serve: node {} on {} queues ({} adapter), edge on http://{bound}",
        node.id(),
        config.queues.count,
        config.queues.adapter
    );
    tokio::signal::ctrl_c().await?;
    println!("stopping: handing every queue over");
    stop.cancel();
    node.shutdown().await?;
    adapter.close().await?;
    let _ = server.await;
    Ok(())
}
