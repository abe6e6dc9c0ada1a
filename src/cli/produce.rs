//! `tailrace produce --fqn F --run R [--status S]`: reads log lines from
//! standard input and posts them to a running edge, in batches sent at
//! least every `--flush-ms` (so a pipeline's output shows up live), with
//! retries on transient failures. At the end of input, sets `--status`.

use std::time::Duration;

use anyhow::{Context, bail};
use tailrace::retry::Backoff;
use tokio::io::{AsyncBufReadExt, BufReader};

/// The run a command talks to, and how to reach it.
#[derive(clap::Args, Debug)]
pub struct RunTarget {
    /// The edge (`http://` or `https://`).
    #[arg(long, default_value = "http://127.0.0.1:8585")]
    pub url: String,
    /// A PEM file of the authority an HTTPS edge's certificate chains to
    /// (a private CA; only it is then trusted).
    #[arg(long, env = "TAILRACE_CA_FILE")]
    pub ca_file: Option<std::path::PathBuf>,
    /// The pipeline's fully qualified name.
    #[arg(long)]
    pub fqn: String,
    /// The run id.
    #[arg(long)]
    pub run: String,
    /// A bearer token (`write` scope to produce, `read` to tail).
    #[arg(long, env = "TAILRACE_TOKEN")]
    pub token: Option<String>,
}

impl RunTarget {
    /// A client for this edge.
    pub fn client(&self) -> anyhow::Result<reqwest::Client> {
        super::http_client(self.ca_file.as_deref())
    }

    /// A request to `{url}{path}`, with `{fqn}` and `{run}` in `path`
    /// replaced by the percent-encoded pipeline and run, and the token.
    pub fn request(&self, client: &reqwest::Client, method: reqwest::Method, path: &str) -> reqwest::RequestBuilder {
        let path = path.replace("{fqn}", &enc(&self.fqn)).replace("{run}", &enc(&self.run));
        let request = client.request(method, format!("{}{path}", self.url.trim_end_matches('/')));
        match &self.token {
            Some(token) => request.bearer_auth(token),
            None => request,
        }
    }
}

/// Options of `tailrace produce`.
#[derive(clap::Args, Debug)]
pub struct ProduceArgs {
    #[command(flatten)]
    target: RunTarget,
    /// The run's state to set at the end of input (queued, running,
    /// success, failed, partialSuccess, stopped).
    #[arg(long)]
    status: Option<String>,
    /// Most lines per request.
    #[arg(long, default_value_t = 1000)]
    batch_lines: usize,
    /// Longest a read line waits before it is sent.
    #[arg(long, default_value_t = 200)]
    flush_ms: u64,
    /// Attempts per request before giving up.
    #[arg(long, default_value_t = 8)]
    attempts: u32,
}

struct Poster {
    client: reqwest::Client,
    args: ProduceArgs,
    sent: u64,
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
                    eprint!("\r  {} lines sent   ", self.sent);
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
                Err(error) => eprintln!("\n  attempt {attempt}: {error}"),
            }
            tokio::time::sleep(backoff.delay(attempt)).await;
        }
        bail!("gave up after {} attempts; {} lines were sent before", self.args.attempts, self.sent)
    }
}

/// Percent-encodes a path segment.
pub fn enc(segment: &str) -> String {
    let mut out = String::with_capacity(segment.len());
    for byte in segment.bytes() {
        if byte.is_ascii_alphanumeric() || b"-._~".contains(&byte) {
            out.push(byte as char);
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

pub async fn run(args: ProduceArgs) -> anyhow::Result<()> {
    let flush = Duration::from_millis(args.flush_ms.max(1));
    let batch = args.batch_lines.max(1);
    let mut poster = Poster { client: args.target.client()?, args, sent: 0 };
    let mut input = BufReader::new(tokio::io::stdin()).lines();
    let mut pending: Vec<String> = Vec::new();
    let mut deadline = tokio::time::Instant::now() + flush;
    loop {
        tokio::select! {
            line = input.next_line() => match line.context("reading standard input")? {
                Some(line) => {
                    if pending.is_empty() {
                        deadline = tokio::time::Instant::now() + flush;
                    }
                    pending.push(line);
                    if pending.len() >= batch {
                        poster.send(&mut pending).await?;
                    }
                }
                None => break,
            },
            _ = tokio::time::sleep_until(deadline), if !pending.is_empty() => poster.send(&mut pending).await?,
        }
    }
    poster.send(&mut pending).await?;
    eprintln!("\r  {} lines sent", poster.sent);
    if let Some(status) = poster.args.status.clone() {
        let response = poster
            .request(reqwest::Method::PUT, "status")
            .json(&serde_json::json!({ "state": status }))
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
        eprintln!("  run is now {status}");
    }
    Ok(())
}
