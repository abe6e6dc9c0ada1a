//! The pump and its schedule: the receiver and the checkpoint (lent to one
//! pump task at a time), whether the receiver initialized, when the next
//! read is due and how long to back off.
//!
//! One pump acks what the cache purged, records checkpoint progress, serves
//! pending rewinds and reads at most one bucket, every receiver call bounded
//! by the init timeout. The agent decides what to read ([`Pump::begin`]);
//! the part says when to read again ([`Pump::schedule`], [`Pump::after_read`]).

use std::sync::Arc;
use std::time::Duration;

use rand::RngExt;
use tokio::time::Instant;

use super::settings::{AgentOptions, AgentServices};
use crate::cache::Purged;
use crate::checkpoint::QueueCheckpoint;
use crate::pubsub::SubscriptionId;
use crate::queue::{Fence, QueueError, QueueReceiver, Wake};
use crate::stream::{BatchContainer, QueueId, SequenceToken, StreamId};
use ractor::ActorProcessingErr;

mod task;
pub(crate) use task::{commit, flatten};

/// The receiver and checkpoint: owned by the pump, lent to its task.
pub(crate) struct Io {
    pub receiver: Box<dyn QueueReceiver>,
    pub checkpoint: QueueCheckpoint,
}

impl Io {
    /// The queue's receiver and its checkpoint, both fenced with the
    /// agent's lease token when it has one.
    pub(crate) async fn open(services: &AgentServices, queue: QueueId) -> Result<Self, ActorProcessingErr> {
        let fence = Fence::from(services.lease_token);
        let receiver = services.adapter.create_receiver(queue, fence).await?;
        let checkpoint = QueueCheckpoint::load(services.checkpointer.clone(), queue, services.checkpoint.clone())
            .await?
            .fenced(fence);
        Ok(Self { receiver, checkpoint })
    }
}

/// A rewind read for one catching-up subscription.
pub(crate) struct RewindJob {
    pub stream: StreamId,
    pub id: SubscriptionId,
    /// Which catch-up asked (a newer one ignores older answers).
    pub epoch: u64,
    pub from: SequenceToken,
    pub max: usize,
}

/// A rewind read's answer.
pub(crate) struct RewindResult {
    pub stream: StreamId,
    pub id: SubscriptionId,
    pub epoch: u64,
    pub result: Result<Vec<Arc<BatchContainer>>, QueueError>,
}

/// What one pump did, sent back to the agent.
pub(crate) struct PumpOutcome {
    /// The receiver and checkpoint, or `None` if the task panicked.
    io: Option<Io>,
    panic: Option<String>,
    init_error: Option<QueueError>,
    read: Result<Vec<Arc<BatchContainer>>, QueueError>,
    rewinds: Vec<RewindResult>,
}

/// What the agent does with a finished pump.
pub(crate) enum Pumped {
    /// The receiver did not initialize; the pump runs again after `wait`.
    InitFailed { error: QueueError, wait: Duration },
    /// It ran: the rewind answers, then the read.
    Ran { rewinds: Vec<RewindResult>, read: Result<Vec<Arc<BatchContainer>>, QueueError> },
}

/// Why the agent cannot go on reading its queue.
#[derive(Debug, thiserror::Error)]
pub(crate) enum PumpError {
    /// The receiver panicked and its state is lost.
    #[error("the receiver of queue {queue} panicked: {panic}")]
    Panicked { queue: QueueId, panic: String },
    /// A newer receiver owns the queue.
    #[error("queue {0} was taken over by a newer receiver")]
    Fenced(QueueId),
}

/// Whether an agent failed because a newer receiver took its queue (its
/// lease is gone: not a crash to restart).
pub(crate) fn is_fenced(error: &ActorProcessingErr) -> bool {
    matches!(error.downcast_ref::<PumpError>(), Some(PumpError::Fenced(_)))
}

/// What the agent does after a read.
pub(crate) enum AfterRead {
    /// Pump again after this long.
    Pump(Duration),
    /// Sleep until this wake completes (the queue may hold something new),
    /// or on the wake already awaited (`None`).
    Sleep(Option<Wake>),
}

