//! Bounded reads of one stored run for scripts and coding agents, as JSON
//! Lines (`application/x-ndjson`): one object per log line, then one
//! summary object.
//!
//! - `GET /api/v1/logs/{fqn}/runs/{runId}/lines`: a range (`from`, `to`,
//!   1-based and inclusive), the last lines (`tail=N`, up to `to`), or only
//!   matching lines (`q` with `regex`/`case`, or `level=error|warning`) with
//!   `before`/`after` lines of context;
//! - `GET /api/v1/logs/{fqn}/runs/{runId}/failures`: the groups that hold an
//!   error line, folded to their title and error lines (`failures.rs`).
//!
//! Every line carries its 1-based number and its group path (the titles of
//! the groups it is in, outermost first, by the viewer's rules, see
//! `groups.rs`). Every answer is bounded: at most `edge.max_answer_bytes`
//! of records (or `maxBytes`, if smaller), at most `edge.max_page_lines`
//! lines, at most `edge.max_search_scan_lines` lines scanned; the summary's
//! `next` is the `from` that continues where it stopped, so that following
//! `next` returns every line (and every match) exactly once.

use std::collections::VecDeque;
use std::sync::Arc;

use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::{Value, json};

use super::LogEdge;
use super::groups::Groups;
use super::incident::store_unavailable;
use super::problem::{ApiError, problem, run_key};
use super::search::{Matcher, SCAN_PAGE_BYTES, SCAN_PAGE_LINES, cut_at, flag, visible};
use crate::archive::{RunInfo, RunKey};

/// The most of one line an answer carries (longer lines are cut and marked
/// `"cut": true`).
pub(crate) const LINE_TEXT_BYTES: usize = 4096;
/// The most context lines asked for on either side of a match.
pub(crate) const MAX_CONTEXT_LINES: usize = 100;
/// The smallest `maxBytes` taken (a smaller one counts as this).
const MIN_ANSWER_BYTES: usize = 256;

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct LinesQuery {
    from: Option<u64>,
    to: Option<u64>,
    tail: Option<u64>,
    q: Option<String>,
    regex: Option<String>,
    case: Option<String>,
    level: Option<String>,
    before: Option<usize>,
    after: Option<usize>,
    max_bytes: Option<usize>,
    raw: Option<String>,
}

/// The run a read is about, with what the store says of it now.
pub(crate) struct Run {
    pub(crate) key: RunKey,
    pub(crate) info: RunInfo,
}

/// The run `fqn`/`run`, or 404 if the store has never seen it.
pub(crate) async fn stored_run(edge: &LogEdge, fqn: &str, run: &str) -> Result<Run, ApiError> {
    let key = run_key(fqn, run)?;
    let info = stored_info(edge, &key).await?;
    Ok(Run { key, info })
}

/// What the store holds of `key`, once this edge's own last write to it is
/// stored; 404 if the store has never seen it.
pub(crate) async fn stored_info(edge: &LogEdge, key: &RunKey) -> Result<RunInfo, ApiError> {
    edge.caught_up(key).await;
    edge.store
        .info(key)
        .await
        .map_err(store_unavailable)?
        .ok_or_else(|| problem(StatusCode::NOT_FOUND, format!("pipeline `{}` has no run `{}`", key.fqn(), key.run())))
}

/// What an answer may hold, in bytes of records.
pub(crate) fn answer_bytes(edge: &LogEdge, asked: Option<usize>) -> usize {
    let most = edge.options.max_answer_bytes;
    asked.map_or(most, |asked| asked.clamp(MIN_ANSWER_BYTES, most.max(MIN_ANSWER_BYTES)))
}

/// Calls `each` with every stored line `[from, end)` (0-based offsets) in
/// order, page by page, until it returns false. Returns the offset after
/// the last line `each` was given and accepted.
pub(crate) async fn scan(
    edge: &LogEdge,
    key: &RunKey,
    from: u64,
    end: u64,
    mut each: impl FnMut(u64, &str) -> bool,
) -> Result<u64, ApiError> {
    let mut at = from;
    while at < end {
        let want = usize::try_from(end - at).unwrap_or(usize::MAX).min(SCAN_PAGE_LINES);
        edge.count_read();
        let lines = edge.store.read(key, at, want, SCAN_PAGE_BYTES).await.map_err(store_unavailable)?;
        if lines.is_empty() {
            break;
        }
        for line in &lines {
            if !each(at, line) {
                return Ok(at);
            }
            at += 1;
        }
    }
    Ok(at)
}

