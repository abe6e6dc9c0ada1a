//! Queues and the plug-in surface every queue adapter implements.
//!
//! A queue is a partition of a durable store; many streams share one and a
//! stream lives in exactly one (the [`QueueMapper`] decides which). An adapter
//! turns a concrete store (memory, a file directory, Redis Streams, yours) into
//! three async traits:
//!
//! - [`QueueAdapterFactory`] builds the adapter, the mapper, the checkpointer
//!   and the per-queue cache from configuration;
//! - [`QueueAdapter`] writes (`enqueue`) and hands out receivers;
//! - [`QueueReceiver`] reads one queue for its pulling agent: `initialize`,
//!   `read(max)`, `delivered(tokens)` (the ack), `shutdown`, and
//!   optionally `wake_on_write` (an idle agent waits on it, not on a poll).
//!
//! The runtime never names a concrete adapter. `docs/adapters.md` explains how
//! to write one and [`crate::conformance`] checks it.

mod fence;
mod mapper;
mod storage;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use crate::stream::{BatchContainer, Event, QueueId, SequenceToken, StreamId};

pub use fence::Fence;
pub use mapper::QueueMapper;
pub use storage::{CacheOptions, CheckpointError, Checkpointer};

/// What an adapter can do with its store.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Direction {
    /// Only receivers (a generator, an external feed).
    ReadOnly,
    /// Only `enqueue` (a sink); no agents pull it.
    WriteOnly,
    /// Both.
    ReadWrite,
}

/// Errors of the queue surface, with enough context to act on.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum QueueError {
    /// `try_enqueue` found the queue full; nothing was written.
    #[error("queue {queue} is full ({capacity} events); nothing was written, retry later")]
    Full {
        /// The full queue.
        queue: QueueId,
        /// Its capacity in events.
        capacity: usize,
    },
    /// The queue refused the events (a byte budget); nothing was written.
    #[error("queue {queue} refused the events: {reason}")]
    Refused {
        /// The queue.
        queue: QueueId,
        /// Why.
        reason: String,
    },
    /// One batch cannot ever fit the queue.
    #[error("a batch of {events} events can never fit queue {queue} (capacity {capacity} events); split it")]
    BatchTooLarge {
        /// The queue it was meant for.
        queue: QueueId,
        /// Events in the refused batch.
        events: usize,
        /// The queue's capacity in events.
        capacity: usize,
    },
    /// One batch holds more bytes than the store takes in one write (a
    /// Kafka record); nothing was written.
    #[error(
        "a batch of {bytes} bytes can never fit queue {queue} (it takes {limit} bytes at most in one write); split it"
    )]
    BatchTooManyBytes {
        /// The queue it was meant for.
        queue: QueueId,
        /// The batch's size as stored.
        bytes: usize,
        /// The most one write takes.
        limit: usize,
    },
    /// An empty batch was offered.
    #[error("refusing an empty batch for stream {0}")]
    EmptyBatch(StreamId),
    /// The adapter cannot do what was asked in this direction.
    #[error("adapter `{adapter}` is {direction:?} and cannot {operation}")]
    WrongDirection {
        /// The adapter's name.
        adapter: String,
        /// Its direction.
        direction: Direction,
        /// What was attempted.
        operation: &'static str,
    },
    /// The adapter is not rewindable and was asked for a past position.
    #[error("this adapter is not rewindable: it cannot serve position {requested} again")]
    NotRewindable {
        /// The position asked for.
        requested: SequenceToken,
    },
    /// The adapter cannot serve a position before what it still holds
    /// (its retention, a trim or a deleted file passed it): never served
    /// from later data instead.
    #[error("adapter `{adapter}` cannot rewind queue {queue} to {requested}: {reason}; {}", shown_oldest(*.oldest))]
    CannotRewind {
        /// The adapter's name.
        adapter: String,
        /// The queue.
        queue: QueueId,
        /// The position asked for.
        requested: SequenceToken,
        /// Why (not rewindable, or no longer held).
        reason: String,
        /// The oldest position the queue still holds (a rewind or a
        /// subscription can start there), if it holds any.
        oldest: Option<SequenceToken>,
    },
    /// A newer receiver took this queue over (or a newer lease of it was
    /// granted, and the store refused a write of the old one); this one
    /// must stop.
    #[error("receiver of queue {0} was superseded by a newer receiver")]
    Fenced(QueueId),
    /// The receiver was used after `shutdown`.
    #[error("receiver of queue {0} is shut down")]
    ShutDown(QueueId),
    /// An operation did not finish in time.
    #[error("{operation} on queue {queue} did not finish within {after:?}")]
    Timeout {
        /// What timed out.
        operation: &'static str,
        /// The queue.
        queue: QueueId,
        /// The limit that passed.
        after: Duration,
    },
    /// The disk holding the queue's files is full: nothing of the batch was
    /// kept; appends succeed again once there is room, without a restart.
    #[error("the disk holding queue {queue}'s files is full ({}); nothing was written", shown_free(*.free_bytes))]
    DiskFull {
        /// The queue.
        queue: QueueId,
        /// Free bytes on that disk, if it could be read.
        free_bytes: Option<u64>,
    },
    /// A file-system error, with what was being done.
    #[error("{context}: {source}")]
    Io {
        /// What was being done (with the path).
        context: String,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The backing store failed; `transient` says whether a retry may help.
    #[error("{adapter} backend error: {message}")]
    Backend {
        /// The adapter's name.
        adapter: String,
        /// What went wrong.
        message: String,
        /// Whether retrying may succeed.
        transient: bool,
    },
    /// Configuration that cannot work.
    #[error("invalid queue configuration: {0}")]
    Config(String),
}

