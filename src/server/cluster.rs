//! Joining the Redis membership from a process: a member joins to share
//! the queues with the other nodes; a server alone on Redis queues joins
//! only to make sure it is alone (it pulls every queue).

use std::time::Duration;

use super::{SERVE_ADVERTISE, ServerError, failed};
use crate::cluster::{
    Member, Membership, MembershipError, RedisLeases, RedisMembership, TcpTransport, TlsFiles, TransportSettings,
};
use crate::config::Config;
use crate::redis_conn::durability::Persistence;
use crate::stream::NodeId;

/// The leases and membership of a process on the Redis of `[adapters.redis]`
/// (same server and key prefix as the queues, so the lease tokens fence
/// the queues' writes).
pub(super) struct RedisCluster {
    /// The queue leases.
    pub leases: RedisLeases,
    /// This process's member record.
    pub membership: RedisMembership,
}

/// Connects and claims `config.node.name`'s member record, with its agents
/// published as `agents_started` (`false`: the other nodes never balance
/// queues to it). A name held by
/// another incarnation is waited for up to one `membership.ttl` (a process
/// killed with `kill -9` holds it until its record lapses); still held after
/// that, it is refused: another live process runs under that name.
pub(super) async fn join(
    config: &Config,
    advertise: &str,
    view: Membership,
    agents_started: bool,
) -> Result<RedisCluster, ServerError> {
    let redis = &config.adapters.redis;
    let endpoint = redis.endpoint();
    let leases = RedisLeases::connect_to(&endpoint, &redis.key_prefix, redis.response_timeout)
        .await
        .map_err(failed(format!("connecting to Redis at {} for leases and membership", endpoint.shown())))?;
    let leases = leases.with_wait_replicas(redis.wait());
    // Before the member record: a node refused here takes no lease.
    check_persistence(config, &mut leases.connection(), advertise != SERVE_ADVERTISE).await?;
    let me = NodeId::new(config.node.name.clone());
    let options = config.membership.clone();
    let deadline = tokio::time::Instant::now() + options.ttl + options.heartbeat;
    loop {
        let joined = RedisMembership::join_as(
            leases.connection(),
            &redis.key_prefix,
            me.clone(),
            advertise,
            options.clone(),
            view.clone(),
            agents_started,
        )
        .await;
        match joined {
            Ok(membership) => return Ok(RedisCluster { leases, membership }),
            Err(MembershipError::NameTaken { .. }) if tokio::time::Instant::now() < deadline => {
                tracing::warn!(node = %me, "node name held by another process; waiting for its record to lapse");
                tokio::time::sleep(options.heartbeat).await;
            }
            Err(error) => return Err(failed("joining the cluster membership")(error)),
        }
    }
}

/// Reads what Redis keeps across a crash and logs it in one line. With
/// `cluster` (`tailrace node`), refuses a Redis that keeps nothing across a
/// restart unless `[lease] allow_volatile_redis`: its fence counters would
/// start again at 1, and the run log store would refuse the new owners'
/// appends.
pub async fn check_persistence(
    config: &Config,
    conn: &mut crate::redis_conn::RedisConn,
    cluster: bool,
) -> Result<(), ServerError> {
    let persistence = Persistence::read(conn).await;
    let line = persistence.describe();
    match (persistence.survives_restart(), persistence.loses_on_crash()) {
        (Some(false), _) if cluster && !config.lease.allow_volatile_redis => {
            return Err(ServerError::Refused(format!(
                "{line}. `tailrace node` refuses such a Redis: after its restart the queues' lease tokens would go \
                 back and the run log store would refuse the new owners' appends. Run Redis with appendonly yes \
                 (appendfsync always to lose no acknowledged write), or set [lease] allow_volatile_redis = true to \
                 run anyway"
            )));
        }
        (Some(false), _) | (None, _) | (_, Some(true)) => tracing::warn!("{line}"),
        _ => tracing::info!("{line}"),
    }
    Ok(())
}

/// The live members other than `me` that `refuse` picks, waited for up to
/// one `membership.ttl` to go (a killed process's key lapses by then).
pub(super) async fn others_after_ttl(
    config: &Config,
    membership: &RedisMembership,
    refuse: impl Fn(&Member) -> bool,
) -> Result<Vec<Member>, ServerError> {
    let me = NodeId::new(config.node.name.clone());
    let deadline = tokio::time::Instant::now() + config.membership.ttl + config.membership.heartbeat;
    loop {
        let members = membership.members().await.map_err(failed("reading the cluster's members"))?;
        let others: Vec<Member> = members.into_iter().filter(|m| m.name != me && refuse(m)).collect();
        if others.is_empty() || tokio::time::Instant::now() >= deadline {
            return Ok(others);
        }
        tokio::time::sleep(config.membership.heartbeat.min(Duration::from_millis(500))).await;
    }
}

/// Starts this node's cluster transport on `cluster.listen` and
/// authenticates with every live member that accepts node connections;
/// refuses (naming the peer) if one does not accept this node.
pub(super) async fn connect(
    config: &Config,
    cookie: String,
    membership: &RedisMembership,
) -> Result<TcpTransport, ServerError> {
    let listen: std::net::SocketAddr = config.cluster.listen.parse().map_err(|_| {
        ServerError::Refused(format!("cluster.listen must be ip:port (got `{}`)", config.cluster.listen))
    })?;
    let settings = TransportSettings {
        me: NodeId::new(config.node.name.clone()),
        listen,
        cookie,
        call_timeout: config.cluster.call_timeout,
        max_message_bytes: config.cluster.max_message_bytes,
        max_inflight: config.cluster.max_inflight_calls,
        redial: config.membership.heartbeat,
        tls: config.cluster.tls.as_ref().map(|tls| TlsFiles {
            cert: tls.cert.clone(),
            key: tls.key.clone(),
            ca: tls.ca.clone(),
        }),
    };
    let transport =
        TcpTransport::start(settings, membership.everyone()).await.map_err(failed("starting the cluster transport"))?;
    let members = membership.members().await.map_err(failed("reading the cluster's members"))?;
    let peers: Vec<Member> = members.into_iter().filter(|m| m.advertise != SERVE_ADVERTISE).collect();
    if let Err(error) = transport.authenticate(&peers, config.cluster.call_timeout * 2).await {
        transport.shutdown().await;
        return Err(failed("joining the cluster")(error));
    }
    Ok(transport)
}

/// Deletes this process's member record, retrying a few times (a connection
/// cut by a Redis restart is re-made on the next command). Best effort: a
/// key left behind lapses within `membership.ttl`, so a failure is logged,
/// not returned.
pub(super) async fn leave(membership: &RedisMembership) {
    const ATTEMPTS: u32 = 3;
    for attempt in 1..=ATTEMPTS {
        match membership.leave().await {
            Ok(()) => return,
            Err(error) if attempt == ATTEMPTS => {
                tracing::warn!(%error, "cannot delete the member record; it lapses within membership.ttl")
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
}

/// `a`, `b` (advertising …): for a refusal's message.
pub(super) fn names(members: &[Member]) -> String {
    members.iter().map(|m| format!("`{}` (advertising {})", m.name, m.advertise)).collect::<Vec<_>>().join(", ")
}
