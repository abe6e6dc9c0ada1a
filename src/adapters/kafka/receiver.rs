//! The receiver of one partition: fetches from the offset after the stored
//! checkpoint on a connection of its own, hands out what a fetch returned
//! a container at a time (a record that is none goes to the dead-letter
//! sink), and serves rewinds from any offset the partition still holds.
//! Acks cost nothing (the agent's checkpoint is the ack).

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use rskafka::client::error::{Error as KafkaError, ProtocolError};
use rskafka::client::partition::{OffsetAt, PartitionClient};
use rskafka::record::RecordAndOffset;
use tokio::sync::Notify;
use tokio::time::Instant;

use super::connect::{self, bounded, offset, token};
use super::dead_letters::DeadLetters;
use super::records::{Records, Unreadable};
use super::{KafkaOptions, NAME};
use crate::failure::DeadLetterSink;
use crate::queue::{Checkpointer, QueueError, QueueMapper, QueueReceiver, Wake};
use crate::stream::{BatchContainer, QueueId, SequenceToken, StreamIdCache};
use crate::telemetry;

/// How a receiver reads its records: their format, where a stream
/// belongs, where the unreadable ones go.
pub(super) struct Reading {
    pub(super) records: Arc<Records>,
    pub(super) mapper: QueueMapper,
    pub(super) dead_letters: Arc<dyn DeadLetterSink>,
}

/// Reads one partition. See the module documentation.
pub(super) struct KafkaReceiver {
    queue: QueueId,
    options: KafkaOptions,
    checkpointer: Arc<dyn Checkpointer>,
    records: Arc<Records>,
    mapper: QueueMapper,
    dead_letters: DeadLetters,
    /// Signalled when this process produced to the partition.
    written: Arc<Notify>,
    /// The partition on this receiver's connection (made at initialize).
    reader: Option<Arc<PartitionClient>>,
    /// The partition on a second connection, for an idle queue's long
    /// fetch: a broker serves one connection's requests in turn, so a
    /// fetch left waiting there would hold up the next read.
    waker: Option<Arc<PartitionClient>>,
    /// The next offset to fetch.
    next: i64,
    /// Fetched and not yet handed out.
    fetched: VecDeque<Arc<BatchContainer>>,
    /// What the last rewind fetched past what it handed out (a catch-up
    /// asks for the rest next), and the last token it handed out.
    rewound: VecDeque<Arc<BatchContainer>>,
    rewound_through: Option<SequenceToken>,
    streams: StreamIdCache,
    /// The gap being read again, if any: its first missing offset, and
    /// since when.
    gap_since: Option<(i64, Instant)>,
    shut_down: bool,
}

impl KafkaReceiver {
    pub(super) fn new(
        queue: QueueId,
        options: KafkaOptions,
        checkpointer: Arc<dyn Checkpointer>,
        written: Arc<Notify>,
        reading: Reading,
    ) -> Self {
        let dead_letters =
            DeadLetters::new(queue, options.topic.clone(), reading.dead_letters, options.response_timeout);
        Self {
            queue,
            options,
            checkpointer,
            records: reading.records,
            mapper: reading.mapper,
            dead_letters,
            written,
            reader: None,
            waker: None,
            next: 0,
            fetched: VecDeque::new(),
            rewound: VecDeque::new(),
            rewound_through: None,
            streams: StreamIdCache::default(),
            gap_since: None,
            shut_down: false,
        }
    }

    /// A client of this receiver's partition on a new connection.
    async fn connect(&self, role: &str) -> Result<Arc<PartitionClient>, QueueError> {
        let client = connect::client(&self.options, role).await?;
        Ok(Arc::new(connect::partition(&client, &self.options, self.queue.0).await?))
    }

    /// The partition's first offset still held.
    async fn earliest(&self, partition: &PartitionClient) -> Result<i64, QueueError> {
        bounded(&self.options, "reading the partition's start", partition.get_offset(OffsetAt::Earliest)).await
    }