/// The oldest held position as a refusal says it.
fn shown_oldest(oldest: Option<SequenceToken>) -> String {
    match oldest {
        Some(token) => format!("the oldest position it holds is {token}"),
        None => "it holds no older position than what is written next".into(),
    }
}

/// Free bytes as a message says them.
fn shown_free(free: Option<u64>) -> String {
    match free {
        Some(bytes) if bytes >= 1 << 20 => format!("{:.1} MiB free", bytes as f64 / (1 << 20) as f64),
        Some(bytes) => format!("{bytes} bytes free"),
        None => "free space unknown".into(),
    }
}

impl QueueError {
    /// For a position the queue no longer holds ([`QueueError::CannotRewind`]):
    /// the oldest position it still holds, if it holds any.
    pub fn oldest_held(&self) -> Option<SequenceToken> {
        match self {
            QueueError::CannotRewind { oldest, .. } => *oldest,
            _ => None,
        }
    }

    /// Whether retrying the same call later may succeed.
    pub fn is_transient(&self) -> bool {
        match self {
            QueueError::Full { .. }
            | QueueError::Refused { .. }
            | QueueError::Timeout { .. }
            | QueueError::DiskFull { .. }
            | QueueError::Io { .. } => true,
            QueueError::Backend { transient, .. } => *transient,
            _ => false,
        }
    }
}

/// Builds everything a provider needs from its configuration. One factory per
/// provider per node; every node must build the same mapper.
#[async_trait]
pub trait QueueAdapterFactory: Send + Sync + 'static {
    /// The provider's name (used in logs, metrics and store keys).
    fn name(&self) -> &str;

    /// The stream-to-queue mapping. Must be identical on every node.
    fn queue_mapper(&self) -> QueueMapper;

    /// The adapter producers write to and agents pull from.
    async fn create_adapter(&self) -> Result<Arc<dyn QueueAdapter>, QueueError>;

    /// Where agents keep each queue's checkpoint. An adapter that resumes
    /// from checkpoints shares this instance with its receivers.
    async fn create_checkpointer(&self) -> Result<Arc<dyn Checkpointer>, QueueError>;

    /// The options of each queue's cache (bounded, pressure-bucketed).
    fn cache_options(&self) -> CacheOptions {
        CacheOptions::default()
    }
}

