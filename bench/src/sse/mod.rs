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
//!
//! Each SSE round also reports the server's socket writes per viewer and
//! second (`send` calls counted by `perf stat` on this process, and the
//! clients' reads that returned data), the kernel's TCP memory per viewer
//! beside the server's RSS, and how the two cores were shared: each
//! process's CPU time over the window (nothing is pinned: server and
//! clients share both cores as the scheduler decides, and the report
//! shows what each took). The other cases (`cases.rs`): `--sweep`,
//! `--burst`, `--stalled`. `--tls` runs the default case over HTTPS
//! (`[edge.tls]`, a certificate of an authority made for the run with
//! `openssl`; the viewers and pollers are TLS clients), at 2 000 viewers
//! (500 with `--quick`): encryption costs the server and the clients CPU
//! on the same two cores.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use tailrace::Node;
use tailrace::NodeId;
use tailrace::adapters::memory::{MemoryAdapterFactory, MemoryOptions};
use tailrace::archive::{Archiver, FileRunLogStore, LOGS_NAMESPACE};
use tailrace::config::{Config, EdgeOptions, LogStreamSettings};
use tailrace::edge::LogEdge;
use tailrace::pubsub::ImplicitSubscriptions;
use tokio_util::sync::CancellationToken;

use super::sse_client::{Mode, raise_open_files};
use phase::{Load, Phase, Spec, phase};

mod cases;
mod measure;
mod phase;

pub const FQN: &str = "bench.pipeline";
pub const RUN: &str = "run-1";
/// Posts per second and lines per post.
const POSTS_PER_SECOND: u64 = 10;
const LINES_PER_POST: usize = 5;
/// Rounds of the SSE phase (the polling baseline runs once).
const SSE_ROUNDS: usize = 3;

/// Which case `sse` runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Case {
    /// N viewers in three rounds against N pollers.
    Default,
    /// Viewer counts up until p99 passes 100 ms.
    Sweep,
    /// 50 000 lines in one second to 1 000 viewers.
    Burst,
    /// One viewer that never reads beside healthy ones.
    Stalled,
    /// The default case over HTTPS.
    Tls,
}

pub async fn run(quick: bool, case: Case) -> anyhow::Result<()> {
    match case {
        Case::Default => default_case(quick, false).await,
        Case::Tls => default_case(quick, true).await,
        Case::Sweep => cases::sweep(quick).await,
        Case::Burst => cases::burst(quick).await,
        Case::Stalled => cases::stalled(quick).await,
    }
}

/// The server: one node, memory queues, a file run log store and the
/// edge on loopback, with one run in the `running` state.
pub(super) struct Server {
    pub edge: Arc<LogEdge>,
    pub base: String,
    client: reqwest::Client,
    node: Arc<Node>,
    stop: CancellationToken,
    /// Lines the run has.
    lines: AtomicU64,
    /// Over HTTPS: the authority's certificate the clients trust.
    pub ca: Option<std::path::PathBuf>,
    _dir: tempfile::TempDir,
}

impl Server {
    /// A server for up to `viewers` viewers at once; `settings` adjusts the
    /// stream settings.
    pub(super) async fn start(viewers: usize, settings: impl FnOnce(&mut LogStreamSettings)) -> anyhow::Result<Self> {
        Self::start_with(viewers, false, settings).await
    }

    /// As [`Server::start`], over HTTPS with `tls`.
    pub(super) async fn start_with(
        viewers: usize,
        tls: bool,
        settings: impl FnOnce(&mut LogStreamSettings),
    ) -> anyhow::Result<Self> {
        let limit = raise_open_files(viewers as u64 + 1024)?;
        anyhow::ensure!(
            limit >= viewers as u64 + 256,
            "the open-files limit ({limit}) is too low for {viewers} viewers"
        );
        let dir = tempfile::tempdir()?;
        let store = Arc::new(FileRunLogStore::open(dir.path().join("runs"), false)?);
        let factory = Arc::new(MemoryAdapterFactory::new(4, MemoryOptions::default()));
        let archiver = Archiver::new(store);
        let implicit = ImplicitSubscriptions::new().bind(LOGS_NAMESPACE, archiver.clone());
        let node = Arc::new(
            Node::builder(NodeId::new("bench"), factory).config(Config::default()).implicit(implicit).start().await?,
        );
        let mut log_stream = LogStreamSettings {
            max_active_connections: viewers + 16,
            max_idle_seconds: 3600.0,
            ..LogStreamSettings::default()
        };
        settings(&mut log_stream);
        let mut client = reqwest::Client::builder();
        let mut options = EdgeOptions { log_stream, ..EdgeOptions::default() };
        let ca = if tls {
            let certs = dir.path().to_path_buf();
            tokio::task::spawn_blocking(move || tailrace_testkit::certs::authority(&certs, "ca", &["edge"])).await?;
            let (cert, key) = (dir.path().join("edge.pem"), dir.path().join("edge.key"));
            options.tls = Some(tailrace::config::EdgeTls { cert, key });
            let ca = dir.path().join("ca.pem");
            client = client.tls_certs_only(reqwest::Certificate::from_pem_bundle(&std::fs::read(&ca)?)?);
            Some(ca)
        } else {
            None
        };
        let stop = CancellationToken::new();
        let edge = LogEdge::new(node.clone(), archiver, options, stop.clone());
        let (bound, _server) = edge.serve("127.0.0.1:0".parse()?, axum::Router::new(), stop.clone()).await?;
        let scheme = if tls { "https" } else { "http" };
        let server = Self {
            edge,
            base: format!("{scheme}://{bound}"),
            client: client.build()?,
            node,
            stop,
            lines: AtomicU64::new(0),
            ca,
            _dir: dir,
        };
        server.post(0, 0).await?; // the run exists, with one line
        let status = server
            .client
            .put(format!("{}/api/v1/logs/{FQN}/runs/{RUN}/status", server.base))
            .json(&serde_json::json!({ "state": "running" }))
            .send()
            .await?;
        anyhow::ensure!(status.status().is_success(), "setting the run's state: {}", status.status());
        Ok(server)
    }

