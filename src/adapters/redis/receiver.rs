//! The receiver of one Redis queue: a consumer-group reader. It acks,
//! trims, claims and takes new entries through the scripts of `fence.rs`
//! with its agent's lease token (or an open fence without a lease), so a
//! paused old owner does none of these once a newer lease was granted. No
//! call blocks; after an empty read its agent waits on `wake.rs`.
//!
//! An ack goes out with the next read, both in flight at once on the
//! shared connection (one round trip for the pair, where the agent's pump
//! made two), or at the latest when the receiver shuts down. On one server
//! a leased receiver's reads of new entries and the acks before them go
//! through the process's batched path instead (`batch.rs`: one
//! transaction for many queues, the fence checked once for all). An ack that
//! never reaches Redis only means a redelivery, which at least once allows;
//! a fenced ack fails that read.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::redis_conn::RedisConn;
use async_trait::async_trait;
use backon::RetryableWithContext;
use redis::streams::{StreamRangeReply, StreamReadReply};

mod start;

use super::batch::{Answer, Batcher, Work};
use super::fence::{self, Fence, NewEntries};
use super::wake::Wakes;
use super::{NAME, RedisCheckpointer, RedisOptions, TrimPolicy, backend};
use crate::adapters::entry::decode_entry;
use crate::queue::{Checkpointer, QueueError, QueueReceiver, Wake};
use crate::stream::{BatchContainer, QueueId, SequenceToken, StreamIdCache};
use start::{NOT_READY, RAISE_LAST_ID, claim_attempt};

/// Where the next read starts.
enum Phase {
    /// Entries already ours (claimed from a previous owner, or delivered to
    /// us before a restart), after this id.
    Pending(String),
    /// New entries.
    New,
}

pub(crate) struct RedisReceiver {
    queue: QueueId,
    conn: RedisConn,
    key: String,
    options: RedisOptions,
    consumer: String,
    checkpointer: Arc<RedisCheckpointer>,
    phase: Phase,
    /// The id of the last entry handed to the agent.
    last_read: Option<String>,
    last_trim: Instant,
    /// Entries were read since the last trim.
    untrimmed: bool,
    shut_down: bool,
    raise_last_id: redis::Script,
    fence: Arc<Fence>,
    /// The streams met lately (decoded entries share their ids).
    streams: StreamIdCache,
    /// Acks not sent yet (they go with the next read; at most what the
    /// agent's cache held).
    unacked: Vec<SequenceToken>,
    wakes: Arc<Wakes>,
    /// The stream's last id at the last read, if it found nothing new.
    idle_at: Option<String>,
    /// The last read of new entries found none.
    found_nothing: bool,
    /// The process's batched fenced path (one Redis server; see
    /// `batch.rs`), for the reads of a fenced receiver.
    batcher: Option<Batcher>,
}

/// What every receiver of an adapter shares.
#[derive(Clone)]
pub(crate) struct Shared {
    pub(crate) conn: RedisConn,
    pub(crate) options: RedisOptions,
    /// This node's name in the consumer group.
    pub(crate) consumer: String,
    pub(crate) checkpointer: Arc<RedisCheckpointer>,
    pub(crate) wakes: Arc<Wakes>,
    pub(crate) batcher: Option<Batcher>,
}

impl RedisReceiver {
    /// The receiver of `queue` (stream `key`), writing under `fence`.
    pub(crate) fn new(queue: QueueId, key: String, fence: Fence, shared: Shared) -> Self {
        let Shared { conn, options, consumer, checkpointer, wakes, batcher } = shared;
        let batcher = batcher.filter(|_| fence.token.is_some());
        Self {
            queue,
            conn,
            key,
            options,
            consumer,
            checkpointer,
            phase: Phase::Pending("0".into()),
            last_read: None,
            last_trim: Instant::now(),
            untrimmed: false,
            shut_down: false,
            raise_last_id: redis::Script::new(RAISE_LAST_ID),
            fence: Arc::new(fence),
            unacked: Vec::new(),
            streams: StreamIdCache::default(),
            wakes,
            idle_at: None,
            found_nothing: false,
            batcher,
        }
    }

