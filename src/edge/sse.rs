//! `GET /api/v1/services/ingestionPipelines/logs/{fqn}/stream/{runId}?after=`:
//! one viewer's session.
//!
//! The response (200, `text/event-stream`) commits at once; everything
//! after is a frame. The session acquires the run's tailer (or gets
//! `TOO_MANY_RUNS`), a connection slot (or `TOO_MANY_VIEWERS`), then
//! catches up from the run log store page by page (`replay: true`, paced
//! by `max_reads_per_tick` and `max_bytes_per_tick`, and by the socket) up
//! to what the tailer still holds, attaches, and follows the live feed.
//! Dropping the body (the client left) frees both slots at once.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Path, Query, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use serde::Deserialize;
use tokio::time::Instant;

use super::LogEdge;
use super::frames;
use super::tailer::{NotAttached, Phase, StartAt, Tailer};
use super::viewer::{Next, Viewer};
use crate::archive::RunKey;
use crate::config::secs;

/// How often a session retries when the store has not caught up yet.
const STORE_LAG_WAIT: Duration = Duration::from_millis(50);
/// How long a session waits for a lagging store before it resets the view.
const STORE_LAG_LIMIT: Duration = Duration::from_secs(10);

#[derive(Deserialize)]
pub(crate) struct StreamQuery {
    after: Option<String>,
}

pub(crate) async fn stream(
    State(edge): State<Arc<LogEdge>>,
    Path((fqn, run)): Path<(String, String)>,
    Query(query): Query<StreamQuery>,
) -> Response {
    match open(edge, &fqn, &run, query.after.as_deref()).await {
        Ok(body) => (
            [
                (header::CONTENT_TYPE, "text/event-stream"),
                (header::CACHE_CONTROL, "no-cache"),
                (header::HeaderName::from_static("x-accel-buffering"), "no"),
            ],
            Body::from_stream(body),
        )
            .into_response(),
        Err((status, message)) => (status, message).into_response(),
    }
}

/// The frames of a viewer's stream, or why there is none (404 for an
/// unknown pipeline, 503 if the store cannot tell). An `Err` item means
/// "cut the connection".
pub(crate) async fn open(
    edge: Arc<LogEdge>,
    fqn: &str,
    run: &str,
    after: Option<&str>,
) -> Result<impl futures::Stream<Item = Result<Bytes, std::io::Error>> + Send + 'static, (StatusCode, String)> {
    let unknown = || (StatusCode::NOT_FOUND, format!("no pipeline `{fqn}`\n"));
    let key = RunKey::new(fqn, run).map_err(|_| unknown())?;
    match edge.store.pipeline_exists(key.fqn()).await {
        Ok(true) => {}
        Ok(false) => return Err(unknown()),
        Err(error) => {
            let told = super::incident::report("the run log store failed", &error);
            return Err((StatusCode::SERVICE_UNAVAILABLE, format!("{told}; retry later\n")));
        }
    }
    let start = match after {
        None => StartAt::Offset(0),
        Some(text) => text.parse().map_or(StartAt::Unplaceable, StartAt::Offset),
    };
    let stop = edge.tasks.token().clone();
    let session = Session { edge, key, start, viewer: None, tailer: None, attached: false, stage: Stage::Setup };
    let body = futures::stream::unfold(session, |mut session| async move {
        session.next_frame().await.map(|frame| (frame, session))
    });
    // Open streams must not hold up a graceful shutdown.
    Ok(futures::StreamExt::take_until(body, stop.cancelled_owned()))
}

enum Stage {
    Setup,
    CatchUp { at: u64, until: u64, tick: Tick, lag_since: Option<Instant> },
    Live,
    Done,
}

/// Store reads and bytes spent in the current tick.
struct Tick {
    started: Instant,
    reads: usize,
    bytes: usize,
}

struct Session {
    edge: Arc<LogEdge>,
    key: RunKey,
    start: StartAt,
    viewer: Option<Arc<Viewer>>,
    tailer: Option<Arc<Tailer>>,
    attached: bool,
    stage: Stage,
}

impl Session {
    fn end_with(&mut self, frame: Bytes) -> Option<Bytes> {
        self.stage = Stage::Done;
        Some(frame)
    }

