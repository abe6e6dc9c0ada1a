//! Reading: the pump. One pump at a time; each acks what the cache purged,
//! records checkpoint progress, serves pending rewinds and reads at most one
//! bucket, all in a task that owns the receiver while it runs.

use rustc_hash::FxHashMap as HashMap;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt;
use ractor::ActorProcessingErr;
use rand::RngExt;
use tokio::time::Instant;

use super::state::{Agent, InternalMsg, Io, StreamEntry, panic_text};
use super::{AgentMsg, Internal};
use crate::cache::Purged;
use crate::pubsub::SubscriptionId;
use crate::queue::QueueError;
use crate::stream::{BatchContainer, SequenceToken, StreamId};

/// A rewind read for one catching-up subscription.
pub(crate) struct RewindJob {
    stream: StreamId,
    id: SubscriptionId,
    /// Which catch-up asked (a newer one ignores older answers).
    epoch: u64,
    from: SequenceToken,
    max: usize,
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

struct PumpJob {
    queue: crate::queue::QueueId,
    initialize: bool,
    init_timeout: Duration,
    purged: Purged,
    progress: Option<SequenceToken>,
    rewinds: Vec<RewindJob>,
    read_max: usize,
}

impl Agent {
    pub(crate) fn schedule_first_pump(&mut self) {
        let period = self.services.options.poll_period.as_nanos().min(u128::from(u64::MAX)) as u64;
        let offset = if period == 0 { 0 } else { rand::rng().random_range(0..period) };
        self.schedule_pump(Duration::from_nanos(offset));
    }

    /// Arranges a pump after `delay` unless one is already due by then.
    pub(crate) fn schedule_pump(&mut self, delay: Duration) {
        if self.pump.immediate || self.shutdown.is_some() {
            return;
        }
        if delay.is_zero() {
            self.pump.immediate = true;
            self.send_self(InternalMsg::Pump);
            return;
        }
        let due = Instant::now() + delay;
        if self.pump.scheduled.is_some_and(|at| at <= due) {
            return;
        }
        self.pump.scheduled = Some(due);
        self.send_self_after(delay, || InternalMsg::Pump);
    }

    pub(crate) fn on_pump_tick(&mut self) {
        // A timer superseded by a sooner one may still fire: one extra pump.
        self.pump.scheduled = None;
        self.pump.immediate = false;
        if self.shutdown.is_some() || self.pump.in_flight {
            return;
        }
        let Some(io) = self.io.take() else { return };
        let now = Instant::now();
        self.clock = now;
        self.cleanup_inactive_streams(now);
        let mut purged = self.cache.purge();
        purged.acked.append(&mut self.redelivered);
        self.status.acked += purged.acked.len() as u64;
        let progress = self.cache.progress();
        let paused = self.cache.is_under_pressure() || self.streams.len() >= self.services.options.max_streams;
        self.pump.blocked = paused;
        let read_max = if paused { 0 } else { self.cache.max_add_count() };
        // Rewinds wait for a receiver that initialized (a failed initialize
        // would drop them).
        let rewinds = if self.initialized { self.take_rewinds() } else { Vec::new() };
        let job = PumpJob {
            queue: self.queue,
            initialize: !self.initialized,
            init_timeout: self.services.options.init_timeout,
            purged,
            progress,
            rewinds,
            read_max,
        };
        if read_max > 0 {
            self.status.read_calls += 1;
        }
        self.pump.in_flight = true;
        let myself = self.myself.clone();
        let kill = self.kill.clone();
        let span = self.span.clone();
        let pump = async move {
            let outcome = tokio::select! {
                _ = kill.cancelled() => return,
                outcome = AssertUnwindSafe(run_pump(io, job)).catch_unwind() => outcome,
            };
            let outcome = outcome.unwrap_or_else(|panic| PumpOutcome {
                io: None,
                panic: Some(panic_text(&panic)),
                init_error: None,
                read: Ok(Vec::new()),
                rewinds: Vec::new(),
            });
            let _ = myself.cast(AgentMsg::Internal(Internal(InternalMsg::PumpDone(Box::new(outcome)))));
        };
        tokio::spawn(tracing::Instrument::instrument(pump, span));
    }

