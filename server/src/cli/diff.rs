//! `tailrace diff --fqn F --run R [--against last-success|RUN] [--context N]`:
//! what changed in a run against another run of its pipeline (by default
//! the newest successful one created before it), as a unified diff on
//! standard output. The edge compares the runs after its normalisation
//! rules (timestamps, durations, ids and hashes, temporary paths and ports
//! compare equal: `docs/viewer.md`); the lines shown are the stored ones
//! (cut at 1 KiB), context lines the new run's. It follows the answer's
//! `next` until every hunk is printed. Exits 0 when the runs are the same,
//! 1 when they differ, 2 on an error (said on standard error).

use std::io::Write;

use anyhow::Context;
use serde::Deserialize;

use super::client::{Reader, RunTarget, run_path};

/// Options of `tailrace diff`.
#[derive(clap::Args, Debug)]
pub struct DiffArgs {
    #[command(flatten)]
    target: RunTarget,
    /// The run to compare with: `last-success` (the newest run of the
    /// pipeline in state success created before this one) or a run id.
    #[arg(long, default_value = "last-success")]
    against: String,
    /// Equal lines shown around each change (at most 100).
    #[arg(long, default_value_t = 3)]
    context: usize,
}

/// One answer of `…/diff`.
#[derive(Deserialize)]
pub struct Answer {
    pub run: String,
    pub against: String,
    pub identical: bool,
    hunks: Vec<Hunk>,
    pub next: Option<String>,
    #[serde(default)]
    pub approximate: bool,
}

#[derive(Deserialize)]
struct Hunk {
    old: [u64; 2],
    new: [u64; 2],
    lines: Vec<Line>,
}

#[derive(Deserialize)]
struct Line {
    op: String,
    text: String,
    /// Its number in the new run (context and added lines).
    #[serde(default)]
    new: Option<u64>,
    /// Its number in the old run (context and removed lines).
    #[serde(default)]
    old: Option<u64>,
}

/// What [`Answer::write_hunks`] wrote.
pub struct Written {
    /// Hunks written whole.
    pub hunks: usize,
    /// Where a hunk too large for the bound was cut: the old and new run's
    /// line numbers of its first line left out.
    pub cut: Option<(Option<u64>, Option<u64>)>,
}

/// Runs the command; the process's exit code.
pub async fn run(args: DiffArgs) -> u8 {
    match diff(&args, &mut std::io::stdout().lock()).await {
        Ok(false) => 0,
        Ok(true) => 1,
        Err(error) => {
            eprintln!("Error: {error:#}");
            2
        }
    }
}

/// Prints the diff; whether the runs differ.
async fn diff(args: &DiffArgs, out: &mut impl Write) -> anyhow::Result<bool> {
    let reader = Reader::new(args.target.edge.clone())?;
    let path = run_path("/api/v1/logs/{fqn}/runs/{run}/diff", &args.target.fqn, &args.target.run);
    let mut after: Option<String> = None;
    loop {
        let mut query = vec![("against", args.against.clone()), ("context", args.context.to_string())];
        query.extend(after.take().map(|after| ("after", after)));
        let first = query.len() == 2;
        let answer = reader.json(&path, &query).await?;
        let answer: Answer = serde_json::from_value(answer).context("the edge's answer is not a diff")?;
        if first {
            if answer.identical {
                return Ok(false);
            }
            if answer.approximate {
                eprintln!("the runs differ too much for the smallest diff in time: this one is correct but longer");
            }
            writeln!(out, "--- {}/{}", args.target.fqn, answer.against)?;
            writeln!(out, "+++ {}/{}", args.target.fqn, answer.run)?;
        }
        answer.write_hunks(out, usize::MAX)?;
        out.flush().context("writing to standard output")?;
        match answer.next {
            Some(next) => after = Some(next),
            None => return Ok(true),
        }
    }
}

impl Answer {
    /// Hunks in this answer.
    pub fn hunk_count(&self) -> usize {
        self.hunks.len()
    }

    /// Writes the hunks in unified form, no more than `max_bytes` of
    /// them: hunks that do not fit are left out, and a first hunk larger
    /// than the bound is cut (the bound is on what is written, always at
    /// least one line).
    pub fn write_hunks(&self, out: &mut impl Write, max_bytes: usize) -> std::io::Result<Written> {
        let mut written = 0;
        for (i, hunk) in self.hunks.iter().enumerate() {
            let head = format!("@@ -{} +{} @@\n", range(hunk.old), range(hunk.new));
            let size = head.len() + hunk.lines.iter().map(|l| l.op.len() + l.text.len() + 1).sum::<usize>();
            if written + size > max_bytes && i > 0 {
                return Ok(Written { hunks: i, cut: None });
            }
            out.write_all(head.as_bytes())?;
            written += head.len();
            for (j, line) in hunk.lines.iter().enumerate() {
                let text = format!("{}{}\n", line.op, line.text);
                if written + text.len() > max_bytes && j > 0 {
                    return Ok(Written { hunks: i, cut: Some((line.old, line.new)) });
                }
                written += text.len();
                out.write_all(text.as_bytes())?;
            }
        }
        Ok(Written { hunks: self.hunks.len(), cut: None })
    }
}

/// A hunk's range as a unified diff writes it: `start`, or `start,count`
/// unless the count is 1.
fn range([start, count]: [u64; 2]) -> String {
    if count == 1 { start.to_string() } else { format!("{start},{count}") }
}