/// When the agent should send itself the next pump tick.
pub(crate) enum Tick {
    Now,
    After(Duration),
}

/// One pump, lent the receiver, ready to run in a task.
pub(crate) struct PumpRun {
    io: Io,
    job: PumpJob,
}

/// What the agent asks of one pump.
pub(crate) struct PumpWork {
    /// What every cursor passed (to ack) or gave up (to report failed).
    pub purged: Purged,
    /// The delivery progress to checkpoint, if known.
    pub progress: Option<SequenceToken>,
    /// Streams to serve from before the live position.
    pub rewinds: Vec<RewindJob>,
    /// No read this time: the cache is under pressure or full of streams.
    pub paused: bool,
    /// Containers the cache has room for.
    pub room: usize,
}

/// The work as the pump's task runs it.
struct PumpJob {
    queue: QueueId,
    initialize: bool,
    init_timeout: Duration,
    purged: Purged,
    progress: Option<SequenceToken>,
    rewinds: Vec<RewindJob>,
    read_max: usize,
}

/// A read that brought less than 1/`THIN_READ` of what it could is thin:
/// about a dozen containers of a default cache's bucket (409). A busy queue
/// read one container at a time (the Redis cluster of `bench scale` read
/// 0.8 a read) spends most of its work on the reads themselves; one read
/// fifty at a time (`bench redis`) loses throughput to a wait.
const THIN_READ: usize = 32;

/// Thin reads in a row after which the next read lingers.
const THIN_READS_TO_LINGER: u32 = 3;

/// Empty reads in a row, `min_poll_period` apart and doubling (1, 2, 4
/// ms), before the agent sleeps on its receiver's wake: a queue between
/// two bursts is read again within milliseconds without a wake's cost
/// (two commands on Redis), and the first event after a pause waits at
/// most the last of those delays. (Polling on up to `poll_period` first
/// had that event wait up to 64 ms.)
const POLLS_BEFORE_WAKE: u32 = 3;

/// Pumps in a row that serve rewinds without reading a quiet queue.
const READS_SKIPPED_AT_MOST: u32 = 8;

/// The pump's state and its schedule.
pub(crate) struct Pump {
    io: Option<Io>,
    initialized: bool,
    in_flight: bool,
    /// When the next timed pump is due, if one is arranged.
    scheduled: Option<Instant>,
    /// A pump message is already on its way with no delay.
    immediate: bool,
    blocked: bool,
    read_failures: u32,
    /// Consecutive empty reads (the idle wait doubles with each).
    empty_reads: u32,
    /// The receiver's wake is awaited (the agent sleeps until a write).
    armed: bool,
    /// The last read that ran found nothing (the queue is quiet).
    quiet: bool,
    /// Whether the pump in flight reads.
    reading: bool,
    /// Most containers the last pump could read.
    read_max: usize,
    /// Thin reads in a row.
    thin_reads: u32,
    /// Consecutive pumps that served rewinds and skipped their read.
    reads_skipped: u32,
    /// Containers read again at or below the progress already recorded:
    /// done, to be acked by the next pump.
    redelivered: Vec<SequenceToken>,
}

impl Pump {
    pub(crate) fn new(io: Io) -> Self {
        Self {
            io: Some(io),
            initialized: false,
            in_flight: false,
            scheduled: None,
            immediate: false,
            blocked: false,
            read_failures: 0,
            empty_reads: 0,
            armed: false,
            quiet: false,
            reading: false,
            read_max: 0,
            thin_reads: 0,
            reads_skipped: 0,
            redelivered: Vec::new(),
        }
    }

    /// The checkpoint recorded (while the receiver is home).
    pub(crate) fn checkpoint(&self) -> Option<SequenceToken> {
        self.io.as_ref().and_then(|io| io.checkpoint.latest())
    }

    pub(crate) fn in_flight(&self) -> bool {
        self.in_flight
    }

