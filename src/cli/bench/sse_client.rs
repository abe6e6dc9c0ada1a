//! The client side of `tailrace bench sse`, run as a child process
//! (`tailrace bench-client`): N SSE viewers of one run, or N pollers of its
//! paginated endpoint every 2 s. It prints `READY` once every client is in
//! place, follows for the given time, then prints `REPORT <json>`.
//!
//! Every line the bench ingests reads `t=<µs since the epoch> n=<i>`; a
//! client's delay for a line is its arrival time minus `t`. Viewers parse
//! every frame of one client in ten (the others only count), so the client
//! process does not starve the server it measures.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use futures::StreamExt;
use serde::{Deserialize, Serialize};
use tokio::sync::{Mutex, Semaphore};

/// Clients connecting at once.
const CONNECT_AT_ONCE: usize = 200;
/// The pollers' interval (OpenMetadata's client default).
const POLL_EVERY: Duration = Duration::from_secs(2);

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Mode {
    Stream,
    Poll,
}

impl Mode {
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Stream => "stream",
            Mode::Poll => "poll",
        }
    }
}

/// Options of the hidden `tailrace bench-client`.
#[derive(clap::Args, Debug)]
pub struct ClientArgs {
    #[arg(long)]
    url: String,
    #[arg(long, value_enum)]
    mode: Mode,
    #[arg(long)]
    clients: usize,
    #[arg(long)]
    seconds: u64,
    #[arg(long)]
    fqn: String,
    #[arg(long)]
    run: String,
}

/// What the clients saw while the producer ran.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct ClientReport {
    pub clients: usize,
    pub failed: usize,
    pub seconds: f64,
    /// Live frames (SSE) or non-empty pages (polling) received.
    pub frames: u64,
    /// Live lines received, all clients together.
    pub lines: u64,
    /// The 99th percentile of the sampled lines' delays, in microseconds.
    pub p99_us: u64,
    pub samples: usize,
    /// The fewest measured lines one client received (SSE: every viewer
    /// should have every line).
    #[serde(default)]
    pub min_lines: u64,
    /// Clients whose stream ended or failed after they connected.
    #[serde(default)]
    pub dropped: usize,
}

impl ClientReport {
    pub fn lines_per_s(&self) -> f64 {
        self.lines as f64 / self.seconds.max(1e-9)
    }

    pub fn frames_per_s(&self) -> f64 {
        self.frames as f64 / self.seconds.max(1e-9)
    }

    pub fn p99_ms(&self) -> f64 {
        self.p99_us as f64 / 1000.0
    }
}

#[derive(Default)]
struct Totals {
    connected: AtomicUsize,
    failed: AtomicUsize,
    /// Clients that connected, then lost their stream.
    dropped: AtomicUsize,
    /// Measured lines per client.
    per_client: Vec<AtomicU64>,
    frames: AtomicU64,
    lines: AtomicU64,
    delays: Mutex<Vec<u64>>,
}

fn now_us() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_micros() as u64)
}

/// The send times of the lines in `logs`.
fn stamps(logs: &str) -> impl Iterator<Item = u64> + '_ {
    logs.lines().filter_map(|line| line.strip_prefix("t=")?.split(' ').next()?.parse().ok())
}

/// What every client task shares.
struct Shared {
    client: reqwest::Client,
    base: String,
    fqn: String,
    run: String,
    totals: Totals,
    /// When measuring began (µs since the epoch; `u64::MAX` before).
    measuring: AtomicU64,
    /// Bounds the clients connecting at once.
    gate: Semaphore,
}

/// Raises the soft open-files limit to the hard one.
pub fn raise_open_files() -> anyhow::Result<u64> {
    let (_, hard) = rlimit::Resource::NOFILE.get().context("reading the open-files limit")?;
    rlimit::Resource::NOFILE.set(hard, hard).context("raising the open-files limit")?;
    Ok(hard)
}