    fn check(&self) -> Result<(), QueueError> {
        if self.shut_down { Err(QueueError::ShutDown(self.queue)) } else { Ok(()) }
    }

    fn containers(&mut self, entries: Vec<redis::streams::StreamId>) -> Vec<Arc<BatchContainer>> {
        let mut out = Vec::with_capacity(entries.len());
        for mut entry in entries {
            match entry_container(&entry.id, entry.map.remove("b"), &mut self.streams) {
                Ok(container) => out.push(Arc::new(container)),
                // A foreign or damaged entry: skip it (it stays visible in Redis).
                Err(error) => {
                    tracing::error!(queue = %self.queue, key = %self.key, %error, "unreadable stream entry skipped")
                }
            }
        }
        out
    }

    /// Trims the stream up to the stored checkpoint, now and then. Fails
    /// only when the fence refused it.
    fn trim_due(&self) -> bool {
        self.options.trim != TrimPolicy::Never && self.last_trim.elapsed() >= self.options.trim_every
    }

    /// Sends the acks not sent yet; a future that holds nothing of the
    /// receiver, so that a read can go at the same time. It also answers
    /// the acks to send again: all of them after a failure other than a
    /// refusal (whether they ran is unknown; an `XACK` of an acked entry
    /// changes nothing), for [`Self::acks_sent`].
    fn send_acks(
        &mut self,
    ) -> impl std::future::Future<Output = (Result<(), QueueError>, Vec<SequenceToken>)> + 'static {
        let tokens = std::mem::take(&mut self.unacked);
        let (mut conn, fence, key, group) =
            (self.conn.clone(), self.fence.clone(), self.key.clone(), self.options.group.clone());
        let queue = self.queue;
        async move {
            if tokens.is_empty() {
                return (Ok(()), tokens);
            }
            let ids = tokens.iter().map(|t| t.to_string());
            match fence.ack(&mut conn, &key, &group, ids).await {
                Err(error) if fence::is_refusal(&error) => {
                    (Err(fence::queue_refusal("ack", queue, fence.token.unwrap_or(0), &error)), Vec::new())
                }
                Err(error) => (Err(backend(&error, "acking")), tokens),
                Ok(_) => (Ok(()), Vec::new()),
            }
        }
    }

    /// Keeps the acks a failed send answered for the next read.
    fn acks_sent(&mut self, (result, again): (Result<(), QueueError>, Vec<SequenceToken>)) -> Result<(), QueueError> {
        self.unacked.splice(0..0, again);
        result
    }

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
            Err(error) if fence::is_refusal(&error) => return Err(self.refusal("trim", &error)),
            Err(error) => tracing::warn!(queue = %self.queue, %error, "XTRIM failed"),
        }
        Ok(())
    }

    /// A refusal of the fence (there is one if Redis refused).
    fn refusal(&self, kind: &'static str, error: &redis::RedisError) -> QueueError {
        fence::queue_refusal(kind, self.queue, self.fence.token.unwrap_or(0), error)
    }

    /// A failed read as a queue error.
    fn read_error(&self, (error, doing): (redis::RedisError, &'static str)) -> QueueError {
        if fence::is_refusal(&error) { self.refusal("read", &error) } else { backend(&error, doing) }
    }
}

#[async_trait]
impl QueueReceiver for RedisReceiver {
    async fn initialize(&mut self, timeout: Duration) -> Result<(), QueueError> {
        let queue = self.queue;
        let (_, claimed) = claim_attempt
            .retry(NOT_READY.within(timeout))
            .context(self)
            .when(QueueError::is_transient)
            .notify(|error, wait| tracing::warn!(%queue, %error, ?wait, "redis not ready; retrying"))
            .await;
        claimed
    }