    pub(crate) fn initialized(&self) -> bool {
        self.initialized
    }

    /// The first pump waits a random part of the poll period, so that the
    /// agents of a node do not read in step.
    pub(crate) fn first_delay(options: &AgentOptions) -> Duration {
        let period = options.poll_period.as_nanos().min(u128::from(u64::MAX)) as u64;
        Duration::from_nanos(if period == 0 { 0 } else { rand::rng().random_range(0..period) })
    }

    /// Arranges a pump after `delay` unless one is already due by then (or
    /// the agent is closing): the tick to send, if any.
    pub(crate) fn schedule(&mut self, delay: Duration, closing: bool) -> Option<Tick> {
        if self.immediate || closing {
            return None;
        }
        if delay.is_zero() {
            self.immediate = true;
            return Some(Tick::Now);
        }
        let due = Instant::now() + delay;
        if self.scheduled.is_some_and(|at| at <= due) {
            return None;
        }
        self.scheduled = Some(due);
        Some(Tick::After(delay))
    }

    /// A tick arrived: whether a pump may start now.
    pub(crate) fn ticked(&mut self, closing: bool) -> bool {
        // A timer superseded by a sooner one may still fire: one extra pump.
        self.scheduled = None;
        self.immediate = false;
        !closing && !self.in_flight && self.io.is_some()
    }

    /// Progress made: the next read is not an idle one.
    pub(crate) fn wake(&mut self) {
        self.empty_reads = 0;
    }

    /// Containers read again that were already done: acked by the next pump.
    pub(crate) fn redelivered(&mut self, tokens: &mut Vec<SequenceToken>) {
        self.redelivered.append(tokens);
    }

    /// Adds what is redelivered to the acks of a purge.
    /// Acks go in token order (the adapter contract), and what was read
    /// again may be older than what the cursors passed.
    pub(crate) fn take_redelivered(&mut self, purged: &mut Purged) {
        purged.acked.append(&mut self.redelivered);
        if !purged.acked.is_sorted() {
            purged.acked.sort_unstable();
        }
    }

    /// Lends the receiver to one pump: ack `purged`, record `progress`,
    /// serve `rewinds`, then read up to `room` containers unless `paused`.
    pub(crate) fn begin(&mut self, queue: QueueId, init_timeout: Duration, work: PumpWork) -> Option<PumpRun> {
        let io = self.io.take()?;
        let PumpWork { purged, progress, rewinds, paused, room } = work;
        self.blocked = paused;
        self.in_flight = true;
        // On a quiet queue a read waits (the adapter's read wait) before it
        // answers nothing: a pump that serves rewinds skips it, or each
        // step of a catch-up would wait that long. Every few such pumps it
        // reads anyway, so new events never wait long behind a replay.
        let skip = !rewinds.is_empty() && self.quiet && self.reads_skipped < READS_SKIPPED_AT_MOST;
        self.reads_skipped = if skip { self.reads_skipped + 1 } else { 0 };
        let read_max = if paused || skip { 0 } else { room };
        self.reading = read_max > 0;
        self.read_max = read_max;
        let job = PumpJob { queue, initialize: !self.initialized, init_timeout, purged, progress, rewinds, read_max };
        Some(PumpRun { io, job })
    }

    /// The pump came back: the receiver is home again.
    pub(crate) fn finish(
        &mut self,
        outcome: PumpOutcome,
        queue: QueueId,
        options: &AgentOptions,
    ) -> Result<Pumped, PumpError> {
        self.in_flight = false;
        let Some(io) = outcome.io else {
            return Err(PumpError::Panicked { queue, panic: outcome.panic.unwrap_or_default() });
        };
        self.io = Some(io);
        if let Some(error) = outcome.init_error {
            return Ok(Pumped::InitFailed { error, wait: self.failed(options) });
        }
        self.initialized = true;
        if self.reading {
            self.quiet = outcome.read.as_ref().is_ok_and(Vec::is_empty);
        }
        Ok(Pumped::Ran { rewinds: outcome.rewinds, read: outcome.read })
    }

