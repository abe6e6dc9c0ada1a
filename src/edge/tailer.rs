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
//! What a viewer at the head needs (the newest chunks' frames, the head,
//! the end) is also published, after every change, as a snapshot that
//! viewers read without that lock: ten thousand viewers of a run each read
//! at every new chunk, and would otherwise queue on one mutex. A viewer
//! further behind, or mid-chunk, or replaying, takes the lock. A viewer's
//! place is its own offset, so it can neither miss a chunk between its
//! catch-up and the live feed nor see one twice.
//!
//! The parts: `runs.rs` is the node's table of tailers (admission under
//! `max_active_runs`) and the task each tailer runs; `lifecycle.rs` is one
//! tailer's state machine (live, the timer's checks, the end);
//! `consumer.rs` is the tailer as the stream's subscriber. Ownership goes
//! one way: the table holds its tailers and runs each one's task, which
//! alone frees the tailer's slot and ends its subscription once it ended;
//! a tailer knows nothing of the table.

mod consumer;
mod lifecycle;
mod runs;
#[cfg(test)]
mod tests;

use std::sync::Arc;

use arc_swap::ArcSwap;
use bytes::Bytes;
use parking_lot::Mutex;
use tokio::sync::watch;
use tokio::time::Instant;

use super::fanout::Shards;
use super::frames::EndReason;
use super::viewer::Viewer;
use super::window::{LiveFrame, Read, Window};
use crate::archive::RunKey;
use crate::config::LogStreamSettings;
use crate::node::SubscriptionHandle;
use crate::stream::SequenceToken;

pub(crate) use runs::Runs;

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
    /// A cursor this server cannot read (garbage, another server's): the
    /// viewer restarts from the beginning of the log (OpenMetadata's rule),
    /// told that it must reset its view.
    Unreadable,
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

/// A tailer's state, by concern, under one mutex.
struct State {
    phase: Phase,
    /// What the store said of the run's status (probed by the timer).
    known: Known,
    subscription: Option<SubscriptionHandle>,
    feed: Feed,
    audience: Audience,
    clock: Clock,
    end: End,
}

/// The run's lines as the tailer has them.
struct Feed {
    /// The last token the store held when the tailer went live: containers
    /// at or below it are in the store already.
    base_token: Option<SequenceToken>,
    last_token: Option<SequenceToken>,
    /// Fingerprints of the run's last containers with lines (oldest first,
    /// at most `RECENT_BATCHES`), from the store's and then its own: a
    /// producer's retried batch is dropped, as the store drops it, so a
    /// viewer's offsets stay the store's.
    recent: std::collections::VecDeque<u64>,
    window: Window,
    streamed_bytes: u64,
    bytes_since_tick: u64,
}

/// Who watches.
struct Audience {
    viewers: Vec<Arc<Viewer>>,
    /// Sessions that acquired the tailer and have not attached yet.
    joining: usize,
    /// Since when nobody watches (the tailer lingers, then ends).
    empty_since: Option<Instant>,
}

/// When things last happened, for the timer's checks.
struct Clock {
    started_at: Instant,
    /// The last content, or the start.
    last_content_at: Instant,
    /// The last content this tailer received, if any.
    content_at: Option<Instant>,
    /// When the run was last active in the store (its last line or status
    /// change), as of the probe that found it finished.
    run_active_at: Option<Instant>,
    last_probe_at: Option<Instant>,
}

/// How it ended.
#[derive(Default)]
struct End {
    /// The frame viewers get once they have every line (set at the end).
    terminal: Option<Bytes>,
    /// Why the tailer completed, if it did (not stopped, not failed).
    completed: Option<EndReason>,
    /// The `error` the tailer ended with, for sessions still joining.
    failure: Option<Bytes>,
}

/// Chunks in the lock-free snapshot: a viewer woken by a new chunk is
/// usually one chunk behind, and at most this many when the node is busy.
pub(crate) const SNAPSHOT_CHUNKS: usize = 8;

/// What a viewer at the head needs, published at every change.
#[derive(Default)]
pub(crate) struct Snapshot {
    /// The newest chunks, oldest first.
    pub(crate) chunks: Vec<LiveFrame>,
    /// The offset after the newest line.
    pub(crate) head: u64,
    /// Once the tailer ended: the frame viewers get at the head.
    pub(crate) ended: Option<Option<Bytes>>,
}

/// See the module documentation.
pub(crate) struct Tailer {
    key: RunKey,
    settings: Arc<LogStreamSettings>,
    state: Mutex<State>,
    /// Written under `state`'s lock, read without it.
    snapshot: ArcSwap<Snapshot>,
    phase: watch::Sender<Phase>,
    /// Bumped at every new chunk and at the end.
    version: watch::Sender<u64>,
    /// The last session joining attached (a finished run may end then).
    attached: tokio::sync::Notify,
    /// The writers of its viewers handed over to the fan-out.
    pub(crate) fanout: Shards,
}

