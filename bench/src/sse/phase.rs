//! One measured phase of `sse`: a fresh client process, its viewers (or
//! pollers) in place, the producer's load, then the client's report and
//! what the kernel says about the window.

use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use tokio::io::AsyncBufReadExt;

use super::Server;
use super::measure::{CpuSample, CpuSplit, PerfCount, Writes, kernel_slab_bytes, kernel_tcp_bytes, rss};
use crate::now_us;
use crate::sse_client::{ClientReport, Mode};

/// The producer's load: `posts_per_second` posts of `lines_per_post`
/// lines for `seconds`.
#[derive(Clone, Copy, Debug)]
pub(super) struct Load {
    pub posts_per_second: u64,
    pub lines_per_post: usize,
    pub seconds: u64,
}

impl Load {
    pub(super) fn posts(&self) -> u64 {
        self.posts_per_second * self.seconds
    }
}

/// What a phase runs.
#[derive(Clone, Copy, Debug)]
pub(super) struct Spec {
    pub mode: Mode,
    pub clients: usize,
    /// Viewers that never read, beside `clients`.
    pub stalled: usize,
    pub load: Load,
    /// Wait until every viewer has every line posted (the burst).
    pub expect_all: bool,
    /// Viewers start at the run's head rather than at line 0.
    pub at_head: bool,
}

impl Spec {
    pub(super) fn stream(clients: usize, load: Load) -> Self {
        Self { mode: Mode::Stream, clients, stalled: 0, load, expect_all: false, at_head: false }
    }
}

pub(super) struct Phase {
    pub report: ClientReport,
    pub store_reads_per_s: f64,
    pub tailers: usize,
    /// The server's RSS growth per viewer, idle and at the end of the
    /// producer's run.
    pub rss_per_viewer: Option<f64>,
    pub rss_flowing_per_viewer: Option<f64>,
    /// The same for the kernel's TCP buffer memory and its slab (both ends
    /// of each connection, host-wide).
    pub kernel_per_viewer: Option<f64>,
    pub kernel_flowing_per_viewer: Option<f64>,
    pub slab_per_viewer: Option<f64>,
    pub slab_flowing_per_viewer: Option<f64>,
    /// Lines posted while measuring, and how long posting took.
    pub posted: u64,
    pub posting_seconds: f64,
    /// The measured window: from the first post to the end of posting, or
    /// with `expect_all` to the client's report.
    pub window_seconds: f64,
    /// When the first measured post was sent (µs since the epoch).
    pub started_us: u64,
    /// When the last one was.
    pub last_post_us: u64,
    /// The server's write calls over the window (`None` without perf).
    pub writes: Option<Writes>,
    pub cpu: CpuSplit,
    /// SSE connections open at the end of the window.
    pub connections_at_end: usize,
}

impl Phase {
    /// The server's `send` and `writev` calls per viewer and second of the
    /// window (a viewer's connection task writes with `send`, the fan-out
    /// with `writev`; hyper's answers to the producer, about 20 a second,
    /// are in it too).
    pub(super) fn writes_per_viewer_s(&self, viewers: usize) -> Option<f64> {
        self.writes.map(|w| (w.sendto + w.writev) as f64 / (viewers.max(1) as f64 * self.window_seconds.max(1e-9)))
    }

    pub(super) fn every_line(&self) -> bool {
        self.report.min_lines == self.posted && self.report.failed == 0
    }

    /// The round's line: p99, lines, writes and how the cores were shared.
    pub(super) fn summary(&self, viewers: usize) -> String {
        let writes = match (self.writes_per_viewer_s(viewers), self.writes) {
            (Some(per), Some(w)) => format!("{per:.1} [send {}, writev {}, write {}]", w.sendto, w.writev, w.write),
            _ => "n/a".to_string(),
        };
        format!(
            "p99 {:.0} ms, fewest lines {} of {}, dropped {}, writes/viewer-s {writes} (client reads {:.1}); {}",
            self.report.p99_ms(),
            self.report.min_lines,
            self.posted,
            self.report.dropped,
            self.report.reads_per_viewer_s(),
            self.cpu
        )
    }
}

