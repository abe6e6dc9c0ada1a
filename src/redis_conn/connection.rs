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