    async fn read(&mut self, max: usize) -> Result<Vec<Arc<BatchContainer>>, QueueError> {
        self.check()?;
        self.idle_at = None;
        let read = match (self.batcher.clone(), &self.phase) {
            (Some(batcher), Phase::New) => self.read_batched(&batcher, max).await?,
            _ => {
                let acks = self.send_acks();
                let (acked, read) = tokio::join!(acks, self.read_batch(max));
                match self.acks_sent(acked) {
                    // A newer lease was granted: nothing more is read either.
                    Err(fenced @ QueueError::Fenced(_)) => return Err(fenced),
                    Err(error) => ack_failed(self.queue, &error),
                    Ok(()) => {}
                }
                read?
            }
        };
        self.untrimmed |= !read.is_empty();
        // Nothing new: time to trim (a refusal fails the read).
        if read.is_empty() {
            self.trim().await?;
        }
        Ok(read)
    }

    async fn delivered(&mut self, tokens: &[SequenceToken]) -> Result<(), QueueError> {
        self.unacked.extend_from_slice(tokens);
        if self.trim_due() {
            let acked = self.send_acks().await;
            self.acks_sent(acked)?;
            return self.trim().await;
        }
        Ok(())
    }

    /// Dead-lettered entries are acked: their copy is in the sink, and the
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
        let reply: StreamRangeReply = redis::cmd("XRANGE")
            .arg(&self.key)
            .arg(from.to_string())
            .arg("+")
            .arg("COUNT")
            .arg(max.max(1))
            .query_async(&mut self.conn)
            .await
            .map_err(|e| backend(&e, "rewinding"))?;
        Ok(self.containers(reply.ids))
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
        let last_id = self.idle_at.take()?;
        let wait = self.wakes.wait(self.key.clone(), last_id)?;
        if !self.untrimmed || self.options.trim == TrimPolicy::Never {
            return Some(wait);
        }
        let due = tokio::time::Instant::from_std(self.last_trim + self.options.trim_every);
        Some(Box::pin(async move { drop(tokio::time::timeout_at(due, wait).await) }))
    }

    async fn shutdown(&mut self, _timeout: Duration) -> Result<(), QueueError> {
        let acked = self.send_acks().await;
        self.shut_down = true;
        self.acks_sent(acked)
    }
}

impl RedisReceiver {
    /// One read, creating the consumer group again if it vanished.
    async fn read_batch(&mut self, max: usize) -> Result<Vec<Arc<BatchContainer>>, QueueError> {
        match self.read_entries(max).await {
            Err((error, _)) if fence::is_no_group(&error) => {
                // The stream key vanished (deleted, or a Redis that lost its
                // data) and took the group with it; producers may already
                // be appending to a new stream. Without a group nothing is
                // ever read again: create it and read the new stream from
                // its start.
                tracing::warn!(queue = %self.queue, key = %self.key, %error,
                    "the consumer group is gone; creating it again and reading the stream from its start");
                self.claim_everything().await?;
                let read = self.read_entries(max).await;
                read.map_err(|error| self.read_error(error))
            }
            result => result.map_err(|error| self.read_error(error)),
        }
    }

