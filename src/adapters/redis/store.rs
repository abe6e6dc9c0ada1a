//! Checkpoints and subscriptions in Redis, so that every node of a cluster
//! sees the same.

use crate::redis_conn::RedisConn;
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
}

impl RedisCheckpointer {
    /// Over an existing connection.
    pub fn new(conn: impl Into<RedisConn>, prefix: &str) -> Self {
        let conn = conn.into();
        Self { conn, prefix: prefix.to_string(), save_fenced: fence::script(fence::SAVE) }
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
            Some(fence) => self.save_fenced(queue, token, fence).await,
            None => self.save_unfenced(queue, token).await,
        }
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

/// Inserts or replaces a subscription unless the stream already holds
/// `ARGV[3]` others: one script, so two nodes cannot both pass the check.
/// Stores a subscription and indexes it under its consumer's node
/// (`KEYS[2]`), so that the subscriptions of a dead node can be purged.
const UPSERT: &str = r"
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 0 and redis.call('HLEN', KEYS[1]) >= tonumber(ARGV[3]) then
  return 0
end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
redis.call('SADD', KEYS[2], KEYS[1] .. '\t' .. ARGV[1])
return 1";

/// Removes a subscription and its node index entry (`ARGV[2]` is the index
/// keys' prefix; the node comes from the stored subscription).
const REMOVE: &str = r"
local stored = redis.call('HGET', KEYS[1], ARGV[1])
if not stored then
  return 0
end
local ok, sub = pcall(cjson.decode, stored)
if ok and type(sub) == 'table' and type(sub.consumer) == 'table' and type(sub.consumer.node) == 'string' then
  redis.call('SREM', ARGV[2] .. sub.consumer.node, KEYS[1] .. '\t' .. ARGV[1])
end
return redis.call('HDEL', KEYS[1], ARGV[1])";

/// Removes every subscription indexed under one node (`KEYS[1]`).
const REMOVE_NODE: &str = r"
local entries = redis.call('SMEMBERS', KEYS[1])
local removed = 0
for _, entry in ipairs(entries) do
  local tab = string.find(entry, '\t', 1, true)
  if tab then
    removed = removed + redis.call('HDEL', string.sub(entry, 1, tab - 1), string.sub(entry, tab + 1))
  end
end
redis.call('DEL', KEYS[1])
return removed";

/// Subscriptions as one hash per stream, field = subscription id, at most
/// `max_per_stream` of them.
pub struct RedisPubSubStore {
    conn: RedisConn,
    prefix: String,
    max_per_stream: usize,
    upsert: redis::Script,
    remove: redis::Script,
    remove_node: redis::Script,
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
            remove_node: redis::Script::new(REMOVE_NODE),
        }
    }

    /// The prefix of the per-node index keys.
    fn node_index_prefix(&self) -> String {
        format!("{}:subs-of:", self.prefix)
    }

    /// Length-prefixed, so `a:b`/`c` and `a`/`b:c` never share a key.
    fn key(&self, stream: &StreamId) -> String {
        format!("{}:subs:{}:{}:{}", self.prefix, stream.namespace().len(), stream.namespace(), stream.key())
    }
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
        let stored: i64 = self
            .upsert
            .key(self.key(&subscription.stream))
            .key(format!("{}{}", self.node_index_prefix(), subscription.consumer.node))
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
        let removed: u64 = self
            .remove
            .key(self.key(stream))
            .arg(id.to_string())
            .arg(self.node_index_prefix())
            .invoke_async(&mut conn)
            .await
            .map_err(store_error)?;
        Ok(removed > 0)
    }

    async fn remove_node(&self, node: &NodeId) -> Result<usize, PubSubError> {
        let mut conn = self.conn.clone();
        let removed: u64 = self
            .remove_node
            .key(format!("{}{node}", self.node_index_prefix()))
            .invoke_async(&mut conn)
            .await
            .map_err(store_error)?;
        Ok(usize::try_from(removed).unwrap_or(usize::MAX))
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
