//! `GET /api/v1/logs/{fqn}/runs/{runId}/failures[?from=N][&maxBytes=B]`:
//! what failed in a run, folded. One JSON Lines record per group that holds
//! an error line (by the viewer's rule, `level=error` of the search), in the
//! order of their first error: `{"group": [titles…], "title", "from", "to"?,
//! "errors": [{"line", "text"}], "errorCount"}`; error lines in no group
//! make one record with `"group": []` and no title. `from` is the group's
//! opening line and `to` its closing one (absent while it is open);
//! `errors` holds its first [`MAX_ERRORS_PER_GROUP`] error lines,
//! `errorCount` all it had in the lines scanned. Bounded like every read
//! (`reads.rs`): the summary's `next` (a `from`) continues, and following it
//! reports every error line once.

use std::sync::Arc;

use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::Response;
use serde::Deserialize;
use serde_json::{Value, json};

use super::LogEdge;
use super::groups::Change;
use super::problem::{ApiError, problem};
use super::reads::{Answer, answer_bytes, groups_before, scan, stored_run, summary};
use super::search::{MATCH_TEXT_BYTES, Matcher, cut_at, visible};
use crate::archive::RunKey;

/// Error lines listed per group (the rest are counted).
pub(crate) const MAX_ERRORS_PER_GROUP: usize = 10;
/// Failing groups one answer tracks; past it the scan stops there and
/// `next` continues.
const MAX_FAILING_GROUPS: usize = 1_000;

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct FailuresQuery {
    from: Option<u64>,
    max_bytes: Option<usize>,
}

/// One failing group as it is found.
struct Failing {
    /// The innermost group's opening line, `None` outside any group.
    opened: Option<u64>,
    closed: Option<u64>,
    path: Vec<Arc<str>>,
    /// Its error lines: number and text (the first few).
    errors: Vec<(u64, String)>,
    count: u64,
}

impl Failing {
    fn record(&self) -> Value {
        let errors: Vec<Value> = self.errors.iter().map(|(line, text)| json!({ "line": line, "text": text })).collect();
        let mut record = json!({
            "group": self.path.iter().map(|t| t.as_ref()).collect::<Vec<_>>(),
            "errors": errors,
            "errorCount": self.count,
        });
        if let (Some(opened), Some(title)) = (self.opened, self.path.last()) {
            record["title"] = json!(title.as_ref());
            record["from"] = json!(opened);
        }
        if let Some(closed) = self.closed {
            record["to"] = json!(closed);
        }
        record
    }
}

/// `GET …/runs/{runId}/failures`.
pub(crate) async fn failures(
    State(edge): State<Arc<LogEdge>>,
    Path((fqn, run)): Path<(String, String)>,
    query: Result<Query<FailuresQuery>, QueryRejection>,
) -> Result<Response, ApiError> {
    let Query(query) = query.map_err(|e| problem(StatusCode::BAD_REQUEST, e.body_text()))?;
    if query.from == Some(0) {
        return Err(problem(StatusCode::BAD_REQUEST, "from is a 1-based line number"));
    }
    let run = stored_run(&edge, &fqn, &run).await?;
    let from = query.from.unwrap_or(1) - 1;
    let to = run.info.lines;
    let stop = to.min(from.saturating_add(edge.options.max_search_scan_lines as u64));
    let (found, end, known) = collect(&edge, &run.key, from, stop).await?;
    let mut answer = Answer::new(answer_bytes(&edge, query.max_bytes));
    let mut next = (end < to).then_some(end + 1);
    for failing in &found {
        if !answer.push(&failing.record()) {
            // The answer stops at this group's first error line: the
            // groups before it are read again up to there, so that they
            // say nothing of the lines a continuation reports.
            let cut = failing.errors.first().map_or(end + 1, |(line, _)| *line);
            let (before, _, _) = collect(&edge, &run.key, from, cut - 1).await?;
            answer = Answer::new(answer_bytes(&edge, query.max_bytes));
            for earlier in &before {
                answer.push(&earlier.record());
            }
            next = Some(cut);
            break;
        }
    }
    let mut summary = summary(&run, next);
    if !known {
        // Groups opened before `from` are not known: their error lines
        // count as in no group (or in a group opened after `from`).
        summary["groupsKnown"] = json!(false);
    }
    Ok(answer.finish(&summary))
}

/// The failing groups of lines `[from, stop)` (offsets), in the order of
/// their first error, the offset the scan stopped at, and whether the
/// groups open at `from` were known.
async fn collect(edge: &LogEdge, key: &RunKey, from: u64, stop: u64) -> Result<(Vec<Failing>, u64, bool), ApiError> {
    let errors = Matcher::new(None, false, false, Some("error"), false)?;
    let before = groups_before(edge, key, from).await?;
    let known = before.is_some();
    let mut groups = before.unwrap_or_default();
    let mut found: Vec<Failing> = Vec::new();
    let end = scan(edge, key, from, stop, |at, line| {
        let number = at + 1;
        if let Change::Closed(closed) = groups.observe(number, line)
            && let Some(failing) = found.iter_mut().rev().find(|f| f.opened == Some(closed.line) && f.closed.is_none())
        {
            failing.closed = Some(number);
        }
        if !errors.is_match(line) {
            return true;
        }
        let opened = groups.innermost().map(|g| g.line);
        let index = match found.iter().rposition(|f| f.opened == opened && f.closed.is_none()) {
            Some(index) => index,
            None if found.len() >= MAX_FAILING_GROUPS => return false,
            None => {
                found.push(Failing { opened, closed: None, path: groups.path(), errors: Vec::new(), count: 0 });
                found.len() - 1
            }
        };
        let failing = &mut found[index];
        failing.count += 1;
        if failing.errors.len() < MAX_ERRORS_PER_GROUP {
            failing.errors.push((number, cut_at(&visible(line), MATCH_TEXT_BYTES).to_string()));
        }
        true
    })
    .await?;
    Ok((found, end, known))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_names_its_group_and_its_first_errors() {
        let failing = Failing {
            opened: Some(3),
            closed: Some(40),
            path: vec!["Build".into(), "Test".into()],
            errors: vec![(10, "error: a".into()), (30, "error: b".into())],
            count: 2,
        };
        assert_eq!(
            failing.record(),
            json!({"group": ["Build", "Test"], "title": "Test", "from": 3, "to": 40,
                   "errors": [{"line": 10, "text": "error: a"}, {"line": 30, "text": "error: b"}], "errorCount": 2})
        );
        let outside = Failing { opened: None, closed: None, path: vec![], errors: vec![(1, "fatal".into())], count: 1 };
        assert_eq!(outside.record(), json!({"group": [], "errors": [{"line": 1, "text": "fatal"}], "errorCount": 1}));
    }
}
