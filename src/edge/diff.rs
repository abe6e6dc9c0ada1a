//! What changed in a run against another run of its pipeline:
//! `GET /api/v1/logs/{fqn}/runs/{runId}/diff?against=last-success|{runId}[&context=3][&after=K]`.
//!
//! Each line of both runs is normalised (`edge/normalise.rs`: what changes
//! from run to run without meaning anything, such as timestamps and
//! durations, is masked) and hashed, page by page off the async threads;
//! the two sequences of hashes are diffed (`similar`'s Myers, given
//! [`DIFF_DEADLINE`]: past it the rest is a coarser but still exact edit
//! script, flagged `approximate`); and only the lines of the hunks an
//! answer holds are read again, for their text. A diff's cost is bounded:
//! runs of at most `edge.max_diff_lines` lines each (over it: `422`), at
//! most `edge.max_concurrent_diffs` diffs at once (over it: `503`), and an
//! answer holds at most `edge.max_diff_hunks` hunks and
//! `edge.max_page_lines` rows; `next` is the hunk to continue from.

mod hunks;

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Json;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::{Value, json};

use self::hunks::{Hunk, Kind};
use super::LogEdge;
use super::incident::{report, store_unavailable};
use super::normalise::{line_hash, rule_names};
use super::problem::{ApiError, problem, run_key};
use super::reads::stored_info;
use super::search::cut;
use crate::archive::{RunInfo, RunKey, RunState};

/// What `against` is by default, and the word for the newest successful
/// run created before this one.
pub(crate) const LAST_SUCCESS: &str = "last-success";
/// Context lines around each change unless `context` says otherwise.
const DEFAULT_CONTEXT: usize = 3;
/// Most context lines a request may ask for.
const MAX_CONTEXT: usize = 100;
/// How long the search for the smallest edit script may take; what is
/// left then is diffed coarsely (removed whole, added whole).
pub(crate) const DIFF_DEADLINE: Duration = Duration::from_secs(5);
/// Lines and bytes read from the store per page.
const READ_PAGE_LINES: usize = 10_000;
const READ_PAGE_BYTES: usize = 4 * 1024 * 1024;

#[derive(Deserialize)]
pub(crate) struct DiffQuery {
    against: Option<String>,
    context: Option<usize>,
    after: Option<String>,
}

/// `{"run", "against", "identical", "rules", "oldLines", "newLines",
/// "hunks": [{"old": [start, count], "new": [start, count], "lines":
/// [{"op", "old"?, "new"?, "text"}]}], "next"?, "approximate"?}`.
pub(crate) async fn diff(
    State(edge): State<Arc<LogEdge>>,
    Path((fqn, run)): Path<(String, String)>,
    query: Result<Query<DiffQuery>, QueryRejection>,
) -> Result<Response, ApiError> {
    let Query(query) = query.map_err(|e| problem(StatusCode::BAD_REQUEST, e.body_text()))?;
    let context = query.context.unwrap_or(DEFAULT_CONTEXT).min(MAX_CONTEXT);
    let after = query.after.as_deref().and_then(|a| a.parse::<usize>().ok()).unwrap_or(0);
    let new_key = run_key(&fqn, &run)?;
    let new_info = stored_info(&edge, &new_key).await?;
    let (old_key, old_info) = match query.against.as_deref().unwrap_or(LAST_SUCCESS) {
        LAST_SUCCESS => last_success(&edge, &new_key, &new_info).await?,
        other => {
            let key = run_key(&fqn, other)?;
            let info = stored_info(&edge, &key).await?;
            (key, info)
        }
    };
    let max = edge.options.max_diff_lines;
    for (key, info) in [(&old_key, &old_info), (&new_key, &new_info)] {
        if info.lines > max as u64 {
            return Err(problem(
                StatusCode::UNPROCESSABLE_ENTITY,
                format!(
                    "run `{}` has {} lines, more than a diff compares (setting edge.max_diff_lines = {max})",
                    key.run(),
                    info.lines
                ),
            ));
        }
    }
    let Ok(_slot) = edge.diffs.try_acquire() else {
        let limit = edge.options.max_concurrent_diffs;
        return Err(problem(
            StatusCode::SERVICE_UNAVAILABLE,
            format!("{limit} diffs are running (setting edge.max_concurrent_diffs); retry later"),
        ));
    };
    let (old, new) = tokio::try_join!(
        hashes(&edge, &old_key, old_info.lines as usize),
        hashes(&edge, &new_key, new_info.lines as usize)
    )?;
    let (old_lines, new_lines) = (old.len(), new.len());
    let max_rows = edge.options.max_page_lines.max(1);
    let (all, approximate) = tokio::task::spawn_blocking(move || {
        let deadline = Instant::now() + DIFF_DEADLINE;
        let ops = similar::capture_diff_slices_deadline(similar::Algorithm::Myers, &old, &new, Some(deadline));
        let approximate = Instant::now() >= deadline;
        (hunks::hunks(&hunks::spans(&ops), context, max_rows), approximate)
    })
    .await
    .map_err(failed)?;

    let mut answered = Vec::new();
    let (mut rows, mut at) = (0, after.min(all.len()));
    while at < all.len() && answered.len() < edge.options.max_diff_hunks.max(1) {
        let hunk = &all[at];
        if !answered.is_empty() && rows + hunk.rows() > max_rows {
            break;
        }
        rows += hunk.rows();
        answered.push(hunk_json(&edge, &old_key, &new_key, hunk).await?);
        at += 1;
    }
    let mut body = json!({
        "run": new_key.run(),
        "against": old_key.run(),
        "identical": all.is_empty(),
        "rules": rule_names(),
        "oldLines": old_lines,
        "newLines": new_lines,
        "hunks": answered,
    });
    if at < all.len() {
        body["next"] = json!(at.to_string());
    }
    if approximate {
        body["approximate"] = json!(true);
    }
    Ok(Json(body).into_response())
}