pub async fn run(args: ClientArgs) -> anyhow::Result<()> {
    raise_open_files()?;
    let shared = Arc::new(Shared {
        client: reqwest::Client::builder().pool_max_idle_per_host(args.clients).build()?,
        base: args.url.clone(),
        fqn: args.fqn.clone(),
        run: args.run.clone(),
        totals: Totals { per_client: (0..args.clients).map(|_| AtomicU64::new(0)).collect(), ..Totals::default() },
        measuring: AtomicU64::new(u64::MAX),
        gate: Semaphore::new(CONNECT_AT_ONCE),
    });
    let (totals, measuring) = (&shared.totals, &shared.measuring);
    let mut tasks = Vec::with_capacity(args.clients);
    for i in 0..args.clients {
        let shared = shared.clone();
        tasks.push(tokio::spawn(async move {
            let outcome = match args.mode {
                Mode::Stream => viewer(i, &shared).await,
                Mode::Poll => poller(i, &shared).await,
            };
            if outcome.is_err() {
                shared.totals.failed.fetch_add(1, Ordering::Relaxed);
            }
        }));
    }
    let deadline = Instant::now() + Duration::from_secs(110);
    while totals.connected.load(Ordering::Relaxed) + totals.failed.load(Ordering::Relaxed) < args.clients {
        anyhow::ensure!(Instant::now() < deadline, "clients could not connect");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Lines sent from now on are measured.
    measuring.store(now_us(), Ordering::Relaxed);
    println!("READY");
    let started = Instant::now();
    // The producer runs `seconds`; the last lines need a moment to arrive,
    // and pollers up to one interval.
    let grace = match args.mode {
        Mode::Stream => Duration::from_secs(1),
        Mode::Poll => POLL_EVERY + Duration::from_secs(1),
    };
    tokio::time::sleep(Duration::from_secs(args.seconds) + grace).await;
    let seconds = started.elapsed().as_secs_f64() - grace.as_secs_f64();
    for task in &tasks {
        task.abort();
    }
    let mut delays = std::mem::take(&mut *totals.delays.lock().await);
    delays.sort_unstable();
    let p99_us = delays.get((delays.len() * 99 / 100).min(delays.len().saturating_sub(1))).copied().unwrap_or(0);
    let report = ClientReport {
        clients: args.clients,
        failed: totals.failed.load(Ordering::Relaxed),
        seconds,
        frames: totals.frames.load(Ordering::Relaxed),
        lines: totals.lines.load(Ordering::Relaxed),
        samples: delays.len(),
        p99_us,
        min_lines: totals.per_client.iter().map(|n| n.load(Ordering::Relaxed)).min().unwrap_or(0),
        dropped: totals.dropped.load(Ordering::Relaxed),
    };
    println!("REPORT {}", serde_json::to_string(&report)?);
    Ok(())
}

async fn viewer(i: usize, shared: &Shared) -> anyhow::Result<()> {
    let Shared { client, base, fqn, run, totals, measuring, gate } = shared;
    let permit = gate.acquire().await?;
    let response =
        client.get(format!("{base}/api/v1/services/ingestionPipelines/logs/{fqn}/stream/{run}")).send().await?;
    anyhow::ensure!(response.status().is_success(), "stream answered {}", response.status());
    totals.connected.fetch_add(1, Ordering::Relaxed);
    drop(permit);
    let sampled = i.is_multiple_of(10);
    let mine = &totals.per_client[i];
    let mut body = response.bytes_stream();
    let mut buffer: Vec<u8> = Vec::new();
    while let Some(chunk) = body.next().await {
        let arrived = now_us();
        let Ok(chunk) = chunk else { break };
        buffer.extend_from_slice(&chunk);
        while let Some(end) = memchr::memmem::find(&buffer, b"\n\n") {
            let frame: Vec<u8> = buffer.drain(..end + 2).collect();
            if !frame.starts_with(b"data: ") || memchr::memmem::find(&frame, b"\"replay\":false").is_none() {
                continue;
            }
            let measured = measuring.load(Ordering::Relaxed);
            mine.fetch_add(count_measured(&frame, measured), Ordering::Relaxed);
            if sampled {
                let event: serde_json::Value = serde_json::from_slice(&frame[6..end])?;
                let logs = event["logs"].as_str().unwrap_or_default();
                let sent: Vec<u64> = stamps(logs).collect();
                let measured = measuring.load(Ordering::Relaxed);
                if sent.iter().all(|t| *t >= measured) {
                    totals.frames.fetch_add(1, Ordering::Relaxed);
                    totals.lines.fetch_add(sent.len() as u64, Ordering::Relaxed);
                    totals.delays.lock().await.extend(sent.iter().map(|t| arrived.saturating_sub(*t)));
                }
            } else if measuring.load(Ordering::Relaxed) != u64::MAX {
                totals.frames.fetch_add(1, Ordering::Relaxed);
                totals.lines.fetch_add(memchr::memmem::find_iter(&frame, b"t=").count() as u64, Ordering::Relaxed);
            }
        }
    }
    totals.dropped.fetch_add(1, Ordering::Relaxed);
    anyhow::bail!("the stream ended")
}

/// Lines in `frame` sent at or after `measured` (their `t=` stamps).
fn count_measured(frame: &[u8], measured: u64) -> u64 {
    memchr::memmem::find_iter(frame, b"t=")
        .filter(|at| {
            let digits = frame[at + 2..].iter().take_while(|b| b.is_ascii_digit()).count();
            std::str::from_utf8(&frame[at + 2..at + 2 + digits]).ok().and_then(|d| d.parse::<u64>().ok())
                >= Some(measured)
        })
        .count() as u64
}

#[derive(Deserialize)]
struct Page {
    logs: String,
    after: Option<String>,
    total: String,
}

async fn poller(i: usize, shared: &Shared) -> anyhow::Result<()> {
    let Shared { client, base, fqn, run, totals, measuring, gate } = shared;
    let url = format!("{base}/api/v1/services/ingestionPipelines/logs/{fqn}/last");
    let get = |after: u64| client.get(&url).query(&[("runId", run), ("after", &after.to_string())]).send();
    // Start where the log ends now, like a viewer that caught up.
    let permit = gate.acquire().await?;
    let first: Page = get(0).await?.error_for_status()?.json().await?;
    let mut cursor: u64 = first.total.parse()?;
    totals.connected.fetch_add(1, Ordering::Relaxed);
    drop(permit);
    // Spread the pollers over the interval.
    let offset = POLL_EVERY.mul_f64((i % 1000) as f64 / 1000.0);
    let mut ticks = tokio::time::interval_at(tokio::time::Instant::now() + offset, POLL_EVERY);
    loop {
        ticks.tick().await;
        let page: Page = get(cursor).await?.error_for_status()?.json().await?;
        let arrived = now_us();
        let count = if page.logs.is_empty() { 0 } else { page.logs.lines().count() as u64 };
        cursor = page.after.as_deref().and_then(|a| a.parse().ok()).unwrap_or(cursor + count);
        let measured = measuring.load(Ordering::Relaxed);
        let sent: Vec<u64> = stamps(&page.logs).filter(|t| *t >= measured).collect();
        if !sent.is_empty() {
            totals.frames.fetch_add(1, Ordering::Relaxed);
            totals.lines.fetch_add(sent.len() as u64, Ordering::Relaxed);
            if i.is_multiple_of(10) {
                totals.delays.lock().await.extend(sent.iter().map(|t| arrived.saturating_sub(*t)));
            }
        }
    }
}