/// The groups open before line offset `from`, read from the start of the
/// run; `None` when that is more than `edge.max_search_scan_lines` lines
/// (the answer then carries no group paths).
pub(crate) async fn groups_before(edge: &LogEdge, key: &RunKey, from: u64) -> Result<Option<Groups>, ApiError> {
    if from > edge.options.max_search_scan_lines as u64 {
        return Ok(None);
    }
    let mut groups = Groups::default();
    scan(edge, key, 0, from, |at, line| {
        groups.observe(at + 1, line);
        true
    })
    .await?;
    Ok(Some(groups))
}

/// An answer being built: records up to a byte budget, then the summary.
pub(crate) struct Answer {
    body: Vec<u8>,
    budget: usize,
    records: usize,
}

impl Answer {
    pub(crate) fn new(budget: usize) -> Self {
        Answer { body: Vec::new(), budget, records: 0 }
    }

    /// Adds `record` unless it would pass the budget (the first record is
    /// always taken, so that following `next` always moves on).
    pub(crate) fn push(&mut self, record: &Value) -> bool {
        self.push_all(std::slice::from_ref(record))
    }

    /// Adds all of `records`, or none if they would pass the budget
    /// together (into an empty answer they always go).
    pub(crate) fn push_all(&mut self, records: &[Value]) -> bool {
        let texts: Vec<String> = records.iter().map(Value::to_string).collect();
        let bytes: usize = texts.iter().map(|t| t.len() + 1).sum();
        if self.records > 0 && self.body.len() + bytes > self.budget {
            return false;
        }
        for text in texts {
            self.push_text(text);
        }
        true
    }

    fn push_text(&mut self, text: String) {
        self.body.extend_from_slice(text.as_bytes());
        self.body.push(b'\n');
        self.records += 1;
    }

    /// The answer, ended by `summary`.
    pub(crate) fn finish(mut self, summary: &Value) -> Response {
        self.body.extend_from_slice(summary.to_string().as_bytes());
        self.body.push(b'\n');
        ([(header::CONTENT_TYPE, "application/x-ndjson")], self.body).into_response()
    }
}

/// One line's record: `{"line", "text", "group"?, "cut"?, "match"?}`.
pub(crate) fn line_record(number: u64, line: &str, raw: bool, groups: Option<&Groups>) -> Value {
    let shown = if raw { std::borrow::Cow::Borrowed(line) } else { visible(line) };
    let text = cut_at(&shown, LINE_TEXT_BYTES);
    let mut record = json!({ "line": number, "text": text });
    if text.len() < shown.len() {
        record["cut"] = json!(true);
    }
    if let Some(path) = groups.map(Groups::path).filter(|path| !path.is_empty()) {
        record["group"] = json!(path.iter().map(|t| t.as_ref()).collect::<Vec<_>>());
    }
    record
}

/// The summary every answer ends with: `{"total", "state", "next"?}`.
pub(crate) fn summary(run: &Run, next: Option<u64>) -> Value {
    let mut summary = json!({ "total": run.info.lines, "state": run.info.state });
    if let Some(next) = next {
        summary["next"] = json!(next.to_string());
    }
    summary
}

/// Says in `summary` when the group paths are not known (a read that
/// starts more than `edge.max_search_scan_lines` into the run).
pub(crate) fn unknown_groups(summary: &mut Value, groups: &Option<Groups>) {
    if groups.is_none() {
        summary["groupsKnown"] = json!(false);
    }
}

fn bad(message: impl Into<String>) -> ApiError {
    problem(StatusCode::BAD_REQUEST, message)
}

