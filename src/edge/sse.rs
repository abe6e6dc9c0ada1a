//! `GET /api/v1/services/ingestionPipelines/logs/{fqn}/stream/{runId}?after=`:
//! one viewer's session.
//!
//! The response (200, `text/event-stream`) commits at once; everything
//! after is a frame. The session acquires the run's tailer (or gets
//! `TOO_MANY_RUNS`) and a connection slot (or `TOO_MANY_VIEWERS`), then
//! pulls frames at the pace its socket takes them: from the tailer's window
//! while its cursor is in it, from the run log store page by page when it
//! is behind the window (`replay: true` below the head at join; paced by
//! `max_reads_per_tick` and `max_bytes_per_tick`), and it waits (with
//! heartbeats) at the head. A cursor past what the stream or the store
//! reached yet waits up to `resume_wait_seconds`; one that cannot be read
//! (not a line offset) gets the truncation notice and the whole log from
//! line 0, as replay. Dropping the body (the
//! client left) frees both slots at once; a socket that takes nothing for
//! `stall_timeout_seconds` is cut by the tailer through the connection's
//! [`ConnectionCut`]. On the direct path (a plain socket or a TLS session)
//! a session stops at the head instead of waiting there, and the fan-out
//! (`fanout.rs`) writes its live frames from then on (`handover.rs`).

use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use axum::Extension;
use axum::body::Body;
use axum::extract::{Path, Query, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use serde::Deserialize;
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};

use super::LogEdge;
use super::frames;
use super::incident::store_unavailable;
use super::problem::{ApiError, problem};
use super::tailer::{Phase, Pull, StartAt, Tailer};
use super::viewer::{HEARTBEAT, Viewer};
use crate::archive::RunKey;
use crate::config::secs;

mod handover;

/// How often a session retries when the store has not caught up yet.
const STORE_LAG_WAIT: Duration = Duration::from_millis(50);

/// Closes one HTTP connection: the accept loop puts it in each request's
/// extensions and drops the connection when it fires.
#[derive(Clone, Debug, Default)]
pub(crate) struct ConnectionCut(pub(crate) CancellationToken);

#[derive(Deserialize)]
pub(crate) struct StreamQuery {
    after: Option<String>,
}

pub(crate) async fn stream(
    State(edge): State<Arc<LogEdge>>,
    Path((fqn, run)): Path<(String, String)>,
    Query(query): Query<StreamQuery>,
    cut: Option<Extension<ConnectionCut>>,
) -> Response {
    let connection = cut.map(|Extension(cut)| cut.0).unwrap_or_default();
    match open(edge, &fqn, &run, query.after.as_deref(), connection).await {
        Ok(body) => {
            let (parts, _) = response_head().into_parts();
            Response::from_parts(parts, Body::from_stream(body))
        }
        Err(refusal) => refusal.into_response(),
    }
}

/// A log stream's status and headers (its body follows), on either path.
pub(crate) fn response_head() -> Response {
    let headers = [
        (header::CONTENT_TYPE, "text/event-stream"),
        (header::CACHE_CONTROL, "no-cache"),
        (header::HeaderName::from_static("x-accel-buffering"), "no"),
    ];
    (StatusCode::OK, headers).into_response()
}

/// The frames of a viewer's stream, or why there is none (404 for an
/// unknown pipeline, 503 if the store cannot tell). An `Err` item means
/// "cut the connection". `connection` closes the viewer's connection.
pub(crate) async fn open(
    edge: Arc<LogEdge>,
    fqn: &str,
    run: &str,
    after: Option<&str>,
    connection: CancellationToken,
) -> Result<impl futures::Stream<Item = Result<Bytes, std::io::Error>> + Send + 'static, ApiError> {
    let stop = edge.tasks.token().clone();
    let session = open_session(edge, fqn, run, after, connection, false).await?;
    let body = futures::stream::unfold(session, |mut session| async move {
        let item = match session.next().await {
            Next::Frame(frame) => Some(Ok(frame)),
            Next::Cut => Some(Err(std::io::Error::other("viewer cut: its socket stalled"))),
            // (Not handed over: this session was not opened to be.)
            Next::End | Next::HandOver => None,
        };
        item.map(|item| (item, session))
    });
    // Open streams must not hold up a graceful shutdown. A child token:
    // the stream checks it at every frame, and ten thousand streams
    // checking the edge's own token would all take its one lock.
    Ok(futures::StreamExt::take_until(body, stop.child_token().cancelled_owned()))
}

