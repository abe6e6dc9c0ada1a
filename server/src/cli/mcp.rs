//! `tailrace mcp`: a Model Context Protocol server over standard input and
//! output, so that a coding agent can read pipeline logs. Its tools call a
//! running edge's read endpoints (`--url`, `--token`), never the store
//! itself: list pipelines and runs, a run's status, the last lines, a
//! range, a search (or the errors) with context, the failing groups, and a
//! comparison with another run. Every answer is bounded (`--max-bytes`, and
//! the edge's own bounds) and says how to get more: the JSON Lines reads
//! end with the edge's summary, whose `next` is the `from` to call again
//! with.

use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::{ServerHandler, ServiceExt, tool, tool_handler, tool_router};
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::Value;

use super::client::{EdgeTarget, Reader, enc, run_path};
use super::diff::Answer as Diff;

/// Options of `tailrace mcp`.
#[derive(clap::Args, Debug)]
pub struct McpArgs {
    #[command(flatten)]
    edge: EdgeTarget,
    /// Bytes of log records per tool answer at most (the edge caps it at
    /// `edge.max_answer_bytes`).
    #[arg(long, default_value_t = 16 * 1024)]
    max_bytes: usize,
}

/// Serves MCP on standard input and output until the client closes them.
pub async fn run(args: McpArgs) -> anyhow::Result<()> {
    let server = Logs {
        reader: std::sync::Arc::new(Reader::new(args.edge)?),
        max_bytes: args.max_bytes,
        tool_router: Logs::tool_router(),
    };
    let service = server.serve(rmcp::transport::stdio()).await?;
    service.waiting().await?;
    Ok(())
}

#[derive(Clone)]
struct Logs {
    reader: std::sync::Arc<Reader>,
    max_bytes: usize,
    tool_router: ToolRouter<Self>,
}

#[derive(Deserialize, JsonSchema)]
struct Pipeline {
    /// The pipeline's fully qualified name.
    pipeline: String,
    /// Runs to list at most (newest first; default 20).
    limit: Option<usize>,
}

#[derive(Deserialize, JsonSchema)]
struct RunId {
    /// The pipeline's fully qualified name.
    pipeline: String,
    /// The run id.
    run: String,
}

#[derive(Deserialize, JsonSchema)]
struct Tail {
    /// The pipeline's fully qualified name.
    pipeline: String,
    /// The run id.
    run: String,
    /// How many of the last lines (default 100).
    lines: Option<u64>,
    /// The last line to end at (1-based; default the run's last): to read
    /// further back, give the summary's `prev`.
    to: Option<u64>,
}

#[derive(Deserialize, JsonSchema)]
struct Range {
    /// The pipeline's fully qualified name.
    pipeline: String,
    /// The run id.
    run: String,
    /// The first line (1-based).
    from: u64,
    /// The last line (1-based, included; default the run's last).
    to: Option<u64>,
}

#[derive(Deserialize, JsonSchema)]
struct Search {
    /// The pipeline's fully qualified name.
    pipeline: String,
    /// The run id.
    run: String,
    /// Text to look for (case ignored); leave out with `errors_only`.
    query: Option<String>,
    /// `query` is a regular expression (Rust syntax).
    regex: Option<bool>,
    /// Only the lines that look like errors, instead of `query`.
    errors_only: Option<bool>,
    /// Lines of context before each match (at most 100).
    before: Option<usize>,
    /// Lines of context after each match (at most 100).
    after: Option<usize>,
    /// Where to start (1-based): the summary's `next` of the last call.
    from: Option<u64>,
}

#[derive(Deserialize, JsonSchema)]
struct Failures {
    /// The pipeline's fully qualified name.
    pipeline: String,
    /// The run id.
    run: String,
    /// Where to start (1-based): the summary's `next` of the last call.
    from: Option<u64>,
}

