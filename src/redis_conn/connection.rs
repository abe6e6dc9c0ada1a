//! [`RedisConn`]: one connection type for one Redis server or a Redis
//! Cluster, so the adapter, the stores and the cluster's keepers run their
//! commands and scripts the same way on either.

use redis::aio::ConnectionManager;

/// A connection to Redis, cheap to clone: to one server (reconnecting with
/// backoff) or to a Redis Cluster (the cluster client's, which follows
/// `MOVED` and `ASK` and reconnects). Commands and scripts run on either; on
/// a cluster a script or a pipeline goes to the slot of its keys, which must
/// share one.
#[derive(Clone)]
pub enum RedisConn {
    /// One server.
    Single(ConnectionManager),
    /// A Redis Cluster.
    Cluster(redis::cluster_async::ClusterConnection),
}

impl From<ConnectionManager> for RedisConn {
    fn from(conn: ConnectionManager) -> Self {
        Self::Single(conn)
    }
}

impl redis::aio::ConnectionLike for RedisConn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a redis::Cmd) -> redis::RedisFuture<'a, redis::Value> {
        match self {
            Self::Single(conn) => conn.req_packed_command(cmd),
            Self::Cluster(conn) => conn.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> redis::RedisFuture<'a, Vec<redis::Value>> {
        match self {
            Self::Single(conn) => conn.req_packed_commands(pipeline, offset, count),
            Self::Cluster(conn) => conn.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Self::Single(conn) => conn.get_db(),
            Self::Cluster(conn) => conn.get_db(),
        }
    }
}

impl RedisConn {
    /// Whether this connection is to a Redis Cluster.
    pub fn is_cluster(&self) -> bool {
        matches!(self, Self::Cluster(_))
    }

    /// Runs `commands`, each with the key that decides its slot, in as few
    /// round trips as the connection allows: one pipeline on one server;
    /// on a cluster one pipeline per slot, all sent at once (a pipeline
    /// may not cross slots there). The answers come in the order of
    /// `commands`.
    pub async fn query_by_slot<T: redis::FromRedisValue>(
        &self,
        commands: Vec<(String, redis::Cmd)>,
    ) -> redis::RedisResult<Vec<T>> {
        if commands.is_empty() {
            return Ok(Vec::new());
        }
        let mut groups: Vec<(redis::cluster_routing::Slot, redis::Pipeline, Vec<usize>)> = Vec::new();
        for (index, (key, command)) in commands.into_iter().enumerate() {
            let slot = match self {
                Self::Single(_) => redis::cluster_routing::Slot::for_key(""),
                Self::Cluster(_) => redis::cluster_routing::Slot::for_key(&key),
            };
            let group = match groups.iter().position(|(s, _, _)| *s == slot) {
                Some(group) => group,
                None => {
                    groups.push((slot, redis::pipe(), Vec::new()));
                    groups.len() - 1
                }
            };
            groups[group].1.add_command(command);
            groups[group].2.push(index);
        }
        let sent = groups.iter().map(|(_, pipe, _)| {
            let mut conn = self.clone();
            async move { pipe.query_async::<Vec<redis::Value>>(&mut conn).await }
        });
        let answers = futures::future::try_join_all(sent).await?;
        let total = groups.iter().map(|(_, _, indexes)| indexes.len()).sum();
        let mut out: Vec<Option<redis::Value>> = (0..total).map(|_| None).collect();
        for ((_, _, indexes), values) in groups.iter().zip(answers) {
            for (index, value) in indexes.iter().zip(values) {
                out[*index] = Some(value);
            }
        }
        out.into_iter()
            .map(|value| {
                let value = value.unwrap_or(redis::Value::Nil);
                redis::from_redis_value(value).map_err(redis::RedisError::from)
            })
            .collect()
    }
}

/// How many replicas must have a write before it is acknowledged (`WAIT`),
/// and for how long to wait for them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WaitReplicas {
    /// Replicas that must confirm.
    pub replicas: u32,
    /// Longest wait.
    pub timeout: std::time::Duration,
}

impl RedisConn {
    /// After a write to `key`'s slot: how many replicas have it (at least
    /// `wait.replicas`, or what confirmed within `wait.timeout`). `WAIT`
    /// goes in one pipeline with a read of `key`, so a cluster sends it to
    /// that slot's master, over the connection the write took.
    pub async fn wait_replicas(&self, key: &str, wait: WaitReplicas) -> redis::RedisResult<u32> {
        let millis = u64::try_from(wait.timeout.as_millis()).unwrap_or(u64::MAX);
        let mut pipe = redis::pipe();
        pipe.cmd("EXISTS").arg(key).ignore().cmd("WAIT").arg(wait.replicas).arg(millis);
        let (confirmed,): (u32,) = pipe.query_async(&mut self.clone()).await?;
        Ok(confirmed)
    }
}

impl RedisConn {
    /// Runs `pipe` on the master of `key`'s slot, even where its commands
    /// carry no key (`CLIENT TRACKING`, which a cluster would send
    /// anywhere); the answers after the first `skip`.
    pub(crate) async fn pipeline_at(
        &self,
        key: &str,
        pipe: redis::Pipeline,
        skip: usize,
    ) -> redis::RedisResult<Vec<redis::Value>> {
        use redis::aio::ConnectionLike;
        let count = pipe.len().saturating_sub(skip);
        match self {
            Self::Single(conn) => conn.clone().req_packed_commands(&pipe, skip, count).await,
            Self::Cluster(conn) => {
                use redis::cluster_routing::{Route, SingleNodeRoutingInfo, SlotAddr};
                let route = SingleNodeRoutingInfo::SpecificNode(Route::with_key(key, SlotAddr::Master));
                conn.clone().route_pipeline(pipe, skip, count, route).await
            }
        }
    }
}
