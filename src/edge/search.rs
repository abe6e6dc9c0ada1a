//! Search over one run's whole log in the store, not just what a viewer has
//! loaded, and the run's facts for the viewer's header:
//!
//! - `GET /api/v1/logs/{fqn}/runs/{runId}/search?q=&regex=&case=&after=&limit=`
//!   (or `level=error|warning`, or `groups=1`, instead of `q`);
//! - `GET /api/v1/logs/{fqn}/runs/{runId}`;
//! - `GET /api/v1/logs/{fqn}/runs/{runId}/times?after=&limit=`: when lines
//!   `[after, after + limit)` arrived (marks of 1-based line and ms, each
//!   holding until the next; `limit` capped at `edge.max_page_lines`).
//!
//! A search's cost is bounded per request: it scans at most
//! `edge.max_search_scan_lines` lines from `after` (a zero-based offset,
//! like every cursor) and returns at most `limit` matches (capped at
//! `edge.max_search_matches`); `next`, when present, is where to continue.
//! Lines are matched as a viewer sees them ([`visible`]: escape sequences
//! removed, the last `\r` segment); a match carries its 1-based line number
//! and the stored line (cut at [`MATCH_TEXT_BYTES`]). The presets are the
//! viewer's own rules ([`ERROR_PATTERN`], [`WARNING_PATTERN`] for its gutter
//! marks, [`GROUP_PATTERN`] for its foldable sections), so that the page and
//! the server never disagree on what an error or a group is.

use std::borrow::Cow;
use std::sync::Arc;

use axum::Json;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use regex::{Regex, RegexBuilder};
use serde::Deserialize;
use serde_json::json;

use super::LogEdge;
use super::incident::store_unavailable;
use super::problem::{ApiError, problem, run_key};
use super::reads::stored_info;

/// Lines that look like errors: level words, panics, a non-zero exit.
pub(crate) const ERROR_PATTERN: &str = r"(?i)\b(error|err|fatal|failed|failure|panic|panicked|exception|traceback)\b|\bexit(ed)?( with)? (code|status):? *[1-9]";
/// Lines that look like warnings.
pub(crate) const WARNING_PATTERN: &str = r"(?i)\b(warn|warning|deprecated)\b";
/// The markers of foldable sections: GitHub's `::group::title` and
/// `::endgroup::`, GitLab's `section_start:…` and `section_end:…` (matched
/// before the `\r` GitLab puts after the marker).
pub(crate) const GROUP_PATTERN: &str = r"^(::group::|::endgroup::|section_start:[0-9]+:|section_end:[0-9]+:)";

/// The most of a matching line a search returns.
pub(crate) const MATCH_TEXT_BYTES: usize = 1024;
/// Longest query text.
const MAX_QUERY_BYTES: usize = 1024;
/// Lines and bytes read from the store per page while scanning.
pub(crate) const SCAN_PAGE_LINES: usize = 10_000;
pub(crate) const SCAN_PAGE_BYTES: usize = 4 * 1024 * 1024;

#[derive(Deserialize)]
pub(crate) struct SearchQuery {
    q: Option<String>,
    regex: Option<String>,
    case: Option<String>,
    level: Option<String>,
    groups: Option<String>,
    after: Option<String>,
    limit: Option<usize>,
}

pub(crate) fn flag(value: &Option<String>) -> bool {
    matches!(value.as_deref(), Some("1" | "true" | "on" | "yes"))
}

/// What a search looks for, and whether it looks before the `\r` rule.
pub(crate) struct Matcher {
    regex: Regex,
    raw: bool,
}

impl Matcher {
    fn of(query: &SearchQuery) -> Result<Self, ApiError> {
        Self::new(
            query.q.as_deref(),
            flag(&query.regex),
            flag(&query.case),
            query.level.as_deref(),
            flag(&query.groups),
        )
    }

