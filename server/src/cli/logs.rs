//! `tailrace logs --fqn F --run R …`: reads a stored run as a script or a
//! coding agent wants it, through the edge's JSON Lines reads (`…/lines`,
//! `…/failures`): a range, the last lines, matches with context, the error
//! lines, or the failing groups. Text by default (grep's shape: `N:` for a
//! match, `N-` for context, `--` between blocks), the edge's records with
//! `--json`. One bounded answer unless `--all`; what was left says how to
//! go on, on standard error.

use std::io::Write;

use anyhow::bail;
use serde_json::Value;

use super::client::{Reader, RunTarget, run_path};

/// Options of `tailrace logs`.
#[derive(clap::Args, Debug)]
pub struct LogsArgs {
    #[command(flatten)]
    target: RunTarget,
    /// The first line (1-based).
    #[arg(long)]
    from: Option<u64>,
    /// The last line (1-based, included).
    #[arg(long)]
    to: Option<u64>,
    /// The last N lines (up to `--to`).
    #[arg(long, conflicts_with_all = ["from", "grep", "errors", "failures"])]
    tail: Option<u64>,
    /// Only lines that hold this text (ignoring case unless `--case`).
    #[arg(long, conflicts_with = "errors")]
    grep: Option<String>,
    /// `--grep` is a regular expression.
    #[arg(long, requires = "grep")]
    regex: bool,
    /// `--grep` minds case.
    #[arg(long, requires = "grep")]
    case: bool,
    /// Only the lines that look like errors (the viewer's rule).
    #[arg(long)]
    errors: bool,
    /// Lines of context before each match.
    #[arg(short = 'B', long, default_value_t = 0)]
    before: usize,
    /// Lines of context after each match.
    #[arg(short = 'A', long, default_value_t = 0)]
    after: usize,
    /// The groups that hold an error line, folded to their titles and
    /// error lines.
    #[arg(long, conflicts_with_all = ["grep", "errors", "to"])]
    failures: bool,
    /// The edge's JSON Lines records (and its summary, last) instead of text.
    #[arg(long)]
    json: bool,
    /// Bytes of records per answer at most (the edge caps it at
    /// `edge.max_answer_bytes`).
    #[arg(long)]
    max_bytes: Option<usize>,
    /// Every answer to the end, not just the first.
    #[arg(long, conflicts_with = "tail")]
    all: bool,
}

/// Runs the command; whether it found anything (a filter that found
/// nothing exits 1, like grep).
pub async fn run(args: LogsArgs) -> anyhow::Result<u8> {
    let reader = Reader::new(args.target.edge.clone())?;
    let filtering = args.grep.is_some() || args.errors || args.failures;
    if !filtering && (args.before > 0 || args.after > 0) {
        bail!("--before and --after are context for --grep or --errors");
    }
    let endpoint = if args.failures { "failures" } else { "lines" };
    let path = run_path(&format!("/api/v1/logs/{{fqn}}/runs/{{run}}/{endpoint}"), &args.target.fqn, &args.target.run);
    let mut from = args.from;
    let mut out = std::io::stdout().lock();
    let mut found = 0usize;
    let mut last_line = None;
    loop {
        let (records, summary) = reader.json_lines(&path, &query(&args, from)).await?;
        found += records.len();
        for record in &records {
            if args.json {
                writeln!(out, "{record}")?;
            } else if args.failures {
                print_failure(&mut out, record)?;
            } else {
                let line = record["line"].as_u64().unwrap_or(0);
                if filtering && last_line.is_some_and(|last| line > last + 1) {
                    writeln!(out, "--")?;
                }
                last_line = Some(line);
                print_line(&mut out, record, filtering)?;
            }
        }
        let next = summary["next"].as_str().and_then(|n| n.parse::<u64>().ok());
        if args.json && (!args.all || next.is_none()) {
            writeln!(out, "{summary}")?;
        }
        match next {
            Some(next) if args.all => from = Some(next),
            Some(next) => {
                eprintln!("(more from line {next}: add --from {next}, or --all)");
                break;
            }
            None => {
                if let Some(prev) = summary["prev"].as_str() {
                    eprintln!("(earlier lines end at line {prev}: add --to {prev})");
                }
                break;
            }
        }
    }
    out.flush()?;
    Ok(if filtering && found == 0 { 1 } else { 0 })
}

fn query(args: &LogsArgs, from: Option<u64>) -> Vec<(&'static str, String)> {
    let mut query = Vec::new();
    let mut put = |key: &'static str, value: Option<String>| {
        if let Some(value) = value {
            query.push((key, value));
        }
    };
    put("from", from.map(|n| n.to_string()));
    put("maxBytes", args.max_bytes.map(|n| n.to_string()));
    if args.failures {
        return query;
    }
    put("to", args.to.map(|n| n.to_string()));
    put("tail", args.tail.map(|n| n.to_string()));
    put("q", args.grep.clone());
    put("regex", args.regex.then(|| "1".into()));
    put("case", args.case.then(|| "1".into()));
    put("level", args.errors.then(|| "error".into()));
    put("before", (args.before > 0).then(|| args.before.to_string()));
    put("after", (args.after > 0).then(|| args.after.to_string()));
    query
}

fn print_line(out: &mut impl Write, record: &Value, filtering: bool) -> std::io::Result<()> {
    let line = record["line"].as_u64().unwrap_or(0);
    let text = record["text"].as_str().unwrap_or("");
    let mark = match (filtering, record["match"] == Value::Bool(true)) {
        (false, _) => ' ',
        (true, true) => ':',
        (true, false) => '-',
    };
    writeln!(out, "{line:>6}{mark} {text}")
}

fn print_failure(out: &mut impl Write, record: &Value) -> std::io::Result<()> {
    let path: Vec<&str> =
        record["group"].as_array().map_or(Vec::new(), |g| g.iter().filter_map(Value::as_str).collect());
    let count = record["errorCount"].as_u64().unwrap_or(0);
    let plural = if count == 1 { "error" } else { "errors" };
    let place = match (path.is_empty(), record["from"].as_u64(), record["to"].as_u64()) {
        (true, _, _) => "outside any group".to_string(),
        (false, Some(from), Some(to)) => format!("{} (lines {from}-{to})", path.join(" > ")),
        (false, Some(from), None) => format!("{} (from line {from}, still open)", path.join(" > ")),
        (false, None, _) => path.join(" > "),
    };
    writeln!(out, "{place}: {count} {plural}")?;
    for error in record["errors"].as_array().into_iter().flatten() {
        let line = error["line"].as_u64().unwrap_or(0);
        writeln!(out, "{line:>6}: {}", error["text"].as_str().unwrap_or(""))?;
    }
    Ok(())
}
