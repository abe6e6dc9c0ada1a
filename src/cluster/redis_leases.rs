//! Queue leases in Redis, for nodes in separate processes.
//!
//! A grant is per queue, its life is per node: a node's leases live as long
//! as its **alive key**, so that a node renews all of them with one command
//! and a dead node's leases are all free the moment its key goes.
//!
//! - `{prefix}:{q3}:lease`, a hash `holder`, `token`, `epoch`, without a
//!   TTL: the grant. Each queue's keys share the hash tag `{q3}`, so that a
//!   Redis Cluster keeps them (and the queue's stream and checkpoint) in
//!   one slot;
//! - `{prefix}:{q3}:fence`, the counter `INCR`ed for every grant (no TTL,
//!   never reset): fencing tokens only grow, across releases and expiries;
//! - `{prefix}:alive:{node}`, the holder's current **epoch** (a random
//!   number), with a PX TTL of `lease.ttl` that every acquire and every
//!   renewal extends. Redis expires it on its own clock, so node clocks do
//!   not matter.
//!
//! A grant is live while its holder's alive key holds the grant's epoch.
//! An epoch never comes back: a node that finds its alive key gone (it
//! paused or lost Redis past the TTL, or another node evicted it) takes a
//! new epoch, and every lease it held under the old one is lost to it
//! (`renew` says so) and free for the others. Acquire, renew, release and
//! the read of the holders are Lua scripts, atomic on the server: a grant
//! is taken only if it is free, its holder's epoch is dead, or it is
//! already the caller's; renew and release act only with the current
//! token. A lease's local `expires_at` counts from when the request was
//! sent, so it never comes after the server's expiry. A grant written by an
//! older tailrace (no `epoch`, a TTL on the hash) lives while its hash does.

use std::collections::HashMap;
use std::time::Duration;

use async_trait::async_trait;
use parking_lot::Mutex;
use redis::aio::ConnectionManager;
use tokio::time::Instant;

use super::lease::{Lease, LeaseError, QueueLeases};
use crate::redis_conn::{self, RedisConnError, RedisEndpoint};
use crate::stream::{NodeId, QueueId};

/// Takes the lease (KEYS[1]) for ARGV[1] under epoch ARGV[2] if it is free,
/// its holder's epoch is dead (the alive key `ARGV[4] .. holder` does not
/// hold it) or it is ARGV[1]'s, with a new token from the fence (KEYS[2]);
/// extends the caller's alive key (KEYS[3]) to ARGV[3] ms. `{token}`,
/// `{0, holder}`, or `{-1}` when the caller's alive key does not hold its
/// epoch (it must take a new one first).
const ACQUIRE: &str = r"
if redis.call('GET', KEYS[3]) ~= ARGV[2] then
  return {'-1'}
end
local holder = redis.call('HGET', KEYS[1], 'holder')
if holder and holder ~= ARGV[1] then
  local epoch = redis.call('HGET', KEYS[1], 'epoch')
  if not epoch or redis.call('GET', ARGV[4] .. holder) == epoch then
    return {'0', holder}
  end
end
local token = string.format('%d', redis.call('INCR', KEYS[2]))
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], 'holder', ARGV[1], 'token', token, 'epoch', ARGV[2])
redis.call('PEXPIRE', KEYS[3], ARGV[3])
return {token}";

/// A new epoch ARGV[1] for the alive key KEYS[1], for ARGV[2] ms: every
/// grant of the old epoch is dead from now on.
const REJOIN: &str = r"
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return 1";

/// Extends the alive key KEYS[1] to ARGV[2] ms if it still holds epoch
/// ARGV[1]: every lease of that epoch is renewed at once. 1, or 0.
const RENEW: &str = r"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
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

/// The live grants among the leases KEYS, as `{index, holder, token,
/// pttl}`: a grant is live while its holder's alive key (`ARGV[1] ..
/// holder`) holds its epoch, and lasts that key's PTTL. Each holder's key
/// is read once.
const HOLDERS: &str = r"
local out, alive = {}, {}
for i, key in ipairs(KEYS) do
  local grant = redis.call('HMGET', key, 'holder', 'token', 'epoch')
  local holder, pttl = grant[1], nil
  if holder and grant[3] then
    if alive[holder] == nil then
      local epoch = redis.call('GET', ARGV[1] .. holder)
      alive[holder] = epoch and {epoch, redis.call('PTTL', ARGV[1] .. holder)} or false
    end
    local a = alive[holder]
    if a and a[1] == grant[3] then pttl = a[2] end
  elseif holder then
    pttl = redis.call('PTTL', key)
  end
  if pttl then out[#out + 1] = {tostring(i), holder, grant[2], tostring(pttl)} end
end
return out";

/// Deletes the alive key KEYS[1]: every grant of that node is free.
const EVICT: &str = r"
return redis.call('DEL', KEYS[1])";

/// Lease keys read by one script call of `holders`.
const HOLDERS_PER_CALL: usize = 256;

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
    rejoin: redis::Script,
    renew: redis::Script,
    release: redis::Script,
    holders: redis::Script,
    evict: redis::Script,
    /// Per node name this store acquires for: its epoch, and the grants
    /// it holds under which epoch (at most one per queue).
    nodes: Mutex<HashMap<NodeId, Epoch>>,
    /// One new epoch at a time: the acquires that found the old one dead
    /// together wait for it, and then use it.
    rejoining: tokio::sync::Mutex<()>,
}

