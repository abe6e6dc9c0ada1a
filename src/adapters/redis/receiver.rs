//! The receiver of one Redis queue: a consumer-group reader.

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use redis::aio::ConnectionManager;
use redis::streams::{StreamAutoClaimReply, StreamRangeReply, StreamReadReply};

use super::entry::decode_entry;
use super::{NAME, RedisCheckpointer, RedisOptions, TrimPolicy, backend};
use crate::checkpoint::Checkpointer;
use crate::queue::{QueueError, QueueId, QueueReceiver};
use crate::stream::{BatchContainer, SequenceToken};

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
    conn: ConnectionManager,
    key: String,
    options: RedisOptions,
    consumer: String,
    checkpointer: Arc<RedisCheckpointer>,
    phase: Phase,
    /// The id of the last entry handed to the agent.
    last_read: Option<String>,
    last_trim: Instant,
    shut_down: bool,
}

impl RedisReceiver {
    pub(crate) fn new(
        queue: QueueId,
        conn: ConnectionManager,
        key: String,
        options: RedisOptions,
        consumer: String,
        checkpointer: Arc<RedisCheckpointer>,
    ) -> Self {
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
            shut_down: false,
        }
    }

    fn check(&self) -> Result<(), QueueError> {
        if self.shut_down { Err(QueueError::ShutDown(self.queue)) } else { Ok(()) }
    }

    fn containers(&self, entries: Vec<redis::streams::StreamId>) -> Vec<Arc<BatchContainer>> {
        let mut out = Vec::with_capacity(entries.len());
        for mut entry in entries {
            match decode_entry(&entry.id, entry.map.remove("b")) {
                Ok(container) => out.push(Arc::new(container)),
                // A foreign or damaged entry: skip it (it stays visible in Redis).
                Err(error) => {
                    tracing::error!(queue = %self.queue, key = %self.key, %error, "unreadable stream entry skipped")
                }
            }
        }
        out
    }

    /// Trims the stream up to the stored checkpoint, now and then.
    async fn trim(&mut self) {
        if self.options.trim == TrimPolicy::Never || self.last_trim.elapsed() < self.options.trim_every {
            return;
        }
        self.last_trim = Instant::now();
        let Ok(Some(checkpoint)) = self.checkpointer.load(self.queue).await else { return };
        let trimmed: Result<u64, _> = redis::cmd("XTRIM")
            .arg(&self.key)
            .arg("MINID")
            .arg(checkpoint.to_string())
            .query_async(&mut self.conn)
            .await;
        match trimmed {
            Ok(n) if n > 0 => {
                tracing::debug!(queue = %self.queue, removed = n, %checkpoint, "stream trimmed up to the checkpoint")
            }
            Ok(_) => {}
            Err(error) => tracing::warn!(queue = %self.queue, %error, "XTRIM failed"),
        }
    }
}

#[async_trait]
impl QueueReceiver for RedisReceiver {
    async fn initialize(&mut self, timeout: Duration) -> Result<(), QueueError> {
        let deadline = Instant::now() + timeout;
        loop {
            match self.claim_everything().await {
                Ok(()) => return Ok(()),
                Err(error) if error.is_transient() && Instant::now() < deadline => {
                    tracing::warn!(queue = %self.queue, %error, "redis not ready; retrying");
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                Err(error) => return Err(error),
            }
        }
    }

    async fn read(&mut self, max: usize) -> Result<Vec<Arc<BatchContainer>>, QueueError> {
        self.check()?;
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
                .map_err(|e| backend(&e, "reading pending entries"))?;
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
        let reply: Result<Option<StreamReadReply>, redis::RedisError> = redis::cmd("XREADGROUP")
            .arg("GROUP")
            .arg(&self.options.group)
            .arg(&self.consumer)
            .arg("COUNT")
            .arg(max.max(1))
            .arg("BLOCK")
            .arg(self.options.block.as_millis() as u64)
            .arg("STREAMS")
            .arg(&self.key)
            .arg(">")
            .query_async(&mut self.conn)
            .await;
        let reply = match reply {
            Ok(reply) => reply,
            Err(error) => {
                // The server may have handed us entries (they are in our
                // pending list now) whose reply was lost with the
                // connection: read our pending entries again first.
                self.phase = Phase::Pending(self.last_read.clone().unwrap_or_else(|| "0".into()));
                return Err(backend(&error, "reading"));
            }
        };
        let entries: Vec<_> = reply.map(|r| r.keys.into_iter().flat_map(|k| k.ids).collect()).unwrap_or_default();
        if let Some(last) = entries.last() {
            self.last_read = Some(last.id.clone());
        }
        if entries.is_empty() {
            self.trim().await;
        }
        Ok(self.containers(entries))
    }

    async fn delivered(&mut self, tokens: &[SequenceToken]) -> Result<(), QueueError> {
        if tokens.is_empty() {
            return Ok(());
        }
        let mut cmd = redis::cmd("XACK");
        cmd.arg(&self.key).arg(&self.options.group);
        for token in tokens {
            cmd.arg(token.to_string());
        }
        let _: u64 = cmd.query_async(&mut self.conn).await.map_err(|e| backend(&e, "acking"))?;
        self.trim().await;
        Ok(())
    }

    /// Dead-lettered entries are acked: their copy is in the sink, and the
    /// checkpoint passes them.
    async fn failed(&mut self, tokens: &[SequenceToken]) -> Result<(), QueueError> {
        self.delivered(tokens).await
    }

    async fn rewind(&mut self, from: SequenceToken, max: usize) -> Result<Vec<Arc<BatchContainer>>, QueueError> {
        self.check()?;
        if let Some(reason) = self.gone_before(from).await {
            return Err(QueueError::CannotRewind { adapter: NAME.into(), queue: self.queue, requested: from, reason });
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

    async fn shutdown(&mut self, _timeout: Duration) -> Result<(), QueueError> {
        self.shut_down = true;
        Ok(())
    }
}

impl RedisReceiver {
    /// Why `from` can no longer be served, if it cannot: entries before the
    /// first one recorded were trimmed away, and deleted ones are gone.
    async fn gone_before(&mut self, from: SequenceToken) -> Option<String> {
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
        let removed = number("entries-added")? > number("length")?;
        if let Some(first) = token("recorded-first-entry-id").filter(|first| removed && from < *first) {
            return Some(format!("the stream was trimmed; its oldest entry is {first}"));
        }
        token("max-deleted-entry-id")
            .filter(|deleted| *deleted != SequenceToken::default() && from <= *deleted)
            .map(|deleted| format!("entries through {deleted} were deleted"))
    }

    /// Creates the group if needed and takes over every pending entry (a
    /// previous owner's, or our own from before a restart): they are read
    /// first, in order.
    async fn claim_everything(&mut self) -> Result<(), QueueError> {
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
        let mut start = "0-0".to_string();
        loop {
            let reply: StreamAutoClaimReply = redis::cmd("XAUTOCLAIM")
                .arg(&self.key)
                .arg(&self.options.group)
                .arg(&self.consumer)
                .arg(0)
                .arg(&start)
                .arg("COUNT")
                .arg(1000)
                .arg("JUSTID")
                .query_async(&mut self.conn)
                .await
                .map_err(|e| backend(&e, "claiming pending entries"))?;
            if reply.next_stream_id == "0-0" {
                break;
            }
            start = reply.next_stream_id;
        }
        self.phase = Phase::Pending("0".into());
        self.shut_down = false;
        Ok(())
    }
}
