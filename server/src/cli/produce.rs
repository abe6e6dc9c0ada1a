//! `tailrace produce --fqn F --run R [--status S] [-- COMMAND ARGS…]`:
//! posts log lines to a run on a running edge, in batches sent at least
//! every `--flush-ms` (so a pipeline's output shows up live), with retries
//! on transient failures. Lines come from standard input, or, after `--`,
//! from a command it runs (its standard output and error through one pipe,
//! in the order it wrote them, echoed to this process's standard output):
//! the run is `running` while it runs and then `success`, `failed` or
//! `stopped` (a signal) from its exit, and `produce` exits with its code.
//! A line that is not valid UTF-8 is kept, its bad bytes replaced, and
//! counted. Progress and the summary go to standard error.

mod command;

use std::time::Duration;

use anyhow::{Context, bail};
use tailrace::config::Backoff;

use super::client::{RunTarget, with_causes};
use tokio::io::{AsyncBufRead, AsyncBufReadExt, AsyncWrite, AsyncWriteExt, BufReader};

/// Options of `tailrace produce`.
#[derive(clap::Args, Debug)]
pub struct ProduceArgs {
    #[command(flatten)]
    target: RunTarget,
    /// The run's state to set at the end of input (queued, running,
    /// success, failed, partialSuccess, stopped). With a command, its exit
    /// decides instead.
    #[arg(long, conflicts_with = "command")]
    status: Option<String>,
    /// Most lines per request.
    #[arg(long, default_value_t = 1000)]
    batch_lines: usize,
    /// Longest a read line waits before it is sent.
    #[arg(long, default_value_t = 200)]
    flush_ms: u64,
    /// Tries in all per batch of lines (not retries): a connection error
    /// or an answer other than 2xx and 4xx (such as 503) is tried again
    /// after a backoff (100 ms growing to 10 s); a 4xx stops at once. The
    /// status PUT is sent once.
    #[arg(long, default_value_t = 8)]
    attempts: u32,
    /// The command to run and whose output to send (after `--`).
    #[arg(last = true, value_name = "COMMAND")]
    command: Vec<String>,
}

/// What was read: lines, and lines whose invalid UTF-8 was replaced.
#[derive(Default)]
struct Read {
    lines: u64,
    lossy: u64,
}

impl Read {
    /// The next line of `input` without its `\n` (or `\r\n`), invalid
    /// UTF-8 replaced; `None` at the end.
    async fn next(
        &mut self,
        input: &mut (impl AsyncBufRead + Unpin),
        buf: &mut Vec<u8>,
    ) -> anyhow::Result<Option<String>> {
        buf.clear();
        if input.read_until(b'\n', buf).await.context("reading the input")? == 0 {
            return Ok(None);
        }
        let line = buf.strip_suffix(b"\n").unwrap_or(buf);
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        self.lines += 1;
        Ok(Some(match std::str::from_utf8(line) {
            Ok(text) => text.to_string(),
            Err(_) => {
                self.lossy += 1;
                String::from_utf8_lossy(line).into_owned()
            }
        }))
    }
}

struct Poster {
    client: reqwest::Client,
    args: ProduceArgs,
    sent: u64,
    /// Show a progress line (not while a command's output is echoed).
    progress: bool,
}

impl Poster {
    fn request(&self, method: reqwest::Method, what: &str) -> reqwest::RequestBuilder {
        self.args.target.request(&self.client, method, &format!("/api/v1/logs/{{fqn}}/runs/{{run}}/{what}"))
    }

