//! Queue leases in Redis, for nodes in separate processes.
//!
//! Each queue has two keys that share the hash tag `{q<n>}`, so that a
//! Redis Cluster keeps them (and, later, the queue's stream and checkpoint)
//! in one slot and every script touches one slot only:
//!
//! - `{prefix}:{q3}:lease`, a hash `holder`, `token`, with a PX TTL: the
//!   grant. Redis expires it on its own clock, so node clocks do not matter;
//! - `{prefix}:{q3}:fence`, the counter `INCR`ed for every grant (no TTL,
//!   never reset): fencing tokens only grow, across releases and expiries.
//!
//! Acquire, renew and release are Lua scripts, atomic on the server: a grant
//! is taken only if the lease is free, expired or already the caller's;
//! renew and release act only with the current token. A lease's local
//! `expires_at` counts from when the request was sent, so it never comes
//! after the server's expiry.

use std::time::Duration;

use async_trait::async_trait;
use redis::aio::ConnectionManager;
use tokio::time::Instant;

use super::lease::{Lease, LeaseError, QueueLeases};
use crate::redis_conn::{self, RedisConnError, RedisEndpoint};
use crate::stream::{NodeId, QueueId};

/// Takes the lease (KEYS[1]) if free or already ARGV[1]'s, with a new token
/// from the fence (KEYS[2]), for ARGV[2] ms. `{token}` or `{0, holder}`.
const ACQUIRE: &str = r"
local holder = redis.call('HGET', KEYS[1], 'holder')
if holder and holder ~= ARGV[1] then
  return {'0', holder}
end
local token = string.format('%d', redis.call('INCR', KEYS[2]))
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], 'holder', ARGV[1], 'token', token)
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return {token}";

/// Extends the lease to ARGV[3] ms if ARGV[1] holds it with token ARGV[2].
const RENEW: &str = r"
if redis.call('HGET', KEYS[1], 'token') == ARGV[2] and redis.call('HGET', KEYS[1], 'holder') == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[3])
  return 1
end
return 0";

/// Deletes the lease if ARGV[1] holds it with token ARGV[2].
const RELEASE: &str = r"
if redis.call('HGET', KEYS[1], 'token') == ARGV[2] and redis.call('HGET', KEYS[1], 'holder') == ARGV[1] then
  redis.call('DEL', KEYS[1])
  return 1
end
return 0";

/// The lease as `{holder, token, pttl}`, or `{}` if none.
const PEEK: &str = r"
local holder = redis.call('HGET', KEYS[1], 'holder')
if not holder then
  return {}
end
return {holder, redis.call('HGET', KEYS[1], 'token'), string.format('%d', redis.call('PTTL', KEYS[1]))}";

/// The key prefix every key of `queue` starts with: `{prefix}:{q3}`, whose
/// hash tag puts all of them in one Redis Cluster slot.
pub fn queue_tag(prefix: &str, queue: QueueId) -> String {
    format!("{prefix}:{{{queue}}}")
}

/// Queue leases in Redis. See the module documentation.
pub struct RedisLeases {
    conn: ConnectionManager,
    prefix: String,
    acquire: redis::Script,
    renew: redis::Script,
    release: redis::Script,
    peek: redis::Script,
}

impl RedisLeases {
    /// Over an existing connection; keys start with `prefix`.
    pub fn new(conn: ConnectionManager, prefix: &str) -> Self {
        Self {
            conn,
            prefix: prefix.to_string(),
            acquire: redis::Script::new(ACQUIRE),
            renew: redis::Script::new(RENEW),
            release: redis::Script::new(RELEASE),
            peek: redis::Script::new(PEEK),
        }
    }

    /// Connects to `url` (`redis://host:port/db`, credentials in the URL);
    /// see [`RedisLeases::connect_to`].
    pub async fn connect(url: &str, prefix: &str, response_timeout: Duration) -> Result<Self, LeaseError> {
        Self::connect_to(&RedisEndpoint::from_url(url, "url"), prefix, response_timeout).await
    }

    /// Connects to `endpoint`, reconnecting with backoff when the
    /// connection drops; every command is bounded by `response_timeout`.
    /// Keys start with `prefix`. A refused password or certificate is
    /// [`LeaseError::Refused`], naming the setting.
    pub async fn connect_to(
        endpoint: &RedisEndpoint,
        prefix: &str,
        response_timeout: Duration,
    ) -> Result<Self, LeaseError> {
        let conn = endpoint.connect(redis_conn::reconnecting(response_timeout)).await.map_err(|e| match e {
            RedisConnError::Unreachable { url, message } => LeaseError::Connect { url, message },
            other => LeaseError::Refused(other.to_string()),
        })?;
        Ok(Self::new(conn, prefix))
    }

