//! `tailrace-bench failover [--quick] [--graceful]`: a node of a
//! three-process cluster dies under load; how long until its queues are
//! pulled again, and was anything lost or delivered twice?
//!
//! It starts a private `redis-server` (a free loopback port, no
//! persistence, so the nodes run with `[lease] allow_volatile_redis`) and
//! three `tailrace node` processes (this executable) with
//! 12 queues, the default leases (8 s ttl, 2 s renew, 1 s acquire) and the
//! audit log on (one file per node). The bench produces a steady load with
//! the Redis adapter's producer (the path a producer process takes), events
//! with unique ids in the audited namespace. Once every node holds its
//! share, it kills the node holding the most queues (`kill -9`; SIGTERM
//! with `--graceful`) and keeps producing. It then stops the load, waits
//! until every produced event is in an audit log (or a deadline), stops the
//! other nodes with SIGTERM and prints
//! `RESULT scenario=failover mode=… lease_ttl_ms=… reown_ms=… reown_over_ttl=… first_delivery_ms=… produced=… lost=… duplicates=…`:
//!
//! - `reown_ms`: from the kill until a live node holds every queue of the
//!   killed one (read from the live nodes' admin API, i.e. the lease keys);
//! - `first_delivery_ms`: from the kill until the first audit line of an
//!   event of one of those queues written by another node (polled every
//!   50 ms);
//! - `lost`: produced ids never audited; `duplicates`: ids audited more
//!   than once (possible after `kill -9`: what the killed node delivered
//!   but had not yet acknowledged is delivered again; none after SIGTERM).
//!
//! It exits non-zero if `lost > 0`, or `duplicates > 0` with `--graceful`.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

use super::cluster::{NAMESPACE, NodeProc, private_redis};
use tailrace::adapters::redis::{RedisAdapterFactory, RedisOptions};
use tailrace::archive::AuditLine;
use tailrace::queue::{QueueAdapterFactory, QueueMapper};
use tailrace::{Event, EventId, StreamId};
use tailrace_testkit::redis_server::RedisServer;
use tokio_util::sync::CancellationToken;

const QUEUES: u32 = 12;
const NODES: usize = 3;
const STREAMS: usize = 48;
/// The defaults of `[lease]`.
const LEASE_TTL: Duration = Duration::from_secs(8);

/// How hard and how long.
struct Shape {
    /// Containers per second.
    containers_per_sec: u64,
    /// Events per container.
    batch: u64,
    /// Load before the kill, once the queues are spread.
    before: Duration,
    /// Load after the queues were re-owned and first delivered.
    after: Duration,
}

fn shape(quick: bool) -> Shape {
    if quick {
        Shape { containers_per_sec: 50, batch: 2, before: Duration::from_secs(3), after: Duration::from_secs(2) }
    } else {
        Shape { containers_per_sec: 200, batch: 5, before: Duration::from_secs(10), after: Duration::from_secs(10) }
    }
}

pub async fn run(quick: bool, graceful: bool) -> anyhow::Result<()> {
    let shape = shape(quick);
    let dir = tempfile::Builder::new().prefix("tailrace-failover-").tempdir().context("creating a work directory")?;
    let outcome = Bench::start(dir.path(), &shape).await;
    let mut bench = match outcome {
        Ok(bench) => bench,
        Err(error) => {
            let kept = dir.keep();
            return Err(error.context(format!("node logs kept in {}", kept.display())));
        }
    };
    let result = bench.run(&shape, graceful).await;
    bench.stop().await;
    match result {
        Ok(report) => {
            println!("{}", report.line(graceful));
            if report.lost > 0 {
                bail!("{} produced events were never delivered", report.lost);
            }
            if graceful && report.duplicates > 0 {
                bail!("{} events were delivered twice after a graceful stop", report.duplicates);
            }
            Ok(())
        }
        Err(error) => {
            let kept = dir.keep();
            Err(error.context(format!("node logs kept in {}", kept.display())))
        }
    }
}

