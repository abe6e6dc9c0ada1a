//! Ingest: `POST /api/v1/logs/{fqn}/runs/{runId}/lines` and
//! `PUT /api/v1/logs/{fqn}/runs/{runId}/status`.
//!
//! A request's lines become one batch (one container): it is accepted
//! whole or refused whole, and answered `202 {"accepted": n}` once the
//! queue adapter has it durably. `text/plain`: one line per line.
//! `application/x-ndjson`: one JSON object per line, `{"line": "…"}` or
//! `{"line": "…", "id": "…"}` (the producer's event id, kept end to end).
//!
//! A status change goes through the run's stream too (a status event),
//! answered once the queue adapter has it: it is stored, and reaches
//! viewers, after every line accepted before it.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use axum::Json;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use serde::Deserialize;
use serde_json::json;

use super::LogEdge;
use super::body::IngestBody;
use super::incident;
use super::problem::{ApiError, problem, run_key};
use crate::archive::{RESERVED_ID_PREFIX, RunState, is_reserved, lines_of, status_event};
use crate::config::secs;
use crate::queue::QueueError;
use crate::stream::{Event, EventId, now_ms};
use crate::telemetry;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct NdLine {
    line: String,
    #[serde(default)]
    id: Option<String>,
}

/// The request's media type, lower-cased, without parameters; `None`
/// without a `Content-Type`.
fn media_type(headers: &HeaderMap) -> Result<Option<String>, ApiError> {
    let Some(value) = headers.get(header::CONTENT_TYPE) else { return Ok(None) };
    let value = value
        .to_str()
        .map_err(|_| problem(StatusCode::UNSUPPORTED_MEDIA_TYPE, "the content type is not readable text"))?;
    let essence = value.split(';').next().unwrap_or_default().trim().to_ascii_lowercase();
    Ok((!essence.is_empty()).then_some(essence))
}

/// The body's lines with their optional producer ids.
fn parse_lines(headers: &HeaderMap, body: &[u8], max: usize) -> Result<Vec<(String, Option<String>)>, ApiError> {
    let ndjson = match media_type(headers)?.as_deref() {
        None | Some("text/plain") => false,
        Some("application/x-ndjson") => true,
        Some(other) => {
            return Err(problem(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                format!("content type `{other}` is not accepted: send text/plain or application/x-ndjson"),
            ));
        }
    };
    let text = std::str::from_utf8(body)
        .map_err(|e| problem(StatusCode::BAD_REQUEST, format!("the body is not UTF-8: {e}")))?;
    let mut out = Vec::new();
    if ndjson {
        for (n, raw) in text.lines().enumerate() {
            if raw.trim().is_empty() {
                continue;
            }
            let expected = |e: &dyn std::fmt::Display| {
                problem(StatusCode::BAD_REQUEST, format!("line {}: expected {{\"line\": …, \"id\"?: …}}: {e}", n + 1))
            };
            // An object only (serde would also read `["a"]` by position).
            if !raw.trim_start().starts_with('{') {
                return Err(expected(&"not a JSON object"));
            }
            let parsed: NdLine = serde_json::from_str(raw).map_err(|e| expected(&e))?;
            if parsed.id.as_ref().is_some_and(|id| id.is_empty() || id.len() > 256) {
                return Err(problem(StatusCode::BAD_REQUEST, format!("line {}: an id must be 1 to 256 bytes", n + 1)));
            }
            if parsed.id.as_deref().is_some_and(is_reserved) {
                let message = format!("line {}: ids starting with `{RESERVED_ID_PREFIX}` are reserved", n + 1);
                return Err(problem(StatusCode::BAD_REQUEST, message));
            }
            for line in lines_of(&parsed.line) {
                out.push((line.to_string(), parsed.id.clone()));
            }
        }
    } else if !text.is_empty() {
        out.extend(lines_of(text).map(|l| (l.to_string(), None)));
    }
    if out.is_empty() {
        return Err(problem(StatusCode::BAD_REQUEST, "no lines in the body"));
    }
    if out.len() > max {
        return Err(problem(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("{} lines in one request; at most {max} (setting edge.max_lines_per_request)", out.len()),
        ));
    }
    Ok(out)
}

