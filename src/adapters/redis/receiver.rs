//! The receiver of one Redis queue: it reads the stream as a log, from the
//! queue's checkpoint on (where it starts is `start.rs`), as the Kafka
//! adapter reads a partition from its offset. No consumer group, no pending
//! list, no per-entry ack or claim: the agent's checkpoint is the ack, and
//! a new owner starts at it. A read is `XRANGE stream (position + COUNT n`;
//! under a lease the fencing counter is read in the same pipeline (see
//! `fence.rs`), so a paused old owner's read after a newer grant hands its
//! agent nothing. A read whose reply never arrives moved nothing: the next
//! read asks again from the same position. No call blocks; after an empty
//! read its agent waits on `wake.rs` for an entry past the position.
//!
//! Trimming follows the checkpoint (`XTRIM MINID`, fenced), at most every
//! `trim_every`, never past it: what a subscriber may still replay stays.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::redis_conn::RedisConn;
use async_trait::async_trait;
use backon::RetryableWithContext;

mod start;

use super::fence::{self, Entries, Entry, Fence, Read};
use super::wake::Wakes;
use super::{NAME, RedisCheckpointer, RedisOptions, TrimPolicy, backend};
use crate::adapters::entry::decode_entry;
use crate::queue::{Checkpointer, QueueError, QueueReceiver, Wake};
use crate::stream::{BatchContainer, QueueId, SequenceToken, StreamIdCache};
use start::{NOT_READY, RAISE_LAST_ID, start_attempt};

pub(crate) struct RedisReceiver {
    queue: QueueId,
    conn: RedisConn,
    key: String,
    options: RedisOptions,
    checkpointer: Arc<RedisCheckpointer>,
    /// The id of the last entry handed to the agent (or where reading
    /// starts): the next read takes entries after it; `None`: from the
    /// stream's start.
    position: Option<SequenceToken>,
    last_trim: Instant,
    /// Entries were read since the last trim.
    untrimmed: bool,
    shut_down: bool,
    raise_last_id: redis::Script,
    fence: Fence,
    /// The streams met lately (decoded entries share their ids).
    streams: StreamIdCache,
    wakes: Arc<Wakes>,
    /// The last read found nothing: wait for an entry past the position.
    idle: bool,
}

/// What every receiver of an adapter shares.
#[derive(Clone)]
pub(crate) struct Shared {
    pub(crate) conn: RedisConn,
    pub(crate) options: RedisOptions,
    pub(crate) checkpointer: Arc<RedisCheckpointer>,
    pub(crate) wakes: Arc<Wakes>,
}

impl RedisReceiver {
    /// The receiver of `queue` (stream `key`), reading under `fence`.
    pub(crate) fn new(queue: QueueId, key: String, fence: Fence, shared: Shared) -> Self {
        let Shared { conn, options, checkpointer, wakes } = shared;
        Self {
            queue,
            conn,
            key,
            options,
            checkpointer,
            position: None,
            last_trim: Instant::now(),
            untrimmed: false,
            shut_down: false,
            raise_last_id: redis::Script::new(RAISE_LAST_ID),
            fence,
            streams: StreamIdCache::default(),
            wakes,
            idle: false,
        }
    }

    fn check(&self) -> Result<(), QueueError> {
        if self.shut_down { Err(QueueError::ShutDown(self.queue)) } else { Ok(()) }
    }

    fn containers(&mut self, entries: Vec<Entry>) -> Vec<Arc<BatchContainer>> {
        let mut out = Vec::with_capacity(entries.len());
        for entry in entries {
            match entry_container(&entry.id, entry.body, &mut self.streams) {
                Ok(container) => out.push(Arc::new(container)),
                // A foreign or damaged entry: skip it (it stays visible in Redis).
                Err(error) => {
                    tracing::error!(queue = %self.queue, key = %self.key, %error, "unreadable stream entry skipped")
                }
            }
        }
        out
    }

    fn trim_due(&self) -> bool {
        self.options.trim != TrimPolicy::Never && self.last_trim.elapsed() >= self.options.trim_every
    }

