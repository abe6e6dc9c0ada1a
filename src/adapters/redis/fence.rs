//! The Redis key layout of a queue, the one-time move of the old layout's
//! keys, and the fence every write of a queue's owner passes.
//!
//! Every key of queue `n` shares the hash tag of its lease
//! ([`crate::cluster::queue_tag`]), so that a Redis Cluster keeps them in
//! one slot and one script may touch them all:
//!
//! ```text
//! {prefix}:{qn}:stream      the stream (its entries, read as a log)
//! {prefix}:{qn}:checkpoint  the checkpoint (a token as a string)
//! {prefix}:{qn}:lease       the lease (written by RedisLeases)
//! {prefix}:{qn}:fence       the fencing counter (written by RedisLeases)
//! ```
//!
//! **The fence.** A fenced write carries the token of the lease its agent
//! runs under and is refused when the queue's fencing counter is above it:
//! a newer lease was granted since, so the writer is a paused old owner (a
//! zombie). The counter, not the lease hash, is compared because it only
//! grows and never expires: a lease that merely lapsed, with nobody granted
//! after it, refuses nothing (its owner is about to learn it lost the lease,
//! and nobody else reads the queue meanwhile), while every grant fences all
//! older tokens at once. No counter (leases kept elsewhere, or never taken)
//! refuses nothing. For a write (the checkpoint, a trim) the check and the
//! write run in one script, so nothing comes between them; a refusal is
//! the error code `FENCED`. A read is fenced by reading the counter just
//! before the entries, in one pipeline: a read after a newer grant hands
//! its agent nothing to deliver.

use crate::cluster::queue_tag;
use crate::queue::QueueError;
use crate::redis_conn::RedisConn;
use crate::stream::{QueueId, SequenceToken};
use crate::telemetry;

/// The stream key of `queue`.
pub(crate) fn stream_key(prefix: &str, queue: QueueId) -> String {
    format!("{}:stream", queue_tag(prefix, queue))
}

/// The checkpoint key of `queue`.
pub(crate) fn checkpoint_key(prefix: &str, queue: QueueId) -> String {
    format!("{}:checkpoint", queue_tag(prefix, queue))
}

/// The fencing counter of `queue` (the one `RedisLeases` increments).
pub(crate) fn fence_key(prefix: &str, queue: QueueId) -> String {
    format!("{}:fence", queue_tag(prefix, queue))
}

/// The keys of `queue` before they moved under the lease's hash tag:
/// (stream, checkpoint).
pub(crate) fn legacy_keys(prefix: &str, queue: QueueId) -> (String, String) {
    (format!("{prefix}:{queue}"), format!("{prefix}:checkpoint:{queue}"))
}

/// The Lua function every fenced script starts with: whether the counter
/// at `key` is above `token` (decimal strings, compared exactly).
const IS_FENCED: &str = r"
local function is_fenced(key, token)
  local fence = redis.call('GET', key)
  if not fence then return false end
  if #fence ~= #token then return #fence > #token end
  return fence > token
end
local function refuse(key)
  return redis.error_reply('FENCED queue fence ' .. redis.call('GET', key))
end
";

/// A fenced script: the fence check, then `body`.
pub(crate) fn script(body: &str) -> redis::Script {
    redis::Script::new(&format!("{IS_FENCED}{body}"))
}

/// KEYS: stream, fence. ARGV: token, min id. `XTRIM MINID`, fenced.
pub(crate) const TRIM: &str = r"
if is_fenced(KEYS[2], ARGV[1]) then return refuse(KEYS[2]) end
return redis.call('XTRIM', KEYS[1], 'MINID', ARGV[2])";

/// KEYS: checkpoint, fence. ARGV: token, checkpoint. `SET`, fenced.
pub(crate) const SAVE: &str = r"
if is_fenced(KEYS[2], ARGV[1]) then return refuse(KEYS[2]) end
redis.call('SET', KEYS[1], ARGV[2])
return 1";

/// KEYS: old key, new key. Renames the old layout's key to the new one if
/// only the old exists; 1 if it did.
const MIGRATE: &str = r"
if redis.call('EXISTS', KEYS[1]) == 1 and redis.call('EXISTS', KEYS[2]) == 0 then
  redis.call('RENAME', KEYS[1], KEYS[2])
  return 1
end
return 0";

