//! How a Redis queue's receiver starts: it creates the consumer group if
//! needed, keeps new ids past what the queue already saw, and claims every
//! pending entry, so they are read first, in order.

use std::time::Duration;

use redis::streams::StreamAutoClaimReply;

use super::{Phase, RedisReceiver};
use crate::adapters::redis::fence;
use crate::adapters::redis::{NAME, backend};
use crate::queue::{CheckpointError, Checkpointer, QueueError};
use crate::retry::Backoff;
use crate::stream::SequenceToken;

/// Waits between attempts while Redis is not ready at start.
pub(super) const NOT_READY: Backoff =
    Backoff::new(Duration::from_millis(100), Duration::from_secs(1), Duration::from_millis(100));

impl RedisReceiver {
    /// Creates the group if needed (reading the stream from its start, so
    /// that nothing appended before it existed is skipped) and takes over
    /// every pending entry (a previous owner's, or our own from before a
    /// restart): they are read first, in order.
    pub(super) async fn claim_everything(&mut self) -> Result<(), QueueError> {
        let created: Result<(), redis::RedisError> = redis::cmd("XGROUP")
            .arg("CREATE")
            .arg(&self.key)
            .arg(&self.options.group)
            .arg("0")
            .arg("MKSTREAM")
            .query_async(&mut self.conn)
            .await;
        if let Err(error) = created
            && error.code() != Some("BUSYGROUP")
        {
            return Err(backend(&error, "creating the consumer group"));
        }
        self.keep_new_ids_past_what_was_seen().await?;
        let mut start = "0-0".to_string();
        loop {
            let claimed: Result<StreamAutoClaimReply, _> =
                self.fence.claim(&mut self.conn, &self.key, &self.options.group, &self.consumer, &start).await;
            let reply = match claimed {
                Err(error) if fence::is_refusal(&error) => return Err(self.refusal("claim", &error)),
                Err(error) => return Err(backend(&error, "claiming pending entries")),
                Ok(reply) => reply,
            };
            if reply.next_stream_id == "0-0" {
                break;
            }
            start = reply.next_stream_id;
        }
        self.phase = Phase::Pending("0".into());
        self.shut_down = false;
        Ok(())
    }

    /// Makes every entry appended from now on newer than the stored
    /// checkpoint and than what this receiver already handed out. The agent
    /// takes anything at or below those for a redelivery and skips it (and
    /// trimming removes what is below the checkpoint), so a stream whose
    /// ids fell behind them (Redis lost its latest writes or the whole key,
    /// on a server whose clock is behind the one that numbered them) would
    /// otherwise swallow new entries.
    async fn keep_new_ids_past_what_was_seen(&mut self) -> Result<(), QueueError> {
        let checkpoint = self.checkpointer.load(self.queue).await.map_err(|error| QueueError::Backend {
            adapter: NAME.into(),
            message: format!("loading the checkpoint: {error}"),
            transient: !matches!(error, CheckpointError::Corrupt { .. }),
        })?;
        let last_read = self.last_read.as_deref().and_then(|id| id.parse::<SequenceToken>().ok());
        let Some(floor) = checkpoint.max(last_read) else { return Ok(()) };
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

/// One attempt of `initialize`, for `backon`'s retry with a context.
pub(super) async fn claim_attempt(receiver: &mut RedisReceiver) -> (&mut RedisReceiver, Result<(), QueueError>) {
    let claimed = receiver.claim_everything().await;
    (receiver, claimed)
}

/// KEYS: the stream. ARGV: an id. Raises the stream's last generated id to
/// ARGV[1] if it is behind, so that every later entry is numbered past it;
/// returns 1 if it did. Ids are compared exactly, as decimal strings.
pub(super) const RAISE_LAST_ID: &str = r"
local function less(a, b)
  if #a ~= #b then return #a < #b end
  return a < b
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
