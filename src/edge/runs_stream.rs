//! `GET /api/v1/logs/{fqn}/runs/stream?after=`: a pipeline's runs as they
//! start, change state and finish, over SSE (`docs/sse.md`, "The runs
//! stream").
//!
//! A session takes a connection slot (`max_active_connections`, shared
//! with the log streams) and watches the pipeline's run feed
//! (`runs_feed.rs`, one per pipeline per node). From the first listing it
//! sends every run (oldest activity first) or, resumed with a cursor, the
//! runs active since the cursor less `resume_overlap_seconds`; then, at
//! each new listing, the runs whose record changed. Each `run` event is the
//! run's whole record, so a run sent twice is harmless. What a session
//! holds is the last listing it sent (bounded by `max_runs`): a slow
//! socket skips listings, never piles them up.

use std::collections::HashMap;
use std::collections::VecDeque;
use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::Response;
use bytes::Bytes;
use serde::{Deserialize, Serialize};
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::LogEdge;
use super::frames::{DURATION_MESSAGE, TOO_MANY_VIEWERS};
use super::problem::{ApiError, problem};
use super::runs_feed::Listing;
use super::sse::{ConnectionCut, response_head};
use super::viewer::{HEARTBEAT, Viewer};
use crate::archive::{RunKey, RunState, RunSummary};
use crate::config::secs;

/// `error` past `edge.runs_stream.max_pipelines`.
pub(crate) const TOO_MANY_PIPELINES: &str =
    "The server is already watching the maximum number of pipelines. Retry shortly or use the run listing endpoint.";

#[derive(Deserialize)]
pub(crate) struct RunsStreamQuery {
    after: Option<String>,
}

pub(crate) async fn stream(
    State(edge): State<Arc<LogEdge>>,
    Path(fqn): Path<String>,
    Query(query): Query<RunsStreamQuery>,
    cut: Option<axum::Extension<ConnectionCut>>,
) -> Result<Response, ApiError> {
    // The pipeline's name follows the rules of a run's.
    RunKey::new(&fqn, "x").map_err(|e| problem(StatusCode::BAD_REQUEST, e.to_string()))?;
    let connection = cut.map(|axum::Extension(cut)| cut.0).unwrap_or_default();
    // An unreadable cursor counts as none: the whole listing (the log
    // stream's rule).
    let after = query.after.as_deref().and_then(|a| a.parse::<u64>().ok());
    let stop = edge.tasks.token().child_token();
    let session = Session::new(edge, fqn, after, connection);
    let frames = futures::stream::unfold(session, |mut session| async move {
        session.next_frame().await.map(|frame| (Ok::<_, std::io::Error>(frame), session))
    });
    let body = futures::StreamExt::take_until(frames, stop.cancelled_owned());
    let (parts, _) = response_head().into_parts();
    Ok(Response::from_parts(parts, Body::from_stream(body)))
}

struct Session {
    edge: Arc<LogEdge>,
    fqn: String,
    /// The cursor asked for (runs active since then are sent first).
    since: Option<u64>,
    connection: CancellationToken,
    viewer: Option<Arc<Viewer>>,
    feed: Option<watch::Receiver<Listing>>,
    /// The listing last sent.
    sent: Listing,
    /// The cursor of the last event: the latest activity sent (ms).
    cursor: Option<u64>,
    ready: VecDeque<Bytes>,
    last_sent: Instant,
    ends_at: Instant,
    started: bool,
    done: bool,
}

impl Session {
    fn new(edge: Arc<LogEdge>, fqn: String, since: Option<u64>, connection: CancellationToken) -> Self {
        let ends_at = Instant::now() + secs(edge.settings.max_stream_seconds);
        Self {
            edge,
            fqn,
            since,
            connection,
            viewer: None,
            feed: None,
            sent: None,
            cursor: None,
            ready: VecDeque::new(),
            last_sent: Instant::now(),
            ends_at,
            started: false,
            done: false,
        }
    }

    /// The next frame; `None` ends the response.
    async fn next_frame(&mut self) -> Option<Bytes> {
        loop {
            if let Some(frame) = self.ready.pop_front() {
                self.last_sent = Instant::now();
                return Some(frame);
            }
            if self.done {
                return None;
            }
            if !self.started {
                self.started = true;
                self.setup();
                continue;
            }
            let feed = self.feed.as_mut()?;
            let listing = feed.borrow_and_update().clone();
            let new = match (&listing, &self.sent) {
                (Some(now), Some(sent)) => !Arc::ptr_eq(now, sent),
                (Some(_), None) => true,
                (None, _) => false,
            };
            if new && let Some(now) = listing {
                self.send_changes(&now);
                self.sent = Some(now);
                continue;
            }
            let heartbeat = self.last_sent + secs(self.edge.settings.heartbeat_seconds);
            tokio::select! {
                changed = feed.changed() => if changed.is_err() { self.done = true },
                () = tokio::time::sleep_until(heartbeat) => self.ready.push_back(Bytes::from_static(HEARTBEAT)),
                () = tokio::time::sleep_until(self.ends_at) => {
                    self.ready.push_back(complete(self.cursor));
                    self.done = true;
                }
                () = self.connection.cancelled() => self.done = true,
            }
        }
    }

