//! One **tailer** per watched run per node: an explicit subscriber of the
//! run's stream, shared by every viewer of the run on this node.
//!
//! It subscribes from the oldest cached container of the stream, then reads
//! from the run log store how many lines and which last token the store
//! holds: containers at or below that token are already in the store, the
//! others are new lines at the offsets that follow. So its cursor (a line
//! offset) always agrees with the store's. It keeps the newest chunks (up
//! to `max_replay_bytes`) for viewers who join or resume; older lines come
//! from the store. New lines are pushed to viewers as the subscription
//! delivers them; a timer only checks the end conditions.
//!
//! A tailer and its unsubscribe are tasks of the edge's [`Tasks`]. When
//! the edge stops, a tailer ends at once (its viewers' streams end, without
//! a terminal frame) and gives its subscription back; only a subscribe
//! under way is let finish first (it is bounded by the attach timeout, and
//! cutting it would leave the subscription behind).
//!
//! Its state sits behind a mutex that is never held across an `.await`:
//! attaching a viewer (replay, then live) and publishing a chunk are each
//! one critical section, so a viewer never misses a chunk between its
//! replay and the live feed, and never sees one twice.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Weak};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use parking_lot::{Mutex, MutexGuard};
use tokio::sync::watch;
use tokio::time::Instant;

use super::frames::{self, EndReason};
use super::incident;
use super::viewer::Viewer;
use crate::archive::{RunKey, RunLogStore, lines_of};
use crate::config::{LogStreamSettings, secs};
use crate::node::{Node, SubscribeError, SubscriptionHandle};
use crate::pubsub::{ConsumerError, Delivery, DeliveryOutcome, StartPosition, StreamConsumer};
use crate::stream::{BatchContainer, SequenceToken};
use crate::tasks::Tasks;
use crate::telemetry;

/// Store lookups a starting tailer retries before it gives up.
const STORE_ATTEMPTS: u32 = 5;
/// The first retry's wait (then twice, three times… as long).
const STORE_RETRY: Duration = Duration::from_millis(100);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Phase {
    Starting,
    Live,
    Ended,
}

/// Where a viewer asks to start.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum StartAt {
    /// A line offset.
    Offset(u64),
    /// A cursor this server cannot place (garbage, another server's).
    Unplaceable,
}

/// Why a viewer could not attach yet.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum NotAttached {
    /// Still subscribing.
    Starting,
    /// The tailer ended.
    Ended,
    /// Lines `[from, until)` must come from the store first.
    Behind { until: u64 },
}

struct Chunk {
    start: u64,
    lines: Vec<String>,
    bytes: usize,
}