    /// Fetches from `from` on the reader's connection, waiting up to `wait`
    /// for a first record. A fetch that failed (other than for an offset
    /// the partition does not hold) drops the connection: one the broker
    /// stopped answering on (a node paused past the broker's patience, a
    /// broker restarted) would otherwise fail every read until the client
    /// noticed; the next call dials anew.
    async fn fetch(
        &mut self,
        from: i64,
        wait: Duration,
    ) -> Result<Result<(Vec<RecordAndOffset>, i64), KafkaError>, QueueError> {
        let partition = self.reader().await?;
        let bytes = 1..i32::try_from(self.options.fetch_max_bytes).unwrap_or(i32::MAX);
        let wait_ms = i32::try_from(wait.as_millis()).unwrap_or(i32::MAX);
        // The broker holds the fetch up to `wait`: the limit comes on top.
        let limit = self.options.response_timeout + wait;
        let fetched = tokio::time::timeout(limit, partition.fetch_records(from, bytes, wait_ms)).await;
        if !matches!(&fetched, Ok(Ok(_))) && !matches!(&fetched, Ok(Err(e)) if out_of_range(e)) {
            self.reader = None;
        }
        fetched.map_err(|_| QueueError::Backend {
            adapter: NAME.into(),
            message: format!("fetching partition {}: no answer within {limit:?}", self.queue.0),
            transient: true,
        })
    }

    /// The records as containers, and those that are none (not in the
    /// topic's format, or of a stream another partition holds).
    fn containers(&mut self, records: Vec<RecordAndOffset>) -> (Vec<Arc<BatchContainer>>, Vec<Unreadable>) {
        let (mut out, mut unreadable) = (Vec::with_capacity(records.len()), Vec::new());
        for record in records {
            match self.records.decode(self.queue, self.mapper, record, &mut self.streams) {
                Ok(container) => out.push(Arc::new(container)),
                Err(record) => unreadable.push(*record),
            }
        }
        (out, unreadable)
    }

    /// The reader's partition client, on a new connection if a failure
    /// dropped the last one.
    async fn reader(&mut self) -> Result<Arc<PartitionClient>, QueueError> {
        if self.shut_down {
            return Err(QueueError::ShutDown(self.queue));
        }
        match &self.reader {
            Some(reader) => Ok(reader.clone()),
            None => {
                let reader = self.connect("reader").await?;
                self.reader = Some(reader.clone());
                Ok(reader)
            }
        }
    }

    /// Fetches what follows `next` into `fetched`: the records up to the
    /// first offset missing from the answer (see [`Gap`]).
    async fn fetch_next(&mut self) -> Result<(), QueueError> {
        match self.fetch(self.next, self.options.read_wait).await? {
            Ok((mut records, _)) => {
                let gap = contiguous(self.next, &mut records);
                let handed_out = !records.is_empty();
                if let Some(last) = records.last() {
                    self.next = last.offset + 1;
                }
                let (containers, unreadable) = self.containers(records);
                self.fetched.extend(containers);
                self.gap(gap, handed_out);
                self.dead_letters.found(unreadable);
                Ok(())
            }
            Err(error) if out_of_range(&error) => {
                // Retention removed records this queue never read, or the
                // topic was made anew: go on from where it starts now.
                let partition = self.reader().await?;
                let earliest = self.earliest(&partition).await?;
                if earliest > self.next {
                    tracing::error!(queue = %self.queue, topic = %self.options.topic, from = self.next, to = earliest,
                        "the topic's retention removed records before they were read; going on from its start");
                    self.next = earliest;
                }
                Ok(())
            }
            Err(error) => Err(connect::backend(&format!("fetching partition {}", self.queue.0), &error)),
        }
    }

    /// After a fetch: a gap right at `next` is read again until it fills
    /// (an answer that hands out records with no gap first); one still
    /// there after [`GAP_PATIENCE`] is passed, said aloud and counted
    /// (records a compaction or an aborted transaction removed). An empty
    /// answer changes nothing.
    fn gap(&mut self, gap: Option<Gap>, handed_out: bool) {
        let Some(Gap { missing, resumes }) = gap else {
            if handed_out && let Some((_, since)) = self.gap_since.take() {
                tracing::debug!(queue = %self.queue, waited = ?since.elapsed(), "a gap in the partition filled");
                metrics::counter!(telemetry::QUEUE_OFFSET_GAPS, "outcome" => "filled").increment(1);
            }
            return;
        };
        let since = match self.gap_since {
            Some((at, since)) if at == missing => since,
            earlier => {
                // An earlier gap filled: this answer handed out its records.
                if earlier.is_some() && handed_out {
                    metrics::counter!(telemetry::QUEUE_OFFSET_GAPS, "outcome" => "filled").increment(1);
                }
                self.gap_since.insert((missing, Instant::now())).1
            }
        };
        if since.elapsed() < GAP_PATIENCE {
            return;
        }
        tracing::error!(queue = %self.queue, topic = %self.options.topic, from = missing, to = resumes,
            "partition offsets missing for {GAP_PATIENCE:?} (compacted, or an aborted transaction); going on past them");
        metrics::counter!(telemetry::QUEUE_OFFSET_GAPS, "outcome" => "skipped").increment(1);
        self.next = resumes;
        self.gap_since = None;
    }
}

