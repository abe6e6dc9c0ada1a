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

use anyhow::{Context, bail};
use serde::Deserialize;

use super::produce::{RunTarget, enc};

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

#[derive(Deserialize)]
struct Answer {
    run: String,
    against: String,
    identical: bool,
    hunks: Vec<Hunk>,
    next: Option<String>,
    #[serde(default)]
    approximate: bool,
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
    let client = args.target.client()?;
    let mut after: Option<String> = None;
    loop {
        let mut path =
            format!("/api/v1/logs/{{fqn}}/runs/{{run}}/diff?against={}&context={}", enc(&args.against), args.context);
        if let Some(after) = &after {
            path.push_str(&format!("&after={}", enc(after)));
        }
        let response = args
            .target
            .request(&client, reqwest::Method::GET, &path)
            .send()
            .await
            .with_context(|| format!("cannot reach the edge at {}", args.target.url))?;
        let status = response.status();
        if !status.is_success() {
            let text = response.text().await.unwrap_or_default();
            let message = serde_json::from_str::<serde_json::Value>(&text)
                .ok()
                .and_then(|v| v["message"].as_str().map(str::to_string))
                .unwrap_or(text);
            bail!("{status}: {}", message.trim());
        }
        let answer: Answer = response.json().await.context("the edge's answer is not a diff")?;
        if after.is_none() {
            if answer.identical {
                return Ok(false);
            }
            if answer.approximate {
                eprintln!("the runs differ too much for the smallest diff in time: this one is correct but longer");
            }
            writeln!(out, "--- {}/{}", args.target.fqn, answer.against)?;
            writeln!(out, "+++ {}/{}", args.target.fqn, answer.run)?;
        }
        for hunk in &answer.hunks {
            writeln!(out, "@@ -{} +{} @@", range(hunk.old), range(hunk.new))?;
            for line in &hunk.lines {
                writeln!(out, "{}{}", line.op, line.text)?;
            }
        }
        out.flush().context("writing to standard output")?;
        match answer.next {
            Some(next) => after = Some(next),
            None => return Ok(true),
        }
    }
}

/// A hunk's range as a unified diff writes it: `start`, or `start,count`
/// unless the count is 1.
fn range([start, count]: [u64; 2]) -> String {
    if count == 1 { start.to_string() } else { format!("{start},{count}") }
}
