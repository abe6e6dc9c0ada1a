//! One **tailer** per watched run per node: an explicit subscriber of the
//! run's stream, shared by every viewer of the run on this node.
//!
//! It subscribes from the oldest cached container of the stream, then reads
//! from the run log store how many lines and which last token the store
//! holds: containers at or below that token are already in the store, the
//! others are new lines at the offsets that follow. So its offsets always
//! agree with the store's. It keeps the newest chunks in its [`Window`]
//! (up to `max_replay_bytes`), each rendered once as a frame every viewer
//! shares; viewers pull from it at their own cursors, and what fell out of
//! it they read from the store. A timer checks the end conditions, cuts
//! viewers whose sockets stalled, and ends a tailer nobody watched for
//! `linger_seconds`.
//!
//! A tailer and its unsubscribe are tasks of the edge's [`Tasks`]. When
//! the edge stops, a tailer ends at once (its viewers' streams end, without
//! a terminal frame) and gives its subscription back; only a subscribe
//! under way is let finish first (it is bounded by the attach timeout, and
//! cutting it would leave the subscription behind).
//!
//! Its state sits behind a mutex that is never held across an `.await`.
//! A viewer's place is its own offset, so it can neither miss a chunk
//! between its catch-up and the live feed nor see one twice.

use std::collections::HashMap;
use std::sync::{Arc, Weak};
use std::time::Duration;

use async_trait::async_trait;
use backon::Retryable;
use bytes::Bytes;
use parking_lot::{Mutex, MutexGuard};
use tokio::sync::watch;
use tokio::time::Instant;

use super::frames::{self, EndReason};
use super::incident;
use super::viewer::Viewer;
use super::window::{Read, Window};
use crate::archive::{Contents, RunKey, RunLogReader};
use crate::config::{LogStreamSettings, secs};
use crate::node::{Node, SubscribeError, SubscriptionHandle};
use crate::pubsub::{ConsumerError, Delivery, DeliveryOutcome, StartPosition, StreamConsumer};
use crate::retry::Backoff;
use crate::stream::{BatchContainer, SequenceToken};
use crate::tasks::Tasks;
use crate::telemetry;

/// Store lookups a starting tailer retries before it gives up.
const STORE_RETRIES: u32 = 5;
/// Waits between those retries.
const STORE_RETRY: Backoff =
    Backoff::new(Duration::from_millis(100), Duration::from_secs(2), Duration::from_millis(100));

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

/// What a viewer gets next.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Pull {
    /// A frame from the window, and the offset after it.
    Frame(Bytes, u64),
    /// Lines up to `until` fell out of the window: read them from the store.
    Behind { until: u64 },
    /// Nothing new yet: wait for [`Tailer::changed`].
    Wait,
    /// The tailer ended and the viewer has every line it published: the
    /// terminal frame (none when the edge stops), then the end.
    End(Option<Bytes>),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Known {
    Running,
    Finished,
    Unknown,
}

struct State {
    phase: Phase,
    base_token: Option<SequenceToken>,
    last_token: Option<SequenceToken>,
    window: Window,
    viewers: Vec<Arc<Viewer>>,
    /// Sessions that acquired the tailer and have not attached yet.
    joining: usize,
    /// Since when nobody watches (the tailer lingers, then ends).
    empty_since: Option<Instant>,
    started_at: Instant,
    last_content_at: Instant,
    last_probe_at: Option<Instant>,
    known: Known,
    streamed_bytes: u64,
    bytes_since_tick: u64,
    subscription: Option<SubscriptionHandle>,
    /// The frame viewers get once they have every line (set at the end).
    terminal: Option<Bytes>,
    /// Why the tailer completed, if it did (not stopped, not failed).
    completed: Option<EndReason>,
    /// The `error` the tailer ended with, for sessions still joining.
    failure: Option<Bytes>,
}

/// The node's tailers, bounded by `max_active_runs`.
pub(crate) struct Runs {
    node: Arc<Node>,
    store: RunLogReader,
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
    /// Bumped at every new chunk and at the end.
    version: watch::Sender<u64>,
}

impl Runs {
    pub(crate) fn new(
        node: Arc<Node>,
        store: RunLogReader,
        settings: Arc<LogStreamSettings>,
        tasks: Tasks,
    ) -> Arc<Self> {
        Arc::new(Self { node, store, settings, tailers: Mutex::new(HashMap::new()), tasks })
    }

    /// Runs tailed now (lingering ones included).
    pub(crate) fn len(&self) -> usize {
        self.tailers.lock().len()
    }