/// A viewer's session, or why there is none (see [`open`]). With
/// `hand_over`, the session stops at the head of the tailer's window
/// ([`Next::HandOver`]): its connection's writer passes the socket to the
/// fan-out, which writes the live frames from then on.
pub(crate) async fn open_session(
    edge: Arc<LogEdge>,
    fqn: &str,
    run: &str,
    after: Option<&str>,
    connection: CancellationToken,
    hand_over: bool,
) -> Result<Session, ApiError> {
    let unknown = || problem(StatusCode::NOT_FOUND, format!("no pipeline `{fqn}`"));
    let key = RunKey::new(fqn, run).map_err(|_| unknown())?;
    // (No read-your-writes wait: the run's tailer delivers what the store
    // does not have yet.)
    match edge.store.pipeline_exists(key.fqn()).await {
        Ok(true) => {}
        // A run whose first line was just accepted here is stored a moment
        // later: wait for that write, as a page does. A pipeline nobody
        // wrote to through this edge is unknown at once.
        Ok(false) if edge.written.last(&key).is_some() && edge.caught_up(&key).await => {}
        Ok(false) => return Err(unknown()),
        Err(error) => return Err(store_unavailable(error)),
    }
    let start = match after {
        None => StartAt::Offset(0),
        Some(text) => text.parse().map_or(StartAt::Unreadable, StartAt::Offset),
    };
    let session = Session {
        edge,
        key,
        start,
        connection,
        viewer: None,
        tailer: None,
        attached: false,
        at: 0,
        replay_until: 0,
        last_sent: Instant::now(),
        heartbeat: None,
        changes: None,
        cut: None,
        was_cut: false,
        stage: Stage::Setup,
        hand_over,
    };
    Ok(session)
}

/// What a session gives next.
pub(crate) enum Next {
    /// A frame to write.
    Frame(Bytes),
    /// The response ends (after its terminal frame, if it had one).
    End,
    /// Cut: close the connection without ending the response.
    Cut,
    /// At the head of the tailer's window: the fan-out takes the viewer
    /// ([`Session::into_handover`]).
    HandOver,
}

enum Stage {
    Setup,
    /// Reading lines `[at, until)` from the store.
    CatchUp {
        until: u64,
        tick: Tick,
        lag_since: Option<Instant>,
    },
    /// Pulling from the tailer's window; `ahead_since`: since when the
    /// viewer waits for a cursor past the head.
    Live {
        ahead_since: Option<Instant>,
    },
    /// At the head, to be handed over to the fan-out.
    HandOver,
    Done,
}

/// Store reads and bytes spent in the current tick.
struct Tick {
    started: Instant,
    reads: usize,
    bytes: usize,
}

impl Tick {
    fn new() -> Self {
        Tick { started: Instant::now(), reads: 0, bytes: 0 }
    }
}

pub(crate) struct Session {
    edge: Arc<LogEdge>,
    key: RunKey,
    start: StartAt,
    connection: CancellationToken,
    viewer: Option<Arc<Viewer>>,
    tailer: Option<Arc<Tailer>>,
    attached: bool,
    /// The next line offset this viewer needs.
    at: u64,
    /// Lines below this offset are replay for this viewer.
    replay_until: u64,
    last_sent: Instant,
    /// Fires when a heartbeat may be due (or a cursor ahead of the head
    /// stops waiting); made at the first wait.
    heartbeat: Option<Pin<Box<tokio::time::Sleep>>>,
    /// The tailer's changes, seen up to the last pull.
    changes: Option<watch::Receiver<u64>>,
    /// Resolves when `connection` is cut; made at the first wait and kept,
    /// so it is registered once.
    cut: Option<Pin<Box<WaitForCancellationFutureOwned>>>,
    was_cut: bool,
    stage: Stage,
    /// Stop at the head for the fan-out rather than wait there.
    hand_over: bool,
}

impl Session {
    /// The token that closes the viewer's connection.
    pub(crate) fn connection(&self) -> &CancellationToken {
        &self.connection
    }

    fn end_with(&mut self, frame: Bytes) -> Option<Bytes> {
        self.stage = Stage::Done;
        Some(frame)
    }

