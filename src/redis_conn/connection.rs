//! [`RedisConn`]: one connection type for one Redis server or a Redis
//! Cluster, so the adapter, the stores and the cluster's keepers run their
//! commands and scripts the same way on either; how an endpoint connects to
//! either (a cluster through its seeds); commands grouped per slot; `WAIT`
//! on a key's master.

use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};

use super::{CONNECT_TIMEOUT, RedisConnError, RedisEndpoint, WaitReplicas};

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
    /// anywhere); every answer, a refused command's as its error.
    pub(crate) async fn pipeline_at(&self, key: &str, pipe: redis::Pipeline) -> redis::RedisResult<Vec<redis::Value>> {
        use redis::aio::ConnectionLike;
        let count = pipe.len();
        let answers = match self {
            Self::Single(conn) => conn.clone().req_packed_commands(&pipe, 0, count).await?,
            Self::Cluster(conn) => {
                use redis::cluster_routing::{Route, SingleNodeRoutingInfo, SlotAddr};
                let route = SingleNodeRoutingInfo::SpecificNode(Route::with_key(key, SlotAddr::Master));
                conn.clone().route_pipeline(pipe, 0, count, route).await?
            }
        };
        // A pipeline answers a refused command in its place; say so.
        for answer in &answers {
            if let redis::Value::ServerError(error) = answer {
                return Err(error.clone().into());
            }
        }
        Ok(answers)
    }
}

impl RedisEndpoint {
    /// Connects as [`RedisEndpoint::connect`] does, or, when the access says
    /// `cluster`, to the Redis Cluster the URL is a seed of (commands time
    /// out after `response_timeout`; a refused password or certificate is
    /// named as for one server).
    pub async fn connect_any(
        &self,
        config: ConnectionManagerConfig,
        response_timeout: Duration,
    ) -> Result<RedisConn, RedisConnError> {
        if !self.access.cluster {
            return self.connect(config).await.map(RedisConn::Single);
        }
        self.connect_cluster(response_timeout, redis::ProtocolVersion::RESP2, None::<fn(_) -> Result<(), ()>>).await
    }

    /// As [`RedisEndpoint::connect_any`], speaking RESP3, with what the
    /// server pushes (tracking invalidations) going to `on_push` (on one
    /// server, through `config`'s push sender).
    pub(crate) async fn connect_any_resp3(
        &self,
        config: ConnectionManagerConfig,
        response_timeout: Duration,
        on_push: impl redis::aio::AsyncPushSender + Clone,
    ) -> Result<RedisConn, RedisConnError> {
        if !self.access.cluster {
            return self.connect_resp3(config.set_push_sender(on_push)).await.map(RedisConn::Single);
        }
        self.connect_cluster(response_timeout, redis::ProtocolVersion::RESP3, Some(on_push)).await
    }

    async fn connect_cluster(
        &self,
        response_timeout: Duration,
        protocol: redis::ProtocolVersion,
        on_push: Option<impl redis::aio::AsyncPushSender>,
    ) -> Result<RedisConn, RedisConnError> {
        // Seeds: `url` may list several, comma-separated (any that answers
        // will do); each gets the same user, password and TLS files.
        let mut seeds = Vec::new();
        let (mut tls, mut password_setting) = (None, String::new());
        for url in self.url.split(',').map(str::trim).filter(|u| !u.is_empty()) {
            let seed = Self { url: url.to_string(), ..self.clone() };
            let (info, certificates, setting) = seed.parts(protocol)?;
            // As for one server: a refused password or certificate fails
            // now, naming the setting (the cluster client would only say
            // it could not connect).
            let (client, _) = seed.build(protocol)?;
            seed.probe(&client, &setting).await?;
            seeds.push(info);
            (tls, password_setting) = (tls.or(certificates), setting);
        }
        let mut builder = redis::cluster::ClusterClientBuilder::new(seeds)
            .connection_timeout(CONNECT_TIMEOUT)
            .response_timeout(response_timeout)
            .use_protocol(protocol);
        if let Some(on_push) = on_push {
            builder = builder.push_sender(on_push);
        }
        if let Some(certificates) = tls {
            crate::tls::use_ring_by_default();
            builder = builder.certs(certificates);
        }
        let client = builder.build().map_err(|e| self.url_error(e))?;
        client.get_async_connection().await.map(RedisConn::Cluster).map_err(|error| {
            self.refusal(&error, &password_setting)
                .unwrap_or_else(|| RedisConnError::Unreachable { url: self.shown(), message: error.to_string() })
        })
    }
}