#[derive(Deserialize, JsonSchema)]
struct Compare {
    /// The pipeline's fully qualified name.
    pipeline: String,
    /// The run id.
    run: String,
    /// The run to compare with (default: the last successful run before it).
    against: Option<String>,
    /// Where to go on: the `next` of the last call.
    after: Option<String>,
}

type Answer = Result<String, String>;

#[tool_router]
impl Logs {
    #[tool(description = "List the pipelines that have stored runs.")]
    async fn list_pipelines(&self) -> Answer {
        let answer = self.reader.json("/api/v1/logs/pipelines", &[]).await.map_err(|e| format!("{e:#}"))?;
        Ok(self.bounded_json(answer))
    }

    #[tool(description = "List a pipeline's runs, newest first, with their state and line count.")]
    async fn list_runs(&self, Parameters(args): Parameters<Pipeline>) -> Answer {
        let path = format!("/api/v1/logs/{}/runs", enc(&args.pipeline));
        let mut answer = self.reader.json(&path, &[]).await.map_err(|e| format!("{e:#}"))?;
        if let Some(runs) = answer["runs"].as_array_mut() {
            runs.truncate(args.limit.unwrap_or(20));
        }
        Ok(self.bounded_json(answer))
    }

    #[tool(description = "A run's status: state (running, success, failed…), lines, bytes, start and last update.")]
    async fn run_status(&self, Parameters(args): Parameters<RunId>) -> Answer {
        let path = run_path("/api/v1/logs/{fqn}/runs/{run}", &args.pipeline, &args.run);
        self.reader.json(&path, &[]).await.map(|v| v.to_string()).map_err(|e| format!("{e:#}"))
    }

    #[tool(description = "The last lines of a run, as JSON Lines ({line, text, group}) and a summary.")]
    async fn tail(&self, Parameters(args): Parameters<Tail>) -> Answer {
        let mut query = vec![("tail", args.lines.unwrap_or(100).to_string())];
        query.extend(args.to.map(|to| ("to", to.to_string())));
        self.lines(&args.pipeline, &args.run, "lines", query).await
    }

    #[tool(description = "Lines `from`..`to` of a run (1-based), as JSON Lines and a summary whose `next` continues.")]
    async fn read_range(&self, Parameters(args): Parameters<Range>) -> Answer {
        let mut query = vec![("from", args.from.max(1).to_string())];
        query.extend(args.to.map(|to| ("to", to.to_string())));
        self.lines(&args.pipeline, &args.run, "lines", query).await
    }

    #[tool(description = "The lines of a run that hold `query` (or, with `errors_only`, that look like errors), \
                          with context; `match: true` marks the matching lines; the summary's `next` continues.")]
    async fn search(&self, Parameters(args): Parameters<Search>) -> Answer {
        let mut query = Vec::new();
        match (args.query, args.errors_only.unwrap_or(false)) {
            (Some(text), false) => query.push(("q", text)),
            (None, true) => query.push(("level", "error".to_string())),
            _ => return Err("give either `query` or `errors_only: true`".into()),
        }
        if args.regex.unwrap_or(false) {
            query.push(("regex", "1".into()));
        }
        query.extend(args.before.map(|n| ("before", n.to_string())));
        query.extend(args.after.map(|n| ("after", n.to_string())));
        query.extend(args.from.map(|n| ("from", n.to_string())));
        self.lines(&args.pipeline, &args.run, "lines", query).await
    }

    #[tool(description = "What failed in a run: each group (step) that holds an error line, with its title, \
                          its line span and its first error lines.")]
    async fn failing_groups(&self, Parameters(args): Parameters<Failures>) -> Answer {
        let query = args.from.map(|n| ("from", n.to_string())).into_iter().collect();
        self.lines(&args.pipeline, &args.run, "failures", query).await
    }