    /// A frame goes out: the viewer now needs line `self.at`.
    fn sent(&mut self, frame: Bytes) -> Option<Bytes> {
        self.last_sent = Instant::now();
        if let Some(viewer) = &self.viewer {
            viewer.progressed(self.at);
        }
        Some(frame)
    }

    /// Whether [`Self::next`] answers without starting a store read: a
    /// call polled once and dropped then loses nothing (a catch-up's read
    /// would be started and thrown away).
    pub(crate) fn answers_at_once(&self) -> bool {
        !matches!(self.stage, Stage::Setup | Stage::CatchUp { .. })
    }

    /// What comes next (see [`Next`]).
    pub(crate) async fn next(&mut self) -> Next {
        loop {
            // (A connection cut while frames flow is closed by whoever
            // writes them; one cut while the session waits is seen here.)
            if self.was_cut {
                self.stage = Stage::Done;
                return Next::Cut;
            }
            let frame = match &self.stage {
                Stage::Done => return Next::End,
                Stage::HandOver => return Next::HandOver,
                Stage::Setup => self.setup().await,
                Stage::CatchUp { .. } => self.catch_up().await,
                Stage::Live { .. } => self.live().await,
            };
            if let Some(frame) = frame {
                return Next::Frame(frame);
            }
        }
    }

    /// Acquires the tailer and a connection slot, then attaches. Returns a
    /// frame to refuse, or the truncation notice.
    async fn setup(&mut self) -> Option<Bytes> {
        let run = self.key.run().to_string();
        // Twice: a tailer may end between the lookup and the attach.
        for _ in 0..2 {
            let Some(tailer) = self.edge.runs.acquire(&self.key) else {
                return self.end_with(frames::error(&run, frames::TOO_MANY_RUNS));
            };
            self.tailer = Some(tailer.clone());
            if self.viewer.is_none() {
                match self.edge.registry.register(0, self.connection.clone()) {
                    Some(viewer) => self.viewer = Some(viewer),
                    None => {
                        self.leave();
                        return self.end_with(frames::error(&run, frames::TOO_MANY_VIEWERS));
                    }
                }
            }
            if tailer.started().await == Phase::Live
                && let Some(viewer) = &self.viewer
                && let Some(attached) = tailer.attach(viewer, self.start)
            {
                self.attached = true;
                self.at = attached.at;
                self.replay_until = attached.replay_until;
                self.stage = Stage::Live { ahead_since: None };
                return attached.truncated.then(|| frames::truncated(&run)).and_then(|frame| self.sent(frame));
            }
            self.leave();
            if let Some(failure) = tailer.failure() {
                return self.end_with(failure);
            }
        }
        self.end_with(frames::error(&run, frames::TOO_MANY_RUNS))
    }

    /// The next frame from the window, or the wait for one.
    async fn live(&mut self) -> Option<Bytes> {
        // Nothing shared is cloned here (no `Arc` of the tailer or the
        // settings, no new receiver of its changes): ten thousand viewers
        // of one run would all count on the same cache lines at every frame.
        let Some(tailer) = self.tailer.as_ref() else {
            self.stage = Stage::Done;
            return None;
        };
        let changes = self.changes.get_or_insert_with(|| tailer.changed());
        // What changes after this point wakes the wait below.
        changes.mark_unchanged();
        match tailer.pull(self.at, self.replay_until) {
            Pull::Frame(frame, next) => {
                self.at = next;
                self.stage = Stage::Live { ahead_since: None };
                return self.sent(frame);
            }
            Pull::Behind { until } => {
                self.stage = Stage::CatchUp { until, tick: Tick::new(), lag_since: None };
                return None;
            }
            Pull::End(frame) => {
                // A viewer waiting past the head keeps its own cursor: the
                // tailer's would make it read lines it already has.
                let ended = (self.at > tailer.head()).then(|| tailer.completed()).flatten();
                self.stage = Stage::Done;
                if let Some(reason) = ended {
                    return Some(frames::complete(self.key.run(), Some(self.at), reason));
                }
                return frame;
            }
            Pull::Wait => {}
        }
        let ahead = self.at > tailer.head();
        if self.hand_over && !ahead {
            self.stage = Stage::HandOver;
            return None;
        }
        let settings = &self.edge.settings;
        let every = secs(settings.heartbeat_seconds);
        // A cursor past the head: lines the stream has not delivered here
        // yet (a new tailer starts at what the store holds). Wait for
        // them, up to `resume_wait_seconds`.
        let ahead_until = if ahead {
            let Stage::Live { ahead_since } = &mut self.stage else { return None };
            let since = *ahead_since.get_or_insert_with(Instant::now);
            let until = since + secs(settings.resume_wait_seconds);
            if Instant::now() >= until {
                let tailer = self.tailer.clone()?;
                return self.unplaceable(&tailer);
            }
            Some(until)
        } else {
            None
        };
        // One timer per session, moved only when it fires: a session that
        // sends a frame every few hundred milliseconds would otherwise
        // register and drop a timer for each.
        let heartbeat = self.last_sent + every;
        let timer = self.heartbeat.get_or_insert_with(|| Box::pin(tokio::time::sleep_until(heartbeat)));
        let wake_at = ahead_until.map_or(heartbeat, |until| until.min(heartbeat));
        if timer.deadline() > wake_at {
            timer.as_mut().reset(wake_at);
        }
        let changes = self.changes.as_mut()?;
        let cut = self.cut.get_or_insert_with(|| Box::pin(self.connection.clone().cancelled_owned()));
        tokio::select! {
            _ = changes.changed() => None,
            // Cut (its socket stalled): the next call ends the stream.
            () = cut.as_mut() => {
                self.was_cut = true;
                None
            }
            () = timer.as_mut() => {
                let due = self.last_sent + every;
                let now = Instant::now();
                timer.as_mut().reset(if now >= due { now + every } else { due });
                if now >= due { self.sent(Bytes::from_static(HEARTBEAT)) } else { None }
            }
        }
    }

