//! `tailrace-bench <scenario> [--quick]`: each throughput scenario runs
//! tailrace and a baseline of the same shape in one process and ends with
//! `RESULT scenario=<name> tailrace_eps=… baseline_eps=… ratio=…`;
//! `failover` runs a cluster of node processes, kills one and ends with
//! `RESULT scenario=failover … reown_ms=… lost=… duplicates=…`; `scale`
//! runs one idle and measures what it costs Redis and the nodes; `viewer`
//! drives the viewer page in headless Chromium on a million-line run;
//! `diff` diffs two runs of a million lines against GNU `diff`; `sse`
//! also has `--sweep`, `--burst` and `--stalled`, each ending with
//! `RESULT scenario=sse-<case> …`, and `--tls` (its default case over
//! HTTPS, `RESULT scenario=sse-tls …`).
//! Scenarios that run node processes take the `tailrace` binary built
//! beside this one (`TAILRACE_BIN` names another).

mod cluster;
mod diff;
mod failover;
mod file;
#[cfg(feature = "kafka")]
mod kafka;
mod pipeline;
mod redis;
mod redis_cluster;
mod scale;
mod scale_active;
mod sse;
mod sse_client;
mod transport;
mod viewer;

use clap::{Parser, Subcommand};
use std::io::Write;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// The same allocator as the `tailrace` binary, so that the tailrace side
/// of each scenario runs as it does in production.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Threads for blocking file I/O, as in the `tailrace` binary.
const MAX_BLOCKING_THREADS: usize = 16;

#[derive(Parser)]
#[command(
    name = "tailrace-bench",
    version,
    about = "tailrace's hot paths beside their baselines; the last line is `RESULT scenario=... ratio=...`"
)]
struct Args {
    #[command(subcommand)]
    scenario: Scenario,
}

/// The flag every scenario takes.
#[derive(clap::Args, Clone, Copy)]
struct Common {
    /// A shorter run (CI).
    #[arg(long)]
    quick: bool,
}

#[derive(Subcommand)]
enum Scenario {
    /// The memory pipeline: produce, agent, cache, delivery, against a channel.
    Pipeline(Common),
    /// The file handoff: its writer and its reader against raw file I/O.
    File(Common),
    /// The Redis queue: one process's produce and read against a raw loop.
    Redis {
        #[command(flatten)]
        common: Common,
        /// The Redis server to run on (its keys are deleted after each round).
        #[arg(long, default_value = "redis://127.0.0.1:6379")]
        redis_url: String,
        /// Run on a private Redis Cluster of three masters and on a private
        /// single Redis, and compare.
        #[arg(long)]
        cluster: bool,
    },
    /// The Kafka queue against a raw client loop on the same broker.
    #[cfg(feature = "kafka")]
    Kafka {
        #[command(flatten)]
        common: Common,
        /// The brokers to run on (`host:port`; its topics stay); without
        /// it, a private memory-only Tansu broker.
        #[arg(long)]
        kafka_brokers: Option<String>,
    },
    /// SSE viewers of a run against plain polling.
    Sse {
        #[command(flatten)]
        common: Common,
        /// Viewer counts from 1 000 up until p99 passes 100 ms: the largest that held.
        #[arg(long, conflicts_with_all = ["burst", "stalled"])]
        sweep: bool,
        /// 50 000 lines posted in one second to 1 000 viewers.
        #[arg(long, conflicts_with = "stalled")]
        burst: bool,
        /// One viewer that never reads beside 9 999 healthy ones, against the same without it.
        #[arg(long)]
        stalled: bool,
        /// The default case over HTTPS (2 000 viewers; 500 with --quick).
        #[arg(long, conflicts_with_all = ["sweep", "burst", "stalled"])]
        tls: bool,
    },
    /// Calls between two nodes against a plain TCP request loop.
    Transport(Common),
    /// A cluster of node processes: one killed, its queues re-owned.
    Failover {
        #[command(flatten)]
        common: Common,
        /// Stop the node with SIGTERM instead of `kill -9`.
        #[arg(long)]
        graceful: bool,
    },
    /// Three nodes and many queues on one Redis: idle cost and busy rate.
    Scale {
        #[command(flatten)]
        common: Common,
        /// How many queues (default 1 000; 120 with --quick).
        #[arg(long)]
        queues: Option<u32>,
    },
    /// The viewer page in headless Chromium on a million-line run.
    Viewer(Common),
    /// The run diff on two runs of a million lines against GNU diff.
    Diff(Common),
    /// The client process of `sse` (viewers or pollers).
    #[command(hide = true)]
    SseClient(sse_client::ClientArgs),
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    tailrace::tls::use_ring_by_default();
    let runtime =
        tokio::runtime::Builder::new_multi_thread().max_blocking_threads(MAX_BLOCKING_THREADS).enable_all().build()?;
    runtime.block_on(run(args.scenario))
}