    /// Its connection (membership shares it, so both reach the same server).
    pub fn connection(&self) -> ConnectionManager {
        self.conn.clone()
    }

    /// The lease key of `queue`.
    pub fn lease_key(&self, queue: QueueId) -> String {
        format!("{}:lease", queue_tag(&self.prefix, queue))
    }

    /// The fencing counter of `queue`.
    pub fn fence_key(&self, queue: QueueId) -> String {
        format!("{}:fence", queue_tag(&self.prefix, queue))
    }
}

fn millis(ttl: Duration) -> u64 {
    u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX).max(1)
}

fn backend(operation: &'static str, queue: QueueId) -> impl FnOnce(redis::RedisError) -> LeaseError {
    move |e| LeaseError::Backend { operation, queue, message: e.to_string() }
}

fn parse<T: std::str::FromStr>(key: &str, what: &str, value: &str) -> Result<T, LeaseError>
where
    T::Err: std::fmt::Display,
{
    value.parse().map_err(|e| LeaseError::Corrupt { key: key.into(), message: format!("{what} `{value}`: {e}") })
}

#[async_trait]
impl QueueLeases for RedisLeases {
    async fn acquire(&self, queue: QueueId, node: &NodeId, ttl: Duration) -> Result<Option<Lease>, LeaseError> {
        let sent = Instant::now();
        let key = self.lease_key(queue);
        let answer: Vec<String> = self
            .acquire
            .key(&key)
            .key(self.fence_key(queue))
            .arg(node.as_str())
            .arg(millis(ttl))
            .invoke_async(&mut self.conn.clone())
            .await
            .map_err(backend("acquire", queue))?;
        match answer.as_slice() {
            [token] => {
                let token = parse(&key, "token", token)?;
                tracing::debug!(%queue, %node, token, "queue lease granted");
                Ok(Some(Lease { queue, holder: node.clone(), token, expires_at: sent + ttl }))
            }
            [_, holder] => {
                tracing::trace!(%queue, %node, %holder, "queue lease held by another node");
                Ok(None)
            }
            other => Err(LeaseError::Corrupt { key, message: format!("acquire answered {other:?}") }),
        }
    }

    async fn renew(&self, lease: &Lease, ttl: Duration) -> Result<Option<Lease>, LeaseError> {
        let sent = Instant::now();
        let renewed: i64 = self
            .renew
            .key(self.lease_key(lease.queue))
            .arg(lease.holder.as_str())
            .arg(lease.token)
            .arg(millis(ttl))
            .invoke_async(&mut self.conn.clone())
            .await
            .map_err(backend("renew", lease.queue))?;
        Ok((renewed == 1).then(|| Lease { expires_at: sent + ttl, ..lease.clone() }))
    }

    async fn release(&self, lease: &Lease) -> Result<bool, LeaseError> {
        let released: i64 = self
            .release
            .key(self.lease_key(lease.queue))
            .arg(lease.holder.as_str())
            .arg(lease.token)
            .invoke_async(&mut self.conn.clone())
            .await
            .map_err(backend("release", lease.queue))?;
        Ok(released == 1)
    }

    async fn holders(&self, queues: &[QueueId]) -> Result<Vec<Lease>, LeaseError> {
        let peeks = queues.iter().map(|queue| async move {
            let sent = Instant::now();
            let key = self.lease_key(*queue);
            let answer: Vec<String> =
                self.peek.key(&key).invoke_async(&mut self.conn.clone()).await.map_err(backend("holders", *queue))?;
            match answer.as_slice() {
                [] => Ok(None),
                [holder, token, pttl] => {
                    // -1 (no TTL) cannot happen for keys this module writes;
                    // treat it as already lapsed rather than held forever.
                    let pttl: i64 = parse(&key, "pttl", pttl)?;
                    let left = Duration::from_millis(u64::try_from(pttl).unwrap_or(0));
                    Ok(Some(Lease {
                        queue: *queue,
                        holder: NodeId::new(holder),
                        token: parse(&key, "token", token)?,
                        expires_at: sent + left,
                    }))
                }
                other => Err(LeaseError::Corrupt { key, message: format!("peek answered {other:?}") }),
            }
        });
        let found = futures::future::try_join_all(peeks).await?;
        Ok(found.into_iter().flatten().collect())
    }

    /// The Redis adapter, its checkpointer and the Redis run log store
    /// check `{prefix}:{qn}:fence` (same server and key prefix).
    fn fences_queue_stores(&self) -> bool {
        true
    }
}