impl Tailer {
    fn new(key: RunKey, settings: Arc<LogStreamSettings>) -> Arc<Self> {
        let now = Instant::now();
        let state = State {
            phase: Phase::Starting,
            known: Known::Running,
            subscription: None,
            feed: Feed {
                base_token: None,
                last_token: None,
                recent: Default::default(),
                window: Window::new(key.run(), 0, settings.max_replay_bytes),
                streamed_bytes: 0,
                bytes_since_tick: 0,
            },
            audience: Audience { viewers: Vec::new(), joining: 0, empty_since: None },
            clock: Clock {
                started_at: now,
                last_content_at: now,
                content_at: None,
                run_active_at: None,
                last_probe_at: None,
            },
            end: End::default(),
        };
        Arc::new(Self {
            key,
            settings,
            state: Mutex::new(state),
            snapshot: ArcSwap::from_pointee(Snapshot::default()),
            phase: watch::channel(Phase::Starting).0,
            version: watch::channel(0).0,
            attached: tokio::sync::Notify::new(),
            fanout: Shards::default(),
        })
    }

    /// The run it tails.
    pub(crate) fn key(&self) -> &RunKey {
        &self.key
    }

    /// What a viewer at the head needs, read without the lock: the
    /// fan-out loads it once per pass over its viewers.
    pub(crate) fn snapshot(&self) -> Arc<Snapshot> {
        self.snapshot.load_full()
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
        self.state.lock().end.failure.clone()
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
            // From line 0: what the window no longer holds is read from the
            // store, so the viewer gets the whole log, never an empty one.
            StartAt::Unreadable => (0, true),
        };
        state.audience.joining = state.audience.joining.saturating_sub(1);
        state.audience.empty_since = None;
        viewer.progressed(at);
        state.audience.viewers.push(viewer.clone());
        let attached = Attached { at, truncated, replay_until: state.feed.window.head() };
        if state.audience.joining == 0 {
            drop(state);
            self.attached.notify_one();
        }
        Some(attached)
    }

    /// The next frame for a viewer that needs line `at` (see [`Pull`]):
    /// from the snapshot when it has it, else from the window.
    pub(crate) fn pull(&self, at: u64, replay_until: u64) -> Pull {
        let snapshot = self.snapshot.load();
        if at >= snapshot.head {
            if let Some(terminal) = &snapshot.ended {
                return Pull::End(terminal.clone());
            }
            // (Before the tailer went live the snapshot is empty.)
            if snapshot.head > 0 || !snapshot.chunks.is_empty() {
                return Pull::Wait;
            }
        }
        if at >= replay_until
            && let Some(chunk) = snapshot.chunks.iter().find(|c| c.start == at)
        {
            return Pull::Frame(chunk.frame.clone(), chunk.end);
        }
        drop(snapshot);
        self.pull_from_window(at, replay_until)
    }

    /// [`Tailer::pull`] from the window itself, under the lock.
    fn pull_from_window(&self, at: u64, replay_until: u64) -> Pull {
        let state = self.state.lock();
        match state.feed.window.read(at, replay_until) {
            Read::Frame(frame, next) => Pull::Frame(frame, next),
            Read::Behind { until } => Pull::Behind { until },
            Read::Head if state.phase == Phase::Ended => Pull::End(state.end.terminal.clone()),
            Read::Head => Pull::Wait,
        }
    }

    /// Publishes the snapshot of `state` (called with its lock held, after
    /// a change and before viewers are told of it).
    fn publish_snapshot(&self, state: &State) {
        let ended = (state.phase == Phase::Ended).then(|| state.end.terminal.clone());
        let window = &state.feed.window;
        let snapshot = Snapshot { chunks: window.newest(SNAPSHOT_CHUNKS), head: window.head(), ended };
        self.snapshot.store(Arc::new(snapshot));
    }

    /// Why the tailer completed, once it did.
    pub(crate) fn completed(&self) -> Option<EndReason> {
        self.state.lock().end.completed
    }

    /// The offset after the newest line.
    pub(crate) fn head(&self) -> u64 {
        self.state.lock().feed.window.head()
    }

    /// The oldest offset the window holds.
    pub(crate) fn front(&self) -> u64 {
        self.state.lock().feed.window.front()
    }

    /// A session leaves (its connection closed), attached or not. When
    /// nobody is left the tailer lingers `linger_seconds`, so a viewer
    /// that reconnects finds it, then ends.
    pub(crate) fn leave(self: &Arc<Self>, viewer: Option<u64>, attached: bool) {
        let mut state = self.state.lock();
        match (attached, viewer) {
            (true, Some(id)) => state.audience.viewers.retain(|v| v.id() != id),
            _ => state.audience.joining = state.audience.joining.saturating_sub(1),
        }
        if state.audience.viewers.is_empty() && state.audience.joining == 0 && state.phase != Phase::Ended {
            if self.settings.linger_seconds <= 0.0 {
                return self.end(state, None);
            }
            state.audience.empty_since = Some(Instant::now());
        }
    }
}

/// Where an attached viewer starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Attached {
    /// The line offset it needs first.
    pub(crate) at: u64,
    /// Its cursor could not be read: it gets the truncation notice, then
    /// the whole log from line 0.
    pub(crate) truncated: bool,
    /// Lines below this offset are replay for it.
    pub(crate) replay_until: u64,
}

#[derive(Debug)]
enum Ending {
    Complete(EndReason),
    Error(String),
}
