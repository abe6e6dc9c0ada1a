//! The client side of `tailrace-bench sse`, run as a child process
//! (`tailrace-bench sse-client`): N SSE viewers of one run, or N pollers of its
//! paginated endpoint every 2 s. It prints `READY` once every client is in
//! place, follows for the given time, then prints `REPORT <json>`.
//!
//! Every line the bench ingests reads `t=<µs since the epoch> n=<i>`; a
//! client's delay for a line is its arrival time minus `t`. Viewers parse
//! every frame of one client in ten (the others only count), so the client
//! process does not starve the server it measures.
//!
//! Each viewer counts its socket reads that returned data (a lower bound
//! of the server's writes to it: one read may take several). With
//! `--stalled N`, N more viewers connect with a small receive buffer, send
//! their request and never read. With `--expect N`, the process waits
//! after `--seconds` (up to 20 s) until every viewer has N measured lines,
//! and reports when the last one had them. With `--ca-file`, viewers and
//! pollers speak HTTPS and trust that authority only (a viewer is then a
//! TLS session over its socket, through tokio-rustls).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::Semaphore;

use crate::now_us;

mod count;
mod https;

use count::count_measured;

/// Clients connecting at once.
const CONNECT_AT_ONCE: usize = 200;
/// The pollers' interval (OpenMetadata's client default).
const POLL_EVERY: Duration = Duration::from_secs(2);
/// A stalled viewer's receive buffer (the kernel doubles it): its socket
/// fills within seconds, and the server's writes to it wait.
const STALLED_RECEIVE_BUFFER: u32 = 4096;
/// A stalled viewer's MSS (see `stalled_viewer`).
const STALLED_MSS: libc::c_int = 536;
/// How long `--expect` waits for the last viewer after `--seconds`.
const EXPECT_WAIT: Duration = Duration::from_secs(20);

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
    /// Viewers that connect and never read, beside `clients`.
    #[arg(long, default_value_t = 0)]
    stalled: usize,
    /// Lines every viewer should get: wait for them after `seconds`.
    #[arg(long)]
    expect: Option<u64>,
    /// Viewers start at this line (`?after=`), not at line 0.
    #[arg(long)]
    after: Option<u64>,
    /// HTTPS, trusting the authority in this PEM file.
    #[arg(long)]
    ca_file: Option<std::path::PathBuf>,
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
    /// Viewers' socket reads that returned data once measuring began.
    #[serde(default)]
    pub reads: u64,
    /// Seconds from measuring to the report (over which `reads` counted).
    #[serde(default)]
    pub read_seconds: f64,
    /// With `--expect`: viewers that had every expected line, and when the
    /// last of them had it (µs since the epoch).
    #[serde(default)]
    pub complete: usize,
    #[serde(default)]
    pub last_complete_us: u64,
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

    /// Socket reads with data per viewer and second.
    pub fn reads_per_viewer_s(&self) -> f64 {
        self.reads as f64 / (self.clients.max(1) as f64 * self.read_seconds.max(1e-9))
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
    /// Socket reads that returned data once measuring began.
    reads: AtomicU64,
    /// When this viewer had `--expect` lines (µs since the epoch; 0: not yet).
    complete_at: AtomicU64,
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
    expect: Option<u64>,
    after: Option<u64>,
    /// Over HTTPS: the viewers' TLS client.
    tls: Option<tokio_rustls::TlsConnector>,
}

/// Raises the soft open-files limit to the hard one, and both to `want`
/// when the hard one is lower and the process may (as root).
pub fn raise_open_files(want: u64) -> anyhow::Result<u64> {
    let (_, hard) = rlimit::Resource::NOFILE.get().context("reading the open-files limit")?;
    if want > hard && rlimit::Resource::NOFILE.set(want, want).is_ok() {
        return Ok(want);
    }
    rlimit::Resource::NOFILE.set(hard, hard).context("raising the open-files limit")?;
    Ok(hard)
}