/// `GET …/runs/{runId}/lines`.
pub(crate) async fn lines(
    State(edge): State<Arc<LogEdge>>,
    Path((fqn, run)): Path<(String, String)>,
    query: Result<Query<LinesQuery>, QueryRejection>,
) -> Result<Response, ApiError> {
    let Query(query) = query.map_err(|e| bad(e.body_text()))?;
    let filter = match (&query.q, &query.level) {
        (None, None) => None,
        (q, level) => Some(Matcher::new(q.as_deref(), flag(&query.regex), flag(&query.case), level.as_deref(), false)?),
    };
    if query.from == Some(0) || query.to == Some(0) {
        return Err(bad("from and to are 1-based line numbers"));
    }
    if query.tail.is_some() && query.from.is_some() {
        return Err(bad("give from or tail, not both"));
    }
    if query.tail.is_some() && filter.is_some() {
        return Err(bad("tail reads the last lines: give it without q or level"));
    }
    let context = (query.before.unwrap_or(0), query.after.unwrap_or(0));
    if context.0.max(context.1) > MAX_CONTEXT_LINES {
        return Err(bad(format!("before and after are at most {MAX_CONTEXT_LINES} lines")));
    }
    if filter.is_none() && (query.before.is_some() || query.after.is_some()) {
        return Err(bad("before and after are context for q or level"));
    }
    let run = stored_run(&edge, &fqn, &run).await?;
    let read = Read {
        edge: &edge,
        run: &run,
        raw: flag(&query.raw),
        answer: Answer::new(answer_bytes(&edge, query.max_bytes)),
        most_lines: edge.options.max_page_lines,
    };
    let to = query.to.unwrap_or(u64::MAX).min(run.info.lines);
    match (query.tail, filter) {
        (Some(tail), _) => read.tail(tail.min(edge.options.max_page_lines as u64), to).await,
        (None, None) => read.range(query.from.unwrap_or(1) - 1, to).await,
        (None, Some(filter)) => read.matches(query.from.unwrap_or(1) - 1, to, &filter, context).await,
    }
}

struct Read<'a> {
    edge: &'a LogEdge,
    run: &'a Run,
    raw: bool,
    answer: Answer,
    most_lines: usize,
}

impl Read<'_> {
    /// Lines `[from, to)` (offsets).
    async fn range(mut self, from: u64, to: u64) -> Result<Response, ApiError> {
        let mut groups = groups_before(self.edge, &self.run.key, from).await?;
        let stop = to.min(from.saturating_add(self.most_lines as u64));
        let answer = &mut self.answer;
        let end = scan(self.edge, &self.run.key, from, stop, |at, line| {
            if let Some(groups) = groups.as_mut() {
                groups.observe(at + 1, line);
            }
            answer.push(&line_record(at + 1, line, self.raw, groups.as_ref()))
        })
        .await?;
        let next = (end < to).then_some(end + 1);
        let mut summary = summary(self.run, next);
        unknown_groups(&mut summary, &groups);
        Ok(self.answer.finish(&summary))
    }

    /// The last `count` lines up to offset `to`: the newest that fit.
    async fn tail(self, count: u64, to: u64) -> Result<Response, ApiError> {
        let from = to.saturating_sub(count);
        let mut groups = groups_before(self.edge, &self.run.key, from).await?;
        let mut records: VecDeque<(u64, String)> = VecDeque::new();
        let mut bytes = 0;
        let budget = self.answer.budget;
        scan(self.edge, &self.run.key, from, to, |at, line| {
            if let Some(groups) = groups.as_mut() {
                groups.observe(at + 1, line);
            }
            let text = line_record(at + 1, line, self.raw, groups.as_ref()).to_string();
            bytes += text.len() + 1;
            records.push_back((at + 1, text));
            // The oldest go first: a tail keeps the newest lines.
            while bytes > budget && records.len() > 1 {
                if let Some((_, old)) = records.pop_front() {
                    bytes -= old.len() + 1;
                }
            }
            true
        })
        .await?;
        let first = records.front().map_or(to + 1, |(number, _)| *number);
        let mut answer = self.answer;
        for (_, text) in records {
            answer.push_text(text);
        }
        let mut summary = summary(self.run, None);
        unknown_groups(&mut summary, &groups);
        // Lines of the asked tail left out: ask `tail` again up to `prev`.
        if first > from + 1 {
            summary["prev"] = json!((first - 1).to_string());
        }
        Ok(answer.finish(&summary))
    }

    /// The lines `filter` matches in `[from, to)`, each with up to
    /// `context` lines before and after it, each line once. A match goes
    /// out with its context as one block (matches whose contexts meet make
    /// one block): a block that does not fit is left whole to the next
    /// answer, which starts at its first line.
    async fn matches(
        mut self,
        from: u64,
        to: u64,
        filter: &Matcher,
        (before, after): (usize, usize),
    ) -> Result<Response, ApiError> {
        let mut groups = groups_before(self.edge, &self.run.key, from).await?;
        let stop = to.min(from.saturating_add(self.edge.options.max_search_scan_lines as u64));
        let mut blocks = Blocks {
            answer: &mut self.answer,
            most: self.most_lines,
            recent: VecDeque::with_capacity(before),
            block: Vec::new(),
            block_bytes: 0,
            trailing: 0,
            taken: 0,
            next: None,
        };
        let end = scan(self.edge, &self.run.key, from, stop, |at, line| {
            if let Some(groups) = groups.as_mut() {
                groups.observe(at + 1, line);
            }
            let mut record = line_record(at + 1, line, self.raw, groups.as_ref());
            if filter.is_match(line) {
                record["match"] = json!(true);
                if blocks.block.is_empty() {
                    while let Some(context) = blocks.recent.pop_front() {
                        blocks.add(context);
                    }
                }
                blocks.add(record);
                blocks.trailing = after;
            } else if !blocks.block.is_empty() {
                blocks.add(record);
                blocks.trailing = blocks.trailing.saturating_sub(1);
            } else {
                if blocks.recent.len() == before {
                    blocks.recent.pop_front();
                }
                if before > 0 {
                    blocks.recent.push_back(record);
                }
                return true;
            }
            if blocks.trailing == 0 || blocks.oversized() { blocks.flush() } else { true }
        })
        .await?;
        let next = match blocks.next {
            Some(next) => Some(next),
            // The scan bound cut a block short of its context: the next
            // answer starts at it (unless it started this one).
            None if end < to && blocks.block.first().is_some_and(|r| r["line"].as_u64() > Some(from + 1)) => {
                blocks.block.first().and_then(|r| r["line"].as_u64())
            }
            None => {
                blocks.flush();
                blocks.next.or((end < to).then_some(end + 1))
            }
        };
        let mut summary = summary(self.run, next);
        unknown_groups(&mut summary, &groups);
        summary["scanned"] = json!(end - from.min(end));
        Ok(self.answer.finish(&summary))
    }
}

