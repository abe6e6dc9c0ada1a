//! `tailrace tail --fqn F --run R`: follows a run's log from the terminal.
//!
//! It keeps the cursor of the last chunk; when the connection closes
//! without `complete` it reconnects with `?after=<cursor>` after a capped
//! exponential backoff with jitter, and gives up after `--max-failures`
//! failures in a row. A truncation notice clears the screen (the replay
//! that follows redraws it). `maxDuration` reconnects at once; the other
//! ends are reported and end the command.

use std::io::{IsTerminal, Write};
use std::time::Duration;

use anyhow::{Context, bail};
use eventsource_stream::Eventsource;
use futures::StreamExt;
use serde::Deserialize;
use tailrace::config::Backoff;

use super::client::{RunTarget, enc, with_causes};

/// Options of `tailrace tail`.
#[derive(clap::Args, Debug)]
pub struct TailArgs {
    #[command(flatten)]
    target: RunTarget,
    /// Start after this cursor (from an earlier `tail` or stream).
    #[arg(long)]
    after: Option<String>,
    /// Failures in a row before giving up.
    #[arg(long, default_value_t = 6)]
    max_failures: u32,
    /// Longest wait between two attempts, in milliseconds.
    #[arg(long, default_value_t = 10_000)]
    max_backoff_ms: u64,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct LogEvent {
    event_type: String,
    #[serde(default)]
    logs: Option<String>,
    #[serde(default)]
    after: Option<String>,
    #[serde(default)]
    truncated: bool,
    #[serde(default)]
    reason: Option<String>,
    #[serde(default)]
    message: Option<String>,
}

/// How one connection ended.
enum Ended {
    /// The server completed or failed the stream: stop, with this result.
    Final(anyhow::Result<()>),
    /// Reconnect now (the stream's lifetime ran out).
    Reconnect,
    /// The connection broke or was refused; `progressed` if it delivered
    /// anything first.
    Broken { progressed: bool, why: String },
}

pub async fn run(args: TailArgs) -> anyhow::Result<()> {
    let client = args.target.client()?;
    let backoff = Backoff::new(
        Duration::from_millis(250),
        Duration::from_millis(args.max_backoff_ms.max(250)),
        Duration::from_millis(250),
    );
    let mut cursor = args.after.clone();
    let mut failures = 0u32;
    let mut out = std::io::stdout().lock();
    loop {
        match follow(&client, &args, &mut cursor, &mut out).await {
            Ended::Final(result) => return result,
            Ended::Reconnect => failures = 0,
            Ended::Broken { progressed, why } => {
                failures = if progressed { 1 } else { failures + 1 };
                if failures >= args.max_failures {
                    bail!(
                        "giving up after {failures} failed attempts in a row ({why}); resume with --after {}",
                        cursor.as_deref().unwrap_or("0")
                    );
                }
                let wait = backoff.delay(failures - 1);
                eprintln!("connection lost ({why}); reconnecting in {:.1}s", wait.as_secs_f64());
                tokio::time::sleep(wait).await;
            }
        }
    }
}

async fn follow(client: &reqwest::Client, args: &TailArgs, cursor: &mut Option<String>, out: &mut impl Write) -> Ended {
    let mut path = "/api/v1/services/ingestionPipelines/logs/{fqn}/stream/{run}".to_string();
    if let Some(after) = cursor.as_deref() {
        path.push_str(&format!("?after={}", enc(after)));
    }
    let response = match args.target.request(client, reqwest::Method::GET, &path).send().await {
        Ok(response) => response,
        Err(error) => return Ended::Broken { progressed: false, why: with_causes(&error) },
    };
    let status = response.status();
    if status.is_client_error() {
        let text = response.text().await.unwrap_or_default();
        return Ended::Final(Err(anyhow::anyhow!("{status}: {}", text.trim())));
    }
    if !status.is_success() {
        return Ended::Broken { progressed: false, why: status.to_string() };
    }
    let mut events = response.bytes_stream().eventsource();
    let mut progressed = false;
    while let Some(event) = events.next().await {
        let event = match event {
            Ok(event) => event,
            Err(error) => return Ended::Broken { progressed, why: with_causes(&error) },
        };
        progressed = true;
        let parsed: LogEvent = match serde_json::from_str(&event.data) {
            Ok(parsed) => parsed,
            Err(error) => return Ended::Final(Err(anyhow::anyhow!("an unreadable event {:?}: {error}", event.data))),
        };
        if let Err(error) = show(&parsed, cursor, out) {
            return Ended::Final(Err(error));
        }
        if let Some(end) = ended(&parsed) {
            return end;
        }
    }
    Ended::Broken { progressed, why: "closed without completing".into() }
}

fn show(event: &LogEvent, cursor: &mut Option<String>, out: &mut impl Write) -> anyhow::Result<()> {
    if event.event_type == "logs" {
        if event.truncated {
            // The replay that follows redraws the view.
            if std::io::stdout().is_terminal() {
                write!(out, "\x1b[2J\x1b[H")?;
            } else {
                writeln!(out, "--- the view was reset: replaying what the server holds ---")?;
            }
        }
        if let Some(logs) = event.logs.as_deref().filter(|l| !l.is_empty()) {
            writeln!(out, "{logs}").context("writing to standard output")?;
            out.flush()?;
        }
    }
    if event.after.is_some() {
        cursor.clone_from(&event.after);
    }
    Ok(())
}

/// Whether `event` ends the connection, and how.
fn ended(event: &LogEvent) -> Option<Ended> {
    let message = event.message.clone().unwrap_or_default();
    match (event.event_type.as_str(), event.reason.as_deref()) {
        ("complete", Some("maxDuration")) => Some(Ended::Reconnect),
        ("complete", Some("runFinished")) => {
            eprintln!("run finished");
            Some(Ended::Final(Ok(())))
        }
        ("complete", Some("maxBytes")) => {
            eprintln!("{message} (GET …/logs/<fqn>/last/download?runId=<run>)");
            Some(Ended::Final(Ok(())))
        }
        ("complete", reason) => {
            eprintln!("{} {message}", reason.unwrap_or("complete"));
            Some(Ended::Final(Ok(())))
        }
        ("error", _) => Some(Ended::Final(Err(anyhow::anyhow!("the server ended the stream: {message}")))),
        _ => None,
    }
}