    /// Trims the stream up to the stored checkpoint, when due. Fails only
    /// when the fence refused it.
    async fn trim(&mut self) -> Result<(), QueueError> {
        if !self.trim_due() {
            return Ok(());
        }
        self.last_trim = Instant::now();
        self.untrimmed = false;
        let Ok(Some(checkpoint)) = self.checkpointer.load(self.queue).await else { return Ok(()) };
        let trimmed = self.fence.trim(&mut self.conn, &self.key, &checkpoint.to_string()).await;
        match trimmed {
            Ok(n) if n > 0 => {
                tracing::debug!(queue = %self.queue, removed = n, %checkpoint, "stream trimmed up to the checkpoint")
            }
            Ok(_) => {}
            Err(error) if fence::is_refusal(&error) => {
                return Err(fence::queue_refusal("trim", self.queue, self.fence.token.unwrap_or(0), &error));
            }
            Err(error) => tracing::warn!(queue = %self.queue, %error, "XTRIM failed"),
        }
        Ok(())
    }
}

#[async_trait]
impl QueueReceiver for RedisReceiver {
    async fn initialize(&mut self, timeout: Duration) -> Result<(), QueueError> {
        let queue = self.queue;
        let (_, started) = start_attempt
            .retry(NOT_READY.within(timeout))
            .context(self)
            .when(QueueError::is_transient)
            .notify(|error, wait| tracing::warn!(%queue, %error, ?wait, "redis not ready; retrying"))
            .await;
        started
    }

    async fn read(&mut self, max: usize) -> Result<Vec<Arc<BatchContainer>>, QueueError> {
        self.check()?;
        self.idle = false;
        let read = self.fence.read(&mut self.conn, &self.key, self.position, max.max(1)).await;
        let entries = match read.map_err(|error| backend(&error, "reading"))? {
            Read::Entries(entries) => entries,
            Read::Fenced(fence) => {
                let token = self.fence.token.unwrap_or(0);
                fence::refused("read", self.queue, token, &format!("FENCED queue fence {fence}"));
                return Err(QueueError::Fenced(self.queue));
            }
        };
        let Some(last) = entries.last() else {
            self.idle = true;
            // Nothing new: time to trim (a refusal fails the read).
            self.trim().await?;
            return Ok(Vec::new());
        };
        match last.id.parse::<SequenceToken>() {
            Ok(last) => self.position = Some(last),
            Err(error) => {
                return Err(QueueError::Backend {
                    adapter: NAME.into(),
                    message: format!("XRANGE answered the id `{}`: {error}", last.id),
                    transient: false,
                });
            }
        }
        self.untrimmed = true;
        Ok(self.containers(entries))
    }

    /// Nothing to write (the agent's checkpoint is the ack); a trim when due.
    async fn delivered(&mut self, _tokens: &[SequenceToken]) -> Result<(), QueueError> {
        self.trim().await
    }

    /// Dead-lettered entries: their copy is in the sink, and the
    /// checkpoint passes them.
    async fn failed(&mut self, tokens: &[SequenceToken]) -> Result<(), QueueError> {
        self.delivered(tokens).await
    }

    async fn rewind(&mut self, from: SequenceToken, max: usize) -> Result<Vec<Arc<BatchContainer>>, QueueError> {
        self.check()?;
        if let Some((reason, oldest)) = self.gone_before(from).await {
            let requested = from;
            return Err(QueueError::CannotRewind {
                adapter: NAME.into(),
                queue: self.queue,
                requested,
                reason,
                oldest,
            });
        }
        let reply: Entries = redis::cmd("XRANGE")
            .arg(&self.key)
            .arg(from.to_string())
            .arg("+")
            .arg("COUNT")
            .arg(max.max(1))
            .query_async(&mut self.conn)
            .await
            .map_err(|e| backend(&e, "rewinding"))?;
        Ok(self.containers(reply.0))
    }

    /// After a failure: a `PING` every [`PROBE_EVERY`] until Redis answers
    /// `PONG` (a Redis still loading its data answers `LOADING`).
    fn reachable(&mut self) -> Option<Wake> {
        let mut conn = self.conn.clone();
        Some(Box::pin(async move {
            loop {
                tokio::time::sleep(PROBE_EVERY).await;
                let pong: Result<String, _> = redis::cmd("PING").query_async(&mut conn).await;
                if pong.is_ok_and(|p| p == "PONG") {
                    return;
                }
            }
        }))
    }