    pub(crate) fn on_pump_done(&mut self, outcome: PumpOutcome) -> Result<(), ActorProcessingErr> {
        self.pump.in_flight = false;
        let Some(io) = outcome.io else {
            let panic = outcome.panic.unwrap_or_default();
            return Err(format!("the receiver of queue {} panicked: {panic}", self.queue).into());
        };
        self.io = Some(io);
        let options = &self.services.options;
        if let Some(error) = outcome.init_error {
            self.pump.read_failures += 1;
            let wait = options.reader_backoff.delay(self.pump.read_failures - 1);
            tracing::warn!(queue = %self.queue, %error, ?wait, "receiver initialize failed; retrying");
            self.schedule_pump(wait);
            return Ok(());
        }
        self.initialized = true;
        for rewind in outcome.rewinds {
            self.on_rewind(rewind);
        }
        match outcome.read {
            Err(QueueError::Fenced(queue)) => {
                return Err(format!("queue {queue} was taken over by a newer receiver").into());
            }
            Err(error) => {
                self.metrics.read_errors.increment(1);
                self.pump.read_failures += 1;
                let wait = self.services.options.reader_backoff.delay(self.pump.read_failures - 1);
                tracing::warn!(queue = %self.queue, %error, ?wait, "queue read failed; backing off");
                self.schedule_pump(wait);
            }
            // Admission is closed: what was read now is left unacknowledged
            // for the next owner.
            Ok(_) if self.shutdown.is_some() => {}
            Ok(batch) => {
                self.pump.read_failures = 0;
                let got = !batch.is_empty();
                if got {
                    self.add_batch(batch)?;
                }
                if !self.read_once {
                    self.read_once = true;
                    self.place_deferred_latest();
                }
                let delay = if got && !self.pump.blocked || !self.rewinds.is_empty() {
                    self.pump.empty_reads = 0;
                    Duration::ZERO
                } else {
                    self.idle_wait()
                };
                self.schedule_pump(delay);
            }
        }
        self.metrics.cached.set(self.cache.len() as f64);
        self.metrics.pressure.set(if self.cache.is_under_pressure() { 1.0 } else { 0.0 });
        Ok(())
    }

    /// The wait after an empty (or paused) read: `min_poll_period` doubled
    /// per consecutive empty read, up to `poll_period`.
    fn idle_wait(&mut self) -> Duration {
        let options = &self.services.options;
        let shift = self.pump.empty_reads.min(20);
        self.pump.empty_reads += 1;
        options
            .min_poll_period
            .saturating_mul(1 << shift)
            .clamp(options.min_poll_period.min(options.poll_period), options.poll_period)
    }

    fn add_batch(&mut self, batch: Vec<Arc<BatchContainer>>) -> Result<(), ActorProcessingErr> {
        self.status.reads += 1;
        self.status.containers_read += batch.len() as u64;
        // Streams in first-appearance order, with their event counts.
        let mut order: Vec<StreamId> = Vec::new();
        let mut events: HashMap<StreamId, usize> = HashMap::default();
        for container in &batch {
            let count = events.entry(container.stream.clone()).or_insert_with(|| {
                order.push(container.stream.clone());
                0
            });
            *count += container.events.len();
        }
        self.metrics.events_read.increment(events.values().sum::<usize>() as u64);
        // The pump reads at most what fits, so a full cache is a bug; the
        // containers stay unacknowledged in the queue for the next owner.
        let mut added = self.cache.add(batch)?;
        self.redelivered.append(&mut added.skipped);
        for cursor in added.ready {
            if let Some((stream, id)) = self.cursor_owner.get(&cursor).cloned() {
                self.dispatch(&stream, id);
            }
        }
        let now = self.clock;
        for stream in order {
            match self.streams.get_mut(&stream) {
                Some(entry) => {
                    entry.last_activity = now;
                    if entry.registered && entry.subs.is_empty() {
                        self.count_unsubscribed(events[&stream]);
                    }
                }
                None => self.register_stream(stream),
            }
        }
        Ok(())
    }

    fn take_rewinds(&mut self) -> Vec<RewindJob> {
        let max = self.cache.max_add_count();
        let mut jobs = Vec::new();
        while jobs.len() < self.services.options.max_rewinds_per_pump {
            let Some((stream, id)) = self.rewinds.pop_front() else {
                break;
            };
            let catch_up = self.streams.get(&stream).and_then(|e| e.subs.get(&id)).and_then(|s| s.catch_up.as_ref());
            if let Some(catch_up) = catch_up {
                let (from, epoch) = (catch_up.next, catch_up.epoch);
                jobs.push(RewindJob { stream, id, epoch, from, max });
            }
        }
        jobs
    }

