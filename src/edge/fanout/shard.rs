//! A shard: one task that writes the live frames of one run to its share
//! of the run's handed-over viewers. It owns their [`Slot`]s: those at
//! the head wait for the tailer's next change, in one list; those whose
//! socket took less than they lacked wait, each, until it is writable.
//! Each waiting viewer's socket holds the shard's one "readable" waker, so
//! a client that leaves wakes the shard, which then looks at its sockets'
//! readiness (no system call unless one says readable) and drops it.
//! Once a second (or twice per heartbeat period) it sends heartbeats due.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll, Waker};

use futures::StreamExt;
use futures::stream::FuturesUnordered;
use futures::task::{ArcWake, AtomicWaker};
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::Slot;
use super::slot::Served;
use crate::config::secs;
use crate::edge::LogEdge;
use crate::edge::tailer::{Phase, Tailer};
use crate::telemetry;

/// Viewers served between two yields to the runtime: a pass over
/// thousands of viewers must not hold a worker from the other tasks
/// (ingest, the tailer) for its whole length.
const YIELD_EVERY: usize = 256;
/// Longest time between two looks for heartbeats due and cut viewers.
const CLOSE_CHECK: Duration = Duration::from_secs(1);
/// Shortest period of that look.
const MIN_CHECK: Duration = Duration::from_millis(10);

/// A blocked viewer: resolves with its slot once its socket is writable,
/// or with `None` once it is cut (stalled, or the tailer cut it).
type Parked = Pin<Box<dyn Future<Output = Option<Slot>> + Send>>;

/// See the module documentation.
pub(super) struct Shard {
    edge: Arc<LogEdge>,
    tailer: Arc<Tailer>,
    incoming: mpsc::UnboundedReceiver<Slot>,
    /// Viewers with everything, waiting for the next change.
    waiting: Vec<Slot>,
    blocked: FuturesUnordered<Parked>,
    heartbeat: Duration,
    stall: Duration,
    /// Woken when a waiting viewer's socket turns readable (its client
    /// left), and the waker each of their sockets holds.
    readable: Arc<Readable>,
    readable_waker: Waker,
}

/// See [`Shard::readable`].
#[derive(Default)]
struct Readable {
    fired: AtomicBool,
    task: AtomicWaker,
}

impl ArcWake for Readable {
    fn wake_by_ref(readable: &Arc<Self>) {
        readable.fired.store(true, Ordering::Release);
        readable.task.wake();
    }
}

impl Readable {
    /// Resolves once a socket turned readable since the last time.
    fn fired(&self) -> impl Future<Output = ()> + '_ {
        std::future::poll_fn(|context| {
            self.task.register(context.waker());
            if self.fired.swap(false, Ordering::AcqRel) { Poll::Ready(()) } else { Poll::Pending }
        })
    }
}

impl Shard {
    pub(super) fn new(edge: Arc<LogEdge>, tailer: Arc<Tailer>, incoming: mpsc::UnboundedReceiver<Slot>) -> Self {
        let heartbeat = secs(edge.settings.heartbeat_seconds);
        let stall = secs(edge.settings.stall_timeout_seconds);
        let readable = Arc::new(Readable::default());
        let readable_waker = futures::task::waker(readable.clone());
        let blocked = FuturesUnordered::new();
        Self { edge, tailer, incoming, waiting: Vec::new(), blocked, heartbeat, stall, readable, readable_waker }
    }

    /// Serves its viewers until the tailer ended and every one of them got
    /// its end, or the edge stops (their connections close). Outside the
    /// runtime's cooperative budget: a look at ten thousand sockets'
    /// readiness must not be cut short by it (the shard yields itself).
    pub(super) async fn run(self) {
        tokio::task::unconstrained(self.serve()).await;
    }