    /// The next frame; `None` ends the response, an error cuts the
    /// connection.
    async fn next_frame(&mut self) -> Option<Result<Bytes, std::io::Error>> {
        loop {
            match &mut self.stage {
                Stage::Done => return None,
                Stage::Setup => {
                    if let Some(frame) = self.setup().await {
                        return Some(Ok(frame));
                    }
                }
                Stage::CatchUp { .. } => {
                    if let Some(frame) = self.catch_up().await {
                        return Some(Ok(frame));
                    }
                }
                Stage::Live => {
                    let viewer = self.viewer.clone()?;
                    match viewer.next() {
                        Next::Frame(frame) => return Some(Ok(frame)),
                        Next::Wait => viewer.woken().await,
                        Next::End => {
                            self.stage = Stage::Done;
                            return None;
                        }
                        Next::Abort => {
                            self.stage = Stage::Done;
                            return Some(Err(std::io::Error::other("viewer dropped: too far behind")));
                        }
                    }
                }
            }
        }
    }

    /// Acquires the tailer and a connection slot, then tries to attach.
    /// Returns a frame only to refuse.
    async fn setup(&mut self) -> Option<Bytes> {
        let run = self.key.run().to_string();
        // Twice: a tailer may end between the lookup and the attach.
        for _ in 0..2 {
            let Some(tailer) = self.edge.runs.acquire(&self.key) else {
                return self.end_with(frames::error(&run, frames::TOO_MANY_RUNS));
            };
            self.tailer = Some(tailer.clone());
            if self.viewer.is_none() {
                match self.edge.registry.register() {
                    Some(viewer) => self.viewer = Some(viewer),
                    None => {
                        self.leave();
                        return self.end_with(frames::error(&run, frames::TOO_MANY_VIEWERS));
                    }
                }
            }
            if tailer.started().await == Phase::Live {
                return self.try_attach(self.start);
            }
            self.leave();
            if let Some(failure) = tailer.failure() {
                return self.end_with(failure);
            }
        }
        self.end_with(frames::error(&run, frames::TOO_MANY_RUNS))
    }

    fn try_attach(&mut self, at: StartAt) -> Option<Bytes> {
        let (Some(tailer), Some(viewer)) = (self.tailer.clone(), self.viewer.clone()) else {
            self.stage = Stage::Done;
            return None;
        };
        match (tailer.attach(&viewer, at), at) {
            (Ok(()), _) => {
                self.attached = true;
                self.stage = Stage::Live;
            }
            (Err(NotAttached::Behind { until }), StartAt::Offset(at)) => {
                let tick = Tick { started: Instant::now(), reads: 0, bytes: 0 };
                self.stage = Stage::CatchUp { at, until, tick, lag_since: None };
            }
            // Ended meanwhile: the viewer reconnects with its cursor.
            _ => self.stage = Stage::Done,
        }
        None
    }

    /// One page from the store, or (caught up) the attach.
    async fn catch_up(&mut self) -> Option<Bytes> {
        let settings = self.edge.settings.clone();
        let Stage::CatchUp { at, until, tick, lag_since } = &mut self.stage else { return None };
        if *at >= *until {
            let at = *at;
            return self.try_attach(StartAt::Offset(at));
        }
        let period = secs(settings.poll_seconds);
        if tick.started.elapsed() >= period {
            *tick = Tick { started: Instant::now(), reads: 0, bytes: 0 };
        }
        if tick.reads >= settings.max_reads_per_tick || tick.bytes >= settings.max_bytes_per_tick {
            tokio::time::sleep_until(tick.started + period).await;
            return None;
        }
        let want = (*until - *at).min(settings.lines_per_read as u64) as usize;
        let budget = settings.max_bytes_per_tick.saturating_sub(tick.bytes).max(1);
        tick.reads += 1;
        self.edge.count_read();
        let lines = match self.edge.store.read(&self.key, *at, want, budget).await {
            Ok(lines) => lines,
            Err(error) => {
                tracing::debug!(run = %self.key, %error, "store read failed; retrying");
                tokio::time::sleep(STORE_LAG_WAIT).await;
                return None;
            }
        };
        if lines.is_empty() {
            // The archiver has not stored these lines yet.
            let since = *lag_since.get_or_insert_with(Instant::now);
            if since.elapsed() >= STORE_LAG_LIMIT {
                return self.try_attach(StartAt::Unplaceable);
            }
            tokio::time::sleep(STORE_LAG_WAIT).await;
            return None;
        }
        *lag_since = None;
        let content = lines.join("\n");
        tick.bytes += content.len();
        *at += lines.len() as u64;
        Some(frames::logs(self.key.run(), &content, *at, true))
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