    /// A read (or initialize) failed: the backoff before the next.
    pub(crate) fn failed(&mut self, options: &AgentOptions) -> Duration {
        self.read_failures += 1;
        options.reader_backoff.delay(self.read_failures - 1)
    }

    /// A read succeeded: what comes next. Right away after a fruitful read
    /// that was not paused, or when rewinds wait; after the third thin read
    /// in a row, `read_linger` later, unless a pump is asked for sooner (a
    /// delivery finished, a rewind, a purge). After an empty read,
    /// `min_poll_period` doubled per consecutive empty read; after
    /// [`POLLS_BEFORE_WAKE`] of them (the queue is dry, not between two
    /// bursts), sleep until the receiver's wake if it has one, or go on
    /// doubling up to `poll_period`.
    pub(crate) fn after_read(&mut self, read: usize, rewinds_waiting: bool, options: &AgentOptions) -> AfterRead {
        self.read_failures = 0;
        let got = read > 0;
        if got && !self.blocked || rewinds_waiting {
            self.empty_reads = 0;
            // Thin reads in a row of a busy queue: the next one waits to
            // carry more. One thin read is often the gap before a burst.
            let thin = got && !rewinds_waiting && read.saturating_mul(THIN_READ) < self.read_max;
            self.thin_reads = if thin { self.thin_reads + 1 } else { 0 };
            let linger = if self.thin_reads >= THIN_READS_TO_LINGER { options.read_linger } else { Duration::ZERO };
            return AfterRead::Pump(linger);
        }
        if self.armed && !self.blocked {
            return AfterRead::Sleep(None);
        }
        let shift = self.empty_reads.min(20);
        self.empty_reads += 1;
        let delay = options
            .min_poll_period
            .saturating_mul(1 << shift)
            .clamp(options.min_poll_period.min(options.poll_period), options.poll_period);
        // Dry for a few polls: sleep until a write (a queue that only
        // paused between bursts is read again before that).
        let dry = self.empty_reads > POLLS_BEFORE_WAKE || delay >= options.poll_period;
        if !self.blocked
            && dry
            && let Some(wake) = self.io.as_mut().and_then(|io| io.receiver.wake_on_write())
        {
            self.armed = true;
            return AfterRead::Sleep(Some(wake));
        }
        AfterRead::Pump(delay)
    }

    /// After a failed read or initialize (the receiver is home): the
    /// receiver's probe of its backend, if it has one.
    pub(crate) fn reachable(&mut self) -> Option<Wake> {
        self.io.as_mut().and_then(|io| io.receiver.reachable())
    }

    /// Whether the agent sleeps until its receiver's wake.
    pub(crate) fn asleep(&self) -> bool {
        self.armed
    }

    /// Whether a sleeping agent must pump to ack what its subscriptions
    /// finished since (no pump is in flight to do it).
    pub(crate) fn acks_waiting(&self, cache: &crate::cache::QueueCache) -> bool {
        self.armed && !self.in_flight && cache.purgeable()
    }

    /// The receiver's wake completed: the next read is due.
    pub(crate) fn woken(&mut self) {
        self.armed = false;
        self.empty_reads = 0;
    }

    /// When a sleeping agent must still pump: to write progress recorded
    /// but not yet written (the write is throttled, `persist_interval`),
    /// or to forget idle streams (`stream_inactivity`, if it has any).
    pub(crate) fn asleep_due(&self, services: &AgentServices, streams: usize) -> Option<Duration> {
        let unwritten = self.io.as_ref().is_some_and(|io| io.checkpoint.latest() != io.checkpoint.persisted());
        if unwritten {
            Some(services.checkpoint.persist_interval)
        } else {
            (streams > 0).then_some(services.options.stream_inactivity)
        }
    }

    /// Takes the receiver home for good (the ordered shutdown).
    pub(crate) fn take_io(&mut self) -> Option<Io> {
        self.io.take()
    }
}