    /// After an empty read: until Redis tells of a write to the stream, or
    /// until the next trim is due if entries were read since the last one
    /// (reads trim), so an idle stream does not keep what was consumed.
    fn wake_on_write(&mut self) -> Option<Wake> {
        if !std::mem::take(&mut self.idle) {
            return None;
        }
        let position = self.position.unwrap_or_default().to_string();
        let wait = self.wakes.wait(self.key.clone(), position)?;
        if !self.untrimmed || self.options.trim == TrimPolicy::Never {
            return Some(wait);
        }
        let due = tokio::time::Instant::from_std(self.last_trim + self.options.trim_every);
        Some(Box::pin(async move { drop(tokio::time::timeout_at(due, wait).await) }))
    }

    async fn shutdown(&mut self, _timeout: Duration) -> Result<(), QueueError> {
        self.shut_down = true;
        Ok(())
    }
}

impl RedisReceiver {
    /// Why `from` can no longer be served, if it cannot: entries before the
    /// first one recorded were trimmed away, and deleted ones are gone.
    async fn gone_before(&mut self, from: SequenceToken) -> Option<(String, Option<SequenceToken>)> {
        let info: redis::Value =
            redis::cmd("XINFO").arg("STREAM").arg(&self.key).query_async(&mut self.conn).await.ok()?;
        let fields = info_fields(info)?;
        let text = |name: &str| {
            fields.iter().find(|(k, _)| k == name).and_then(|(_, v)| redis::from_redis_value::<String>(v.clone()).ok())
        };
        let number = |name: &str| text(name).and_then(|v| v.parse::<u64>().ok());
        let token = |name: &str| text(name).and_then(|v| v.parse::<SequenceToken>().ok());
        let length = number("length")?;
        let removed = number("entries-added")? > length;
        // An emptied stream records `0-0`: it holds nothing older.
        let first = token("recorded-first-entry-id").filter(|first| *first != SequenceToken::default());
        if first.is_some_and(|first| removed && from < first) {
            return Some(("the stream was trimmed".into(), first));
        }
        if removed && length == 0 && token("last-generated-id").is_some_and(|last| from <= last) {
            return Some(("the stream was trimmed to nothing".into(), None));
        }
        token("max-deleted-entry-id")
            .filter(|deleted| *deleted != SequenceToken::default() && from <= *deleted)
            .map(|deleted| (format!("entries through {deleted} were deleted"), first.filter(|f| *f > deleted)))
    }
}

/// The field-value pairs of an `XINFO` reply (an array of pairs in RESP2,
/// a map in RESP3); `None` if it is neither.
fn info_fields(info: redis::Value) -> Option<Vec<(String, redis::Value)>> {
    let pairs = match info {
        redis::Value::Array(items) => items
            .chunks(2)
            .filter_map(|pair| {
                Some((redis::from_redis_value::<String>(pair.first()?.clone()).ok()?, pair.get(1)?.clone()))
            })
            .collect(),
        redis::Value::Map(items) => {
            items.into_iter().filter_map(|(k, v)| Some((redis::from_redis_value::<String>(k).ok()?, v))).collect()
        }
        _ => return None,
    };
    Some(pairs)
}

/// How often a receiver whose read failed asks Redis whether it is back.
const PROBE_EVERY: Duration = Duration::from_millis(100);

/// The container of the stream entry `id` whose field `b` is `body`.
fn entry_container(
    id: &str,
    body: Option<redis::Value>,
    streams: &mut StreamIdCache,
) -> Result<BatchContainer, String> {
    let token: SequenceToken = id.parse().map_err(|e: crate::stream::ParseTokenError| e.to_string())?;
    let body = match body {
        Some(redis::Value::BulkString(bytes)) => bytes::Bytes::from(bytes),
        Some(redis::Value::SimpleString(text)) => bytes::Bytes::from(text),
        _ => return Err(format!("entry {id} has no field `b`")),
    };
    decode_entry(token, body, streams)
}
