//! The client side of `tailrace-bench sse`, run as a child process
//! (`tailrace-bench sse-client`): N SSE viewers of one run, or N pollers of its
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
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::Semaphore;

use crate::now_us;

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

/// Options of the hidden `tailrace-bench sse-client`.
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
    /// Each client's own counts (summed at the end: clients never count
    /// on a shared line).
    per_client: Vec<Counts>,
}

/// What one client received.
#[derive(Default)]
struct Counts {
    /// Lines sent since measuring began.
    lines_measured: AtomicU64,
    /// Live frames (SSE) or non-empty pages (polling), and their lines.
    frames: AtomicU64,
    lines: AtomicU64,
    /// Sampled clients: each measured line's delay, in microseconds.
    delays: parking_lot::Mutex<Vec<u64>>,
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
        totals: Totals { per_client: (0..args.clients).map(|_| Counts::default()).collect(), ..Totals::default() },
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
    let clients = &totals.per_client;
    let mut delays: Vec<u64> = clients.iter().flat_map(|c| std::mem::take(&mut *c.delays.lock())).collect();
    delays.sort_unstable();
    let p99_us = delays.get((delays.len() * 99 / 100).min(delays.len().saturating_sub(1))).copied().unwrap_or(0);
    let report = ClientReport {
        clients: args.clients,
        failed: totals.failed.load(Ordering::Relaxed),
        seconds,
        frames: clients.iter().map(|c| c.frames.load(Ordering::Relaxed)).sum(),
        lines: clients.iter().map(|c| c.lines.load(Ordering::Relaxed)).sum(),
        samples: delays.len(),
        p99_us,
        min_lines: clients.iter().map(|c| c.lines_measured.load(Ordering::Relaxed)).min().unwrap_or(0),
        dropped: totals.dropped.load(Ordering::Relaxed),
    };
    println!("REPORT {}", serde_json::to_string(&report)?);
    Ok(())
}

/// One SSE viewer on a raw socket: the request, the response head, then
/// the chunked body decoded and split into frames in place. A browser has
/// a machine of its own; these viewers share the server's two cores, so
/// each is as light as a socket read (through reqwest, which runs a task
/// per connection and a channel per body, the viewers took as much CPU as
/// the server they measure, and its p99 measured them).
async fn viewer(i: usize, shared: &Shared) -> anyhow::Result<()> {
    let Shared { base, fqn, run, totals, measuring, gate, .. } = shared;
    let permit = gate.acquire().await?;
    let url = url::Url::parse(base)?;
    let host = url.host_str().context("the base URL has no host")?;
    let port = url.port_or_known_default().context("the base URL has no port")?;
    let mut socket = tokio::net::TcpStream::connect((host, port)).await?;
    let request = format!(
        "GET /api/v1/services/ingestionPipelines/logs/{fqn}/stream/{run} HTTP/1.1\r\nhost: {host}:{port}\r\naccept: text/event-stream\r\n\r\n"
    );
    socket.write_all(request.as_bytes()).await?;
    // What the socket gave and is not decoded yet.
    let mut raw: Vec<u8> = Vec::with_capacity(4096);
    let chunked = loop {
        anyhow::ensure!(socket.read_buf(&mut raw).await? > 0, "the stream closed before its head");
        if let Some(end) = memchr::memmem::find(&raw, b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&raw[..end]).to_ascii_lowercase();
            anyhow::ensure!(head.starts_with("http/1.1 200"), "stream answered {}", head.lines().next().unwrap_or(""));
            raw.drain(..end + 4);
            break head.contains("transfer-encoding: chunked");
        }
    };
    totals.connected.fetch_add(1, Ordering::Relaxed);
    drop(permit);
    let sampled = i.is_multiple_of(10);
    let mine = &totals.per_client[i];
    // The decoded body not yet split into frames.
    let mut body: Vec<u8> = Vec::with_capacity(4096);
    loop {
        let arrived = now_us();
        if chunked {
            decode_chunks(&mut raw, &mut body)?;
        } else {
            body.append(&mut raw);
        }
        let mut start = 0;
        while let Some(end) = memchr::memmem::find(&body[start..], b"\n\n") {
            let frame = &body[start..start + end + 2];
            start += end + 2;
            if !frame.starts_with(b"data: ") || memchr::memmem::find(frame, b"\"replay\":false").is_none() {
                continue;
            }
            let measured = measuring.load(Ordering::Relaxed);
            mine.lines_measured.fetch_add(count_measured(frame, measured), Ordering::Relaxed);
            if measured == u64::MAX {
                continue;
            }
            if sampled {
                let event: serde_json::Value = serde_json::from_slice(&frame[6..end])?;
                let sent: Vec<u64> = stamps(event["logs"].as_str().unwrap_or_default()).collect();
                if sent.iter().all(|t| *t >= measured) {
                    mine.frames.fetch_add(1, Ordering::Relaxed);
                    mine.lines.fetch_add(sent.len() as u64, Ordering::Relaxed);
                    mine.delays.lock().extend(sent.iter().map(|t| arrived.saturating_sub(*t)));
                }
            } else {
                mine.frames.fetch_add(1, Ordering::Relaxed);
                mine.lines.fetch_add(memchr::memmem::find_iter(frame, b"t=").count() as u64, Ordering::Relaxed);
            }
        }
        body.drain(..start);
        if socket.read_buf(&mut raw).await? == 0 {
            break;
        }
    }
    totals.dropped.fetch_add(1, Ordering::Relaxed);
    anyhow::bail!("the stream ended")
}

/// Moves the complete chunks at the front of `raw` (HTTP/1.1 chunked
/// framing) into `body`.
fn decode_chunks(raw: &mut Vec<u8>, body: &mut Vec<u8>) -> anyhow::Result<()> {
    let mut at = 0;
    while let Some(line) = memchr::memmem::find(&raw[at..], b"\r\n") {
        let size = std::str::from_utf8(&raw[at..at + line])?;
        let size = usize::from_str_radix(size.split(';').next().unwrap_or("").trim(), 16)?;
        let data = at + line + 2;
        if raw.len() < data + size + 2 {
            break;
        }
        body.extend_from_slice(&raw[data..data + size]);
        at = data + size + 2;
    }
    raw.drain(..at);
    Ok(())
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
            let mine = &totals.per_client[i];
            mine.frames.fetch_add(1, Ordering::Relaxed);
            mine.lines.fetch_add(sent.len() as u64, Ordering::Relaxed);
            if i.is_multiple_of(10) {
                mine.delays.lock().extend(sent.iter().map(|t| arrived.saturating_sub(*t)));
            }
        }
    }
}