/// What the audit logs said so far.
#[derive(Default)]
struct Audited {
    /// Files and how far they were read.
    offsets: HashMap<PathBuf, u64>,
    /// Times each event number was audited.
    counts: HashMap<u64, u32>,
    lines: u64,
}

impl Audited {
    /// Reads the complete lines added to `files` since the last call.
    fn poll(&mut self, files: &[PathBuf]) -> anyhow::Result<Vec<AuditLine>> {
        use std::io::{Read, Seek};
        let mut new = Vec::new();
        for path in files {
            let Ok(mut file) = std::fs::File::open(path) else { continue };
            let offset = self.offsets.entry(path.clone()).or_insert(0);
            file.seek(std::io::SeekFrom::Start(*offset))?;
            let mut text = String::new();
            file.read_to_string(&mut text)?;
            let complete = text.rfind('\n').map_or(0, |i| i + 1);
            for line in text[..complete].lines() {
                let line = AuditLine::parse(line).with_context(|| format!("{}: `{line}`", path.display()))?;
                if let Some(n) = line.event.strip_prefix('e').and_then(|n| n.parse().ok()) {
                    *self.counts.entry(n).or_insert(0) += 1;
                }
                self.lines += 1;
                new.push(line);
            }
            *offset += complete as u64;
        }
        Ok(new)
    }

    fn missing(&self, produced: u64) -> u64 {
        (0..produced).filter(|n| !self.counts.contains_key(n)).count() as u64
    }
}

/// The measured run.
struct Report {
    reown: Duration,
    first_delivery: Duration,
    produced: u64,
    lost: u64,
    duplicates: u64,
}

impl Report {
    fn line(&self, graceful: bool) -> String {
        format!(
            "RESULT scenario=failover mode={} lease_ttl_ms={} reown_ms={} reown_over_ttl={:.3} first_delivery_ms={} \
             produced={} lost={} duplicates={}",
            if graceful { "graceful" } else { "kill" },
            LEASE_TTL.as_millis(),
            self.reown.as_millis(),
            self.reown.as_secs_f64() / LEASE_TTL.as_secs_f64(),
            self.first_delivery.as_millis(),
            self.produced,
            self.lost,
            self.duplicates
        )
    }
}

struct Bench {
    redis: RedisServer,
    redis_url: String,
    /// The cluster cookie of this run's nodes (random).
    cookie: String,
    nodes: Vec<NodeProc>,
    http: reqwest::Client,
}

impl Bench {
    async fn start(dir: &Path, shape: &Shape) -> anyhow::Result<Self> {
        let (redis, redis_url) = private_redis();
        println!(
            "failover: {NODES} node processes, {QUEUES} queues, leases {}s/2s/1s, {} events/s over {STREAMS} streams, \
             redis on {redis_url}, audit logs in {}",
            LEASE_TTL.as_secs(),
            shape.containers_per_sec * shape.batch,
            dir.display()
        );
        let cookie = format!("{:032x}{:032x}", rand::random::<u128>(), rand::random::<u128>());
        let mut bench = Self { redis, redis_url, cookie, nodes: Vec::new(), http: reqwest::Client::new() };
        for i in 1..=NODES {
            let node = NodeProc::spawn(dir, &format!("n{i}"), &bench.redis_url, &bench.cookie, QUEUES).await?;
            bench.nodes.push(node);
        }
        Ok(bench)
    }

    fn audit_files(&self) -> Vec<PathBuf> {
        self.nodes.iter().map(|n| n.audit.clone()).collect()
    }

    /// Queue → holder as a live node sees it.
    async fn holders(&self) -> Option<BTreeMap<u32, Option<String>>> {
        for node in self.nodes.iter().filter(|n| n.alive) {
            if let Some(held) = node.holders(&self.http).await {
                return Some(held);
            }
        }
        None
    }

