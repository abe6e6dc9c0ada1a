//! A member of a cluster from start to end: its config checked (Redis for
//! leases, membership and run logs; a cookie), its member record claimed
//! with its agents stopped until every live member authenticated it, the
//! cluster transport and the failure detector; after the run, the
//! transport stopped and the member record deleted.

use std::sync::Arc;

use super::cluster;
use super::{SERVE_ADVERTISE, ServerBuilder, ServerError, StopOn, run};
use crate::balancer::BalancerKind;
use crate::cluster::{Membership, QueueLeases};
use crate::config::Config;
use crate::stream::NodeId;

pub(super) async fn run(builder: ServerBuilder, stop: StopOn) -> Result<(), ServerError> {
    let ServerBuilder { mut config, adapter, data_dir, command, .. } = builder;
    check(&mut config, adapter.is_some())?;
    let cookie = cluster_cookie(&config)?;
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
            return Err(ServerError::Refused(format!(
                "`tailrace serve` runs on this Redis under the same key prefix: {}; it pulls every queue alone, \
                 stop it first",
                cluster::names(&serving)
            )));
        }
        let link = cluster::connect(&config, cookie, &membership).await?;
        transport = Some(link.clone());
        // Subscriptions the nodes share: the backend's, or the Redis of the
        // leases (a viewer on one node reads a queue another pulls).
        let redis = &config.adapters.redis;
        let subscriptions = crate::adapters::redis::RedisPubSubStore::new(
            joined.leases.connection(),
            &redis.key_prefix,
            config.pubsub.max_subscriptions_per_stream,
        );
        let leases: Arc<dyn QueueLeases> = Arc::new(joined.leases);
        let detector = crate::cluster::FailureDetector {
            me: NodeId::new(config.node.name.clone()),
            membership: membership.clone(),
            leases: leases.clone(),
        };
        tokio::spawn(detector.run(link.lost_links(), detecting.clone()));
        membership.set_agents_started(true);
        let mut backend = run::backend(&config, adapter, data_dir.as_ref()).await?;
        backend.store.get_or_insert_with(|| Arc::new(subscriptions));
        let plan = run::Plan {
            command,
            leases,
            view: Some(view),
            membership: Some(membership.clone()),
            transport: Some(link),
        };
        run::run_node(&config, backend, stop, plan).await
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
fn cluster_cookie(config: &Config) -> Result<String, ServerError> {
    let env = std::env::var(crate::config::COOKIE_ENV).ok();
    match config.cluster.resolve_cookie(env).map_err(ServerError::Refused)? {
        Some(cookie) => Ok(cookie),
        None => Err(ServerError::Refused(format!(
            "a node of several needs the cluster's shared secret: set {} or cluster.cookie or cluster.cookie_file \
             (at least {} characters, the same on every node)",
            crate::config::COOKIE_ENV,
            crate::config::MIN_COOKIE_LEN
        ))),
    }
}

/// Refuses what a node of several cannot run on. Without a `[balancer]`
/// section the balancer is `lease`. A program's own adapter may carry the
/// queues; the run logs, leases and membership stay in Redis.
fn check(config: &mut Config, own_adapter: bool) -> Result<(), ServerError> {
    config.balancer.get_or_insert(BalancerKind::Lease);
    if !own_adapter && !matches!(config.queues.adapter.as_str(), "redis" | "kafka") {
        return Err(ServerError::Refused(format!(
            "`tailrace node` needs [queues] adapter = \"redis\" or \"kafka\" (got `{}`): the nodes of a cluster \
             share their queues; for one node on the embedded file adapter use `tailrace serve`",
            config.queues.adapter
        )));
    }
    if !own_adapter && config.queues.adapter == "kafka" {
        use crate::adapters::kafka::CheckpointStore;
        match config.adapters.kafka.checkpoints {
            CheckpointStore::Auto => config.adapters.kafka.checkpoints = CheckpointStore::Redis,
            CheckpointStore::Redis => {}
            CheckpointStore::File => {
                return Err(ServerError::Refused(
                    "`tailrace node` needs [adapters.kafka] checkpoints = \"redis\" (or \"auto\"): file checkpoints \
                     are neither shared with the other nodes nor fenced by the leases"
                        .into(),
                ));
            }
        }
    }
    if let Some(tls) = &config.cluster.tls {
        let files = crate::cluster::TlsFiles { cert: tls.cert.clone(), key: tls.key.clone(), ca: tls.ca.clone() };
        files.check().map_err(|e| ServerError::Refused(e.to_string()))?;
    }
    if config.archive.store != "redis" {
        return Err(ServerError::Refused(format!(
            "`tailrace node` needs [archive] store = \"redis\" (got `{}`): every node must read every run's log",
            config.archive.store
        )));
    }
    Ok(())
}