    #[tool(description = "Compare a run with another (by default the last successful one): the lines added and \
                          removed after normalising timestamps, durations, ids and temporary paths, as a unified diff.")]
    async fn diff(&self, Parameters(args): Parameters<Compare>) -> Answer {
        let path = run_path("/api/v1/logs/{fqn}/runs/{run}/diff", &args.pipeline, &args.run);
        let mut query = vec![("against", args.against.unwrap_or_else(|| "last-success".into()))];
        let start = args.after.as_deref().and_then(|a| a.parse().ok()).unwrap_or(0);
        query.extend(args.after.map(|after| ("after", after)));
        let answer = self.reader.json(&path, &query).await.map_err(|e| format!("{e:#}"))?;
        unified(answer, self.max_bytes, start)
    }
}

impl Logs {
    /// A JSON Lines read of `…/runs/{run}/{endpoint}`, as the edge answered.
    async fn lines(&self, fqn: &str, run: &str, endpoint: &str, mut query: Vec<(&str, String)>) -> Answer {
        let path = run_path(&format!("/api/v1/logs/{{fqn}}/runs/{{run}}/{endpoint}"), fqn, run);
        query.push(("maxBytes", self.max_bytes.to_string()));
        let (records, summary) = self.reader.json_lines(&path, &query).await.map_err(|e| format!("{e:#}"))?;
        let mut text = String::new();
        for record in records.iter().chain(std::iter::once(&summary)) {
            text.push_str(&record.to_string());
            text.push('\n');
        }
        Ok(text)
    }

    /// `answer` as JSON, its lists cut to fit `max_bytes` (and said so).
    fn bounded_json(&self, mut answer: Value) -> String {
        loop {
            let text = answer.to_string();
            if text.len() <= self.max_bytes {
                return text;
            }
            let Some(list) = answer.as_object_mut().and_then(|o| o.values_mut().find_map(Value::as_array_mut)) else {
                return text;
            };
            let keep = list.len() / 2;
            list.truncate(keep);
            answer["cut"] = Value::Bool(true);
        }
    }
}

#[tool_handler(
    router = self.tool_router,
    name = "tailrace",
    instructions = "Reads CI pipeline logs stored by a tailrace edge. Start with failing_groups or tail on a \
                    failed run; use search with context to look further, diff to see what changed since the \
                    last success. Line numbers are 1-based; every answer is bounded, and a summary's `next` \
                    is the `from` to call again with."
)]
impl ServerHandler for Logs {}

/// A diff answer (`…/diff`, asked from hunk `start`) as a unified diff, at
/// most `max_bytes` of hunks; what follows says how to go on.
fn unified(answer: Value, max_bytes: usize, start: u64) -> Result<String, String> {
    let answer: Diff = serde_json::from_value(answer).map_err(|e| format!("the edge's answer is not a diff: {e}"))?;
    let mut out = format!("--- {}\n+++ {}\n", answer.against, answer.run).into_bytes();
    if answer.identical {
        out.extend_from_slice(b"(no difference after normalising)\n");
    }
    let budget = max_bytes.saturating_sub(out.len());
    let written = answer.write_hunks(&mut out, budget).map_err(|e| e.to_string())?;
    if let Some((old, new)) = written.cut {
        let at = |run: &str, line: Option<u64>| line.map(|l| format!(" {run} from line {l}")).unwrap_or_default();
        let rest = format!("{}{}", at(&answer.against, old), at(&answer.run, new));
        out.extend_from_slice(format!("(this hunk is cut here: read the rest with read_range:{rest})\n").as_bytes());
    }
    // Hunks dealt with (a cut one too: its rest is read with read_range).
    let done = written.hunks + usize::from(written.cut.is_some());
    let next = if done < answer.hunk_count() { Some((start + done as u64).to_string()) } else { answer.next.clone() };
    if let Some(next) = next {
        out.extend_from_slice(format!("(more hunks: call again with after = \"{next}\")\n").as_bytes());
    }
    String::from_utf8(out).map_err(|e| e.to_string())
}
