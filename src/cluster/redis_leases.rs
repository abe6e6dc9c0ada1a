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
//! (`renew` says so) and free for the others.
//!
//! Every command and script touches the keys of one slot, so the same code
//! runs on one server and on a Redis Cluster (where a node's alive key and
//! a queue's lease live on different shards). An acquire extends the
//! caller's alive key, reads the grant and its holder's alive key, then
//! grants in one script if the lease is free, already the caller's, or
//! still the grant it read under a dead epoch (dead for good: an epoch never
//! comes back). Renew and release act only with the current token. A
//! lease's local `expires_at` counts from when the first request was sent,
//! so it never comes after the server's expiry. A grant written by an older
//! tailrace (no `epoch`, a TTL on the hash) lives while its hash does.
//!
//! **Failover.** Redis replicates asynchronously: a master that dies may
//! take its last writes with it, and a promoted replica that missed a
//! grant's `INCR` would hand the same token to a second node, which the
//! fences could not tell apart. So with `wait_replicas` (see
//! [`RedisLeases::with_wait_replicas`]) a grant is used only once that many
//! replicas have it: every token in use is on the replica that takes over,
//! and the next grant there is above all of them. Alive keys need no such
//! wait: one lost in a failover only makes its node's grants look dead, and
//! a grant taken from them gets a higher token that fences the old owner.

use std::collections::HashMap;
use std::time::Duration;

use async_trait::async_trait;
use parking_lot::Mutex;
use tokio::time::Instant;

use super::lease::{Lease, LeaseError, QueueLeases};
use crate::redis_conn::{self, RedisConn, RedisConnError, RedisEndpoint, WaitReplicas};
use crate::stream::{NodeId, QueueId};
use scripts::{EVICT, GRANT, REJOIN, RELEASE, RENEW};

mod scripts;

/// Lease keys read by one round of `holders`.
const HOLDERS_PER_CALL: usize = 256;

/// The key prefix every key of `queue` starts with: `{prefix}:{q3}`, whose
/// hash tag puts all of them in one Redis Cluster slot.
pub(crate) fn queue_tag(prefix: &str, queue: QueueId) -> String {
    format!("{prefix}:{{{queue}}}")
}