pub(super) async fn phase(server: &Server, spec: Spec) -> anyhow::Result<Phase> {
    let edge = &server.edge;
    let before_rss = rss();
    let before_kernel = kernel_tcp_bytes();
    let before_slab = kernel_slab_bytes();
    let everyone = spec.clients + spec.stalled;
    let mut command = tokio::process::Command::new(std::env::current_exe()?);
    command
        .args(["sse-client", "--url", &server.base, "--mode", spec.mode.as_str()])
        .args(["--clients", &spec.clients.to_string(), "--stalled", &spec.stalled.to_string()])
        .args(["--seconds", &spec.load.seconds.to_string(), "--fqn", super::FQN, "--run", super::RUN]);
    if spec.expect_all {
        let lines = spec.load.posts() * spec.load.lines_per_post as u64;
        command.args(["--expect", &lines.to_string()]);
    }
    if spec.at_head {
        command.args(["--after", &server.lines().to_string()]);
    }
    if let Some(ca) = &server.ca {
        command.arg("--ca-file").arg(ca);
    }
    let mut child = command
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .context("starting the client process")?;
    let child_pid = child.id();
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
    let per_viewer = |grown: u64| Some(grown as f64 / everyone.max(1) as f64);
    let grown_slab = || per_viewer(kernel_slab_bytes().saturating_sub(before_slab));
    let (rss_per_viewer, kernel_per_viewer, slab_per_viewer, tailers) = match spec.mode {
        Mode::Stream => {
            let deadline = Instant::now() + Duration::from_secs(30);
            while edge.active_connections() < everyone && Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            let grown = per_viewer(rss().saturating_sub(before_rss));
            let kernel = per_viewer(kernel_tcp_bytes().saturating_sub(before_kernel));
            (grown, kernel, grown_slab(), edge.active_runs())
        }
        Mode::Poll => (None, None, None, edge.active_runs()),
    };
    let perf = match spec.mode {
        Mode::Stream => PerfCount::start().await,
        Mode::Poll => None,
    };
    let cpu_before = CpuSample::take(child_pid);
    let reads_before = edge.store_reads();
    let started = Instant::now();
    let started_us = now_us();
    let mut last_post_us = started_us;
    let mut ticker = tokio::time::interval(Duration::from_micros(1_000_000 / spec.load.posts_per_second.max(1)));
    for batch in 1..=spec.load.posts() {
        ticker.tick().await;
        last_post_us = now_us();
        server.post(batch, spec.load.lines_per_post).await?;
    }
    let posting_seconds = started.elapsed().as_secs_f64();
    let posted = spec.load.posts() * spec.load.lines_per_post as u64;
    let (rss_flowing_per_viewer, kernel_flowing_per_viewer, slab_flowing_per_viewer) = match spec.mode {
        Mode::Stream => (
            per_viewer(rss().saturating_sub(before_rss)),
            per_viewer(kernel_tcp_bytes().saturating_sub(before_kernel)),
            grown_slab(),
        ),
        Mode::Poll => (None, None, None),
    };
    let store_reads_per_s = (edge.store_reads() - reads_before) as f64 / started.elapsed().as_secs_f64();
    // The window ends with the producer, or with the burst's last viewer
    // (the client's report).
    let mut perf = perf;
    let mut window = None;
    if !spec.expect_all {
        window = Some(close_window(started, child_pid, edge, perf.take()).await);
    }
    let mut report = None;
    while let Some(line) = lines.next_line().await? {
        if let Some(json) = line.strip_prefix("REPORT ") {
            report = Some(serde_json::from_str::<ClientReport>(json)?);
            if window.is_none() {
                window = Some(close_window(started, child_pid, edge, perf.take()).await);
            }
        }
    }
    let (window_seconds, cpu_after, connections_at_end, writes) =
        window.context("the client process sent no report")?;
    let status = child.wait().await?;
    anyhow::ensure!(status.success(), "the client process failed: {status}");
    let report = report.context("the client process sent no report")?;
    Ok(Phase {
        report,
        store_reads_per_s,
        tailers,
        rss_per_viewer,
        rss_flowing_per_viewer,
        kernel_per_viewer,
        kernel_flowing_per_viewer,
        slab_per_viewer,
        slab_flowing_per_viewer,
        posted,
        posting_seconds,
        window_seconds,
        started_us,
        last_post_us,
        writes,
        cpu: cpu_after.since(cpu_before, window_seconds),
        connections_at_end,
    })
}

/// The end of a measured window: its length, the CPU times, the open SSE
/// connections, and perf's counts.
async fn close_window(
    started: Instant,
    child_pid: Option<u32>,
    edge: &tailrace::edge::LogEdge,
    perf: Option<PerfCount>,
) -> (f64, CpuSample, usize, Option<Writes>) {
    let seconds = started.elapsed().as_secs_f64();
    let cpu = CpuSample::take(child_pid);
    let connections = edge.active_connections();
    let writes = match perf {
        Some(perf) => match perf.stop().await {
            Ok(writes) => Some(writes),
            Err(error) => {
                eprintln!("  (perf: {error:#})");
                None
            }
        },
        None => None,
    };
    (seconds, cpu, connections, writes)
}