    /// One post of `lines` lines (at least one), each `t=<µs since the
    /// epoch> n=<batch>.<i>`.
    pub(super) async fn post(&self, batch: u64, lines: usize) -> anyhow::Result<()> {
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?.as_micros();
        let body: Vec<String> = (0..lines.max(1)).map(|i| format!("t={now} n={batch}.{i}")).collect();
        let response = self
            .client
            .post(format!("{}/api/v1/logs/{FQN}/runs/{RUN}/lines", self.base))
            .header("content-type", "text/plain")
            .body(body.join("\n"))
            .send()
            .await?;
        anyhow::ensure!(response.status().is_success(), "ingest answered {}", response.status());
        self.lines.fetch_add(lines.max(1) as u64, Ordering::Relaxed);
        Ok(())
    }

    /// Lines the run has (the head: a viewer starting there gets only new
    /// lines).
    pub(super) fn lines(&self) -> u64 {
        self.lines.load(Ordering::Relaxed)
    }

    pub(super) async fn shutdown(self) -> anyhow::Result<()> {
        self.stop.cancel();
        self.node.shutdown().await?;
        Ok(())
    }
}

/// The producer's steady load for `seconds`.
fn steady(seconds: u64) -> Load {
    Load { posts_per_second: POSTS_PER_SECOND, lines_per_post: LINES_PER_POST, seconds }
}

/// KiB per viewer, or 0 when not measured.
fn kib(bytes: Option<f64>) -> f64 {
    bytes.unwrap_or(0.0) / 1024.0
}

/// The median of `values` (sorted in place), with the lowest and highest.
pub(super) fn spread(values: &mut [f64]) -> (f64, f64, f64) {
    values.sort_by(f64::total_cmp);
    match values {
        [] => (0.0, 0.0, 0.0),
        _ => (values[values.len() / 2], values[0], values[values.len() - 1]),
    }
}