    /// Reads this consumer's pending entries first (after a start or a
    /// lost reply), then new ones.
    async fn read_entries(
        &mut self,
        max: usize,
    ) -> Result<Vec<Arc<BatchContainer>>, (redis::RedisError, &'static str)> {
        if let Phase::Pending(after) = &self.phase {
            let reply: StreamReadReply = redis::cmd("XREADGROUP")
                .arg("GROUP")
                .arg(&self.options.group)
                .arg(&self.consumer)
                .arg("COUNT")
                .arg(max.max(1))
                .arg("STREAMS")
                .arg(&self.key)
                .arg(after)
                .query_async(&mut self.conn)
                .await
                .map_err(|e| (e, "reading pending entries"))?;
            let entries: Vec<_> = reply.keys.into_iter().flat_map(|k| k.ids).collect();
            match entries.last() {
                Some(last) => {
                    self.phase = Phase::Pending(last.id.clone());
                    self.last_read = Some(last.id.clone());
                    return Ok(self.containers(entries));
                }
                None => self.phase = Phase::New,
            }
        }
        // The server may hand us entries (into our pending list) whose reply
        // never reaches us: the connection drops, or this call is cancelled
        // (the agent bounds every receiver call). Until the reply is here,
        // the next read starts with our pending entries after the last one
        // we saw, so none is stranded.
        self.phase = Phase::Pending(self.last_read.clone().unwrap_or_else(|| "0".into()));
        let (group, consumer, count) = (&self.options.group, &self.consumer, max.max(1));
        // The stream's last id (for the wake) is asked for from the second
        // empty read in a row: the agent waits for a write only after
        // several.
        let found = self.fence.read_new(&mut self.conn, &self.key, (group, consumer), count, self.found_nothing).await;
        let entries = match found.map_err(|error| (error, "reading"))? {
            NewEntries::Some(entries) => entries,
            NewEntries::None { last_id } => {
                self.idle_at = last_id;
                Vec::new()
            }
        };
        self.found_nothing = entries.is_empty();
        self.phase = Phase::New;
        if let Some(last) = entries.last() {
            self.last_read = Some(last.id.clone());
        }
        Ok(self.containers(entries))
    }

    /// The acks not sent yet and a read of new entries, in one cycle of
    /// the process's batched fenced path.
    async fn read_batched(&mut self, batcher: &Batcher, max: usize) -> Result<Vec<Arc<BatchContainer>>, QueueError> {
        let token = self.fence.token.unwrap_or(0);
        let acks = std::mem::take(&mut self.unacked);
        let work = Work {
            stream: self.key.clone(),
            fence_key: self.fence.key.clone(),
            token,
            group: self.options.group.clone(),
            consumer: self.consumer.clone(),
            acks: acks.iter().map(ToString::to_string).collect(),
            count: max.max(1),
            last_id: self.found_nothing,
        };
        // As in `read_entries`: until the reply is here, the next read
        // starts with our pending entries after the last one we saw.
        self.phase = Phase::Pending(self.last_read.clone().unwrap_or_else(|| "0".into()));
        let (ack_error, entries, last_id) = match batcher.call(work).await {
            Ok(Answer::Fenced(fence)) => {
                fence::refused("read", self.queue, token, &format!("FENCED queue fence {fence}"));
                return Err(QueueError::Fenced(self.queue));
            }
            Ok(Answer::Done { ack_error, entries, last_id }) => (ack_error, entries, last_id),
            // The group is gone: the per-queue path creates it again.
            Err(error) if fence::is_no_group(&error) => return self.read_batch(max).await,
            // Whether the acks ran is unknown: they go again with the
            // next read (an `XACK` of an acked entry changes nothing).
            Err(error) => {
                self.unacked.splice(0..0, acks);
                return Err(backend(&error, "reading"));
            }
        };
        if let Some(error) = ack_error {
            ack_failed(self.queue, &backend(&error, "acking"));
        }
        self.idle_at = last_id;
        self.found_nothing = entries.is_empty();
        self.phase = Phase::New;
        if let Some(last) = entries.last() {
            self.last_read = Some(last.id.clone());
        }
        Ok(self.containers(entries))
    }

    /// Why `from` can no longer be served, if it cannot: entries before the
    /// first one recorded were trimmed away, and deleted ones are gone.
    async fn gone_before(&mut self, from: SequenceToken) -> Option<(String, Option<SequenceToken>)> {
        let info: redis::Value =
            redis::cmd("XINFO").arg("STREAM").arg(&self.key).query_async(&mut self.conn).await.ok()?;
        let fields: Vec<(String, redis::Value)> = match info {
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

/// How often a receiver whose read failed asks Redis whether it is back.
const PROBE_EVERY: Duration = Duration::from_millis(100);

/// A failed ack: the acks go again with the next read (and if none
/// succeeds, the entries stay pending and come back to the queue's next
/// owner).
fn ack_failed(queue: QueueId, error: &QueueError) {
    tracing::warn!(%queue, %error, "ack failed; sending it again with the next read");
}

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
