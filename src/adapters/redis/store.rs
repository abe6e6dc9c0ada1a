//! Checkpoints and subscriptions in Redis, so that every node of a cluster
//! sees the same.

use crate::redis_conn::{RedisConn, WaitReplicas};
use async_trait::async_trait;

use super::fence;
use crate::pubsub::{PubSubError, PubSubStore, Subscription, SubscriptionId, SubscriptionState};
use crate::queue::{CheckpointError, Checkpointer, Fence};
use crate::stream::{NodeId, QueueId, SequenceToken, StreamId};

/// Checkpoints as strings at `{prefix}:{qn}:checkpoint` (under the queue's
/// hash tag; see `fence.rs`). A fenced save checks the queue's fencing
/// counter in the same script as its `SET`.
pub struct RedisCheckpointer {
    conn: RedisConn,
    prefix: String,
    save_fenced: redis::Script,
    /// Replicas a save must reach before it counts.
    wait: Option<WaitReplicas>,
}

impl RedisCheckpointer {
    /// Over an existing connection.
    pub fn new(conn: impl Into<RedisConn>, prefix: &str) -> Self {
        let conn = conn.into();
        Self { conn, prefix: prefix.to_string(), save_fenced: fence::script(fence::SAVE), wait: None }
    }

    /// A save counts only once `wait.replicas` replicas have it, so a
    /// master's failover cannot take a checkpoint back.
    pub fn with_wait_replicas(mut self, wait: Option<WaitReplicas>) -> Self {
        self.wait = wait;
        self
    }

    /// The checkpoint key of `queue`.
    pub fn key(&self, queue: QueueId) -> String {
        fence::checkpoint_key(&self.prefix, queue)
    }
}

#[async_trait]
impl Checkpointer for RedisCheckpointer {
    async fn load(&self, queue: QueueId) -> Result<Option<SequenceToken>, CheckpointError> {
        let mut conn = self.conn.clone();
        let value: Option<String> = redis::cmd("GET")
            .arg(self.key(queue))
            .query_async(&mut conn)
            .await
            .map_err(|e| CheckpointError::Backend(format!("redis GET {}: {e}", self.key(queue))))?;
        value
            .map(|v| {
                v.parse().map_err(|e: crate::stream::ParseTokenError| CheckpointError::Corrupt {
                    path: self.key(queue).into(),
                    reason: e.to_string(),
                })
            })
            .transpose()
    }

    async fn save(&self, queue: QueueId, token: SequenceToken, fence: Fence) -> Result<(), CheckpointError> {
        match fence.token() {
            Some(fence) => self.save_fenced(queue, token, fence).await?,
            None => self.save_unfenced(queue, token).await?,
        }
        let Some(wait) = self.wait else { return Ok(()) };
        let key = self.key(queue);
        let confirmed = self
            .conn
            .wait_replicas(&key, wait)
            .await
            .map_err(|e| CheckpointError::Backend(format!("redis WAIT after SET {key}: {e}")))?;
        if confirmed < wait.replicas {
            return Err(CheckpointError::Backend(format!(
                "checkpoint {key}: {confirmed} of {} replicas had it within {:?} ([adapters.redis] wait_replicas)",
                wait.replicas, wait.timeout
            )));
        }
        Ok(())
    }
}

impl RedisCheckpointer {
    async fn save_unfenced(&self, queue: QueueId, token: SequenceToken) -> Result<(), CheckpointError> {
        let mut conn = self.conn.clone();
        redis::cmd("SET")
            .arg(self.key(queue))
            .arg(token.to_string())
            .query_async::<()>(&mut conn)
            .await
            .map_err(|e| CheckpointError::Backend(format!("redis SET {}: {e}", self.key(queue))))
    }

    async fn save_fenced(&self, queue: QueueId, token: SequenceToken, fence: u64) -> Result<(), CheckpointError> {
        let saved: Result<i64, _> = self
            .save_fenced
            .key(self.key(queue))
            .key(fence::fence_key(&self.prefix, queue))
            .arg(fence)
            .arg(token.to_string())
            .invoke_async(&mut self.conn.clone())
            .await;
        match saved {
            Ok(_) => Ok(()),
            Err(error) if fence::is_refusal(&error) => {
                fence::refused("checkpoint", queue, fence, &error);
                Err(CheckpointError::Fenced { queue, token: fence })
            }
            Err(e) => Err(CheckpointError::Backend(format!("redis fenced SET {}: {e}", self.key(queue)))),
        }
    }
}

/// Inserts or replaces a subscription unless the stream (`KEYS[1]`)
/// already holds `ARGV[3]` others: one script, so two nodes cannot both
/// pass the check.
const UPSERT: &str = r"
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 0 and redis.call('HLEN', KEYS[1]) >= tonumber(ARGV[3]) then
  return 0
end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
return 1";

/// Removes a subscription from its stream (`KEYS[1]`); answers what was
/// stored (or nothing), so its node index entry can go too.
const REMOVE: &str = r"
local stored = redis.call('HGET', KEYS[1], ARGV[1])
if not stored then
  return false
end
redis.call('HDEL', KEYS[1], ARGV[1])
return stored";

/// Subscriptions as one hash per stream, field = subscription id, at most
/// `max_per_stream` of them, and a set per node of its consumers'
/// subscriptions (`stream key \t id`), so a dead node's can be purged.
///
/// Each command touches one key, so the store runs on a Redis Cluster as
/// on one server. The index entry is written before the subscription and
/// removed after it: an entry may name a subscription that is gone (purging
/// it removes nothing), never the other way round.
pub struct RedisPubSubStore {
    conn: RedisConn,
    prefix: String,
    max_per_stream: usize,
    upsert: redis::Script,
    remove: redis::Script,
}