/// Offsets missing from a fetch's answer: `missing` was asked for (or
/// follows a record handed out) and the answer goes on at `resumes`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Gap {
    missing: i64,
    resumes: i64,
}

/// Keeps the records of an answer from `from` up to the first offset it
/// lacks, and says where that gap is. Some brokers make a record visible
/// before one produced just ahead of it on another connection (the Tansu
/// test broker answered a fetch from 259 with 260.. while 259 was stored
/// and showed a moment later): going on from the last record handed out
/// would skip the late one for good. Records below `from` (the rest of a
/// batch the broker sends whole) are dropped.
fn contiguous(from: i64, records: &mut Vec<RecordAndOffset>) -> Option<Gap> {
    records.retain(|r| r.offset >= from);
    let mut expected = from;
    let gap = records.iter().position(|r| {
        let skips = r.offset != expected;
        expected = r.offset + 1;
        skips
    })?;
    let resumes = records[gap].offset;
    let missing = if gap == 0 { from } else { records[gap - 1].offset + 1 };
    records.truncate(gap);
    Some(Gap { missing, resumes })
}

/// How long a gap in a partition's offsets is read again before it is
/// taken for records that will not come.
const GAP_PATIENCE: Duration = Duration::from_secs(10);

/// The refusal of a rewind to `from` when the partition starts at `earliest`
/// now (its retention removed what lay below).
fn past_retention(queue: QueueId, from: SequenceToken, earliest: i64) -> Option<QueueError> {
    (offset(from) < earliest).then(|| QueueError::CannotRewind {
        adapter: NAME.into(),
        queue,
        requested: from,
        reason: format!("the topic's retention removed partition {}'s records below offset {earliest}", queue.0),
        oldest: Some(token(earliest)),
    })
}

/// How often a failed receiver probes the brokers.
const PROBE_EVERY: Duration = Duration::from_millis(250);

/// Fetches a rewind tries before it calls an empty answer a failure.
const REWIND_ATTEMPTS: u32 = 3;

/// The broker holds no record at the offset asked for.
fn out_of_range(error: &KafkaError) -> bool {
    matches!(error, KafkaError::ServerError { protocol_error: ProtocolError::OffsetOutOfRange, .. })
}

#[async_trait]
impl QueueReceiver for KafkaReceiver {
    /// Connects, then starts after the stored checkpoint, or at the
    /// partition's start when there is none.
    async fn initialize(&mut self, _timeout: Duration) -> Result<(), QueueError> {
        let partition = self.reader().await?;
        if self.waker.is_none() {
            self.waker = Some(self.connect("waker").await?);
        }
        let stored = self.checkpointer.load(self.queue).await.map_err(|e| QueueError::Backend {
            adapter: NAME.into(),
            message: e.to_string(),
            transient: true,
        })?;
        let earliest = self.earliest(&partition).await?;
        self.next = match stored {
            Some(checkpoint) if offset(checkpoint) + 1 < earliest => {
                tracing::error!(queue = %self.queue, topic = %self.options.topic, %checkpoint, earliest,
                    "the topic's retention removed records after the checkpoint before they were read");
                earliest
            }
            Some(checkpoint) => offset(checkpoint) + 1,
            None => earliest,
        };
        tracing::debug!(queue = %self.queue, ?stored, earliest, next = self.next, "kafka receiver positioned");
        self.fetched.clear();
        self.rewound.clear();
        // Read again from the checkpoint: found again there.
        self.dead_letters.forget();
        Ok(())
    }

    /// What the last fetch brought, or a new fetch once that is handed
    /// out and its unreadable records sent to the dead-letter sink.
    async fn read(&mut self, max: usize) -> Result<Vec<Arc<BatchContainer>>, QueueError> {
        self.dead_letters.send().await;
        if self.fetched.is_empty() && self.dead_letters.is_empty() {
            self.fetch_next().await?;
            self.dead_letters.send().await;
        }
        let n = self.fetched.len().min(max);
        Ok(self.fetched.drain(..n).collect())
    }

    /// Nothing to write: the agent's checkpoint is the ack.
    async fn delivered(&mut self, _tokens: &[SequenceToken]) -> Result<(), QueueError> {
        Ok(())
    }