    async fn serve(mut self) {
        let stop = self.edge.tasks.token().clone();
        let mut changes = self.tailer.changed();
        let period = (self.heartbeat / 2).clamp(MIN_CHECK, CLOSE_CHECK);
        let mut check = tokio::time::interval_at(Instant::now() + period, period);
        check.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut readmitted = 0usize;
        tracing::debug!("fan-out shard started");
        loop {
            tokio::select! {
                biased;
                () = stop.cancelled() => break,
                Some(slot) = self.incoming.recv() => self.admit(slot),
                () = self.readable.fired() => self.drop_left().await,
                changed = changes.changed() => {
                    if changed.is_err() {
                        break;
                    }
                    self.pass().await;
                }
                Some(back) = self.blocked.next(), if !self.blocked.is_empty() => {
                    if let Some(slot) = back {
                        self.admit(slot);
                    }
                    // A viewer that is catching up is writable again at
                    // once: the loop would not wait, so it yields now and
                    // then, for the passes and the worker's other tasks.
                    readmitted += 1;
                    if readmitted.is_multiple_of(YIELD_EVERY) {
                        tokio::task::yield_now().await;
                    }
                }
                _ = check.tick() => self.check().await,
            }
            if self.tailer.phase() == Phase::Ended && self.waiting.is_empty() && self.blocked.is_empty() {
                // Viewers handed over from now on go to a new shard; those
                // already sent are served before this one ends.
                self.incoming.close();
                while let Ok(slot) = self.incoming.try_recv() {
                    self.admit(slot);
                }
                if self.waiting.is_empty() && self.blocked.is_empty() {
                    break;
                }
            }
        }
        tracing::debug!(viewers = self.waiting.len() + self.blocked.len(), "fan-out shard ended");
    }

    /// One pass over the waiting viewers after a change: each gets what it
    /// lacks (every chunk that came since its last write, in one write).
    async fn pass(&mut self) {
        let snapshot = self.tailer.snapshot();
        let now = Instant::now();
        let slots = std::mem::take(&mut self.waiting);
        self.waiting.reserve(slots.len());
        for (index, slot) in slots.into_iter().enumerate() {
            if index % YIELD_EVERY == YIELD_EVERY - 1 {
                tokio::task::yield_now().await;
            }
            self.place(slot.serve(&snapshot, now));
        }
    }

    /// A viewer handed over, or back from waiting for its socket: its socket
    /// gets the readable waker (a wake while it was away was not its), then
    /// it is served.
    fn admit(&mut self, mut slot: Slot) {
        let waker = self.readable_waker.clone();
        if slot.client_left(&mut Context::from_waker(&waker)) {
            return;
        }
        let snapshot = self.tailer.snapshot();
        self.place(slot.serve(&snapshot, Instant::now()));
    }

    /// Drops the waiting viewers whose clients left.
    async fn drop_left(&mut self) {
        let waker = self.readable_waker.clone();
        let slots = std::mem::take(&mut self.waiting);
        for (index, mut slot) in slots.into_iter().enumerate() {
            if index % YIELD_EVERY == YIELD_EVERY - 1 {
                tokio::task::yield_now().await;
            }
            if !slot.client_left(&mut Context::from_waker(&waker)) {
                self.waiting.push(slot);
            }
        }
    }

    /// Drops the waiting viewers whose clients left or that were cut, and
    /// sends heartbeats due.
    async fn check(&mut self) {
        let waker = self.readable_waker.clone();
        let snapshot = self.tailer.snapshot();
        let now = Instant::now();
        let slots = std::mem::take(&mut self.waiting);
        for (index, mut slot) in slots.into_iter().enumerate() {
            if index % YIELD_EVERY == YIELD_EVERY - 1 {
                tokio::task::yield_now().await;
            }
            if slot.member().viewer().is_cut() || slot.client_left(&mut Context::from_waker(&waker)) {
                continue;
            }
            if now >= slot.last_sent + self.heartbeat {
                slot.owe_heartbeat();
                self.place(slot.serve(&snapshot, now));
            } else {
                self.waiting.push(slot);
            }
        }
    }

    fn place(&mut self, served: Served) {
        match served {
            Served::Waiting(slot) => self.waiting.push(slot),
            Served::Blocked(slot) => self.blocked.push(park(slot, self.stall)),
            Served::Behind(slot, until) => super::catch_up(&self.edge, slot, until),
            Served::Closed => {}
        }
    }
}

/// Waits until `slot`'s socket is writable; `None` if it is cut first, or
/// if its socket takes nothing for `stall` (the stall rule, applied here
/// too so that it holds after its tailer ended).
fn park(slot: Slot, stall: Duration) -> Parked {
    Box::pin(async move {
        let viewer = slot.member().viewer().clone();
        let stalled_at = slot.last_sent + stall;
        tokio::select! {
            writable = slot.socket().tcp().writable() => writable.ok().map(|()| slot),
            () = viewer.connection().cancelled() => None,
            () = tokio::time::sleep_until(stalled_at) => {
                tracing::debug!(viewer = viewer.id(), "viewer stalled; cutting it");
                viewer.cut();
                metrics::counter!(telemetry::EDGE_VIEWERS_DROPPED).increment(1);
                None
            }
        }
    })
}