impl RedisPubSubStore {
    /// Over an existing connection; a stream holds at most `max_per_stream`
    /// subscriptions.
    pub fn new(conn: impl Into<RedisConn>, prefix: &str, max_per_stream: usize) -> Self {
        let conn = conn.into();
        Self {
            conn,
            prefix: prefix.to_string(),
            max_per_stream,
            upsert: redis::Script::new(UPSERT),
            remove: redis::Script::new(REMOVE),
        }
    }

    /// The index of the subscriptions whose consumer lives on `node`.
    fn node_index(&self, node: &NodeId) -> String {
        format!("{}:subs-of:{node}", self.prefix)
    }

    /// Length-prefixed, so `a:b`/`c` and `a`/`b:c` never share a key.
    fn key(&self, stream: &StreamId) -> String {
        format!("{}:subs:{}:{}:{}", self.prefix, stream.namespace().len(), stream.namespace(), stream.key())
    }
}

/// A node index entry: the stream's key and the subscription id.
fn index_entry(key: &str, id: SubscriptionId) -> String {
    format!("{key}\t{id}")
}

fn store_error(e: redis::RedisError) -> PubSubError {
    PubSubError::Store(format!("redis: {e}"))
}

#[async_trait]
impl PubSubStore for RedisPubSubStore {
    async fn subscriptions(&self, stream: &StreamId) -> Result<Vec<Subscription>, PubSubError> {
        let mut conn = self.conn.clone();
        let values: Vec<String> =
            redis::cmd("HVALS").arg(self.key(stream)).query_async(&mut conn).await.map_err(store_error)?;
        values
            .iter()
            .map(|v| {
                serde_json::from_str(v)
                    .map_err(|e| PubSubError::Store(format!("a stored subscription of {stream} is unreadable: {e}")))
            })
            .collect()
    }

    async fn upsert(&self, subscription: Subscription) -> Result<(), PubSubError> {
        let mut conn = self.conn.clone();
        let json = serde_json::to_string(&subscription).map_err(|e| PubSubError::Store(e.to_string()))?;
        let key = self.key(&subscription.stream);
        redis::cmd("SADD")
            .arg(self.node_index(&subscription.consumer.node))
            .arg(index_entry(&key, subscription.id))
            .query_async::<()>(&mut conn)
            .await
            .map_err(store_error)?;
        let stored: i64 = self
            .upsert
            .key(&key)
            .arg(subscription.id.to_string())
            .arg(json)
            .arg(self.max_per_stream)
            .invoke_async(&mut conn)
            .await
            .map_err(store_error)?;
        if stored == 0 {
            return Err(PubSubError::TooManyOnStream {
                stream: subscription.stream.to_string(),
                limit: self.max_per_stream,
            });
        }
        Ok(())
    }

    async fn remove(&self, stream: &StreamId, id: SubscriptionId) -> Result<bool, PubSubError> {
        let mut conn = self.conn.clone();
        let key = self.key(stream);
        let stored: Option<String> =
            self.remove.key(&key).arg(id.to_string()).invoke_async(&mut conn).await.map_err(store_error)?;
        let Some(stored) = stored else { return Ok(false) };
        // A subscription that does not parse keeps its index entry: purging
        // that node later removes nothing.
        if let Ok(subscription) = serde_json::from_str::<Subscription>(&stored) {
            redis::cmd("SREM")
                .arg(self.node_index(&subscription.consumer.node))
                .arg(index_entry(&key, id))
                .query_async::<()>(&mut conn)
                .await
                .map_err(store_error)?;
        }
        Ok(true)
    }

    /// Reads the node's index, removes each subscription it names, then
    /// those entries (not the whole set: a subscription added meanwhile
    /// keeps its entry).
    async fn remove_node(&self, node: &NodeId) -> Result<usize, PubSubError> {
        let mut conn = self.conn.clone();
        let index = self.node_index(node);
        let entries: Vec<String> =
            redis::cmd("SMEMBERS").arg(&index).query_async(&mut conn).await.map_err(store_error)?;
        let removals = entries.iter().filter_map(|entry| {
            let (key, id) = entry.split_once('\t')?;
            Some((key.to_string(), redis::cmd("HDEL").arg(key).arg(id).clone()))
        });
        let removed: Vec<u64> = self.conn.query_by_slot(removals.collect()).await.map_err(store_error)?;
        if !entries.is_empty() {
            redis::cmd("SREM").arg(&index).arg(&entries).query_async::<()>(&mut conn).await.map_err(store_error)?;
        }
        Ok(usize::try_from(removed.iter().sum::<u64>()).unwrap_or(usize::MAX))
    }

    async fn fault(&self, stream: &StreamId, id: SubscriptionId, reason: &str) -> Result<(), PubSubError> {
        let mut conn = self.conn.clone();
        let current: Option<String> = redis::cmd("HGET")
            .arg(self.key(stream))
            .arg(id.to_string())
            .query_async(&mut conn)
            .await
            .map_err(store_error)?;
        let Some(current) = current else { return Ok(()) };
        let mut subscription: Subscription =
            serde_json::from_str(&current).map_err(|e| PubSubError::Store(e.to_string()))?;
        subscription.state = SubscriptionState::Faulted(reason.to_string());
        self.upsert(subscription).await
    }
}
