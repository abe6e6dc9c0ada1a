//! `tailrace serve`: one node on the adapter `[queues] adapter` names
//! (`file`, the default; `redis`; `kafka`; `memory`), with its HTTP edge,
//! until Ctrl-C or SIGTERM; then every queue is handed over in order (on
//! the file adapter the queue files are sealed). On Redis queues it runs alone: it refuses to
//! start next to another live process on the same Redis key prefix
//! (several processes share the queues as `tailrace node`). The server
//! itself is the library's ([`tailrace::server`]); this is its command line.

use std::net::SocketAddr;
use std::path::PathBuf;

use tailrace::handoff::DataDirLock;
use tailrace::server::Server;

/// Options of `tailrace serve`.
#[derive(clap::Args, Debug)]
pub struct ServeArgs {
    /// A TOML config (defaults otherwise).
    #[arg(long)]
    config: Option<PathBuf>,
    /// Where the edge listens (default: `[edge] listen`, 127.0.0.1:8585).
    #[arg(long)]
    listen: Option<SocketAddr>,
    /// The node's data directory, locked while it runs: the file adapter's
    /// queues and checkpoints in `DIR/queues`, Kafka's file checkpoints in
    /// `DIR/kafka`, the file archive's run logs in `DIR/runs` (these
    /// replace the config's `[adapters.file] dir`, `[adapters.kafka]
    /// checkpoint_dir` and `[archive] dir`).
    #[arg(long, default_value = "data")]
    data_dir: PathBuf,
}

pub async fn run(args: ServeArgs) -> anyhow::Result<()> {
    let config = super::node_config(args.config.as_ref(), &args.data_dir, args.listen)?;
    let stop = super::StopSignal::install()?;
    // Held until the process ends: no other process writes here, so what a
    // crash left in the queues is ours to recover.
    let owner = DataDirLock::acquire(&args.data_dir)?;
    Server::builder(config).data_dir(owner).run_until(stop.into_future()).await?;
    Ok(())
}
