//! The Redis key layout of a queue, the one-time move of the old layout's
//! keys, and the fence every write of a queue's owner passes.
//!
//! Every key of queue `n` shares the hash tag of its lease
//! ([`crate::cluster::queue_tag`]), so that a Redis Cluster keeps them in
//! one slot and one script may touch them all:
//!
//! ```text
//! {prefix}:{qn}:stream      the stream (entries, consumer group)
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
//! refuses nothing. The check and the write run in one script, so nothing
//! comes between them. A refusal is the error code `FENCED`.

use crate::cluster::queue_tag;
use crate::queue::QueueError;
use crate::redis_conn::RedisConn;
use crate::stream::QueueId;
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

/// KEYS: stream, fence. ARGV: token, group, ids… `XACK`, fenced (in
/// slices: `unpack` is bounded by Lua's stack).
pub(crate) const ACK: &str = r"
if is_fenced(KEYS[2], ARGV[1]) then return refuse(KEYS[2]) end
local acked = 0
for i = 3, #ARGV, 1000 do
  acked = acked + redis.call('XACK', KEYS[1], ARGV[2], unpack(ARGV, i, math.min(i + 999, #ARGV)))
end
return acked";

/// KEYS: stream, fence. ARGV: token, min id. `XTRIM MINID`, fenced.
pub(crate) const TRIM: &str = r"
if is_fenced(KEYS[2], ARGV[1]) then return refuse(KEYS[2]) end
return redis.call('XTRIM', KEYS[1], 'MINID', ARGV[2])";

/// KEYS: checkpoint, fence. ARGV: token, checkpoint. `SET`, fenced.
pub(crate) const SAVE: &str = r"
if is_fenced(KEYS[2], ARGV[1]) then return refuse(KEYS[2]) end
redis.call('SET', KEYS[1], ARGV[2])
return 1";

/// KEYS: stream, fence. ARGV: token, group, consumer, start.
/// `XAUTOCLAIM … 0 start COUNT 1000 JUSTID`, fenced: a zombie that starts
/// late cannot take the new owner's pending entries.
pub(crate) const CLAIM: &str = r"
if is_fenced(KEYS[2], ARGV[1]) then return refuse(KEYS[2]) end
return redis.call('XAUTOCLAIM', KEYS[1], ARGV[2], ARGV[3], 0, ARGV[4], 'COUNT', 1000, 'JUSTID')";

/// The body of the read of new entries (KEYS: stream, fence. ARGV: token,
/// group, consumer, count): `XREADGROUP … STREAMS stream >` (scripts
/// cannot block). Answers `{entries, last id}`: the reply (or `{}`) and,
/// when it is empty, the stream's last generated id, to wait for newer
/// ones from.
macro_rules! read_new_body {
    () => {
        r"
local reply = redis.call('XREADGROUP', 'GROUP', ARGV[2], ARGV[3], 'COUNT', ARGV[4], 'STREAMS', KEYS[1], '>')
if reply then return {reply, ''} end
local info = redis.call('XINFO', 'STREAM', KEYS[1])
for i = 1, #info, 2 do
  if info[i] == 'last-generated-id' then return {{}, info[i + 1]} end
end
return {{}, '0-0'}"
    };
}

/// The read of new entries, fenced: entries move into a consumer's
/// pending list only while its lease is current.
pub(crate) const READ_NEW: &str =
    concat!("\nif is_fenced(KEYS[2], ARGV[1]) then return refuse(KEYS[2]) end", read_new_body!());

/// The read of new entries without the fence, for a receiver that holds no
/// lease.
pub(crate) const READ_NEW_OPEN: &str = read_new_body!();

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

/// Counts a refusal of `kind` (`ack`, `trim`, `read`, `claim`,
/// `checkpoint`) and logs it.
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
/// once). `RENAME` keeps the stream's consumer group and pending entries.
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

/// The fence of one receiver: its lease's token and the scripts that
/// check it before each write; without a lease, the plain commands.
pub(crate) struct Fence {
    /// `None`: no lease, nothing to check.
    pub(crate) token: Option<u64>,
    /// The fencing counter's key.
    pub(crate) key: String,
    ack: redis::Script,
    trim: redis::Script,
    claim: redis::Script,
    read_new: redis::Script,
}

/// What a read of new entries found.
pub(crate) enum NewEntries {
    /// Entries, now in this consumer's pending list.
    Some(Vec<redis::streams::StreamId>),
    /// Nothing new; the stream's last generated id, to wait for newer
    /// (`None` when it was not asked for).
    None { last_id: Option<String> },
}

impl Fence {
    /// `token` checked against the counter at `key`.
    pub(crate) fn new(token: u64, key: String) -> Self {
        Self {
            token: Some(token),
            key,
            ack: script(ACK),
            trim: script(TRIM),
            claim: script(CLAIM),
            read_new: script(READ_NEW),
        }
    }

    /// The fence of a receiver that holds no lease: plain commands, and a
    /// script only to learn the stream's last id when nothing is new.
    pub(crate) fn open(key: String) -> Self {
        Self { token: None, read_new: redis::Script::new(READ_NEW_OPEN), ..Self::new(0, key) }
    }

    /// `XACK stream group ids…`.
    pub(crate) async fn ack(
        &self,
        conn: &mut RedisConn,
        stream: &str,
        group: &str,
        ids: impl Iterator<Item = String>,
    ) -> Result<u64, redis::RedisError> {
        let Some(token) = self.token else {
            let mut cmd = redis::cmd("XACK");
            cmd.arg(stream).arg(group);
            for id in ids {
                cmd.arg(id);
            }
            return cmd.query_async(conn).await;
        };
        let mut invocation = self.ack.key(stream);
        invocation.key(&self.key).arg(token).arg(group);
        for id in ids {
            invocation.arg(id);
        }
        invocation.invoke_async(conn).await
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

    /// One `XAUTOCLAIM` page from `start`.
    pub(crate) async fn claim(
        &self,
        conn: &mut RedisConn,
        stream: &str,
        group: &str,
        consumer: &str,
        start: &str,
    ) -> Result<redis::streams::StreamAutoClaimReply, redis::RedisError> {
        let Some(token) = self.token else {
            return redis::cmd("XAUTOCLAIM")
                .arg(stream)
                .arg(group)
                .arg(consumer)
                .arg(0)
                .arg(start)
                .arg("COUNT")
                .arg(1000)
                .arg("JUSTID")
                .query_async(conn)
                .await;
        };
        self.claim.key(stream).key(&self.key).arg(token).arg(group).arg(consumer).arg(start).invoke_async(conn).await
    }

    /// Up to `count` new entries (`XREADGROUP … >`), without waiting.
    /// Without a lease, a plain `XREADGROUP` first: the script (which
    /// passes the whole reply through Lua and reads the stream's last id)
    /// only when it found nothing and `last_id` is wanted. A busy queue's
    /// reader often finds nothing for a moment between writes; it needs
    /// the last id only once it is about to wait for a write.
    pub(crate) async fn read_new(
        &self,
        conn: &mut RedisConn,
        stream: &str,
        (group, consumer): (&str, &str),
        count: usize,
        last_id: bool,
    ) -> Result<NewEntries, redis::RedisError> {
        if self.token.is_none() {
            let reply: Option<redis::streams::StreamReadReply> = redis::cmd("XREADGROUP")
                .arg("GROUP")
                .arg(group)
                .arg(consumer)
                .arg("COUNT")
                .arg(count)
                .arg("STREAMS")
                .arg(stream)
                .arg(">")
                .query_async(conn)
                .await?;
            let entries: Vec<_> = reply.map(|r| r.keys.into_iter().flat_map(|k| k.ids).collect()).unwrap_or_default();
            if !entries.is_empty() {
                return Ok(NewEntries::Some(entries));
            }
            if !last_id {
                return Ok(NewEntries::None { last_id: None });
            }
        }
        let (reply, last_id): (redis::Value, String) = self
            .read_new
            .key(stream)
            .key(&self.key)
            .arg(self.token.unwrap_or(0))
            .arg(group)
            .arg(consumer)
            .arg(count)
            .invoke_async(conn)
            .await?;
        if !last_id.is_empty() {
            return Ok(NewEntries::None { last_id: Some(last_id) });
        }
        let reply: redis::streams::StreamReadReply = redis::from_redis_value(reply)?;
        Ok(NewEntries::Some(reply.keys.into_iter().flat_map(|k| k.ids).collect()))
    }
}

/// Whether `error` says the consumer group is gone (also when a script
/// passed it on).
pub(crate) fn is_no_group(error: &redis::RedisError) -> bool {
    error.code() == Some("NOGROUP") || error.to_string().contains("NOGROUP")
}