    /// Forgets streams idle for the inactivity period (or any idle stream
    /// when over `max_streams`). Their subscriptions are found again, with a
    /// handshake, on their next event.
    fn cleanup_inactive_streams(&mut self, now: Instant) {
        let period = self.services.options.stream_inactivity;
        let crowded = self.streams.len() >= self.services.options.max_streams;
        let every = if crowded { self.services.options.poll_period } else { period / 10 };
        if now.saturating_duration_since(self.last_cleanup) < every {
            return;
        }
        self.last_cleanup = now;
        let threshold = if crowded { Duration::ZERO } else { period };
        let idle: Vec<StreamId> = self
            .streams
            .iter()
            .filter(|(stream, entry)| {
                now.saturating_duration_since(entry.last_activity) >= threshold && self.is_idle(stream, entry)
            })
            .map(|(stream, _)| stream.clone())
            .collect();
        for stream in idle {
            tracing::debug!(queue = %self.queue, %stream, "stream inactive; forgetting it until its next event");
            self.forget_stream(&stream);
        }
    }

    /// Nothing in flight, every cursor caught up, and nothing of the stream
    /// cached (so its next container is the first a new cursor sees).
    fn is_idle(&self, stream: &StreamId, entry: &StreamEntry) -> bool {
        entry.registered
            && !self.cache.holds(stream)
            && entry.subs.values().all(|sub| {
                !sub.delivering
                    && !sub.handshaking
                    && sub.catch_up.is_none()
                    && sub.cursor.is_some_and(|c| !self.cache.has_next(c))
            })
    }
}

async fn run_pump(mut io: Io, job: PumpJob) -> PumpOutcome {
    let mut outcome =
        PumpOutcome { io: None, panic: None, init_error: None, read: Ok(Vec::new()), rewinds: Vec::new() };
    // Every receiver call is bounded: a hung store must not hold the agent
    // (and its ordered shutdown) forever.
    let limit = job.init_timeout;
    let timeout = |operation: &'static str| QueueError::Timeout { operation, queue: job.queue, after: limit };
    if job.initialize {
        let init = tokio::time::timeout(limit, io.receiver.initialize(limit)).await;
        if let Some(error) = match init {
            Ok(Ok(())) => None,
            Ok(Err(error)) => Some(error),
            Err(_) => Some(timeout("initialize")),
        } {
            outcome.init_error = Some(error);
            outcome.io = Some(io);
            return outcome;
        }
    }
    if !job.purged.acked.is_empty() {
        let acked = tokio::time::timeout(limit, io.receiver.delivered(&job.purged.acked)).await;
        if let Some(error) = flatten(acked, || timeout("delivered")) {
            tracing::warn!(%error, containers = job.purged.acked.len(), "ack failed; the queue may redeliver them");
        }
    }
    if !job.purged.failed.is_empty() {
        let failed = tokio::time::timeout(limit, io.receiver.failed(&job.purged.failed)).await;
        if let Some(error) = flatten(failed, || timeout("failed")) {
            tracing::warn!(%error, "reporting failed containers to the receiver failed");
        }
    }
    if let Some(progress) = job.progress {
        match tokio::time::timeout(limit, io.checkpoint.update(progress, Instant::now())).await {
            Ok(Ok(_)) => {}
            Ok(Err(error)) => tracing::warn!(%error, "checkpoint write failed; the next one retries"),
            Err(_) => tracing::warn!(?limit, "checkpoint write timed out; the next one retries"),
        }
    }
    for job in job.rewinds {
        let result = match tokio::time::timeout(limit, io.receiver.rewind(job.from, job.max)).await {
            Ok(result) => result,
            Err(_) => Err(timeout("rewind")),
        };
        outcome.rewinds.push(RewindResult { stream: job.stream, id: job.id, epoch: job.epoch, result });
    }
    if job.read_max > 0 {
        outcome.read = match tokio::time::timeout(limit, io.receiver.read(job.read_max)).await {
            Ok(result) => result,
            Err(_) => Err(timeout("read")),
        };
    }
    outcome.io = Some(io);
    outcome
}

/// The error of a bounded call, if it failed or timed out.
fn flatten(
    outcome: Result<Result<(), QueueError>, tokio::time::error::Elapsed>,
    timeout: impl FnOnce() -> QueueError,
) -> Option<QueueError> {
    match outcome {
        Ok(Ok(())) => None,
        Ok(Err(error)) => Some(error),
        Err(_) => Some(timeout()),
    }
}