    /// A connection slot and the pipeline's feed, or the `error` why not.
    fn setup(&mut self) {
        match self.edge.registry.register(0, self.connection.clone()) {
            Some(viewer) => self.viewer = Some(viewer),
            None => {
                self.ready.push_back(error(TOO_MANY_VIEWERS));
                self.done = true;
                return;
            }
        }
        match self.edge.run_feeds.watch(&self.fqn) {
            Some(feed) => self.feed = Some(feed),
            None => {
                self.ready.push_back(error(TOO_MANY_PIPELINES));
                self.done = true;
            }
        }
    }

    /// Queues a `run` event for each run of `now` this session has not
    /// sent as it is now, oldest activity first.
    fn send_changes(&mut self, now: &[RunSummary]) {
        let mut changed: Vec<&RunSummary> = match (&self.sent, self.since) {
            (Some(sent), _) => {
                let before: HashMap<&str, &RunSummary> = sent.iter().map(|r| (r.run.as_str(), r)).collect();
                now.iter().filter(|r| before.get(r.run.as_str()).copied() != Some(*r)).collect()
            }
            (None, Some(since)) => {
                let overlap = secs(self.edge.options.runs_stream.resume_overlap_seconds).as_millis() as u64;
                let from = since.saturating_sub(overlap);
                now.iter().filter(|r| r.info.last_activity_ms() >= from).collect()
            }
            (None, None) => now.iter().collect(),
        };
        changed.sort_by_key(|r| (r.info.last_activity_ms(), r.info.created_ms));
        for run in changed {
            let cursor = self.cursor.unwrap_or(0).max(run.info.last_activity_ms());
            self.cursor = Some(cursor);
            self.ready.push_back(run_event(&self.fqn, run, cursor));
        }
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        if let Some(viewer) = self.viewer.take() {
            self.edge.registry.unregister(viewer.id());
        }
    }
}

/// A `run`, `complete` or `error` event, its fields in this order (absent
/// ones left out, but `state`, which is `null` before any status).
#[derive(Serialize, Default)]
#[serde(rename_all = "camelCase")]
struct RunsEvent<'a> {
    event_type: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pipeline: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    run_id: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    state: Option<Option<RunState>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    lines: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    bytes: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    created_ms: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    updated_ms: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    after: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    reason: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    message: Option<&'a str>,
}

/// A run's whole record, as `GET …/runs/{runId}` answers it, and the
/// cursor after it.
fn run_event(fqn: &str, run: &RunSummary, cursor: u64) -> Bytes {
    let info = &run.info;
    frame(&RunsEvent {
        event_type: "run",
        pipeline: Some(fqn),
        run_id: Some(&run.run),
        state: Some(info.state),
        lines: Some(info.lines),
        bytes: Some(info.bytes),
        created_ms: Some(info.created_ms),
        updated_ms: Some(info.updated_ms),
        after: Some(cursor.to_string()),
        ..RunsEvent::default()
    })
}

/// The end of the stream: reconnect with `after`.
fn complete(cursor: Option<u64>) -> Bytes {
    frame(&RunsEvent {
        event_type: "complete",
        after: cursor.map(|c| c.to_string()),
        reason: Some("maxDuration"),
        message: Some(DURATION_MESSAGE),
        ..RunsEvent::default()
    })
}

/// A refusal, then the stream closes.
fn error(message: &str) -> Bytes {
    frame(&RunsEvent { event_type: "error", message: Some(message), ..RunsEvent::default() })
}

/// One unnamed SSE event.
fn frame(event: &RunsEvent<'_>) -> Bytes {
    let mut out = b"data: ".to_vec();
    // Strings and numbers always serialise; JSON never holds a raw newline.
    let _ = serde_json::to_writer(&mut out, event);
    out.extend_from_slice(b"\n\n");
    Bytes::from(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::archive::RunInfo;

    #[test]
    fn events_are_byte_exact() {
        let run = RunSummary {
            run: "r-2".into(),
            info: RunInfo { lines: 3, bytes: 12, created_ms: 100, updated_ms: 150, ..RunInfo::default() },
        };
        assert_eq!(
            &run_event("svc.etl", &run, 150)[..],
            b"data: {\"eventType\":\"run\",\"pipeline\":\"svc.etl\",\"runId\":\"r-2\",\"state\":null,\"lines\":3,\"bytes\":12,\"createdMs\":100,\"updatedMs\":150,\"after\":\"150\"}\n\n"
        );
        assert_eq!(
            &complete(Some(150))[..],
            format!("data: {{\"eventType\":\"complete\",\"after\":\"150\",\"reason\":\"maxDuration\",\"message\":\"{DURATION_MESSAGE}\"}}\n\n").as_bytes()
        );
        assert_eq!(
            &error(TOO_MANY_PIPELINES)[..],
            format!("data: {{\"eventType\":\"error\",\"message\":\"{TOO_MANY_PIPELINES}\"}}\n\n").as_bytes()
        );
    }
}