    /// What `q` (plain text, or a regular expression with `regex`; case
    /// ignored unless `case`), `level` or `groups` ask for: exactly one.
    pub(crate) fn new(
        q: Option<&str>,
        regex: bool,
        case: bool,
        level: Option<&str>,
        groups: bool,
    ) -> Result<Self, ApiError> {
        let bad = |message: String| problem(StatusCode::BAD_REQUEST, message);
        let (pattern, case_insensitive, raw) = match (q, level, groups) {
            (Some(q), None, false) => {
                if q.is_empty() {
                    return Err(bad("q must not be empty".into()));
                }
                if q.len() > MAX_QUERY_BYTES {
                    return Err(bad(format!("q is longer than {MAX_QUERY_BYTES} bytes")));
                }
                let pattern = if regex { q.to_string() } else { regex::escape(q) };
                (pattern, !case, false)
            }
            (None, Some("error"), false) => (ERROR_PATTERN.to_string(), false, false),
            (None, Some("warning"), false) => (WARNING_PATTERN.to_string(), false, false),
            (None, Some(other), false) => return Err(bad(format!("unknown level `{other}` (error or warning)"))),
            (None, None, true) => (GROUP_PATTERN.to_string(), false, true),
            _ => return Err(bad("give one of q, level or groups=1".into())),
        };
        let regex = RegexBuilder::new(&pattern)
            .case_insensitive(case_insensitive)
            .size_limit(1 << 20)
            .dfa_size_limit(1 << 20)
            .build()
            .map_err(|e| bad(format!("invalid regular expression: {e}")))?;
        Ok(Self { regex, raw })
    }

    pub(crate) fn is_match(&self, line: &str) -> bool {
        if self.raw { self.regex.is_match(&strip_escapes(line)) } else { self.regex.is_match(&visible(line)) }
    }
}

/// `line` without its terminal escape sequences (colours, cursor moves,
/// titles).
pub(crate) fn strip_escapes(line: &str) -> Cow<'_, str> {
    if !line.contains('\x1b') {
        return Cow::Borrowed(line);
    }
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        if c != '\x1b' {
            out.push(c);
            continue;
        }
        match chars.next() {
            // CSI: parameters and intermediates, then one final byte.
            Some('[') => {
                for c in chars.by_ref() {
                    if ('@'..='~').contains(&c) {
                        break;
                    }
                }
            }
            // OSC: up to BEL or ST (ESC \).
            Some(']') => {
                while let Some(c) = chars.next() {
                    if c == '\x07' || (c == '\x1b' && chars.next_if_eq(&'\\').is_some()) {
                        break;
                    }
                }
            }
            _ => {}
        }
    }
    Cow::Owned(out)
}

/// What a terminal would show of `line`: no escape sequences, and of a line
/// redrawn with `\r` (a progress bar) only its last state.
pub(crate) fn visible(line: &str) -> Cow<'_, str> {
    let stripped = strip_escapes(line);
    let trimmed = stripped.trim_end_matches('\r');
    match trimmed.rfind('\r') {
        Some(at) => Cow::Owned(trimmed[at + 1..].to_string()),
        None if trimmed.len() == stripped.len() => stripped,
        None => Cow::Owned(trimmed.to_string()),
    }
}

/// `line` cut at [`MATCH_TEXT_BYTES`], on a character boundary.
pub(crate) fn cut(line: &str) -> &str {
    cut_at(line, MATCH_TEXT_BYTES)
}

/// `line`, at most `bytes` long, cut on a character boundary.
pub(crate) fn cut_at(line: &str, bytes: usize) -> &str {
    if line.len() <= bytes {
        return line;
    }
    let mut end = bytes;
    while !line.is_char_boundary(end) {
        end -= 1;
    }
    &line[..end]
}

/// `{"matches": [{"line", "text"}], "next"?, "scanned", "total"}`.
pub(crate) async fn search(
    State(edge): State<Arc<LogEdge>>,
    Path((fqn, run)): Path<(String, String)>,
    query: Result<Query<SearchQuery>, QueryRejection>,
) -> Result<Response, ApiError> {
    let Query(query) = query.map_err(|e| problem(StatusCode::BAD_REQUEST, e.body_text()))?;
    let key = run_key(&fqn, &run)?;
    let matcher = Matcher::of(&query)?;
    let limit = query.limit.unwrap_or(edge.options.max_search_matches).clamp(1, edge.options.max_search_matches);
    let from = query.after.as_deref().and_then(|a| a.parse::<u64>().ok()).unwrap_or(0);
    let info = stored_info(&edge, &key).await?;
    let end = info.lines.min(from.saturating_add(edge.options.max_search_scan_lines as u64));
    let (mut at, mut matches) = (from, Vec::new());
    'scan: while at < end {
        let want = usize::try_from(end - at).unwrap_or(usize::MAX).min(SCAN_PAGE_LINES);
        edge.count_read();
        let lines = edge.store.read(&key, at, want, SCAN_PAGE_BYTES).await.map_err(store_unavailable)?;
        if lines.is_empty() {
            break;
        }
        for (i, line) in lines.iter().enumerate() {
            if matcher.is_match(line) {
                matches.push(json!({ "line": at + i as u64 + 1, "text": cut(line) }));
                if matches.len() >= limit {
                    at += i as u64 + 1;
                    break 'scan;
                }
            }
        }
        at += lines.len() as u64;
    }
    let mut body = json!({ "matches": matches, "scanned": at - from.min(at), "total": info.lines });
    if at < info.lines {
        body["next"] = json!(at.to_string());
    }
    Ok(Json(body).into_response())
}