    /// The viewer's cursor cannot be served: the truncation notice, then
    /// the window from its start (all of it replay).
    fn unplaceable(&mut self, tailer: &Tailer) -> Option<Bytes> {
        self.at = tailer.front();
        self.replay_until = tailer.head();
        self.stage = Stage::Live { ahead_since: None };
        let frame = frames::truncated(self.key.run());
        self.sent(frame)
    }

    /// One page from the store, or (caught up) back to the window.
    async fn catch_up(&mut self) -> Option<Bytes> {
        let settings = self.edge.settings.clone();
        let at = self.at;
        let Stage::CatchUp { until, tick, .. } = &mut self.stage else { return None };
        if at >= *until {
            self.stage = Stage::Live { ahead_since: None };
            return None;
        }
        let period = secs(settings.poll_seconds);
        if tick.started.elapsed() >= period {
            *tick = Tick::new();
        }
        if tick.reads >= settings.max_reads_per_tick || tick.bytes >= settings.max_bytes_per_tick {
            tokio::time::sleep_until(tick.started + period).await;
            return None;
        }
        let want = (*until - at).min(settings.lines_per_read as u64) as usize;
        let budget = settings.max_bytes_per_tick.saturating_sub(tick.bytes).max(1);
        tick.reads += 1;
        self.edge.count_read();
        let lines = match self.edge.store.read(&self.key, at, want, budget).await {
            Ok(lines) => lines,
            Err(error) => {
                tracing::debug!(run = %self.key, %error, "store read failed; retrying");
                tokio::time::sleep(STORE_LAG_WAIT).await;
                return None;
            }
        };
        let Stage::CatchUp { tick, lag_since, .. } = &mut self.stage else { return None };
        if lines.is_empty() {
            // The archiver has not stored these lines yet.
            let since = *lag_since.get_or_insert_with(Instant::now);
            if since.elapsed() >= secs(settings.resume_wait_seconds) {
                let tailer = self.tailer.clone()?;
                return self.unplaceable(&tailer);
            }
            tokio::time::sleep(STORE_LAG_WAIT).await;
            return None;
        }
        *lag_since = None;
        let content = lines.join("\n");
        tick.bytes += content.len();
        let replay = at < self.replay_until;
        self.at = at + lines.len() as u64;
        let frame = frames::logs(self.key.run(), &content, self.at, replay);
        self.sent(frame)
    }

    fn leave(&mut self) {
        if let Some(tailer) = self.tailer.take() {
            tailer.leave(self.viewer.as_ref().map(|v| v.id()), self.attached);
        }
        self.attached = false;
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        self.leave();
        if let Some(viewer) = self.viewer.take() {
            self.edge.registry.unregister(viewer.id());
        }
    }
}
