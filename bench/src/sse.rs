//! `tailrace-bench sse`: one run followed by N viewers over loopback (1 000
//! with `--quick`, 10 000 otherwise) against N independent pollers of the
//! paginated endpoint every 2 s (OpenMetadata's client default), with the
//! same producer in both phases: 10 posts of 5 lines per second.
//!
//! The server (one node, memory queues, file run log store, the edge) runs
//! in this process; the viewers or pollers run in a child process (the
//! same binary), so the server's RSS can be measured alone and each
//! process stays under the open-files limit. Reported: store reads per
//! second for both, SSE tailers per run (the target is 1 whatever N),
//! frames per second, the server's RSS per viewer (idle, and at the end of
//! the producer's run while lines flow), whether every viewer received
//! every line posted, viewers dropped, and the p99 delay from ingest to
//! client (every line carries its send time). The SSE phase runs three
//! rounds, each with fresh viewers: `p99_ms` is the median round's, with
//! `p99_ms_min` and `p99_ms_max`; memory is the first round's.

use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use tailrace::Node;
use tailrace::NodeId;
use tailrace::adapters::memory::{MemoryAdapterFactory, MemoryOptions};
use tailrace::archive::{Archiver, FileRunLogStore, LOGS_NAMESPACE};
use tailrace::config::{Config, EdgeOptions, LogStreamSettings};
use tailrace::edge::LogEdge;
use tailrace::pubsub::ImplicitSubscriptions;
use tokio::io::AsyncBufReadExt;
use tokio_util::sync::CancellationToken;

use super::sse_client::{ClientReport, Mode, raise_open_files};

pub const FQN: &str = "bench.pipeline";
pub const RUN: &str = "run-1";
/// Posts per second and lines per post.
const POSTS_PER_SECOND: u64 = 10;
const LINES_PER_POST: usize = 5;
/// Rounds of the SSE phase (the polling baseline runs once).
const SSE_ROUNDS: usize = 3;

/// This process's resident memory, in bytes.
fn rss() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

struct Phase {
    report: ClientReport,
    store_reads_per_s: f64,
    tailers: usize,
    rss_per_viewer: Option<f64>,
    /// The same, measured at the end of the producer's run.
    rss_flowing_per_viewer: Option<f64>,
    /// Lines posted while measuring.
    posted: u64,
}