    /// Until this process produces to the partition, or the broker answers
    /// a fetch held open for `idle_wait` (at once when a record arrives, on
    /// a broker that answers held fetches early); at once while unreadable
    /// records wait to be sent to the dead-letter sink.
    fn wake_on_write(&mut self) -> Option<Wake> {
        if !self.dead_letters.is_empty() {
            // Letters wait to be sent: read again at once.
            return Some(Box::pin(async {}));
        }
        let (written, from, wait) = (self.written.clone(), self.next, self.options.idle_wait);
        let waker = self.waker.clone()?;
        let (limit, queue) = (wait + self.options.response_timeout, self.queue);
        let wait_ms = i32::try_from(wait.as_millis()).unwrap_or(i32::MAX);
        Some(Box::pin(async move {
            let held = tokio::time::timeout(limit, waker.fetch_records(from, 1..2, wait_ms));
            tokio::select! {
                _ = written.notified() => {}
                answered = held => {
                    if let Ok(Err(error)) = answered {
                        tracing::debug!(%queue, %error, "idle fetch failed; reading again");
                    }
                }
            }
        }))
    }

    /// After a failed read: until a new connection to the brokers answers
    /// for the partition's end (tried every [`PROBE_EVERY`], each try
    /// bounded by `response_timeout`), so that the agent reads again as
    /// soon as the broker is back instead of waiting out its backoff.
    fn reachable(&mut self) -> Option<Wake> {
        let (options, queue) = (self.options.clone(), self.queue);
        Some(Box::pin(async move {
            loop {
                tokio::time::sleep(PROBE_EVERY).await;
                let probe = async {
                    let client = connect::client(&options, "probe").await?;
                    let partition = connect::partition(&client, &options, queue.0).await?;
                    bounded(&options, "probing the partition", partition.get_offset(OffsetAt::Latest)).await
                };
                if probe.await.is_ok() {
                    return;
                }
            }
        }))
    }

    /// Containers at or after `from` while the partition still holds it;
    /// an offset its retention removed is refused, naming its start.
    async fn rewind(&mut self, from: SequenceToken, max: usize) -> Result<Vec<Arc<BatchContainer>>, QueueError> {
        let partition = self.reader().await?;
        // The rest of the last rewind's fetch, when this one goes on from
        // where it ended (nothing lies between).
        let goes_on = self.rewound_through.is_some_and(|through| through < from)
            && self.rewound.front().is_some_and(|next| from <= next.token);
        if goes_on {
            let n = self.rewound.len().min(max);
            let out: Vec<_> = self.rewound.drain(..n).collect();
            self.rewound_through = out.last().map(|c| c.token);
            return Ok(out);
        }
        self.rewound.clear();
        if let Some(refusal) = past_retention(self.queue, from, self.earliest(&partition).await?) {
            return Err(refusal);
        }
        // (Some brokers answer a fetch that may not wait at all with no
        // partition in it: it may wait a millisecond.)
        let mut attempts = 0;
        let records = loop {
            let (mut records, high_watermark) = match self.fetch(offset(from), self.options.read_wait).await? {
                Ok(fetched) => fetched,
                // Past the end: nothing there yet.
                Err(error) if out_of_range(&error) => break Vec::new(),
                Err(error) => return Err(connect::backend(&format!("rewinding partition {}", self.queue.0), &error)),
            };
            // Only what follows `from` without a gap (see `contiguous`).
            let gap = contiguous(offset(from), &mut records);
            // Some brokers (Tansu) gather records for the fetch's whole
            // wait and may answer nothing though they hold records from
            // `from` on: nothing is an answer only past the high watermark.
            if !records.is_empty() || (gap.is_none() && offset(from) >= high_watermark) {
                break records;
            }
            attempts += 1;
            if attempts == REWIND_ATTEMPTS {
                let answered = match gap {
                    Some(gap) => format!("records from offset {} but not {}", gap.resumes, gap.missing),
                    None => format!("no record though it holds records up to {high_watermark}"),
                };
                return Err(QueueError::Backend {
                    adapter: NAME.into(),
                    message: format!(
                        "partition {} answered a fetch from offset {} with {answered}",
                        self.queue.0,
                        offset(from)
                    ),
                    transient: true,
                });
            }
        };
        let (containers, unreadable) = self.containers(records);
        if let (Some(first), Some(last)) = (unreadable.first(), unreadable.last()) {
            tracing::debug!(queue = %self.queue, from = first.offset, to = last.offset,
                "unreadable records passed again in a rewind (sent to the dead-letter sink when first read)");
        }
        let mut out: VecDeque<_> = containers.into();
        self.rewound = out.split_off(max.min(out.len()));
        self.rewound_through = out.back().map(|c| c.token);
        Ok(out.into())
    }

    async fn shutdown(&mut self, _timeout: Duration) -> Result<(), QueueError> {
        self.shut_down = true;
        self.reader = None;
        self.waker = None;
        self.fetched.clear();
        Ok(())
    }
}

#[cfg(test)]
mod tests;