impl Chunk {
    fn end(&self) -> u64 {
        self.start + self.lines.len() as u64
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Known {
    Running,
    Finished,
    Unknown,
}

struct State {
    phase: Phase,
    cursor: u64,
    base_token: Option<SequenceToken>,
    last_token: Option<SequenceToken>,
    replay: VecDeque<Chunk>,
    replay_bytes: usize,
    viewers: Vec<Arc<Viewer>>,
    /// Sessions that acquired the tailer and have not attached yet.
    joining: usize,
    started_at: Instant,
    last_content_at: Instant,
    last_probe_at: Option<Instant>,
    known: Known,
    streamed_bytes: u64,
    bytes_since_tick: u64,
    subscription: Option<SubscriptionHandle>,
    /// The `error` the tailer ended with, for sessions still joining.
    failure: Option<Bytes>,
}

/// The node's tailers, bounded by `max_active_runs`.
pub(crate) struct Runs {
    node: Arc<Node>,
    store: Arc<dyn RunLogStore>,
    settings: Arc<LogStreamSettings>,
    tailers: Mutex<HashMap<RunKey, Arc<Tailer>>>,
    /// The edge's tasks: tailers and their unsubscribes run there.
    tasks: Tasks,
}

/// See the module documentation.
pub(crate) struct Tailer {
    key: RunKey,
    runs: Weak<Runs>,
    settings: Arc<LogStreamSettings>,
    state: Mutex<State>,
    phase: watch::Sender<Phase>,
}

impl Runs {
    pub(crate) fn new(
        node: Arc<Node>,
        store: Arc<dyn RunLogStore>,
        settings: Arc<LogStreamSettings>,
        tasks: Tasks,
    ) -> Arc<Self> {
        Arc::new(Self { node, store, settings, tailers: Mutex::new(HashMap::new()), tasks })
    }

    /// Runs tailed now.
    pub(crate) fn len(&self) -> usize {
        self.tailers.lock().len()
    }

    /// The run's tailer, created (and started) if there is none and the
    /// node is under `max_active_runs`; the caller is counted as joining.
    /// None is started once the edge stops.
    pub(crate) fn acquire(self: &Arc<Self>, key: &RunKey) -> Option<Arc<Tailer>> {
        if self.tasks.token().is_cancelled() {
            return None;
        }
        let mut tailers = self.tailers.lock();
        if let Some(tailer) = tailers.get(key)
            && tailer.join()
        {
            return Some(tailer.clone());
        }
        tailers.retain(|_, t| t.phase() != Phase::Ended);
        if tailers.len() >= self.settings.max_active_runs {
            return None;
        }
        let tailer = Tailer::new(key.clone(), Arc::downgrade(self), self.settings.clone());
        tailer.join();
        tailers.insert(key.clone(), tailer.clone());
        metrics::gauge!(telemetry::EDGE_RUNS).set(tailers.len() as f64);
        drop(tailers);
        let span = tracing::info_span!("tailer", node = %self.node.id(), run = %key);
        self.tasks.spawn("tailer", tracing::Instrument::instrument(start(self.clone(), tailer.clone()), span));
        Some(tailer)
    }

    fn release(&self, tailer: &Arc<Tailer>) {
        let mut tailers = self.tailers.lock();
        if tailers.get(&tailer.key).is_some_and(|t| Arc::ptr_eq(t, tailer)) {
            tailers.remove(&tailer.key);
        }
        metrics::gauge!(telemetry::EDGE_RUNS).set(tailers.len() as f64);
    }
}

/// Subscribes, learns the store's position, goes live, runs the timer;
/// ends early when the edge stops.
async fn start(runs: Arc<Runs>, tailer: Arc<Tailer>) {
    let stop = runs.tasks.token().clone();
    let consumer = Arc::new(TailerConsumer { tailer: Arc::downgrade(&tailer) });
    let handle = match runs.node.subscribe(&tailer.key.stream(), consumer, StartPosition::EarliestAvailable).await {
        Ok(handle) => handle,
        // Not attached in time says what to check; any other failure may
        // carry backend errors: the viewer gets an incident id instead.
        Err(error @ SubscribeError::NotAttached { .. }) => {
            return tailer.fail(&format!("cannot follow run {}: {error}", tailer.key));
        }
        Err(error) => return tailer.fail(&incident::report(&format!("cannot follow run {}", tailer.key), &error)),
    };
    // A store hiccup is retried; only a store that stays down ends the
    // stream (with its error).
    let mut attempt = 0;
    let info = loop {
        match runs.store.info(&tailer.key).await {
            Ok(info) => break info.unwrap_or_default(),
            Err(error) if attempt < STORE_ATTEMPTS => {
                attempt += 1;
                tracing::debug!(run = %tailer.key, %error, attempt, "store lookup failed; retrying");
                tokio::select! {
                    _ = tokio::time::sleep(STORE_RETRY * attempt) => {}
                    _ = stop.cancelled() => {
                        tailer.keep_subscription(handle);
                        return tailer.stop();
                    }
                }
            }
            Err(error) => {
                tailer.keep_subscription(handle);
                return tailer.fail(&incident::report("the run log store failed", &error));
            }
        }
    };
    if !tailer.go_live(handle, info.lines, info.last_token) {
        return;
    }
    tracing::debug!(run = %tailer.key, lines = info.lines, "tailer live");
    let every = secs(runs.settings.poll_seconds).max(Duration::from_millis(1));
    loop {
        tokio::select! {
            _ = tokio::time::sleep(every) => {}
            _ = stop.cancelled() => return tailer.stop(),
        }
        if tailer.phase() == Phase::Ended {
            return;
        }
        if tailer.probe_due() {
            // A failed lookup counts as running: it never ends a stream.
            let finished = match runs.store.info(&tailer.key).await {
                Ok(info) => info.and_then(|i| i.state).map(|s| s.is_finished()),
                Err(_) => Some(false),
            };
            tailer.probed(finished);
        }
        if let Some(reason) = tailer.end_reason() {
            tailer.complete(reason);
            return;
        }
    }
}

impl Tailer {
    fn new(key: RunKey, runs: Weak<Runs>, settings: Arc<LogStreamSettings>) -> Arc<Self> {
        let now = Instant::now();
        let state = State {
            phase: Phase::Starting,
            cursor: 0,
            base_token: None,
            last_token: None,
            replay: VecDeque::new(),
            replay_bytes: 0,
            viewers: Vec::new(),
            joining: 0,
            started_at: now,
            last_content_at: now,
            last_probe_at: None,
            known: Known::Running,
            streamed_bytes: 0,
            bytes_since_tick: 0,
            subscription: None,
            failure: None,
        };
        Arc::new(Self { key, runs, settings, state: Mutex::new(state), phase: watch::channel(Phase::Starting).0 })
    }

    pub(crate) fn phase(&self) -> Phase {
        *self.phase.borrow()
    }

    /// Waits until the tailer is live or ended.
    pub(crate) async fn started(&self) -> Phase {
        let mut phase = self.phase.subscribe();
        match phase.wait_for(|p| *p != Phase::Starting).await {
            Ok(p) => *p,
            Err(_) => Phase::Ended,
        }
    }

    /// The `error` frame if the tailer failed.
    pub(crate) fn failure(&self) -> Option<Bytes> {
        self.state.lock().failure.clone()
    }

    fn join(&self) -> bool {
        let mut state = self.state.lock();
        if state.phase == Phase::Ended {
            return false;
        }
        state.joining += 1;
        true
    }

    fn go_live(self: &Arc<Self>, handle: SubscriptionHandle, lines: u64, token: Option<SequenceToken>) -> bool {
        let mut state = self.state.lock();
        state.subscription = Some(handle);
        if state.phase == Phase::Ended {
            drop(state);
            self.release();
            return false;
        }
        state.phase = Phase::Live;
        state.cursor = lines;
        state.base_token = token;
        drop(state);
        self.phase.send_replace(Phase::Live);
        true
    }

    fn keep_subscription(&self, handle: SubscriptionHandle) {
        self.state.lock().subscription = Some(handle);
    }

    /// Attaches `viewer` at `from`: the chunks it missed that the tailer
    /// still holds are queued as replay, then it is live.
    pub(crate) fn attach(&self, viewer: &Arc<Viewer>, from: StartAt) -> Result<(), NotAttached> {
        let mut state = self.state.lock();
        match state.phase {
            Phase::Starting => return Err(NotAttached::Starting),
            Phase::Ended => return Err(NotAttached::Ended),
            Phase::Live => {}
        }
        let run = self.key.run();
        let front = state.replay.front().map_or(state.cursor, |c| c.start);
        match from {
            StartAt::Offset(at) if at == state.cursor => {}
            StartAt::Offset(at) if at >= front && at < state.cursor => {
                for chunk in state.replay.iter().filter(|c| c.end() > at) {
                    let skip = at.saturating_sub(chunk.start) as usize;
                    viewer.push(frames::logs(run, &chunk.lines[skip..].join("\n"), chunk.end(), true));
                }
            }
            StartAt::Offset(at) if at < front => return Err(NotAttached::Behind { until: front }),
            _ => {
                viewer.push(frames::truncated(run));
                for chunk in &state.replay {
                    viewer.push(frames::logs(run, &chunk.lines.join("\n"), chunk.end(), true));
                }
            }
        }
        state.joining = state.joining.saturating_sub(1);
        state.viewers.push(viewer.clone());
        Ok(())
    }

    /// A session leaves (its connection closed), attached or not. The last
    /// one out stops the tailer.
    pub(crate) fn leave(self: &Arc<Self>, viewer: Option<u64>, attached: bool) {
        let mut state = self.state.lock();
        match (attached, viewer) {
            (true, Some(id)) => state.viewers.retain(|v| v.id() != id),
            _ => state.joining = state.joining.saturating_sub(1),
        }
        if state.viewers.is_empty() && state.joining == 0 && state.phase != Phase::Ended {
            self.end(state, None);
        }
    }

    /// New containers from the subscription: each becomes a chunk at the
    /// next offsets, broadcast to every viewer.
    fn publish(self: &Arc<Self>, batches: &[Arc<BatchContainer>]) -> Result<(), ConsumerError> {
        let mut state = self.state.lock();
        if state.phase == Phase::Ended {
            return Err(ConsumerError::Unavailable(format!("the tailer of {} ended", self.key)));
        }
        for batch in batches {
            let stale = |t: Option<SequenceToken>| t.is_some_and(|t| t >= batch.token);
            if stale(state.base_token) || stale(state.last_token) {
                continue;
            }
            state.last_token = Some(batch.token);
            let texts: Vec<_> = batch.events.iter().map(|e| String::from_utf8_lossy(&e.payload)).collect();
            let lines: Vec<String> = texts.iter().flat_map(|t| lines_of(t)).map(str::to_string).collect();
            let content = lines.join("\n");
            let chunk = Chunk { start: state.cursor, bytes: content.len(), lines };
            state.cursor = chunk.end();
            let frame = frames::logs(self.key.run(), &content, state.cursor, false);
            state.viewers.retain(|viewer| {
                let kept = viewer.push(frame.clone());
                if !kept {
                    viewer.close();
                    metrics::counter!(telemetry::EDGE_VIEWERS_DROPPED).increment(1);
                }
                kept
            });
            metrics::counter!(telemetry::EDGE_FRAMES).increment(state.viewers.len() as u64);
            state.streamed_bytes += chunk.bytes as u64;
            state.bytes_since_tick += chunk.bytes as u64;
            state.last_content_at = Instant::now();
            state.replay_bytes += chunk.bytes;
            state.replay.push_back(chunk);
            // Always keep the newest chunk, however large.
            while state.replay_bytes > self.settings.max_replay_bytes && state.replay.len() > 1 {
                let old = state.replay.pop_front().map_or(0, |c| c.bytes);
                state.replay_bytes -= old;
            }
        }
        if state.viewers.is_empty() && state.joining == 0 {
            self.end(state, None);
        } else if state.streamed_bytes >= self.settings.max_stream_bytes {
            self.end(state, Some(Ending::Complete(EndReason::MaxBytes)));
        }
        Ok(())
    }

    fn probe_due(&self) -> bool {
        let state = self.state.lock();
        state.known != Known::Finished
            && state.bytes_since_tick == 0
            && state.last_probe_at.is_none_or(|at| at.elapsed() >= secs(self.settings.run_probe_seconds))
    }

    /// The status lookup's result: finished or not, `None` without status.
    fn probed(&self, finished: Option<bool>) {
        let mut state = self.state.lock();
        state.last_probe_at = Some(Instant::now());
        state.known = match finished {
            Some(true) => Known::Finished,
            Some(false) => Known::Running,
            None => Known::Unknown,
        };
    }

    /// The first end condition that holds, OpenMetadata's order.
    fn end_reason(&self) -> Option<EndReason> {
        let mut state = self.state.lock();
        let quiet_tick = std::mem::take(&mut state.bytes_since_tick) == 0;
        let settings = &self.settings;
        let quiet_for = state.last_content_at.elapsed();
        if state.streamed_bytes >= settings.max_stream_bytes {
            Some(EndReason::MaxBytes)
        } else if state.started_at.elapsed() >= secs(settings.max_stream_seconds) {
            Some(EndReason::MaxDuration)
        } else if quiet_for >= secs(settings.max_idle_seconds) {
            Some(EndReason::IdleTimeout)
        } else if quiet_tick
            && match state.known {
                Known::Running => false,
                Known::Finished => quiet_for >= secs(settings.finish_grace_seconds),
                Known::Unknown => quiet_for >= secs(settings.unknown_run_grace_seconds),
            }
        {
            Some(EndReason::RunFinished)
        } else {
            None
        }
    }

    fn complete(self: &Arc<Self>, reason: EndReason) {
        let state = self.state.lock();
        self.end(state, Some(Ending::Complete(reason)));
    }

    /// The edge stops: every viewer's stream ends (it reconnects with its
    /// cursor), and the subscription is given back.
    fn stop(self: &Arc<Self>) {
        let state = self.state.lock();
        self.end(state, None);
    }

    /// A persistent failure: every viewer gets an `error` and is closed.
    fn fail(self: &Arc<Self>, message: &str) {
        tracing::warn!(run = %self.key, %message, "tailer failed");
        let state = self.state.lock();
        self.end(state, Some(Ending::Error(message.to_string())));
    }

    /// Ends the tailer: the terminal frame (if any) to every viewer, then
    /// the run slot and the subscription are released.
    fn end(self: &Arc<Self>, mut state: MutexGuard<'_, State>, ending: Option<Ending>) {
        if state.phase == Phase::Ended {
            return;
        }
        state.phase = Phase::Ended;
        let frame: Option<Bytes> = match &ending {
            Some(Ending::Complete(reason)) => Some(frames::complete(self.key.run(), Some(state.cursor), *reason)),
            Some(Ending::Error(message)) => Some(frames::error(self.key.run(), message)),
            None => None,
        };
        for viewer in state.viewers.drain(..) {
            viewer.finish(frame.clone());
        }
        if let Some(Ending::Error(_)) = &ending {
            state.failure = frame;
        }
        state.replay.clear();
        state.replay_bytes = 0;
        drop(state);
        self.phase.send_replace(Phase::Ended);
        if let Some(reason) = &ending {
            tracing::debug!(run = %self.key, ?reason, "tailer ended");
        }
        self.release();
    }

    /// Frees the run slot and ends the subscription (if it was made).
    fn release(self: &Arc<Self>) {
        let Some(runs) = self.runs.upgrade() else { return };
        runs.release(self);
        if let Some(handle) = self.state.lock().subscription.take() {
            let tasks = runs.tasks.clone();
            tasks.spawn("tailer unsubscribe", async move {
                if let Err(error) = runs.node.unsubscribe(&handle).await {
                    tracing::warn!(%error, "could not end a tailer's subscription");
                }
            });
        }
    }
}

#[derive(Debug)]
enum Ending {
    Complete(EndReason),
    Error(String),
}

/// The tailer as the run stream's subscriber.
struct TailerConsumer {
    tailer: Weak<Tailer>,
}

#[async_trait]
impl StreamConsumer for TailerConsumer {
    async fn deliver(&self, delivery: &Delivery) -> Result<DeliveryOutcome, ConsumerError> {
        let gone = || ConsumerError::Unavailable("the tailer ended".into());
        let tailer = self.tailer.upgrade().ok_or_else(gone)?;
        // Until the store's position is known, deliveries wait (this
        // subscription only).
        if tailer.started().await == Phase::Ended {
            return Err(gone());
        }
        tailer.publish(&delivery.batches)?;
        Ok(DeliveryOutcome::Continue)
    }
}
