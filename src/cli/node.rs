//! `tailrace node --config FILE`: one node of a multi-process cluster. Its
//! queues, checkpoints, subscriptions and run logs are in Redis; it takes
//! queue leases in Redis (on the queues' server and key prefix, so their
//! tokens fence the queues' writes) and keeps a member record there; the lease
//! balancer (the default here) spreads the queues over the live members.
//! It serves its edge on `[edge] listen` until SIGTERM or SIGINT, then
//! leaves in order: out of the others' balancing, every agent hands its
//! queue over and releases its lease, then its member record is deleted.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;
use tailrace::balancer::BalancerKind;
use tailrace::cluster::{Membership, QueueLeases};
use tailrace::config::Config;
use tailrace::stream::NodeId;

use super::cluster::{self, SERVE_ADVERTISE};
use super::serve::{Plan, run_node};

/// Options of `tailrace node`.
#[derive(clap::Args, Debug)]
pub struct NodeArgs {
    /// The node's TOML config: `[node] name`, Redis queues and archive,
    /// `[edge] listen`.
    #[arg(long)]
    config: PathBuf,
}

pub async fn run(args: NodeArgs) -> anyhow::Result<()> {
    let config = load(&args.config)?;
    tailrace::edge::check_listen(config.edge.listen, &config.edge.auth).map_err(anyhow::Error::msg)?;
    tailrace::edge::check_tls(&config.edge)?;
    let cookie = cluster_cookie(&config, &args.config)?;
    let signals = super::StopSignal::install()?;
    let view = Membership::new();
    let advertise = config.cluster.advertised().to_string();
    // Published with its agents stopped until every live member has
    // authenticated it: a node that is refused never takes a lease.
    let joined = cluster::join(&config, &advertise, view.clone(), false).await?;
    let membership = joined.membership.clone();
    let mut transport = None;
    let detecting = tokio_util::sync::CancellationToken::new();
    let ran = async {
        let serving = cluster::others_after_ttl(&config, &membership, |m| m.advertise == SERVE_ADVERTISE).await?;
        if !serving.is_empty() {
            anyhow::bail!(
                "`tailrace serve` runs on this Redis under the same key prefix: {}; it pulls every queue alone, \
                 stop it first",
                cluster::names(&serving)
            );
        }
        let link = cluster::connect(&config, cookie, &membership).await?;
        transport = Some(link.clone());
        let leases: Arc<dyn QueueLeases> = Arc::new(joined.leases);
        let detector = tailrace::cluster::FailureDetector {
            me: NodeId::new(config.node.name.clone()),
            membership: membership.clone(),
            leases: leases.clone(),
        };
        tokio::spawn(detector.run(link.lost_links(), detecting.clone()));
        membership.set_agents_started(true);
        let metrics = tailrace::edge::install_metrics()?;
        let store = tailrace::archive::open_store(
            &config.archive,
            &config.adapters.redis.access(),
            config.adapters.redis.wait(),
        )
        .await
        .context("opening the run log store")?;
        let backend = tailrace::backend::build(&config, None).await.context("opening the queues")?;
        let plan = Plan {
            command: "node",
            leases,
            view: Some(view),
            membership: Some(membership.clone()),
            transport: Some(link),
        };
        run_node(&config, store, backend, metrics, signals, plan).await
    }
    .await;
    detecting.cancel();
    if let Some(transport) = transport {
        transport.shutdown().await;
    }
    // Idempotent: the heartbeat already left if it ran and reached Redis.
    cluster::leave(&membership).await;
    ran
}

/// The cluster cookie: `TAILRACE_COOKIE`, `cluster.cookie` or
/// `cluster.cookie_file`; a node of several must have one.
fn cluster_cookie(config: &Config, path: &std::path::Path) -> anyhow::Result<String> {
    let env = std::env::var(tailrace::config::COOKIE_ENV).ok();
    match config.cluster.resolve_cookie(env).map_err(anyhow::Error::msg)? {
        Some(cookie) => Ok(cookie),
        None => anyhow::bail!(
            "{}: `tailrace node` needs the cluster's shared secret: set {} or cluster.cookie or cluster.cookie_file \
             (at least {} characters, the same on every node)",
            path.display(),
            tailrace::config::COOKIE_ENV,
            tailrace::config::MIN_COOKIE_LEN
        ),
    }
}

/// Reads the config; refuses what a node of several cannot run on. Without
/// a `[balancer]` section the balancer is `lease`.
fn load(path: &std::path::Path) -> anyhow::Result<Config> {
    let mut config = Config::load(path)?;
    config.balancer.get_or_insert(BalancerKind::Lease);
    let origin = path.display();
    if config.queues.adapter != "redis" {
        anyhow::bail!(
            "{origin}: `tailrace node` needs [queues] adapter = \"redis\" (got `{}`): the nodes of a cluster share \
             their queues in Redis; for one node on the embedded file adapter use `tailrace serve`",
            config.queues.adapter
        );
    }
    if let Some(tls) = &config.cluster.tls {
        let files = tailrace::cluster::TlsFiles { cert: tls.cert.clone(), key: tls.key.clone(), ca: tls.ca.clone() };
        files.check().map_err(|e| anyhow::anyhow!("{origin}: {e}"))?;
    }
    if config.archive.store != "redis" {
        anyhow::bail!(
            "{origin}: `tailrace node` needs [archive] store = \"redis\" (got `{}`): every node must read every \
             run's log",
            config.archive.store
        );
    }
    Ok(config)
}
