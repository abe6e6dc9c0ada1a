//! Reading a run's log without streaming: the paginated
//! `…/logs/{fqn}/last?runId=&after=&limit=`, the whole log as text
//! (`…/last/download?runId=`, streamed page by page, never held in
//! memory), and the listings the viewer page uses.

use std::sync::Arc;

use axum::Json;
use axum::body::Body;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use serde::Deserialize;
use serde_json::json;

use super::LogEdge;
use super::incident::store_unavailable;
use super::problem::{ApiError, problem};
use crate::archive::RunKey;

/// Bytes of one page of the download.
const DOWNLOAD_PAGE_BYTES: usize = 1024 * 1024;

#[derive(Deserialize)]
pub(crate) struct LastQuery {
    #[serde(rename = "runId")]
    run_id: Option<String>,
    after: Option<String>,
    limit: Option<usize>,
}

/// The run named by `runId`, or the pipeline's newest run.
async fn resolve(edge: &LogEdge, fqn: &str, run: Option<&str>) -> Result<RunKey, ApiError> {
    let unknown = || problem(StatusCode::NOT_FOUND, format!("no pipeline `{fqn}`"));
    // After this edge's own write to the run, what it accepted is read.
    if let Some(written) = run.and_then(|run| RunKey::new(fqn, run).ok()) {
        edge.caught_up(&written).await;
    }
    match edge.store.pipeline_exists(fqn).await {
        Ok(true) => {}
        Ok(false) => return Err(unknown()),
        Err(error) => return Err(store_unavailable(error)),
    }
    let run = match run {
        Some(run) => run.to_string(),
        None => match edge.store.runs(fqn, 1).await {
            Ok(runs) => match runs.into_iter().next() {
                Some(newest) => newest.run,
                None => return Err(problem(StatusCode::NOT_FOUND, format!("pipeline `{fqn}` has no run"))),
            },
            Err(error) => return Err(store_unavailable(error)),
        },
    };
    let key = RunKey::new(fqn, &run).map_err(|e| problem(StatusCode::BAD_REQUEST, e.to_string()))?;
    match edge.store.info(&key).await {
        Ok(Some(_)) => Ok(key),
        Ok(None) => Err(problem(StatusCode::NOT_FOUND, format!("pipeline `{fqn}` has no run `{run}`"))),
        Err(error) => Err(store_unavailable(error)),
    }
}

/// `{"logs": "l1\nl2", "after": "<next offset, when more lines exist>", "total": "<lines>"}`.
pub(crate) async fn last(
    State(edge): State<Arc<LogEdge>>,
    Path(fqn): Path<String>,
    query: Result<Query<LastQuery>, QueryRejection>,
) -> Result<Response, ApiError> {
    let Query(query) = query.map_err(|e| problem(StatusCode::BAD_REQUEST, e.body_text()))?;
    if query.limit == Some(0) {
        return Err(problem(StatusCode::BAD_REQUEST, "limit must be at least 1"));
    }
    let key = resolve(&edge, &fqn, query.run_id.as_deref()).await?;
    // An unreadable cursor starts at the beginning, as the stream does.
    let from = query.after.as_deref().and_then(|a| a.parse::<u64>().ok()).unwrap_or(0);
    let limit = query.limit.unwrap_or(edge.settings.lines_per_read).clamp(1, edge.options.max_page_lines);
    edge.count_read();
    let (lines, info) =
        match (edge.store.read(&key, from, limit, edge.options.max_body_bytes).await, edge.store.info(&key).await) {
            (Ok(lines), Ok(info)) => (lines, info.unwrap_or_default()),
            (Err(error), _) | (_, Err(error)) => return Err(store_unavailable(error)),
        };
    let next = from + lines.len() as u64;
    let mut body = json!({ "logs": lines.join("\n"), "total": info.lines.to_string() });
    if next < info.lines {
        body["after"] = json!(next.to_string());
    }
    Ok(Json(body).into_response())
}

#[derive(Deserialize)]
pub(crate) struct DownloadQuery {
    #[serde(rename = "runId")]
    run_id: Option<String>,
}

/// The whole log as `text/plain`, one line per line.
pub(crate) async fn download(
    State(edge): State<Arc<LogEdge>>,
    Path(fqn): Path<String>,
    Query(query): Query<DownloadQuery>,
) -> Result<Response, ApiError> {
    let key = resolve(&edge, &fqn, query.run_id.as_deref()).await?;
    let filename: String = format!("{}_{}.log", key.fqn(), key.run())
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() || "._-".contains(c) { c } else { '_' })
        .collect();
    let lines_per_page = edge.options.max_page_lines;
    let pages = futures::stream::unfold((edge, key, 0u64, false), move |(edge, key, at, done)| async move {
        if done {
            return None;
        }
        edge.count_read();
        match edge.store.read(&key, at, lines_per_page, DOWNLOAD_PAGE_BYTES).await {
            Ok(lines) if lines.is_empty() => None,
            Ok(lines) => {
                let mut page = lines.join("\n");
                page.push('\n');
                let next = at + lines.len() as u64;
                Some((Ok(Bytes::from(page)), (edge, key, next, false)))
            }
            Err(error) => Some((Err(std::io::Error::other(error.to_string())), (edge, key, at, true))),
        }
    });
    Ok((
        [
            (header::CONTENT_TYPE, "text/plain; charset=utf-8".to_string()),
            (header::CONTENT_DISPOSITION, format!("attachment; filename=\"{filename}\"")),
        ],
        Body::from_stream(pages),
    )
        .into_response())
}

/// `{"pipelines": [...]}`
pub(crate) async fn pipelines(State(edge): State<Arc<LogEdge>>) -> Result<Response, ApiError> {
    let names = edge.store.pipelines(edge.options.max_listing).await.map_err(store_unavailable)?;
    Ok(Json(json!({ "pipelines": names })).into_response())
}

/// `{"runs": [{"runId", "state", "lines", "createdMs"}]}`, newest first.
pub(crate) async fn runs(State(edge): State<Arc<LogEdge>>, Path(fqn): Path<String>) -> Result<Response, ApiError> {
    let runs = edge.store.runs(&fqn, edge.options.max_listing).await.map_err(store_unavailable)?;
    let runs: Vec<_> = runs
        .into_iter()
        .map(
            |r| json!({ "runId": r.run, "state": r.info.state, "lines": r.info.lines, "createdMs": r.info.created_ms }),
        )
        .collect();
    Ok(Json(json!({ "runs": runs })).into_response())
}
