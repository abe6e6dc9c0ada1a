//! `tailrace bench <scenario> [--quick]`: each throughput scenario runs
//! tailrace and a baseline of the same shape in one process and ends with
//! `RESULT scenario=<name> tailrace_eps=… baseline_eps=… ratio=…`;
//! `failover` runs a cluster of node processes, kills one and ends with
//! `RESULT scenario=failover … reown_ms=… lost=… duplicates=…`; `scale`
//! runs one idle and measures what it costs Redis and the nodes; `viewer`
//! drives the viewer page in headless Chromium on a million-line run.

mod cluster;
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
pub mod sse_client;
mod transport;
mod viewer;
mod webdriver;

use std::io::Write;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// How a scenario runs: the flags of `tailrace bench`.
pub struct BenchFlags {
    /// A shorter run (CI).
    pub quick: bool,
    /// failover: SIGTERM instead of SIGKILL.
    pub graceful: bool,
    /// scale: how many queues.
    pub queues: Option<u32>,
    /// redis: the server to run on.
    pub redis_url: String,
    /// redis: a private Redis Cluster of three masters against one master.
    pub cluster: bool,
    /// kafka: the brokers (a private Tansu without them).
    pub kafka_brokers: Option<String>,
}

/// The config of a bench's nodes: the defaults, with the sections of
/// `TAILRACE_BENCH_NODE_CONFIG` over them (to measure a setting).
pub(crate) fn node_config() -> anyhow::Result<tailrace::config::Config> {
    let extra = std::env::var(cluster::NODE_CONFIG_ENV).unwrap_or_default();
    Ok(tailrace::config::Config::from_toml(&extra, cluster::NODE_CONFIG_ENV)?)
}

/// Runs one scenario by name, refusing a flag the scenario does not take.
pub async fn run(scenario: &str, flags: BenchFlags) -> anyhow::Result<()> {
    let BenchFlags { quick, graceful, queues, redis_url, cluster, kafka_brokers } = flags;
    if graceful && scenario != "failover" {
        anyhow::bail!("--graceful applies to the failover scenario only");
    }
    if queues.is_some() && scenario != "scale" {
        anyhow::bail!("--queues applies to the scale scenario only");
    }
    if cluster && scenario != "redis" {
        anyhow::bail!("--cluster applies to the redis scenario only");
    }
    if kafka_brokers.is_some() && scenario != "kafka" {
        anyhow::bail!("--kafka-brokers applies to the kafka scenario only");
    }
    match scenario {
        "failover" => failover::run(quick, graceful).await,
        "pipeline" => pipeline::run(quick).await,
        "file" => file::run(quick).await,
        "redis" if cluster => redis_cluster::run(quick).await,
        "redis" => redis::run(quick, &redis_url).await,
        #[cfg(feature = "kafka")]
        "kafka" => kafka::run(quick, kafka_brokers.as_deref()).await,
        "sse" => sse::run(quick).await,
        "transport" => transport::run(quick).await,
        "scale" => scale::run(quick, queues).await,
        "viewer" => viewer::run(quick).await,
        other => {
            anyhow::bail!(
                "unknown bench scenario `{other}` (known: pipeline, file, redis, kafka, sse, transport, failover, scale, viewer)"
            )
        }
    }
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
