//! `tailrace node --config FILE`: one node of a multi-process cluster. Its
//! queues are in Redis or Kafka (`[queues] adapter = "redis"` or
//! `"kafka"`; Kafka's checkpoints then in Redis too); checkpoints,
//! subscriptions and run logs are in Redis; it takes
//! queue leases in Redis (on the queues' server and key prefix, so their
//! tokens fence the queues' writes) and keeps a member record there; the lease
//! balancer (the default here) spreads the queues over the live members.
//! It serves its edge on `[edge] listen` until SIGTERM or SIGINT, then
//! leaves in order: out of the others' balancing, every agent hands its
//! queue over and releases its lease, then its member record is deleted.
//! The server itself is the library's ([`tailrace::server`], a member).

use std::path::PathBuf;

use anyhow::Context;
use tailrace::config::Config;
use tailrace::server::Server;

/// Options of `tailrace node`.
#[derive(clap::Args, Debug)]
pub struct NodeArgs {
    /// The node's TOML config: `[node] name`, Redis or Kafka queues, Redis
    /// archive, `[edge] listen`.
    #[arg(long)]
    config: PathBuf,
}

pub async fn run(args: NodeArgs) -> anyhow::Result<()> {
    let config = Config::load(&args.config)?;
    let stop = super::StopSignal::install()?;
    let origin = args.config.display().to_string();
    Server::builder(config).member().run_until(stop.into_future()).await.with_context(|| origin)?;
    Ok(())
}