pub async fn run(quick: bool) -> anyhow::Result<()> {
    let viewers: usize = std::env::var("TAILRACE_BENCH_VIEWERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(if quick { 1_000 } else { 10_000 });
    let seconds = if quick { 8 } else { 15 };
    let limit = raise_open_files()?;
    anyhow::ensure!(limit >= viewers as u64 + 256, "the open-files limit ({limit}) is too low for {viewers} viewers");
    println!(
        "sse: 1 run, {viewers} viewers vs {viewers} pollers (every 2 s), {} lines/s ingested for {seconds} s per phase",
        POSTS_PER_SECOND * LINES_PER_POST as u64
    );
    let dir = tempfile::tempdir()?;
    let store = Arc::new(FileRunLogStore::open(dir.path().join("runs"), false)?);
    let factory = Arc::new(MemoryAdapterFactory::new(4, MemoryOptions::default()));
    let archiver = Archiver::new(store);
    let implicit = ImplicitSubscriptions::new().bind(LOGS_NAMESPACE, archiver.clone());
    let node = Arc::new(
        Node::builder(NodeId::new("bench"), factory).config(Config::default()).implicit(implicit).start().await?,
    );
    let settings = LogStreamSettings {
        max_active_connections: viewers + 16,
        max_idle_seconds: 3600.0,
        ..LogStreamSettings::default()
    };
    let stop = CancellationToken::new();
    let edge = LogEdge::new(
        node.clone(),
        archiver,
        EdgeOptions { log_stream: settings, ..EdgeOptions::default() },
        stop.clone(),
    );
    let (bound, _server) = edge.serve("127.0.0.1:0".parse()?, axum::Router::new(), stop.clone()).await?;
    let base = format!("http://{bound}");
    let client = reqwest::Client::new();
    post(&client, &base, 0, 0).await?; // the run exists, with one line
    let status = client
        .put(format!("{base}/api/v1/logs/{FQN}/runs/{RUN}/status"))
        .json(&serde_json::json!({ "state": "running" }))
        .send()
        .await?;
    anyhow::ensure!(status.status().is_success(), "setting the run's state: {}", status.status());

    // The SSE phase runs in rounds, each with a fresh client process; the
    // first round's memory is reported (later rounds reuse what the
    // allocator kept), the median round's p99 with the spread of all.
    let mut rounds = Vec::new();
    for round in 1..=SSE_ROUNDS {
        let measured = phase(&edge, &client, &base, Mode::Stream, viewers, seconds).await?;
        println!(
            "  SSE round {round}: p99 {:.0} ms, fewest lines {} of {}, dropped {}",
            measured.report.p99_ms(),
            measured.report.min_lines,
            measured.posted,
            measured.report.dropped
        );
        rounds.push(measured);
    }
    let mut p99s: Vec<f64> = rounds.iter().map(|r| r.report.p99_ms()).collect();
    p99s.sort_by(f64::total_cmp);
    let every_line = rounds.iter().all(|r| r.report.min_lines == r.posted);
    let dropped: usize = rounds.iter().map(|r| r.report.dropped).sum();
    let tailrace = rounds.swap_remove(0);
    // TAILRACE_BENCH_ONLY=tailrace runs the SSE phase alone (for profiling).
    let baseline = match std::env::var("TAILRACE_BENCH_ONLY").as_deref() {
        Ok("tailrace") => None,
        _ => Some(phase(&edge, &client, &base, Mode::Poll, viewers, seconds).await?),
    };
    stop.cancel();
    node.shutdown().await?;

    for (name, p) in [("tailrace (SSE)", Some(&tailrace)), ("baseline (polling)", baseline.as_ref())] {
        let Some(p) = p else { continue };
        println!(
            "  {name:<19} store reads/s {:>8.1}   lines/s to clients {:>9.0}   frames/s {:>8.0}   p99 {:>6.0} ms   clients {} (lost {})",
            p.store_reads_per_s,
            p.report.lines_per_s(),
            p.report.frames_per_s(),
            p.report.p99_ms(),
            p.report.clients,
            p.report.failed
        );
    }
    let rss_kib = tailrace.rss_per_viewer.unwrap_or(0.0) / 1024.0;
    let flowing_kib = tailrace.rss_flowing_per_viewer.unwrap_or(0.0) / 1024.0;
    println!(
        "  SSE tailers for the run: {}   server RSS per viewer: {rss_kib:.2} KiB idle, {flowing_kib:.2} KiB while lines flow",
        tailrace.tailers
    );
    println!(
        "  every viewer got every line in every round: {}   viewers dropped: {dropped}",
        if every_line { "yes" } else { "NO" },
    );
    let extra = [
        ("viewers", viewers.to_string()),
        ("readers_per_run", tailrace.tailers.to_string()),
        ("store_reads_per_s", format!("{:.1}", tailrace.store_reads_per_s)),
        ("baseline_store_reads_per_s", format!("{:.1}", baseline.as_ref().map_or(0.0, |b| b.store_reads_per_s))),
        ("frames_per_s", format!("{:.0}", tailrace.report.frames_per_s())),
        ("rss_per_viewer_kib", format!("{rss_kib:.2}")),
        ("rss_flowing_per_viewer_kib", format!("{flowing_kib:.2}")),
        ("every_viewer_every_line", every_line.to_string()),
        ("viewers_dropped", dropped.to_string()),
        ("p99_ms", format!("{:.0}", p99s[p99s.len() / 2])),
        ("p99_ms_min", format!("{:.0}", p99s[0])),
        ("p99_ms_max", format!("{:.0}", p99s[p99s.len() - 1])),
        ("sse_rounds", SSE_ROUNDS.to_string()),
        ("baseline_p99_ms", format!("{:.0}", baseline.as_ref().map_or(0.0, |b| b.report.p99_ms()))),
    ];
    let rounds = [(tailrace.report.lines_per_s(), baseline.as_ref().map_or(0.0, |b| b.report.lines_per_s()))];
    println!("{}", super::median_line("sse", &rounds, &extra));
    Ok(())
}

/// One post of `LINES_PER_POST` lines, each `t=<µs since the epoch> n=<i>`.
async fn post(client: &reqwest::Client, base: &str, batch: u64, lines: usize) -> anyhow::Result<()> {
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?.as_micros();
    let body: Vec<String> = (0..lines.max(1)).map(|i| format!("t={now} n={batch}.{i}")).collect();
    let response = client
        .post(format!("{base}/api/v1/logs/{FQN}/runs/{RUN}/lines"))
        .header("content-type", "text/plain")
        .body(body.join("\n"))
        .send()
        .await?;
    anyhow::ensure!(response.status().is_success(), "ingest answered {}", response.status());
    Ok(())
}

async fn phase(
    edge: &Arc<LogEdge>,
    client: &reqwest::Client,
    base: &str,
    mode: Mode,
    clients: usize,
    seconds: u64,
) -> anyhow::Result<Phase> {
    let before_rss = rss();
    let mut child = tokio::process::Command::new(std::env::current_exe()?)
        .args(["sse-client", "--url", base, "--mode", mode.as_str(), "--clients", &clients.to_string()])
        .args(["--seconds", &seconds.to_string(), "--fqn", FQN, "--run", RUN])
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .context("starting the client process")?;
    let stdout = child.stdout.take().context("the client's output")?;
    let mut lines = tokio::io::BufReader::new(stdout).lines();
    // The child says READY once every client connected (or polled once).
    let ready = tokio::time::timeout(Duration::from_secs(120), async {
        while let Some(line) = lines.next_line().await? {
            if line == "READY" {
                return anyhow::Ok(());
            }
        }
        bail!("the client process ended before it was ready")
    })
    .await
    .context("clients did not connect within 120 s")?;
    ready?;
    let (rss_per_viewer, tailers) = match mode {
        Mode::Stream => {
            let deadline = Instant::now() + Duration::from_secs(30);
            while edge.active_connections() < clients && Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            let grown = rss().saturating_sub(before_rss) as f64;
            (Some(grown / clients.max(1) as f64), edge.active_runs())
        }
        Mode::Poll => (None, edge.active_runs()),
    };
    let reads_before = edge.store_reads();
    let started = Instant::now();
    let mut ticker = tokio::time::interval(Duration::from_millis(1000 / POSTS_PER_SECOND));
    let mut batch = 1;
    while started.elapsed() < Duration::from_secs(seconds) {
        ticker.tick().await;
        post(client, base, batch, LINES_PER_POST).await?;
        batch += 1;
    }
    let posted = (batch - 1) * LINES_PER_POST as u64;
    let rss_flowing_per_viewer = match mode {
        Mode::Stream => Some(rss().saturating_sub(before_rss) as f64 / clients.max(1) as f64),
        Mode::Poll => None,
    };
    let store_reads_per_s = (edge.store_reads() - reads_before) as f64 / started.elapsed().as_secs_f64();
    let mut report = None;
    while let Some(line) = lines.next_line().await? {
        if let Some(json) = line.strip_prefix("REPORT ") {
            report = Some(serde_json::from_str::<ClientReport>(json)?);
        }
    }
    let status = child.wait().await?;
    anyhow::ensure!(status.success(), "the client process failed: {status}");
    let report = report.context("the client process sent no report")?;
    Ok(Phase { report, store_reads_per_s, tailers, rss_per_viewer, rss_flowing_per_viewer, posted })
}
