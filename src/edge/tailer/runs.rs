//! The node's table of tailers, one per watched run: admission under
//! `max_active_runs` (a lingering tailer gives its slot up to a new run),
//! and the task each tailer runs from its subscribe to its end.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use backon::Retryable;
use parking_lot::Mutex;

use super::consumer::TailerConsumer;
use super::lifecycle::Probed;
use super::{Phase, Tailer};
use crate::archive::{RunInfo, RunKey, RunLogReader};
use crate::config::{LogStreamSettings, secs};
use crate::edge::incident;
use crate::node::{Node, SubscribeError};
use crate::pubsub::StartPosition;
use crate::retry::Backoff;
use crate::tasks::Tasks;
use crate::telemetry;

/// Store lookups a starting tailer retries before it gives up.
const STORE_RETRIES: u32 = 5;
/// Waits between those retries.
const STORE_RETRY: Backoff =
    Backoff::new(Duration::from_millis(100), Duration::from_secs(2), Duration::from_millis(100));
/// The node's tailers, bounded by `max_active_runs`.
pub(crate) struct Runs {
    pub(super) node: Arc<Node>,
    pub(super) store: RunLogReader,
    settings: Arc<LogStreamSettings>,
    tailers: Mutex<HashMap<RunKey, Arc<Tailer>>>,
    /// The edge's tasks: tailers and their unsubscribes run there.
    pub(super) tasks: Tasks,
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
                idle.unwatched();
            }
        }
        if tailers.len() >= self.settings.max_active_runs {
            return None;
        }
        let tailer = Tailer::new(key.clone(), self.settings.clone());
        tailer.join();
        tailers.insert(key.clone(), tailer.clone());
        metrics::gauge!(telemetry::EDGE_RUNS).set(tailers.len() as f64);
        drop(tailers);
        let span = tracing::info_span!("tailer", node = %self.node.id(), run = %key);
        self.tasks.spawn("tailer", tracing::Instrument::instrument(run(self.clone(), tailer.clone()), span));
        Some(tailer)
    }

    /// Frees an ended tailer's slot (if it still holds it).
    fn release(&self, tailer: &Arc<Tailer>) {
        let mut tailers = self.tailers.lock();
        if tailers.get(&tailer.key).is_some_and(|t| Arc::ptr_eq(t, tailer)) {
            tailers.remove(&tailer.key);
        }
        metrics::gauge!(telemetry::EDGE_RUNS).set(tailers.len() as f64);
    }
}

/// A tailer's whole life: it follows the run until it ends, then its slot
/// is freed and its subscription ended, here and only here.
async fn run(runs: Arc<Runs>, tailer: Arc<Tailer>) {
    follow(&runs, &tailer).await;
    tailer.ended().await;
    runs.release(&tailer);
    if let Some(handle) = tailer.take_subscription()
        && let Err(error) = runs.node.unsubscribe(&handle).await
    {
        tracing::warn!(%error, "could not end a tailer's subscription");
    }
}

/// Subscribes, learns the store's position, goes live, runs the timer;
/// ends early when the edge stops. Returns once the tailer ended (or, after
/// a subscribe the edge's stop overtook, is ending).
async fn follow(runs: &Runs, tailer: &Arc<Tailer>) {
    let stop = runs.tasks.token().clone();
    let consumer = Arc::new(TailerConsumer { tailer: Arc::downgrade(tailer), store: runs.store.clone() });
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
    let lookup = (|| runs.store.info_and_recent(&tailer.key))
        .retry(STORE_RETRY.schedule(STORE_RETRIES))
        .notify(|error, wait| tracing::debug!(run = %tailer.key, %error, ?wait, "store lookup failed; retrying"));
    let info = tokio::select! {
        info = lookup => info,
        _ = stop.cancelled() => {
            tailer.keep_subscription(handle);
            return tailer.stop();
        }
    };
    let (info, recent) = match info {
        Ok(info) => info.unwrap_or_default(),
        Err(error) => {
            tailer.keep_subscription(handle);
            return tailer.fail(&incident::report("the run log store failed", &error));
        }
    };
    if !tailer.go_live(handle, info.lines, info.last_token, recent) {
        return;
    }
    tracing::debug!(run = %tailer.key, lines = info.lines, "tailer live");
    // A run that finished long ago ends as soon as its viewers attached
    // (each then reads its lines, and `complete` after them), without
    // waiting for the timer.
    tailer.probed(probed(&info), false);
    let every = secs(runs.settings.poll_seconds).max(Duration::from_millis(1));
    loop {
        tokio::select! {
            _ = tokio::time::sleep(every) => {}
            _ = tailer.attached.notified(), if tailer.is_finished() => {
                match tailer.end_reason() {
                    Some(reason) => return tailer.complete(reason),
                    None => continue,
                }
            }
            _ = tailer.ended() => return,
            _ = stop.cancelled() => return tailer.stop(),
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
                Ok(info) => info.as_ref().and_then(probed),
                Err(_) => Some(Probed { finished: false, lines: 0, active_ms: 0 }),
            };
            tailer.probed(finished, true);
        }
        if let Some(reason) = tailer.end_reason() {
            tailer.complete(reason);
            return;
        }
    }
}

/// What a lookup of `info` tells the tailer (`None`: no status yet).
fn probed(info: &RunInfo) -> Option<Probed> {
    Some(Probed { finished: info.state?.is_finished(), lines: info.lines, active_ms: info.last_activity_ms() })
}