    /// Sends `lines` as one request; transient failures (connection, 503)
    /// are retried with backoff, 4xx are not.
    async fn send(&mut self, lines: &mut Vec<String>) -> anyhow::Result<()> {
        if lines.is_empty() {
            return Ok(());
        }
        let body = lines.join("\n");
        let backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(10), Duration::from_millis(200));
        for attempt in 1..=self.args.attempts {
            let outcome = self
                .request(reqwest::Method::POST, "lines")
                .header("content-type", "text/plain")
                .body(body.clone())
                .send()
                .await;
            match outcome {
                Ok(response) if response.status().is_success() => {
                    self.sent += lines.len() as u64;
                    if self.progress {
                        eprint!("\r  {} lines sent   ", self.sent);
                    }
                    lines.clear();
                    return Ok(());
                }
                Ok(response) if response.status().is_client_error() => {
                    let status = response.status();
                    bail!(
                        "the edge refused the lines ({status}): {}",
                        response.text().await.unwrap_or_default().trim()
                    );
                }
                Ok(response) => eprintln!(
                    "\n  attempt {attempt}: {} ({})",
                    response.status(),
                    response.text().await.unwrap_or_default().trim()
                ),
                Err(error) => eprintln!("\n  attempt {attempt}: {}", with_causes(&error)),
            }
            tokio::time::sleep(backoff.delay(attempt)).await;
        }
        bail!("gave up after {} attempts; {} lines were sent before", self.args.attempts, self.sent)
    }
}

impl Poster {
    /// Sends every line of `input` (echoed to `echo`, if given) until its
    /// end; what was read.
    async fn ship(
        &mut self,
        input: &mut (impl AsyncBufRead + Unpin),
        mut echo: Option<&mut (impl AsyncWrite + Unpin)>,
    ) -> anyhow::Result<Read> {
        let flush = Duration::from_millis(self.args.flush_ms.max(1));
        let batch = self.args.batch_lines.max(1);
        let (mut read, mut buf, mut pending) = (Read::default(), Vec::new(), Vec::new());
        let mut deadline = tokio::time::Instant::now() + flush;
        loop {
            tokio::select! {
                line = read.next(input, &mut buf) => match line? {
                    Some(line) => {
                        if let Some(echo) = echo.as_mut() {
                            echo.write_all(&buf).await.context("echoing the command's output")?;
                        }
                        if pending.is_empty() {
                            deadline = tokio::time::Instant::now() + flush;
                        }
                        pending.push(line);
                        if pending.len() >= batch {
                            self.send(&mut pending).await?;
                        }
                    }
                    None => break,
                },
                _ = tokio::time::sleep_until(deadline), if !pending.is_empty() => self.send(&mut pending).await?,
            }
        }
        self.send(&mut pending).await?;
        Ok(read)
    }

    /// Sets the run's state.
    async fn set_status(&self, state: &str) -> anyhow::Result<()> {
        let response = self
            .request(reqwest::Method::PUT, "status")
            .json(&serde_json::json!({ "state": state }))
            .send()
            .await
            .context("setting the run's status")?;
        if !response.status().is_success() {
            bail!(
                "the edge refused the status ({}): {}",
                response.status(),
                response.text().await.unwrap_or_default().trim()
            );
        }
        Ok(())
    }

    /// The summary line, on standard error.
    fn summary(&self, read: &Read) {
        let lossy = match read.lossy {
            0 => String::new(),
            n => format!(" ({n} with invalid UTF-8, replaced)"),
        };
        eprintln!("\r  {} lines sent{lossy}", self.sent);
    }
}

/// `tailrace produce`; the process's exit code.
pub async fn run(args: ProduceArgs) -> anyhow::Result<u8> {
    let client = args.target.client()?;
    let progress = args.command.is_empty();
    let mut poster = Poster { client, args, sent: 0, progress };
    if !poster.args.command.is_empty() {
        return command::run(&mut poster).await;
    }
    let mut input = BufReader::new(tokio::io::stdin());
    let read = poster.ship(&mut input, None::<&mut tokio::io::Stdout>).await?;
    poster.summary(&read);
    if let Some(status) = poster.args.status.clone() {
        poster.set_status(&status).await?;
        eprintln!("  run is now {status}");
    }
    Ok(0)
}