    /// The run's tailer, created (and started) if there is none and the
    /// node is under `max_active_runs` (a lingering tailer nobody watches
    /// gives its slot up first); the caller is counted as joining. None is
    /// started once the edge stops.
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
            let idle = tailers.values().filter(|t| t.is_lingering()).min_by_key(|t| t.empty_since()).cloned();
            if let Some(idle) = idle {
                tailers.remove(&idle.key);
                // Ending it releases its slot, which takes this lock.
                drop(tailers);
                idle.unwatched();
                tailers = self.tailers.lock();
            }
        }
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
    let lookup = (|| runs.store.info(&tailer.key))
        .retry(STORE_RETRY.schedule(STORE_RETRIES))
        .notify(|error, wait| tracing::debug!(run = %tailer.key, %error, ?wait, "store lookup failed; retrying"));
    let info = tokio::select! {
        info = lookup => info,
        _ = stop.cancelled() => {
            tailer.keep_subscription(handle);
            return tailer.stop();
        }
    };
    let info = match info {
        Ok(info) => info.unwrap_or_default(),
        Err(error) => {
            tailer.keep_subscription(handle);
            return tailer.fail(&incident::report("the run log store failed", &error));
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
        tailer.cut_stalled();
        if tailer.linger_over() {
            return tailer.unwatched();
        }
        if tailer.probe_due() {
            // A failed lookup counts as running: it never ends a stream.
            // A finished status counts once this tailer has every line the
            // store held with it (the archiver stores the status after them).
            let finished = match runs.store.info(&tailer.key).await {
                Ok(info) => info.and_then(|i| Some((i.state?.is_finished(), i.lines))),
                Err(_) => Some((false, 0)),
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
            base_token: None,
            last_token: None,
            window: Window::new(key.run(), 0, settings.max_replay_bytes),
            viewers: Vec::new(),
            joining: 0,
            empty_since: None,
            started_at: now,
            last_content_at: now,
            last_probe_at: None,
            known: Known::Running,
            streamed_bytes: 0,
            bytes_since_tick: 0,
            subscription: None,
            terminal: None,
            completed: None,
            failure: None,
        };
        Arc::new(Self {
            key,
            runs,
            settings,
            state: Mutex::new(state),
            phase: watch::channel(Phase::Starting).0,
            version: watch::channel(0).0,
        })
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

    /// Resolves at the tailer's next change (a chunk, or its end); take it
    /// before [`Tailer::pull`] so nothing is missed in between.
    pub(crate) fn changed(&self) -> watch::Receiver<u64> {
        self.version.subscribe()
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
        state.empty_since = None;
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
        state.window = Window::new(self.key.run(), lines, self.settings.max_replay_bytes);
        state.base_token = token;
        drop(state);
        self.phase.send_replace(Phase::Live);
        true
    }

    fn keep_subscription(&self, handle: SubscriptionHandle) {
        self.state.lock().subscription = Some(handle);
    }

    /// Attaches `viewer`, which asks to start at `from`. Returns where it
    /// starts, whether it must be told its cursor was not placeable
    /// (`truncated`), and the head at this moment (lines below it are
    /// replay for this viewer); `None` if the tailer is not live.
    pub(crate) fn attach(&self, viewer: &Arc<Viewer>, from: StartAt) -> Option<Attached> {
        let mut state = self.state.lock();
        if state.phase != Phase::Live {
            return None;
        }
        let (at, truncated) = match from {
            StartAt::Offset(at) => (at, false),
            StartAt::Unplaceable => (state.window.front(), true),
        };
        state.joining = state.joining.saturating_sub(1);
        state.empty_since = None;
        viewer.progressed(at);
        state.viewers.push(viewer.clone());
        Some(Attached { at, truncated, replay_until: state.window.head() })
    }

    /// The next frame for a viewer that needs line `at` (see [`Pull`]).
    pub(crate) fn pull(&self, at: u64, replay_until: u64) -> Pull {
        let state = self.state.lock();
        match state.window.read(at, replay_until) {
            Read::Frame(frame, next) => Pull::Frame(frame, next),
            Read::Behind { until } => Pull::Behind { until },
            Read::Head if state.phase == Phase::Ended => Pull::End(state.terminal.clone()),
            Read::Head => Pull::Wait,
        }
    }

    /// Why the tailer completed, once it did.
    pub(crate) fn completed(&self) -> Option<EndReason> {
        self.state.lock().completed
    }

    /// The offset after the newest line.
    pub(crate) fn head(&self) -> u64 {
        self.state.lock().window.head()
    }

    /// The oldest offset the window holds.
    pub(crate) fn front(&self) -> u64 {
        self.state.lock().window.front()
    }

    /// A session leaves (its connection closed), attached or not. When
    /// nobody is left the tailer lingers `linger_seconds`, so a viewer
    /// that reconnects finds it, then ends.
    pub(crate) fn leave(self: &Arc<Self>, viewer: Option<u64>, attached: bool) {
        let mut state = self.state.lock();
        match (attached, viewer) {
            (true, Some(id)) => state.viewers.retain(|v| v.id() != id),
            _ => state.joining = state.joining.saturating_sub(1),
        }
        if state.viewers.is_empty() && state.joining == 0 && state.phase != Phase::Ended {
            if self.settings.linger_seconds <= 0.0 {
                return self.end(state, None);
            }
            state.empty_since = Some(Instant::now());
        }
    }

    fn is_lingering(&self) -> bool {
        self.state.lock().empty_since.is_some()
    }

    fn empty_since(&self) -> Option<Instant> {
        self.state.lock().empty_since
    }

    fn linger_over(&self) -> bool {
        self.empty_since().is_some_and(|since| since.elapsed() >= secs(self.settings.linger_seconds))
    }

    /// Nobody watches any more: end without a terminal frame.
    fn unwatched(self: &Arc<Self>) {
        let state = self.state.lock();
        self.end(state, None);
    }

    /// Cuts every viewer whose socket took nothing for
    /// `stall_timeout_seconds` while it had lines to send.
    fn cut_stalled(&self) {
        let limit = secs(self.settings.stall_timeout_seconds);
        let mut state = self.state.lock();
        let head = state.window.head();
        state.viewers.retain(|viewer| {
            let stalled = viewer.cursor() < head && viewer.stalled_for() >= limit;
            if stalled {
                tracing::debug!(run = %self.key, viewer = viewer.id(), "viewer stalled; cutting it");
                viewer.cut();
                metrics::counter!(telemetry::EDGE_VIEWERS_DROPPED).increment(1);
            }
            !stalled
        });
    }

    /// New containers from the subscription: each becomes a chunk of the
    /// window at the next offsets; viewers pull it.
    fn publish(self: &Arc<Self>, batches: &[Arc<BatchContainer>]) -> Result<(), ConsumerError> {
        let mut state = self.state.lock();
        if state.phase == Phase::Ended {
            return Err(ConsumerError::Unavailable(format!("the tailer of {} ended", self.key)));
        }
        let mut published = false;
        for batch in batches {
            let stale = |t: Option<SequenceToken>| t.is_some_and(|t| t >= batch.token);
            if stale(state.base_token) || stale(state.last_token) {
                continue;
            }
            state.last_token = Some(batch.token);
            let contents = Contents::of(&batch.events);
            if let Some(status) = contents.status {
                // In order with the lines: every line before it was published.
                state.known = if status.is_finished() { Known::Finished } else { Known::Running };
                state.last_probe_at = Some(Instant::now());
            }
            if contents.texts.is_empty() {
                continue;
            }
            let bytes = state.window.push(contents.lines().map(str::to_string).collect()) as u64;
            metrics::counter!(telemetry::EDGE_FRAMES).increment(state.viewers.len() as u64);
            state.streamed_bytes += bytes;
            state.bytes_since_tick += bytes;
            state.last_content_at = Instant::now();
            published = true;
        }
        if state.streamed_bytes >= self.settings.max_stream_bytes {
            self.end(state, Some(Ending::Complete(EndReason::MaxBytes)));
        } else if published {
            drop(state);
            self.version.send_modify(|v| *v += 1);
        }
        Ok(())
    }

    fn probe_due(&self) -> bool {
        let state = self.state.lock();
        state.known != Known::Finished
            && state.bytes_since_tick == 0
            && state.last_probe_at.is_none_or(|at| at.elapsed() >= secs(self.settings.run_probe_seconds))
    }

    /// The status lookup's result: finished or not, with the lines the
    /// store held then; `None` without status.
    fn probed(&self, finished: Option<(bool, u64)>) {
        let mut state = self.state.lock();
        state.last_probe_at = Some(Instant::now());
        state.known = match finished {
            Some((true, lines)) if state.window.head() >= lines => Known::Finished,
            Some(_) => Known::Running,
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

    /// Ends the tailer: viewers get what they have not pulled yet of the
    /// window, then the terminal frame (if any); the run slot and the
    /// subscription are released at once.
    fn end(self: &Arc<Self>, mut state: MutexGuard<'_, State>, ending: Option<Ending>) {
        if state.phase == Phase::Ended {
            return;
        }
        state.phase = Phase::Ended;
        let head = state.window.head();
        state.completed = match &ending {
            Some(Ending::Complete(reason)) => Some(*reason),
            _ => None,
        };
        state.terminal = match &ending {
            Some(Ending::Complete(reason)) => Some(frames::complete(self.key.run(), Some(head), *reason)),
            Some(Ending::Error(message)) => Some(frames::error(self.key.run(), message)),
            None => None,
        };
        if let Some(Ending::Error(_)) = &ending {
            state.failure = state.terminal.clone();
        }
        state.viewers.clear();
        drop(state);
        self.phase.send_replace(Phase::Ended);
        self.version.send_modify(|v| *v += 1);
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

/// Where an attached viewer starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Attached {
    /// The line offset it needs first.
    pub(crate) at: u64,
    /// Its cursor could not be placed: it gets the truncation notice, then
    /// the window from its start.
    pub(crate) truncated: bool,
    /// Lines below this offset are replay for it.
    pub(crate) replay_until: u64,
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