/// Whether `error` is a fence's refusal.
pub(crate) fn is_refusal(error: &redis::RedisError) -> bool {
    error.code() == Some("FENCED")
}

/// Counts a refusal of `kind` (`read`, `trim`, `checkpoint`) and logs it.
pub(crate) fn refused(kind: &'static str, queue: QueueId, token: u64, error: &dyn std::fmt::Display) {
    tracing::warn!(%queue, token, kind, %error, "write refused: a newer lease of the queue was granted");
    metrics::counter!(telemetry::FENCED_WRITES, "kind" => kind).increment(1);
}

/// A refusal as the queue error the agent takes for a lost lease.
pub(crate) fn queue_refusal(kind: &'static str, queue: QueueId, token: u64, error: &redis::RedisError) -> QueueError {
    refused(kind, queue, token, &error);
    QueueError::Fenced(queue)
}

/// Moves the old layout's stream and checkpoint keys of queues
/// `0..queue_count` to the new ones, once: a key moves only if the new one
/// does not exist yet (a script, so nodes starting together move each key
/// once). `RENAME` keeps the stream whole (and an older release's consumer group).
/// Run before any receiver starts; every node of a deployment must run the
/// new layout (an older node would go on writing the old keys). The old and
/// new keys hash to different Cluster slots, so this runs on a standalone
/// Redis, the only kind the old layout ever ran on.
pub(crate) async fn migrate_legacy_keys(
    conn: &mut RedisConn,
    prefix: &str,
    queue_count: u32,
) -> Result<u32, redis::RedisError> {
    let migrate = redis::Script::new(MIGRATE);
    let mut moved = 0;
    for queue in (0..queue_count).map(QueueId) {
        let (old_stream, old_checkpoint) = legacy_keys(prefix, queue);
        for (old, new) in [(old_stream, stream_key(prefix, queue)), (old_checkpoint, checkpoint_key(prefix, queue))] {
            let renamed: i64 = migrate.key(&old).key(&new).invoke_async(conn).await?;
            if renamed == 1 {
                tracing::warn!(%queue, from = %old, to = %new, "moved a queue key to the new key layout (one-time migration)");
                moved += 1;
            }
        }
    }
    Ok(moved)
}

/// The fence of one receiver: its lease's token, checked before each
/// read and trim; without a lease, nothing is checked.
pub(crate) struct Fence {
    /// `None`: no lease, nothing to check.
    pub(crate) token: Option<u64>,
    /// The fencing counter's key.
    pub(crate) key: String,
    trim: redis::Script,
}

/// What a read found.
pub(crate) enum Read {
    /// Entries after the position asked for (none: nothing new).
    Entries(Vec<Entry>),
    /// A newer lease was granted: the fencing counter's value. Nothing was
    /// read.
    Fenced(String),
}

impl Fence {
    /// `token` checked against the counter at `key`.
    pub(crate) fn new(token: u64, key: String) -> Self {
        Self { token: Some(token), key, trim: script(TRIM) }
    }

    /// The fence of a receiver that holds no lease: plain commands.
    pub(crate) fn open(key: String) -> Self {
        Self { token: None, ..Self::new(0, key) }
    }

    /// `XTRIM stream MINID min_id`.
    pub(crate) async fn trim(
        &self,
        conn: &mut RedisConn,
        stream: &str,
        min_id: &str,
    ) -> Result<u64, redis::RedisError> {
        match self.token {
            Some(token) => self.trim.key(stream).key(&self.key).arg(token).arg(min_id).invoke_async(conn).await,
            None => redis::cmd("XTRIM").arg(stream).arg("MINID").arg(min_id).query_async(conn).await,
        }
    }