/// A diff task that failed (panicked), as a `500` with an incident id.
fn failed(error: tokio::task::JoinError) -> ApiError {
    problem(StatusCode::INTERNAL_SERVER_ERROR, report("a diff failed", &error))
}

/// The newest run of the pipeline in state `success` created before
/// `key` (among its `edge.max_listing` newest runs), or a `404`.
async fn last_success(edge: &LogEdge, key: &RunKey, info: &RunInfo) -> Result<(RunKey, RunInfo), ApiError> {
    let runs = edge.store.runs(key.fqn(), edge.options.max_listing).await.map_err(store_unavailable)?;
    // Newest first: the runs listed after this one are older (or as old,
    // created in the same millisecond).
    let older: Vec<_> = match runs.iter().position(|r| r.run == key.run()) {
        Some(at) => runs.into_iter().skip(at + 1).collect(),
        None => runs.into_iter().filter(|r| r.info.created_ms < info.created_ms).collect(),
    };
    let found = older.into_iter().find(|r| r.info.state == Some(RunState::Success));
    let none = || {
        problem(StatusCode::NOT_FOUND, format!("pipeline `{}` has no successful run before `{}`", key.fqn(), key.run()))
    };
    let found = found.ok_or_else(none)?;
    let found_key = run_key(key.fqn(), &found.run)?;
    Ok((found_key, found.info))
}

/// The hash of each of the first `lines` lines of `key` (fewer if the
/// store holds fewer), read page by page, each page hashed on a blocking
/// thread while the next is read.
async fn hashes(edge: &LogEdge, key: &RunKey, lines: usize) -> Result<Vec<u64>, ApiError> {
    let mut out = Vec::with_capacity(lines);
    let mut pending: Option<tokio::task::JoinHandle<Vec<u64>>> = None;
    let mut at = 0usize;
    loop {
        let page = if at < lines {
            edge.count_read();
            let want = (lines - at).min(READ_PAGE_LINES);
            edge.store.read(key, at as u64, want, READ_PAGE_BYTES).await.map_err(store_unavailable)?
        } else {
            Vec::new()
        };
        if let Some(hashing) = pending.take() {
            out.extend(hashing.await.map_err(failed)?);
        }
        if page.is_empty() {
            return Ok(out);
        }
        at += page.len();
        pending = Some(tokio::task::spawn_blocking(move || page.iter().map(|line| line_hash(line)).collect()));
    }
}

/// Lines `[from, to)` of `key`, each cut as search cuts a match (a line
/// the store no longer holds reads as empty).
async fn texts(edge: &LogEdge, key: &RunKey, (from, to): (usize, usize)) -> Result<Vec<String>, ApiError> {
    let mut out = Vec::with_capacity(to - from);
    while from + out.len() < to {
        edge.count_read();
        let want = (to - from - out.len()).min(READ_PAGE_LINES);
        let at = (from + out.len()) as u64;
        let page = edge.store.read(key, at, want, READ_PAGE_BYTES).await.map_err(store_unavailable)?;
        if page.is_empty() {
            out.resize(to - from, String::new());
            break;
        }
        out.extend(page.iter().map(|line| cut(line).to_string()));
    }
    Ok(out)
}

/// One hunk of the answer, its text read: removed rows from the old run,
/// context and added rows from the new one.
async fn hunk_json(edge: &LogEdge, old_key: &RunKey, new_key: &RunKey, hunk: &Hunk) -> Result<Value, ApiError> {
    let removed = match hunk.removed() {
        Some(range) => (range.0, texts(edge, old_key, range).await?),
        None => (0, Vec::new()),
    };
    let shown = match hunk.shown_new() {
        Some(range) => (range.0, texts(edge, new_key, range).await?),
        None => (0, Vec::new()),
    };
    let text = |(from, lines): &(usize, Vec<String>), at: usize| {
        at.checked_sub(*from).and_then(|i| lines.get(i)).cloned().unwrap_or_default()
    };
    let mut lines = Vec::with_capacity(hunk.rows());
    for span in &hunk.spans {
        for i in 0..span.len {
            let (old, new) = (span.old + i, span.new + i);
            lines.push(match span.kind {
                Kind::Same => json!({ "op": " ", "old": old + 1, "new": new + 1, "text": text(&shown, new) }),
                Kind::Removed => json!({ "op": "-", "old": old + 1, "text": text(&removed, old) }),
                Kind::Added => json!({ "op": "+", "new": new + 1, "text": text(&shown, new) }),
            });
        }
    }
    let (old_start, old_count) = hunk.old_range();
    let (new_start, new_count) = hunk.new_range();
    Ok(json!({ "old": [old_start, old_count], "new": [new_start, new_count], "lines": lines }))
}