/// Queue leases in Redis. See the module documentation.
pub struct RedisLeases {
    conn: RedisConn,
    prefix: String,
    grant: redis::Script,
    rejoin: redis::Script,
    renew: redis::Script,
    release: redis::Script,
    evict: redis::Script,
    /// Replicas a grant must reach before it is used (see the module
    /// documentation on failover).
    wait: Option<WaitReplicas>,
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
    pub fn new(conn: impl Into<RedisConn>, prefix: &str) -> Self {
        Self {
            conn: conn.into(),
            prefix: prefix.to_string(),
            grant: redis::Script::new(GRANT),
            rejoin: redis::Script::new(REJOIN),
            renew: redis::Script::new(RENEW),
            release: redis::Script::new(RELEASE),
            evict: redis::Script::new(EVICT),
            wait: None,
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
        let config = redis_conn::reconnecting(response_timeout);
        let conn = endpoint.connect_any(config, response_timeout).await.map_err(|e| match e {
            RedisConnError::Unreachable { url, message } => LeaseError::Connect { url, message },
            other => LeaseError::Refused(other.to_string()),
        })?;
        Ok(Self::new(conn, prefix))
    }

    /// A grant is used only once `wait.replicas` replicas have it (`WAIT`
    /// after the grant, on its slot's master): a master's failover then
    /// cannot hand its token out again.
    pub fn with_wait_replicas(mut self, wait: Option<WaitReplicas>) -> Self {
        self.wait = wait;
        self
    }

    /// Its connection (membership shares it, so both reach the same server).
    pub fn connection(&self) -> RedisConn {
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
    /// more) the alive one. Four steps, each on one key's slot: extend our
    /// alive key (the lease's local expiry counts from then), read the
    /// grant, read its holder's alive key, grant if the lease is free,
    /// ours, or still the dead grant we read.
    async fn try_acquire(
        &self,
        queue: QueueId,
        node: &NodeId,
        epoch: u64,
        ttl: Duration,
    ) -> Result<Result<Option<Lease>, ()>, LeaseError> {
        let sent = Instant::now();
        let mut conn = self.conn.clone();
        let alive: i64 = self
            .renew
            .key(self.alive_key(node))
            .arg(epoch)
            .arg(millis(ttl))
            .invoke_async(&mut conn)
            .await
            .map_err(backend("acquire", queue))?;
        if alive != 1 {
            return Ok(Err(()));
        }
        let key = self.lease_key(queue);
        let (holder, held_epoch): (Option<String>, Option<String>) = redis::cmd("HMGET")
            .arg(&key)
            .arg("holder")
            .arg("epoch")
            .query_async(&mut conn)
            .await
            .map_err(backend("acquire", queue))?;
        if let Some(holder) = holder.as_deref().filter(|h| *h != node.as_str()) {
            // A grant without an epoch (an older tailrace's) lives while its
            // hash does; one with an epoch, while its holder's key holds it.
            let live = match &held_epoch {
                None => true,
                Some(held) => {
                    let current: Option<String> = redis::cmd("GET")
                        .arg(self.alive_key(&NodeId::new(holder)))
                        .query_async(&mut conn)
                        .await
                        .map_err(backend("acquire", queue))?;
                    current.as_deref() == Some(held.as_str())
                }
            };
            if live {
                tracing::trace!(%queue, %node, %holder, "queue lease held by another node");
                return Ok(Ok(None));
            }
        }
        let answer: Vec<String> = self
            .grant
            .key(&key)
            .key(self.fence_key(queue))
            .arg(node.as_str())
            .arg(epoch)
            .arg(holder.unwrap_or_default())
            .arg(held_epoch.unwrap_or_default())
            .invoke_async(&mut conn)
            .await
            .map_err(backend("acquire", queue))?;
        match answer.as_slice() {
            [token] => {
                let token = parse(&key, "token", token)?;
                self.confirm_replicated(queue, &key, token).await?;
                if let Some(entry) = self.nodes.lock().get_mut(node) {
                    entry.granted.insert(queue, (token, epoch));
                }
                tracing::debug!(%queue, %node, token, "queue lease granted");
                Ok(Ok(Some(Lease { queue, holder: node.clone(), token, expires_at: sent + ttl })))
            }
            [_, holder] => {
                tracing::trace!(%queue, %node, %holder, "queue lease taken by another node meanwhile");
                Ok(Ok(None))
            }
            other => Err(LeaseError::Corrupt { key, message: format!("acquire answered {other:?}") }),
        }
    }

    /// With `wait_replicas`, a grant is used only once that many replicas
    /// have it; otherwise the acquire fails (and is tried again: the grant
    /// is ours, so the next acquire takes it with a new token).
    async fn confirm_replicated(&self, queue: QueueId, key: &str, token: u64) -> Result<(), LeaseError> {
        let Some(wait) = self.wait else { return Ok(()) };
        let confirmed = self.conn.wait_replicas(key, wait).await.map_err(backend("acquire", queue))?;
        if confirmed < wait.replicas {
            return Err(LeaseError::Backend {
                operation: "acquire",
                queue,
                message: format!(
                    "grant {token} reached {confirmed} of {} replicas within {:?} ([adapters.redis] wait_replicas): \
                     not used, a failover could hand its token out again",
                    wait.replicas, wait.timeout
                ),
            });
        }
        Ok(())
    }

    /// The live grants among `queues` (at most [`HOLDERS_PER_CALL`]): the
    /// grants in one round (one pipeline per slot), then the alive key of
    /// each holder. A grant is live while its holder's alive key holds its
    /// epoch, and lasts that key's PTTL.
    async fn holders_of(&self, queues: &[QueueId]) -> Result<Vec<Lease>, LeaseError> {
        let Some(first) = queues.first().copied() else { return Ok(Vec::new()) };
        let sent = Instant::now();
        let reads = queues.iter().map(|queue| {
            let key = self.lease_key(*queue);
            let mut read = redis::cmd("HMGET");
            read.arg(&key).arg("holder").arg("token").arg("epoch");
            (key, read)
        });
        let grants: Vec<(Option<String>, Option<String>, Option<String>)> =
            self.conn.query_by_slot(reads.collect()).await.map_err(backend("holders", first))?;
        let mut holders: Vec<String> = grants.iter().filter_map(|(holder, _, _)| holder.clone()).collect();
        holders.sort();
        holders.dedup();
        let mut looks = Vec::with_capacity(holders.len() * 2);
        for holder in &holders {
            let key = self.alive_key(&NodeId::new(holder.as_str()));
            looks.push((key.clone(), redis::cmd("GET").arg(&key).clone()));
            looks.push((key.clone(), redis::cmd("PTTL").arg(&key).clone()));
        }
        let alive: Vec<redis::Value> = self.conn.query_by_slot(looks).await.map_err(backend("holders", first))?;
        let mut found = Vec::with_capacity(grants.len());
        for (queue, (holder, token, epoch)) in queues.iter().zip(grants) {
            let (Some(holder), Some(token)) = (holder, token) else { continue };
            let key = self.lease_key(*queue);
            let pttl: i64 = match epoch {
                Some(epoch) => {
                    let Ok(at) = holders.binary_search(&holder) else { continue };
                    let current: Option<String> = redis::from_redis_value_ref(&alive[2 * at]).unwrap_or(None);
                    if current.as_deref() != Some(epoch.as_str()) {
                        continue;
                    }
                    redis::from_redis_value_ref(&alive[2 * at + 1]).unwrap_or(-2)
                }
                // An older tailrace's grant: it lives as long as its hash.
                None => redis::cmd("PTTL")
                    .arg(&key)
                    .query_async(&mut self.conn.clone())
                    .await
                    .map_err(backend("holders", first))?,
            };
            // -1 (no TTL) cannot happen for keys this module writes, and -2
            // is a key gone meanwhile: both count as lapsed.
            let Ok(left) = u64::try_from(pttl) else { continue };
            found.push(Lease {
                queue: *queue,
                holder: NodeId::new(holder),
                token: parse(&key, "token", &token)?,
                expires_at: sent + Duration::from_millis(left),
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