    /// Up to `count` entries after `after` (from the stream's start
    /// without it): `XRANGE stream (after + COUNT count`, without waiting.
    /// Under a lease, the fencing counter is read first in the same
    /// pipeline (so before the entries, on the queue's server): a read
    /// issued after a newer grant returns nothing but the refusal. Reading
    /// changes nothing in Redis, so no transaction is needed: a grant that
    /// lands between the two commands is one that came just after the read.
    pub(crate) async fn read(
        &self,
        conn: &mut RedisConn,
        stream: &str,
        after: Option<SequenceToken>,
        count: usize,
    ) -> Result<Read, redis::RedisError> {
        let start = after.map_or_else(|| "-".to_string(), |after| format!("({after}"));
        let mut range = redis::cmd("XRANGE");
        range.arg(stream).arg(start).arg("+").arg("COUNT").arg(count);
        let Some(token) = self.token else {
            let reply: Entries = range.query_async(conn).await?;
            return Ok(Read::Entries(reply.0));
        };
        let mut pipe = redis::pipe();
        pipe.cmd("GET").arg(&self.key).add_command(range);
        let mut answers = conn.pipeline_at(stream, pipe).await?.into_iter();
        let (Some(fence), Some(entries)) = (answers.next(), answers.next()) else {
            return Err(redis::RedisError::from((redis::ErrorKind::Io, "a fenced read lost an answer")));
        };
        let fence: Option<String> = redis::from_redis_value(fence)?;
        if let Some(fence) = fence.filter(|fence| is_above(fence, token)) {
            return Ok(Read::Fenced(fence));
        }
        let reply: Entries = redis::from_redis_value(entries)?;
        Ok(Read::Entries(reply.0))
    }
}

/// An entry as `XRANGE` gives it: its id and its field `b`.
pub(crate) struct Entry {
    pub(crate) id: String,
    pub(crate) body: Option<redis::Value>,
}

/// What an `XRANGE` answered, each entry's fields scanned for `b` (the
/// client's own reply type builds two maps per entry, which a busy node
/// paid for on every read).
pub(crate) struct Entries(pub(crate) Vec<Entry>);

impl redis::FromRedisValue for Entries {
    fn from_redis_value(value: redis::Value) -> Result<Self, redis::ParsingError> {
        use redis::Value;
        let rows = match value {
            Value::Nil => return Ok(Self(Vec::new())),
            Value::Array(rows) => rows,
            other => return Err(format!("XRANGE answered {other:?}").into()),
        };
        let entry = |row: Value| {
            let Value::Array(parts) = row else { return Err(format!("XRANGE answered the entry {row:?}").into()) };
            let mut parts = parts.into_iter();
            let id: String = redis::from_redis_value(parts.next().unwrap_or(Value::Nil))?;
            let is_b = |field: &Value| matches!(field, Value::BulkString(name) if name == b"b");
            let body = match parts.next() {
                // RESP2: field, value, field, value, …
                Some(Value::Array(fields)) => {
                    let mut fields = fields.into_iter();
                    let mut body = None;
                    while let (Some(field), Some(value)) = (fields.next(), fields.next()) {
                        if is_b(&field) {
                            body = Some(value);
                            break;
                        }
                    }
                    body
                }
                Some(Value::Map(pairs)) => pairs.into_iter().find(|(field, _)| is_b(field)).map(|(_, value)| value),
                _ => None,
            };
            Ok(Entry { id, body })
        };
        rows.into_iter().map(entry).collect::<Result<_, redis::ParsingError>>().map(Self)
    }
}

/// Whether the fencing counter `fence` is above `token`.
fn is_above(fence: &str, token: u64) -> bool {
    fence.parse::<u64>().is_ok_and(|fence| fence > token)
}

#[cfg(test)]
mod tests {
    use redis::Value;

    use super::Entries;

    fn bulk(text: &str) -> Value {
        Value::BulkString(text.as_bytes().to_vec())
    }

    #[test]
    fn an_xrange_reply_gives_each_entrys_id_and_field_b_in_either_protocol() {
        let resp2 = Value::Array(vec![
            Value::Array(vec![bulk("1-0"), Value::Array(vec![bulk("x"), bulk("y"), bulk("b"), bulk("body one")])]),
            Value::Array(vec![bulk("2-0"), Value::Array(vec![bulk("other"), bulk("z")])]),
        ]);
        let resp3 =
            Value::Array(vec![Value::Array(vec![bulk("3-1"), Value::Map(vec![(bulk("b"), bulk("body three"))])])]);
        let read = |value| -> Vec<(String, Option<Value>)> {
            let Entries(entries) = redis::from_redis_value(value).unwrap();
            entries.into_iter().map(|e| (e.id, e.body)).collect()
        };
        assert_eq!(read(resp2), vec![("1-0".into(), Some(bulk("body one"))), ("2-0".into(), None)]);
        assert_eq!(read(resp3), vec![("3-1".into(), Some(bulk("body three")))]);
        assert!(read(Value::Nil).is_empty());
        assert!(redis::from_redis_value::<Entries>(Value::Int(3)).is_err());
    }
}