async fn run(scenario: Scenario) -> anyhow::Result<()> {
    match scenario {
        Scenario::Pipeline(Common { quick }) => pipeline::run(quick).await,
        Scenario::File(Common { quick }) => file::run(quick).await,
        Scenario::Redis { common, cluster: true, .. } => redis_cluster::run(common.quick).await,
        Scenario::Redis { common, redis_url, .. } => redis::run(common.quick, &redis_url).await,
        #[cfg(feature = "kafka")]
        Scenario::Kafka { common, kafka_brokers } => kafka::run(common.quick, kafka_brokers.as_deref()).await,
        Scenario::Sse { common, sweep, burst, stalled, tls } => {
            let case = match (sweep, burst, stalled, tls) {
                (true, ..) => sse::Case::Sweep,
                (_, true, ..) => sse::Case::Burst,
                (_, _, true, _) => sse::Case::Stalled,
                (.., true) => sse::Case::Tls,
                _ => sse::Case::Default,
            };
            sse::run(common.quick, case).await
        }
        Scenario::Transport(Common { quick }) => transport::run(quick).await,
        Scenario::Failover { common, graceful } => failover::run(common.quick, graceful).await,
        Scenario::Scale { common, queues } => scale::run(common.quick, queues).await,
        Scenario::Viewer(Common { quick }) => viewer::run(quick).await,
        Scenario::Diff(Common { quick }) => diff::run(quick).await,
        Scenario::SseClient(args) => sse_client::run(args).await,
    }
}

/// The config of a bench's nodes: the defaults, with the sections of
/// `TAILRACE_BENCH_NODE_CONFIG` over them (to measure a setting).
pub(crate) fn node_config() -> anyhow::Result<tailrace::config::Config> {
    let extra = std::env::var(cluster::NODE_CONFIG_ENV).unwrap_or_default();
    Ok(tailrace::config::Config::from_toml(&extra, cluster::NODE_CONFIG_ENV)?)
}

/// Milliseconds since the Unix epoch, as events are stamped.
pub(crate) fn now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

/// Microseconds since the Unix epoch, as the audit log stamps its lines.
pub(crate) fn now_us() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_micros() as u64)
}

/// The last line every scenario prints, from `(tailrace, baseline)` rates
/// measured in alternating rounds: the round with the median ratio is
/// reported (its rates and its ratio), then the lowest and highest ratio
/// of all rounds and their count, so a one-round dip shows as such.
pub fn median_line(scenario: &str, rounds: &[(f64, f64)], extra: &[(&str, String)]) -> String {
    let spread = Spread::of(rounds);
    let (tailrace, baseline) = spread.median_round;
    let mut line = format!(
        "RESULT scenario={scenario} tailrace_eps={tailrace:.0} baseline_eps={baseline:.0} ratio={:.3} ratio_min={:.3} ratio_max={:.3} rounds={}",
        spread.median, spread.min, spread.max, spread.rounds
    );
    for (key, value) in extra {
        line.push_str(&format!(" {key}={value}"));
    }
    line
}

/// The ratios of `(tailrace, baseline)` rounds: the median round, and the
/// lowest and highest ratio.
pub struct Spread {
    pub median_round: (f64, f64),
    pub median: f64,
    pub min: f64,
    pub max: f64,
    pub rounds: usize,
}

impl Spread {
    pub fn of(rounds: &[(f64, f64)]) -> Self {
        let ratio = |(t, b): (f64, f64)| if b > 0.0 { t / b } else { 0.0 };
        let mut sorted = rounds.to_vec();
        sorted.sort_by(|x, y| ratio(*x).total_cmp(&ratio(*y)));
        let median_round = sorted.get(sorted.len() / 2).copied().unwrap_or_default();
        Self {
            median_round,
            median: ratio(median_round),
            min: sorted.first().copied().map_or(0.0, ratio),
            max: sorted.last().copied().map_or(0.0, ratio),
            rounds: sorted.len(),
        }
    }
}

/// Prints a progress line every second while a run goes.
pub struct Progress {
    stop: Arc<AtomicU64>,
    task: tokio::task::JoinHandle<()>,
}

impl Progress {
    pub fn start(label: &'static str, total: u64, done: Arc<AtomicU64>) -> Self {
        let stop = Arc::new(AtomicU64::new(0));
        let flag = stop.clone();
        let task = tokio::spawn(async move {
            let started = Instant::now();
            loop {
                tokio::time::sleep(Duration::from_secs(1)).await;
                if flag.load(Ordering::Relaxed) == 1 {
                    return;
                }
                let n = done.load(Ordering::Relaxed);
                eprint!(
                    "\r  {label}: {n}/{total} events ({:.0}%) after {:.0?}   ",
                    n as f64 * 100.0 / total.max(1) as f64,
                    started.elapsed()
                );
                let _ = std::io::stderr().flush();
            }
        });
        Self { stop, task }
    }

    pub fn finish(self) {
        self.stop.store(1, Ordering::Relaxed);
        self.task.abort();
        eprint!("\r\x1b[2K");
    }
}