#[derive(Deserialize)]
pub(crate) struct TimesQuery {
    after: Option<String>,
    limit: Option<usize>,
}

/// `{"marks": [[line, ms], …]}`: line is 1-based, the first mark is the one
/// line `after + 1` is under.
pub(crate) async fn times(
    State(edge): State<Arc<LogEdge>>,
    Path((fqn, run)): Path<(String, String)>,
    query: Result<Query<TimesQuery>, QueryRejection>,
) -> Result<Response, ApiError> {
    let Query(query) = query.map_err(|e| problem(StatusCode::BAD_REQUEST, e.body_text()))?;
    let key = run_key(&fqn, &run)?;
    let from = query.after.as_deref().and_then(|a| a.parse::<u64>().ok()).unwrap_or(0);
    let limit = query.limit.unwrap_or(edge.options.max_page_lines).clamp(1, edge.options.max_page_lines);
    edge.count_read();
    let marks = edge.store.times(&key, from, from.saturating_add(limit as u64)).await.map_err(store_unavailable)?;
    let marks: Vec<[u64; 2]> = marks.into_iter().map(|(offset, ms)| [offset + 1, ms]).collect();
    Ok(Json(json!({ "marks": marks })).into_response())
}

/// `{"runId", "pipeline", "state", "lines", "bytes", "createdMs", "updatedMs"}`.
pub(crate) async fn run_info(
    State(edge): State<Arc<LogEdge>>,
    Path((fqn, run)): Path<(String, String)>,
) -> Result<Response, ApiError> {
    let key = run_key(&fqn, &run)?;
    edge.caught_up(&key).await;
    match edge.store.info(&key).await.map_err(store_unavailable)? {
        Some(info) => Ok(Json(json!({
            "pipeline": key.fqn(),
            "runId": key.run(),
            "state": info.state,
            "lines": info.lines,
            "bytes": info.bytes,
            "createdMs": info.created_ms,
            "updatedMs": info.last_activity_ms(),
        }))
        .into_response()),
        None => Err(problem(StatusCode::NOT_FOUND, format!("pipeline `{fqn}` has no run `{run}`"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_line_is_matched_as_a_terminal_shows_it() {
        assert_eq!(visible("\x1b[32mINFO\x1b[0m step ok"), "INFO step ok");
        assert_eq!(visible("\x1b]0;title\x07plain"), "plain");
        assert_eq!(visible("\x1b]8;;http://x\x1b\\link\x1b]8;;\x1b\\"), "link");
        assert_eq!(visible(" 10%\r 50%\r100% done\r"), "100% done");
        assert!(matches!(visible("nothing to do"), Cow::Borrowed(_)));
        assert_eq!(strip_escapes("section_start:1:x\r\x1b[0KHeader"), "section_start:1:x\rHeader");
    }

    #[test]
    fn the_presets_find_errors_warnings_and_groups() {
        let error = Regex::new(ERROR_PATTERN).unwrap();
        for line in ["ERROR boom", "error: cannot find", "thread 'main' panicked at", "Process exited with code 2"] {
            assert!(error.is_match(line), "{line}");
        }
        for line in ["0 errors", "terror", "exit code 0", "all good"] {
            assert!(!error.is_match(line), "{line}");
        }
        assert!(Regex::new(WARNING_PATTERN).unwrap().is_match("WARN slow disk"));
        let group = Regex::new(GROUP_PATTERN).unwrap();
        for line in ["::group::Build", "::endgroup::", "section_start:1560896352:build", "section_end:1560896353:build"]
        {
            assert!(group.is_match(line), "{line}");
        }
        assert!(!group.is_match("echo ::group::x"));
    }

    #[test]
    fn a_long_match_is_cut_on_a_character_boundary() {
        let line = "é".repeat(MATCH_TEXT_BYTES);
        let cut = cut(&line);
        assert!(cut.len() <= MATCH_TEXT_BYTES && cut.len() >= MATCH_TEXT_BYTES - 1);
    }
}