/// Writes events and hands out one receiver per queue.
///
/// What the runtime does with one, by hand, on the memory adapter: write a
/// batch, read it back on its queue's receiver, acknowledge it.
///
/// ```
/// use tailrace::adapters::memory::{MemoryAdapterFactory, MemoryOptions};
/// use tailrace::queue::{Fence, QueueAdapterFactory};
/// use tailrace::{Event, StreamId};
/// use std::time::Duration;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let factory = MemoryAdapterFactory::new(4, MemoryOptions::default());
/// let (adapter, mapper) = (factory.create_adapter().await?, factory.queue_mapper());
/// let stream = StreamId::new("logs", "etl.daily/run-7");
/// let token = adapter.enqueue(&stream, vec![Event::new("e-1", "one")]).await?;
///
/// let mut receiver = adapter.create_receiver(mapper.queue_for(&stream), Fence::NONE).await?;
/// receiver.initialize(Duration::from_secs(5)).await?;
/// let read = receiver.read(16).await?;
/// assert_eq!((read.len(), read[0].token, read[0].stream.clone()), (1, token, stream));
/// receiver.delivered(&[token]).await?; // acknowledged: not read again
/// receiver.shutdown(Duration::from_secs(5)).await?;
/// # Ok(()) }
/// ```
#[async_trait]
pub trait QueueAdapter: Send + Sync + 'static {
    /// The adapter's name.
    fn name(&self) -> &str;

    /// What the adapter can do.
    fn direction(&self) -> Direction;

    /// Whether receivers can serve positions they already passed
    /// ([`QueueReceiver::rewind`]). A non-rewindable adapter refuses such a
    /// start position with [`QueueError::CannotRewind`].
    fn is_rewindable(&self) -> bool;

    /// Appends `events` of `stream` to the stream's queue as one batch
    /// container and returns its token. Waits while the queue is full
    /// (back-pressure); never drops an event. Returns once the batch is as
    /// durable as the adapter promises.
    async fn enqueue(&self, stream: &StreamId, events: Vec<Event>) -> Result<SequenceToken, QueueError>;

    /// Builds the receiver of one queue. Only the queue's owner calls it,
    /// under `fence`: a store that can fence refuses the receiver's writes
    /// (acks, trims, and reads that take entries) once a newer lease of the
    /// queue was granted, with [`QueueError::Fenced`]; one that cannot
    /// ignores it.
    async fn create_receiver(&self, queue: QueueId, fence: Fence) -> Result<Box<dyn QueueReceiver>, QueueError>;

    /// Whether the backend answers now (a cheap probe: a Redis `PING`), for
    /// `GET /readyz`. The default answers yes.
    async fn health(&self) -> Result<(), QueueError> {
        Ok(())
    }

    /// Flushes and releases what the adapter holds (writers, connections)
    /// once nothing enqueues any more. The default has nothing to do.
    async fn close(&self) -> Result<(), QueueError> {
        Ok(())
    }
}

/// What [`QueueReceiver::wake_on_write`] hands out: completes when the
/// queue may hold something new.
pub type Wake = std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send + 'static>>;

/// Reads one queue for its pulling agent. Owned by one task at a time.
#[async_trait]
pub trait QueueReceiver: Send + 'static {
    /// Connects and positions the receiver (after the queue's checkpoint or
    /// at its oldest unacknowledged container). Retries on its own within
    /// `timeout`.
    async fn initialize(&mut self, timeout: Duration) -> Result<(), QueueError>;

    /// Returns up to `max` containers in queue order (possibly none).
    /// Containers read but never acknowledged are read again by the next
    /// receiver of the queue.
    async fn read(&mut self, max: usize) -> Result<Vec<Arc<BatchContainer>>, QueueError>;

    /// The ack: every subscription is done with these containers.
    async fn delivered(&mut self, tokens: &[SequenceToken]) -> Result<(), QueueError>;

    /// These containers failed delivery and went to the dead-letter sink.
    /// They are not acknowledged; an adapter that can redeliver may keep them
    /// pending. The default does nothing.
    async fn failed(&mut self, tokens: &[SequenceToken]) -> Result<(), QueueError> {
        let _ = tokens;
        Ok(())
    }

    /// Asked after the fourth empty read in a row (the agent polled
    /// `min_poll_period` apart, doubling: 1, 2, 4 ms with the defaults;
    /// sooner if that wait reached `poll_period`; never while its reads are
    /// paused, the cache under pressure): a future that completes once the queue may
    /// hold something new (a write to it, a lost connection to
    /// the store), so that an idle agent waits on it instead of polling.
    /// Waking for nothing is fine (the agent reads, finds nothing, asks
    /// again after four more empty reads); staying asleep while the queue
    /// holds unread containers is a bug. The future may be dropped
    /// unfinished. `None` (the default): the agent goes on polling, the
    /// wait doubling up to `poll_period`.
    fn wake_on_write(&mut self) -> Option<Wake> {
        None
    }

    /// After a read or an initialize failed: a future that completes once
    /// the backend answers again (a cheap probe, such as a Redis `PING`
    /// every few hundred milliseconds), so that the agent retries at once
    /// instead of waiting out the rest of `agent.reader_backoff`. It may
    /// complete early (the agent's retry then fails and backs off again);
    /// it may be dropped unfinished. `None` (the default): the agent waits
    /// the backoff out.
    fn reachable(&mut self) -> Option<Wake> {
        None
    }

    /// Reads up to `max` containers at or after `from`, in queue order,
    /// whether or not the live position passed them, without moving it
    /// (rewindable adapters only). The default refuses.
    async fn rewind(&mut self, from: SequenceToken, max: usize) -> Result<Vec<Arc<BatchContainer>>, QueueError> {
        let _ = max;
        Err(QueueError::NotRewindable { requested: from })
    }

    /// Stops the receiver; idempotent. Called once the agent has reported
    /// its final progress.
    async fn shutdown(&mut self, timeout: Duration) -> Result<(), QueueError>;
}