/// The default case, over HTTPS with `tls` (`sse --tls`).
async fn default_case(quick: bool, tls: bool) -> anyhow::Result<()> {
    let default_viewers = match (tls, quick) {
        (false, false) => 10_000,
        (false, true) => 1_000,
        (true, false) => 2_000,
        (true, true) => 500,
    };
    let viewers: usize =
        std::env::var("TAILRACE_BENCH_VIEWERS").ok().and_then(|v| v.parse().ok()).unwrap_or(default_viewers);
    let seconds = if quick { 8 } else { 15 };
    let (name, over) = if tls { ("sse-tls", " over HTTPS") } else { ("sse", "") };
    println!(
        "{name}: 1 run, {viewers} viewers vs {viewers} pollers (every 2 s){over}, {} lines/s ingested for {seconds} s per phase",
        POSTS_PER_SECOND * LINES_PER_POST as u64
    );
    let server = Server::start_with(viewers, tls, |_| {}).await?;

    // The SSE phase runs in rounds, each with a fresh client process; the
    // first round's memory is reported (later rounds reuse what the
    // allocator kept), the median round's p99 with the spread of all.
    let mut rounds: Vec<Phase> = Vec::new();
    for round in 1..=SSE_ROUNDS {
        let measured = phase(&server, Spec::stream(viewers, steady(seconds))).await?;
        println!("  SSE round {round}: {}", measured.summary(viewers));
        rounds.push(measured);
    }
    let (p99, p99_min, p99_max) = spread(&mut rounds.iter().map(|r| r.report.p99_ms()).collect::<Vec<_>>());
    let every_line = rounds.iter().all(|r| r.report.min_lines == r.posted);
    let dropped: usize = rounds.iter().map(|r| r.report.dropped).sum();
    let writes: Vec<f64> = rounds.iter().filter_map(|r| r.writes_per_viewer_s(viewers)).collect();
    let writes = (!writes.is_empty()).then(|| spread(&mut writes.clone()).0);
    let reads = spread(&mut rounds.iter().map(|r| r.report.reads_per_viewer_s()).collect::<Vec<_>>()).0;
    let server_cores = spread(&mut rounds.iter().map(|r| r.cpu.server).collect::<Vec<_>>()).0;
    let client_cores = spread(&mut rounds.iter().map(|r| r.cpu.client).collect::<Vec<_>>()).0;
    let host_busy = spread(&mut rounds.iter().map(|r| r.cpu.host_busy).collect::<Vec<_>>()).0;
    let tailrace = rounds.swap_remove(0);
    // TAILRACE_BENCH_ONLY=tailrace runs the SSE phase alone (for profiling).
    let baseline = match std::env::var("TAILRACE_BENCH_ONLY").as_deref() {
        Ok("tailrace") => None,
        _ => Some(phase(&server, Spec { mode: Mode::Poll, ..Spec::stream(viewers, steady(seconds)) }).await?),
    };
    server.shutdown().await?;

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
    let (rss_kib, flowing_kib) = (kib(tailrace.rss_per_viewer), kib(tailrace.rss_flowing_per_viewer));
    let (kernel_kib, kernel_flowing_kib) = (kib(tailrace.kernel_per_viewer), kib(tailrace.kernel_flowing_per_viewer));
    let (slab_kib, slab_flowing_kib) = (kib(tailrace.slab_per_viewer), kib(tailrace.slab_flowing_per_viewer));
    println!(
        "  SSE tailers for the run: {}   server RSS per viewer: {rss_kib:.2} KiB idle, {flowing_kib:.2} KiB while lines flow",
        tailrace.tailers
    );
    println!(
        "  kernel per viewer (both ends of its loopback connection, host-wide): TCP buffers {kernel_kib:.2} KiB idle, {kernel_flowing_kib:.2} flowing; slab {slab_kib:.2} KiB idle, {slab_flowing_kib:.2} flowing"
    );
    let writes_text = writes.map_or("n/a (no perf)".to_string(), |w| format!("{w:.1}"));
    println!(
        "  server socket writes per viewer-second (perf, send and writev calls): {writes_text}   clients' reads with data: {reads:.1}"
    );
    println!(
        "  CPU (median of rounds, no pinning): server {server_cores:.2} cores, clients {client_cores:.2} cores, host {:.0} % busy",
        host_busy * 100.0
    );
    println!(
        "  every viewer got every line in every round: {}   viewers dropped: {dropped}",
        if every_line { "yes" } else { "NO" },
    );
    let extra = [
        ("viewers", viewers.to_string()),
        ("tls", tls.to_string()),
        ("readers_per_run", tailrace.tailers.to_string()),
        ("store_reads_per_s", format!("{:.1}", tailrace.store_reads_per_s)),
        ("baseline_store_reads_per_s", format!("{:.1}", baseline.as_ref().map_or(0.0, |b| b.store_reads_per_s))),
        ("frames_per_s", format!("{:.0}", tailrace.report.frames_per_s())),
        ("rss_per_viewer_kib", format!("{rss_kib:.2}")),
        ("rss_flowing_per_viewer_kib", format!("{flowing_kib:.2}")),
        ("every_viewer_every_line", every_line.to_string()),
        ("viewers_dropped", dropped.to_string()),
        ("p99_ms", format!("{p99:.0}")),
        ("p99_ms_min", format!("{p99_min:.0}")),
        ("p99_ms_max", format!("{p99_max:.0}")),
        ("sse_rounds", SSE_ROUNDS.to_string()),
        ("baseline_p99_ms", format!("{:.0}", baseline.as_ref().map_or(0.0, |b| b.report.p99_ms()))),
        ("kernel_tcp_buffers_per_viewer_kib", format!("{kernel_kib:.2}")),
        ("kernel_tcp_buffers_flowing_per_viewer_kib", format!("{kernel_flowing_kib:.2}")),
        ("kernel_slab_per_viewer_kib", format!("{slab_kib:.2}")),
        ("kernel_slab_flowing_per_viewer_kib", format!("{slab_flowing_kib:.2}")),
        ("writes_per_viewer_s", writes.map_or("na".to_string(), |w| format!("{w:.1}"))),
        ("client_reads_per_viewer_s", format!("{reads:.1}")),
        ("server_cores", format!("{server_cores:.2}")),
        ("client_cores", format!("{client_cores:.2}")),
        ("host_busy", format!("{host_busy:.2}")),
    ];
    let rounds = [(tailrace.report.lines_per_s(), baseline.as_ref().map_or(0.0, |b| b.report.lines_per_s()))];
    println!("{}", super::median_line(name, &rounds, &extra));
    Ok(())
}