/// One node's epoch and its grants.
struct Epoch {
    epoch: u64,
    /// Queue → (token, epoch) of the grant this store made.
    granted: HashMap<QueueId, (u64, u64)>,
}

impl RedisLeases {
    /// Over an existing connection; keys start with `prefix`.
    pub fn new(conn: ConnectionManager, prefix: &str) -> Self {
        Self {
            conn,
            prefix: prefix.to_string(),
            acquire: redis::Script::new(ACQUIRE),
            rejoin: redis::Script::new(REJOIN),
            renew: redis::Script::new(RENEW),
            release: redis::Script::new(RELEASE),
            holders: redis::Script::new(HOLDERS),
            evict: redis::Script::new(EVICT),
            nodes: Mutex::new(HashMap::new()),
            rejoining: tokio::sync::Mutex::new(()),
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

    /// The alive key of `node` (its epoch; its grants live while it does).
    pub fn alive_key(&self, node: &NodeId) -> String {
        format!("{}{node}", self.alive_prefix())
    }

    fn alive_prefix(&self) -> String {
        format!("{}:alive:", self.prefix)
    }

    /// `node`'s current epoch (drawn at its first acquire).
    fn epoch(&self, node: &NodeId) -> u64 {
        let mut nodes = self.nodes.lock();
        let entry =
            nodes.entry(node.clone()).or_insert_with(|| Epoch { epoch: fresh_epoch(), granted: HashMap::new() });
        entry.epoch
    }

    /// A new epoch for `node` in place of `dead`, written to its alive key:
    /// its grants under the old one are dead. Single-flight: if another
    /// acquire replaced `dead` meanwhile, its epoch is the answer.
    async fn rejoin(&self, node: &NodeId, dead: u64, ttl: Duration, queue: QueueId) -> Result<u64, LeaseError> {
        let _one_at_a_time = self.rejoining.lock().await;
        let current = self.epoch(node);
        if current != dead {
            return Ok(current);
        }
        let epoch = fresh_epoch();
        let _: i64 = self
            .rejoin
            .key(self.alive_key(node))
            .arg(epoch)
            .arg(millis(ttl))
            .invoke_async(&mut self.conn.clone())
            .await
            .map_err(backend("acquire", queue))?;
        let mut nodes = self.nodes.lock();
        let entry = nodes.entry(node.clone()).or_insert_with(|| Epoch { epoch, granted: HashMap::new() });
        entry.epoch = epoch;
        tracing::info!(%node, epoch, "new lease epoch: grants of the old one are given up");
        Ok(epoch)
    }

    /// One acquire under `epoch`: `Ok(Err(()))` if the epoch is not (any
    /// more) the alive one.
    async fn try_acquire(
        &self,
        queue: QueueId,
        node: &NodeId,
        epoch: u64,
        ttl: Duration,
    ) -> Result<Result<Option<Lease>, ()>, LeaseError> {
        let sent = Instant::now();
        let key = self.lease_key(queue);
        let answer: Vec<String> = self
            .acquire
            .key(&key)
            .key(self.fence_key(queue))
            .key(self.alive_key(node))
            .arg(node.as_str())
            .arg(epoch)
            .arg(millis(ttl))
            .arg(self.alive_prefix())
            .invoke_async(&mut self.conn.clone())
            .await
            .map_err(backend("acquire", queue))?;
        match answer.as_slice() {
            [flag] if flag == "-1" => Ok(Err(())),
            [token] => {
                let token = parse(&key, "token", token)?;
                if let Some(entry) = self.nodes.lock().get_mut(node) {
                    entry.granted.insert(queue, (token, epoch));
                }
                tracing::debug!(%queue, %node, token, "queue lease granted");
                Ok(Ok(Some(Lease { queue, holder: node.clone(), token, expires_at: sent + ttl })))
            }
            [_, holder] => {
                tracing::trace!(%queue, %node, %holder, "queue lease held by another node");
                Ok(Ok(None))
            }
            other => Err(LeaseError::Corrupt { key, message: format!("acquire answered {other:?}") }),
        }
    }

    /// The live grants among `queues` (at most [`HOLDERS_PER_CALL`]).
    async fn holders_of(&self, queues: &[QueueId]) -> Result<Vec<Lease>, LeaseError> {
        let Some(first) = queues.first().copied() else { return Ok(Vec::new()) };
        let sent = Instant::now();
        let mut call = self.holders.prepare_invoke();
        for queue in queues {
            call.key(self.lease_key(*queue));
        }
        call.arg(self.alive_prefix());
        let rows: Vec<Vec<String>> =
            call.invoke_async(&mut self.conn.clone()).await.map_err(backend("holders", first))?;
        let mut found = Vec::with_capacity(rows.len());
        for row in rows {
            let [index, holder, token, pttl] = row.as_slice() else {
                return Err(LeaseError::Corrupt {
                    key: self.lease_key(first),
                    message: format!("holders answered {row:?}"),
                });
            };
            let index: usize = parse(&self.lease_key(first), "index", index)?;
            let Some(queue) = index.checked_sub(1).and_then(|i| queues.get(i)).copied() else {
                return Err(LeaseError::Corrupt {
                    key: self.lease_key(first),
                    message: format!("holders answered index {index}"),
                });
            };
            let key = self.lease_key(queue);
            // -1 (no TTL) cannot happen for keys this module writes; treat
            // it as already lapsed rather than held forever.
            let pttl: i64 = parse(&key, "pttl", pttl)?;
            let left = Duration::from_millis(u64::try_from(pttl).unwrap_or(0));
            found.push(Lease {
                queue,
                holder: NodeId::new(holder),
                token: parse(&key, "token", token)?,
                expires_at: sent + left,
            });
        }
        Ok(found)
    }
}

/// A random epoch (never 0).
fn fresh_epoch() -> u64 {
    rand::random::<u64>().max(1)
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
        let epoch = self.epoch(node);
        if let Ok(granted) = self.try_acquire(queue, node, epoch, ttl).await? {
            return Ok(granted);
        }
        // Our alive key is gone (first acquire, a pause past the TTL, an
        // eviction) or another process of ours wrote it: a new epoch.
        let epoch = self.rejoin(node, epoch, ttl, queue).await?;
        match self.try_acquire(queue, node, epoch, ttl).await? {
            Ok(granted) => Ok(granted),
            Err(()) => Err(LeaseError::Backend {
                operation: "acquire",
                queue,
                message: format!("the alive key of {node} changed under it (another process runs as {node}?)"),
            }),
        }
    }

    async fn renew(&self, lease: &Lease, ttl: Duration) -> Result<Option<Lease>, LeaseError> {
        Ok(self.renew_all(std::slice::from_ref(lease), ttl).await?.pop().flatten())
    }

    /// One command for all of them: the holder's alive key, if it still
    /// holds the epoch they were granted under.
    async fn renew_all(&self, leases: &[Lease], ttl: Duration) -> Result<Vec<Option<Lease>>, LeaseError> {
        let mut renewed = Vec::with_capacity(leases.len());
        let mut by_holder: Vec<(&NodeId, Vec<usize>)> = Vec::new();
        for (i, lease) in leases.iter().enumerate() {
            renewed.push(None);
            match by_holder.iter_mut().find(|(holder, _)| *holder == &lease.holder) {
                Some((_, indexes)) => indexes.push(i),
                None => by_holder.push((&lease.holder, vec![i])),
            }
        }
        for (holder, indexes) in by_holder {
            let Some(epoch) = self.nodes.lock().get(holder).map(|e| e.epoch) else { continue };
            let sent = Instant::now();
            let alive: i64 = self
                .renew
                .key(self.alive_key(holder))
                .arg(epoch)
                .arg(millis(ttl))
                .invoke_async(&mut self.conn.clone())
                .await
                .map_err(backend("renew", leases[indexes[0]].queue))?;
            let nodes = self.nodes.lock();
            let Some(granted) = nodes.get(holder).map(|e| &e.granted) else { continue };
            for i in indexes {
                let lease = &leases[i];
                let current = granted.get(&lease.queue) == Some(&(lease.token, epoch));
                if alive == 1 && current {
                    renewed[i] = Some(Lease { expires_at: sent + ttl, ..lease.clone() });
                }
            }
        }
        Ok(renewed)
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
        if let Some(entry) = self.nodes.lock().get_mut(&lease.holder)
            && entry.granted.get(&lease.queue).is_some_and(|(token, _)| *token == lease.token)
        {
            entry.granted.remove(&lease.queue);
        }
        Ok(released == 1)
    }

    /// One script call per 256 queues.
    async fn holders(&self, queues: &[QueueId]) -> Result<Vec<Lease>, LeaseError> {
        let calls = queues.chunks(HOLDERS_PER_CALL).map(|chunk| self.holders_of(chunk));
        Ok(futures::future::try_join_all(calls).await?.into_iter().flatten().collect())
    }

    /// Deletes `node`'s alive key: all its grants are free at once.
    async fn evict(&self, node: &NodeId) -> Result<bool, LeaseError> {
        let deleted: i64 = self
            .evict
            .key(self.alive_key(node))
            .invoke_async(&mut self.conn.clone())
            .await
            .map_err(|e| LeaseError::Backend { operation: "evict", queue: QueueId(0), message: e.to_string() })?;
        Ok(deleted == 1)
    }

    /// The Redis adapter, its checkpointer and the Redis run log store
    /// check `{prefix}:{qn}:fence` (same server and key prefix).
    fn fences_queue_stores(&self) -> bool {
        true
    }
}