pub async fn run(args: ClientArgs) -> anyhow::Result<()> {
    raise_open_files((args.clients + args.stalled) as u64 + 256)?;
    let mut client = reqwest::Client::builder().pool_max_idle_per_host(args.clients);
    let mut tls = None;
    if let Some(ca) = &args.ca_file {
        let (trusting, connector) = https::trusting(client, ca)?;
        (client, tls) = (trusting, Some(connector));
    }
    let shared = Arc::new(Shared {
        client: client.build()?,
        base: args.url.clone(),
        fqn: args.fqn.clone(),
        run: args.run.clone(),
        totals: Totals { per_client: (0..args.clients).map(|_| Counts::default()).collect(), ..Totals::default() },
        measuring: AtomicU64::new(u64::MAX),
        gate: Semaphore::new(CONNECT_AT_ONCE),
        expect: args.expect,
        after: args.after,
        tls,
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
    for _ in 0..args.stalled {
        let shared = shared.clone();
        tasks.push(tokio::spawn(async move {
            if stalled_viewer(&shared).await.is_err() {
                shared.totals.failed.fetch_add(1, Ordering::Relaxed);
            }
        }));
    }
    let deadline = Instant::now() + Duration::from_secs(110);
    let everyone = args.clients + args.stalled;
    while totals.connected.load(Ordering::Relaxed) + totals.failed.load(Ordering::Relaxed) < everyone {
        anyhow::ensure!(Instant::now() < deadline, "clients could not connect");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Lines sent from now on are measured.
    measuring.store(now_us(), Ordering::Relaxed);
    println!("READY");
    let started = Instant::now();
    tokio::time::sleep(Duration::from_secs(args.seconds)).await;
    let seconds = started.elapsed().as_secs_f64();
    // The producer ran `seconds`; the last lines need a moment to arrive,
    // and pollers up to one interval; `--expect` waits for every viewer.
    match (args.mode, args.expect) {
        (Mode::Stream, Some(_)) => {
            let waited = Instant::now();
            let complete = || totals.per_client.iter().all(|c| c.complete_at.load(Ordering::Relaxed) > 0);
            while !complete() && waited.elapsed() < EXPECT_WAIT {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
        (Mode::Stream, None) => tokio::time::sleep(Duration::from_secs(1)).await,
        (Mode::Poll, _) => tokio::time::sleep(POLL_EVERY + Duration::from_secs(1)).await,
    }
    // Reads are counted over the producer's run, or until every viewer
    // had its lines.
    let read_seconds = if args.expect.is_some() { started.elapsed().as_secs_f64() } else { seconds };
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
        reads: clients.iter().map(|c| c.reads.load(Ordering::Relaxed)).sum(),
        read_seconds,
        complete: clients.iter().filter(|c| c.complete_at.load(Ordering::Relaxed) > 0).count(),
        last_complete_us: clients.iter().map(|c| c.complete_at.load(Ordering::Relaxed)).max().unwrap_or(0),
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
    let Shared { totals, measuring, gate, expect, .. } = shared;
    let permit = gate.acquire().await?;
    let (host, port, request) = stream_request(shared, shared.after)?;
    let mut socket = https::connect(shared.tls.as_ref(), &host, port).await?;
    socket.write_all(request.as_bytes()).await?;
    socket.flush().await?;
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
            let (lines, new) = count_measured(frame, measured);
            let had = mine.lines_measured.fetch_add(new, Ordering::Relaxed) + new;
            if expect.is_some_and(|e| had >= e) && mine.complete_at.load(Ordering::Relaxed) == 0 {
                mine.complete_at.store(arrived, Ordering::Relaxed);
            }
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
                mine.lines.fetch_add(lines, Ordering::Relaxed);
            }
        }
        body.drain(..start);
        if socket.read_buf(&mut raw).await? == 0 {
            break;
        }
        if measuring.load(Ordering::Relaxed) != u64::MAX {
            mine.reads.fetch_add(1, Ordering::Relaxed);
        }
    }
    totals.dropped.fetch_add(1, Ordering::Relaxed);
    anyhow::bail!("the stream ended")
}

/// The host and port of the server, and the request of a stream from line
/// `after` (from line 0 without).
fn stream_request(shared: &Shared, after: Option<u64>) -> anyhow::Result<(String, u16, String)> {
    let url = url::Url::parse(&shared.base)?;
    let host = url.host_str().context("the base URL has no host")?.to_string();
    let port = url.port_or_known_default().context("the base URL has no port")?;
    let (fqn, run) = (&shared.fqn, &shared.run);
    let query = after.map_or(String::new(), |a| format!("?after={a}"));
    let request = format!(
        "GET /api/v1/services/ingestionPipelines/logs/{fqn}/stream/{run}{query} HTTP/1.1\r\nhost: {host}:{port}\r\naccept: text/event-stream\r\n\r\n"
    );
    Ok((host, port, request))
}

/// A viewer that sends its request from line 0 (its replay fills its small
/// receive buffer at once) and never reads; it holds its socket until the
/// process ends.
async fn stalled_viewer(shared: &Shared) -> anyhow::Result<()> {
    let (host, port, request) = stream_request(shared, None)?;
    let address = tokio::net::lookup_host((host.as_str(), port)).await?.next().context("no address")?;
    let socket = if address.is_ipv4() { tokio::net::TcpSocket::new_v4()? } else { tokio::net::TcpSocket::new_v6()? };
    socket.set_recv_buffer_size(STALLED_RECEIVE_BUFFER)?;
    // A small MSS, announced in the SYN: the server sizes its send buffer
    // for this socket from it (about 2.6 MB at loopback's 64 KiB MSS, which
    // would take a quarter of an hour of this run's lines to fill).
    let mss: libc::c_int = STALLED_MSS;
    // SAFETY: a valid socket and a c_int of the size given.
    let set = unsafe {
        libc::setsockopt(
            std::os::fd::AsRawFd::as_raw_fd(&socket),
            libc::IPPROTO_TCP,
            libc::TCP_MAXSEG,
            (&mss as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    anyhow::ensure!(set == 0, "TCP_MAXSEG: {}", std::io::Error::last_os_error());
    let mut stream = socket.connect(address).await?;
    stream.write_all(request.as_bytes()).await?;
    shared.totals.connected.fetch_add(1, Ordering::Relaxed);
    std::future::pending::<()>().await;
    drop(stream);
    Ok(())
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

#[derive(Deserialize)]
struct Page {
    logs: String,
    after: Option<String>,
    total: String,
}

async fn poller(i: usize, shared: &Shared) -> anyhow::Result<()> {
    let Shared { client, base, fqn, run, totals, measuring, gate, .. } = shared;
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