pub(crate) async fn post_lines(
    State(edge): State<Arc<LogEdge>>,
    Path((fqn, run)): Path<(String, String)>,
    headers: HeaderMap,
    body: IngestBody,
) -> Result<Response, ApiError> {
    let key = run_key(&fqn, &run)?;
    let lines = parse_lines(&headers, &body, edge.options.max_lines_per_request)?;
    let now = now_ms();
    let events: Vec<Event> = lines
        .into_iter()
        .map(|(line, id)| {
            let id = match id {
                Some(id) => EventId::new(id),
                None => EventId::new(format!("{}-{}", edge.id_prefix, edge.next_id.fetch_add(1, Ordering::Relaxed))),
            };
            Event { id, timestamp_ms: now, payload: Bytes::from(line) }
        })
        .collect();
    let count = events.len();
    let token = edge.node.produce(&key.stream(), events).await.map_err(not_accepted)?;
    edge.written.accepted(&key, token);
    metrics::counter!(telemetry::EDGE_INGESTED_LINES).increment(count as u64);
    Ok((StatusCode::ACCEPTED, Json(json!({ "accepted": count }))).into_response())
}

/// A queue's refusal as an answer: too large (413), full or down for now
/// (503: retry), or broken (500). A capacity refusal accepted nothing; a
/// backend failure may have stored the batch (its reply was lost, or a
/// Redis master took it and no replica confirmed it in time), so the answer
/// says to retry with the same event ids, which stores it once.
fn not_accepted(error: QueueError) -> ApiError {
    let status = match &error {
        QueueError::BatchTooLarge { .. } | QueueError::BatchTooManyBytes { .. } => StatusCode::PAYLOAD_TOO_LARGE,
        QueueError::Refused { .. } | QueueError::Full { .. } => StatusCode::SERVICE_UNAVAILABLE,
        error if error.is_transient() => StatusCode::SERVICE_UNAVAILABLE,
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    };
    let retry = if status == StatusCode::SERVICE_UNAVAILABLE { ", retry later" } else { "" };
    // Capacity refusals say what was refused; any other failure may carry
    // paths or OS errors: the client gets an incident id instead.
    let told = match &error {
        QueueError::BatchTooLarge { .. }
        | QueueError::BatchTooManyBytes { .. }
        | QueueError::Refused { .. }
        | QueueError::Full { .. }
        | QueueError::DiskFull { .. } => format!("{error}; nothing was accepted"),
        _ => format!(
            "{}; the batch may have been stored: a retry with the same event ids (NDJSON `id`) stores it once",
            incident::report("the queue failed", &error)
        ),
    };
    problem(status, format!("{told}{retry}"))
}

#[derive(Deserialize)]
struct StatusBody {
    #[serde(alias = "pipelineState")]
    state: String,
}

pub(crate) async fn put_status(
    State(edge): State<Arc<LogEdge>>,
    Path((fqn, run)): Path<(String, String)>,
    body: IngestBody,
) -> Result<Response, ApiError> {
    let key = run_key(&fqn, &run)?;
    let parsed: StatusBody = serde_json::from_slice(&body)
        .map_err(|e| problem(StatusCode::BAD_REQUEST, format!("expected {{\"state\": …}}: {e}")))?;
    let Some(state) = RunState::parse(&parsed.state) else {
        let known: Vec<&str> = RunState::ALL.iter().map(|s| s.as_str()).collect();
        let message = format!("unknown state `{}` (one of {})", parsed.state, known.join(", "));
        return Err(problem(StatusCode::BAD_REQUEST, message));
    };
    // Through the run's stream, like its lines: stored and shown to
    // viewers after every line accepted before it.
    let token = edge.node.produce(&key.stream(), vec![status_event(state)]).await.map_err(not_accepted)?;
    edge.written.accepted(&key, token);
    let stored = edge.store.wait_stored(&key, token, secs(edge.options.status_wait_seconds)).await;
    let status = if stored { StatusCode::OK } else { StatusCode::ACCEPTED };
    Ok((status, Json(json!({ "runId": key.run(), "state": state, "stored": stored }))).into_response())
}