/// Matches and their context, gathered into blocks that go out whole.
struct Blocks<'a> {
    answer: &'a mut Answer,
    most: usize,
    /// Lines that may still be context before the next match.
    recent: VecDeque<Value>,
    /// The block being gathered: context, matches, context.
    block: Vec<Value>,
    /// Its size as sent.
    block_bytes: usize,
    /// Context lines still owed after the block's last match.
    trailing: usize,
    /// Lines sent.
    taken: usize,
    /// Where the next answer starts, once this one is full.
    next: Option<u64>,
}

impl Blocks<'_> {
    fn add(&mut self, record: Value) {
        self.block_bytes += record.to_string().len() + 1;
        self.block.push(record);
    }

    /// A block that could never go out whole (every line matches).
    fn oversized(&self) -> bool {
        self.block.len() >= self.most || self.block_bytes >= self.answer.budget
    }

    /// Sends the block; whether the scan goes on.
    fn flush(&mut self) -> bool {
        if self.block.is_empty() {
            return true;
        }
        let number = |record: &Value| record["line"].as_u64().unwrap_or(0);
        let (first, last) = (number(&self.block[0]), number(&self.block[self.block.len() - 1]));
        if self.taken + self.block.len() <= self.most && self.answer.push_all(&self.block) {
            self.taken += self.block.len();
            self.block.clear();
            self.block_bytes = 0;
            if self.taken >= self.most {
                self.next = Some(last + 1);
                return false;
            }
            return true;
        }
        if self.taken > 0 {
            self.next = Some(first);
            return false;
        }
        // Alone in the answer and still too big: as much as fits.
        let mut sent = 0;
        for record in &self.block {
            if sent >= self.most || !self.answer.push(record) {
                break;
            }
            sent += 1;
        }
        self.next = Some(self.block.get(sent).map_or(last + 1, number));
        false
    }
}