    fn owned_line(&self, held: Option<&BTreeMap<u32, Option<String>>>) -> String {
        self.nodes
            .iter()
            .map(|node| {
                if !node.alive {
                    return format!("{}=dead", node.name);
                }
                let n = held.map_or(0, |h| h.values().filter(|v| v.as_deref() == Some(&node.name)).count());
                format!("{}={n}", node.name)
            })
            .collect::<Vec<_>>()
            .join(" ")
    }

    async fn run(&mut self, shape: &Shape, graceful: bool) -> anyhow::Result<Report> {
        let streams: Vec<StreamId> = (0..STREAMS).map(|i| StreamId::new(NAMESPACE, format!("s{i}"))).collect();
        let mapper = QueueMapper::new(QUEUES);
        let queue_of: HashMap<String, u32> =
            streams.iter().map(|s| (s.key().to_string(), mapper.queue_for(s).0)).collect();
        let options = RedisOptions { url: self.redis_url.clone(), ..RedisOptions::default() };
        let factory = RedisAdapterFactory::connect(QUEUES, options).await?;
        let adapter = factory.create_adapter().await?;
        let produced = Arc::new(AtomicU64::new(0));
        let stop = CancellationToken::new();
        let producer = {
            let (produced, stop, batch) = (produced.clone(), stop.clone(), shape.batch);
            let period = Duration::from_secs_f64(1.0 / shape.containers_per_sec as f64);
            tokio::spawn(async move {
                let mut tick = tokio::time::interval(period);
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                let mut container = 0usize;
                while !stop.is_cancelled() {
                    tick.tick().await;
                    let first = produced.load(Ordering::Relaxed);
                    let events: Vec<Event> = (first..first + batch)
                        .map(|n| Event::new(EventId::new(format!("e{n}")), format!("event {n}")))
                        .collect();
                    adapter
                        .enqueue(&streams[container % STREAMS], events)
                        .await
                        .with_context(|| format!("producing events e{first}.."))?;
                    produced.store(first + batch, Ordering::Relaxed);
                    container += 1;
                }
                anyhow::Ok(())
            })
        };
        let started = Instant::now();
        let mut audited = Audited::default();
        let files = self.audit_files();
        let measured = async {
            // Spread: every queue held, each node its share.
            let share = QUEUES as usize / NODES;
            let deadline = Instant::now() + Duration::from_secs(90);
            let mut last_print = Instant::now();
            let held = loop {
                audited.poll(&files)?;
                let held = self.holders().await;
                if let Some(held) = &held {
                    let spread = self
                        .nodes
                        .iter()
                        .all(|node| held.values().filter(|v| v.as_deref() == Some(&node.name)).count() == share);
                    if spread {
                        break held.clone();
                    }
                }
                anyhow::ensure!(Instant::now() < deadline, "the queues never spread over the nodes");
                if last_print.elapsed() >= Duration::from_secs(1) {
                    last_print = Instant::now();
                    self.progress(started, &produced, &audited, held.as_ref(), "spreading");
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            };
            let warm = Instant::now() + shape.before;
            while Instant::now() < warm {
                tokio::time::sleep(Duration::from_millis(100)).await;
                audited.poll(&files)?;
                if last_print.elapsed() >= Duration::from_secs(1) {
                    last_print = Instant::now();
                    self.progress(started, &produced, &audited, Some(&held), "steady");
                }
            }
            let held = self.holders().await.unwrap_or(held);
            let victim = self
                .nodes
                .iter()
                .enumerate()
                .max_by_key(|(i, n)| {
                    (held.values().filter(|v| v.as_deref() == Some(&n.name)).count(), std::cmp::Reverse(*i))
                })
                .map(|(i, _)| i)
                .context("no node")?;
            let name = self.nodes[victim].name.clone();
            let lost_queues: BTreeSet<u32> =
                held.iter().filter(|(_, v)| v.as_deref() == Some(&name)).map(|(q, _)| *q).collect();
            let killed_at = Instant::now();
            if graceful {
                self.nodes[victim].signal("TERM");
            } else {
                self.nodes[victim].signal("KILL");
            }
            self.nodes[victim].alive = false;
            println!(
                "  {:>5.1}s {} {name} (queues {lost_queues:?})",
                started.elapsed().as_secs_f64(),
                if graceful { "SIGTERM to" } else { "kill -9" }
            );
            let (mut reown, mut first) = (None, None);
            let deadline = killed_at + LEASE_TTL * 4 + Duration::from_secs(30);
            loop {
                for line in audited.poll(&files)? {
                    let queue = queue_of.get(&line.stream).copied();
                    if first.is_none() && line.node != name && queue.is_some_and(|q| lost_queues.contains(&q)) {
                        first = Some(killed_at.elapsed());
                    }
                }
                let held = self.holders().await;
                if reown.is_none()
                    && let Some(held) = &held
                {
                    let live: BTreeSet<&str> = self.nodes.iter().filter(|n| n.alive).map(|n| n.name.as_str()).collect();
                    let all = lost_queues
                        .iter()
                        .all(|q| held.get(q).and_then(|h| h.as_deref()).is_some_and(|h| live.contains(h)));
                    if all {
                        reown = Some(killed_at.elapsed());
                        println!(
                            "  {:>5.1}s every queue of {name} re-owned after {} ms",
                            started.elapsed().as_secs_f64(),
                            killed_at.elapsed().as_millis()
                        );
                    }
                }
                if let (Some(reown), Some(first)) = (reown, first)
                    && killed_at.elapsed() >= reown.max(first) + shape.after
                {
                    break;
                }
                anyhow::ensure!(
                    Instant::now() < deadline,
                    "{name}'s queues were not taken over (re-owned: {reown:?}, first delivery: {first:?})"
                );
                if last_print.elapsed() >= Duration::from_secs(1) {
                    last_print = Instant::now();
                    self.progress(started, &produced, &audited, held.as_ref(), "failover");
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            // The stopped node's exit (graceful: it handed its queues over).
            self.nodes[victim].wait_exit();
            anyhow::Ok((reown.unwrap_or_default(), first.unwrap_or_default()))
        }
        .await;
        stop.cancel();
        let produced_ok = producer.await;
        let (reown, first_delivery) = measured?;
        produced_ok.context("the producer panicked")??;
        let produced = produced.load(Ordering::Relaxed);
        // Drain: every produced event audited, or a deadline.
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut last_print = Instant::now();
        while audited.missing(produced) > 0 && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(100)).await;
            audited.poll(&files)?;
            if last_print.elapsed() >= Duration::from_secs(1) {
                last_print = Instant::now();
                let held = self.holders().await;
                self.progress(started, &AtomicU64::new(produced), &audited, held.as_ref(), "draining");
            }
        }
        let lost = audited.missing(produced);
        let duplicates = audited.counts.values().filter(|c| **c > 1).count() as u64;
        println!(
            "  {:>5.1}s produced {produced}, audit lines {}, lost {lost}, duplicated {duplicates}",
            started.elapsed().as_secs_f64(),
            audited.lines
        );
        Ok(Report { reown, first_delivery, produced, lost, duplicates })
    }

    fn progress(
        &self,
        started: Instant,
        produced: &AtomicU64,
        audited: &Audited,
        held: Option<&BTreeMap<u32, Option<String>>>,
        phase: &str,
    ) {
        println!(
            "  {:>5.1}s {phase:<9} produced={} audited={} owned: {}",
            started.elapsed().as_secs_f64(),
            produced.load(Ordering::Relaxed),
            audited.counts.len(),
            self.owned_line(held)
        );
    }

    /// Stops the live nodes in order (SIGTERM), then Redis.
    async fn stop(&mut self) {
        for node in &mut self.nodes {
            if node.alive && !node.stop(Duration::from_secs(60)).await {
                eprintln!("node {} did not stop cleanly", node.name);
            }
        }
        self.redis.stop();
    }
}
