//! Where a Redis queue's receiver starts: after the stored checkpoint; on
//! a queue an older release read through a consumer group and never
//! checkpointed, at the group's first entry not acked; else at the
//! stream's start. It also keeps new ids past what the queue already saw.

use std::time::Duration;

use super::{RedisReceiver, info_fields};
use crate::adapters::redis::{NAME, backend};
use crate::queue::{CheckpointError, Checkpointer, QueueError};
use crate::retry::Backoff;
use crate::stream::SequenceToken;

/// Waits between attempts while Redis is not ready at start.
pub(super) const NOT_READY: Backoff =
    Backoff::new(Duration::from_millis(100), Duration::from_secs(1), Duration::from_millis(100));

impl RedisReceiver {
    /// Sets where the first read starts, and makes every entry appended
    /// from now on newer than it.
    async fn start(&mut self) -> Result<(), QueueError> {
        let checkpoint = self.checkpointer.load(self.queue).await.map_err(|error| QueueError::Backend {
            adapter: NAME.into(),
            message: format!("loading the checkpoint: {error}"),
            transient: !matches!(error, CheckpointError::Corrupt { .. }),
        })?;
        let start = match checkpoint {
            Some(checkpoint) => Some(checkpoint),
            None => self.where_the_group_stopped().await?,
        };
        // Never behind what this receiver already handed out (a second
        // start after a failure): the agent has those.
        self.position = start.max(self.position);
        self.keep_new_ids_past(self.position.max(checkpoint)).await?;
        self.shut_down = false;
        Ok(())
    }

    /// Just before the first entry an older release's consumer group (the
    /// setting `group`) did not ack: the smallest of its pending entries,
    /// else the first after its last delivered one. `None` without such a
    /// group (or without the stream). Every entry acked was delivered, so
    /// starting here loses nothing; an entry acked after a pending one is
    /// delivered again.
    async fn where_the_group_stopped(&mut self) -> Result<Option<SequenceToken>, QueueError> {
        let groups: redis::Value =
            match redis::cmd("XINFO").arg("GROUPS").arg(&self.key).query_async(&mut self.conn).await {
                Ok(groups) => groups,
                // No stream: nothing was ever read.
                Err(error) if error.code() == Some("ERR") => return Ok(None),
                Err(error) => return Err(backend(&error, "reading the consumer groups")),
            };
        let redis::Value::Array(groups) = groups else { return Ok(None) };
        let text = |fields: &[(String, redis::Value)], name: &str| {
            fields.iter().find(|(k, _)| k == name).and_then(|(_, v)| redis::from_redis_value::<String>(v.clone()).ok())
        };
        let ours = groups
            .into_iter()
            .filter_map(info_fields)
            .find(|fields| text(fields, "name").is_some_and(|name| name == self.options.group));
        let Some(group) = ours else { return Ok(None) };
        let delivered = text(&group, "last-delivered-id").and_then(|id| id.parse::<SequenceToken>().ok());
        let pending: Vec<(String, String, u64, u64)> = redis::cmd("XPENDING")
            .arg(&self.key)
            .arg(&self.options.group)
            .arg("-")
            .arg("+")
            .arg(1)
            .query_async(&mut self.conn)
            .await
            .map_err(|error| backend(&error, "reading the consumer group's pending entries"))?;
        let first_pending = pending.first().and_then(|(id, ..)| id.parse::<SequenceToken>().ok());
        let start = match first_pending {
            Some(first) => before(first),
            None => delivered.filter(|delivered| *delivered != SequenceToken::default()),
        };
        tracing::info!(queue = %self.queue, key = %self.key, group = %self.options.group,
            start = %start.map_or_else(|| "the stream's start".to_string(), |after| format!("after {after}")),
            "no checkpoint: reading from where the consumer group of an older release stopped");
        Ok(start)
    }

    /// Makes every entry appended from now on newer than `floor`. The
    /// agent takes anything at or below the checkpoint or what it was
    /// handed for a redelivery and skips it (and trimming removes what is
    /// below the checkpoint), so a stream whose ids fell behind them (Redis
    /// lost its latest writes or the whole key, on a server whose clock is
    /// behind the one that numbered them) would otherwise swallow new
    /// entries.
    async fn keep_new_ids_past(&mut self, floor: Option<SequenceToken>) -> Result<(), QueueError> {
        let Some(floor) = floor.filter(|floor| *floor != SequenceToken::default()) else { return Ok(()) };
        let moved: i64 = self
            .raise_last_id
            .key(&self.key)
            .arg(floor.to_string())
            .invoke_async(&mut self.conn)
            .await
            .map_err(|e| backend(&e, "raising the stream's last id"))?;
        if moved == 1 {
            tracing::warn!(queue = %self.queue, key = %self.key, %floor,
                "the stream's ids were behind what this queue already read or checkpointed (Redis lost writes); new entries are numbered past it");
        }
        Ok(())
    }
}

/// The id just before `token` (`XRANGE`'s exclusive start that includes it).
fn before(token: SequenceToken) -> Option<SequenceToken> {
    match (token.major, token.minor) {
        (major, 0) if major > 0 => Some(SequenceToken::new(major - 1, u64::MAX)),
        (_, 0) => None,
        (major, minor) => Some(SequenceToken::new(major, minor - 1)),
    }
}

/// One attempt of `initialize`, for `backon`'s retry with a context.
pub(super) async fn start_attempt(receiver: &mut RedisReceiver) -> (&mut RedisReceiver, Result<(), QueueError>) {
    let started = receiver.start().await;
    (receiver, started)
}

/// KEYS: the stream. ARGV: an id. Raises the stream's last generated id to
/// ARGV[1] if it is behind, so that every later entry is numbered past it;
/// returns 1 if it did. A missing stream is made, empty, with that last id
/// (an entry added and trimmed in one command). Ids are compared exactly,
/// as decimal strings.
pub(super) const RAISE_LAST_ID: &str = r"
local function less(a, b)
  if #a ~= #b then return #a < #b end
  return a < b
end
if redis.call('EXISTS', KEYS[1]) == 0 then
  redis.call('XADD', KEYS[1], 'MAXLEN', '0', ARGV[1], 'b', '')
  return 1
end
local info = redis.call('XINFO', 'STREAM', KEYS[1])
local last
for i = 1, #info, 2 do
  if info[i] == 'last-generated-id' then last = info[i + 1] end
end
local lm, ls = string.match(last, '^(%d+)-(%d+)$')
local fm, fs = string.match(ARGV[1], '^(%d+)-(%d+)$')
if less(lm, fm) or (lm == fm and less(ls, fs)) then
  redis.call('XSETID', KEYS[1], ARGV[1])
  return 1
end
return 0";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_id_before_a_token_includes_it_in_an_exclusive_range() {
        assert_eq!(before(SequenceToken::new(5, 3)), Some(SequenceToken::new(5, 2)));
        assert_eq!(before(SequenceToken::new(5, 0)), Some(SequenceToken::new(4, u64::MAX)));
        assert_eq!(before(SequenceToken::new(0, 0)), None);
    }
}
