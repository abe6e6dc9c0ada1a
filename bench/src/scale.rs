//! `tailrace-bench scale [--quick] [--queues N]`: what an idle cluster
//! costs, as the queue count grows. It starts a private `redis-server` and
//! three `tailrace node` processes (the lease balancer, default leases)
//! with many queues (120 with `--quick`, 1 000 without, or `--queues N`),
//! waits until every queue is owned (`owned_ms`, from the first node's
//! start) and spread over the nodes (`balanced_ms`: their counts differ by
//! at most one), produces nothing, and samples for a while (5 s quick,
//! 20 s): Redis commands per second (from `INFO commandstats`, the bench's
//! own `INFO`s left out), in total and per queue, the top commands, Redis
//! client connections, and each node's CPU (from `/proc`, over the sample)
//! and RSS. Then, on the idle cluster:
//!
//! - produce-to-delivery latency: single events (50 quick, 200) into
//!   streams of their own, 10 ms apart, timed from the `XADD` to the
//!   delivering node's audit line (p50, p99);
//! - rebalance: a fourth node joins (time until the queues are spread over
//!   four), then leaves with SIGTERM (time until spread over three);
//! - every queue busy, in rounds, against raw `XADD` (`scale_active.rs`,
//!   whose fields end the line).
//!
//! It prints
//! `RESULT scenario=scale nodes=… queues=… owned_ms=… balanced_ms=… idle_cmds_per_sec=… idle_cmds_per_queue_sec=… redis_clients=… clients_per_node=… node_cpu_pct_max=… node_rss_mib_max=… top=… idle_latency_p50_ms=… idle_latency_p99_ms=… join_spread_ms=… join_moved=… join_moved_elsewhere=… leave_spread_ms=… leave_moved=… leave_moved_elsewhere=… active_eps=… …`.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::Context;

use super::cluster::{NodeProc, private_redis};

const NODES: usize = 3;

pub async fn run(quick: bool, queues: Option<u32>) -> anyhow::Result<()> {
    let (default_queues, sample) = if quick { (120, Duration::from_secs(5)) } else { (1_000, Duration::from_secs(20)) };
    let queues = queues.unwrap_or(default_queues);
    anyhow::ensure!(queues > 0, "--queues must be at least 1");
    let dir = tempfile::Builder::new().prefix("tailrace-scale-").tempdir().context("creating a work directory")?;
    let (mut redis, url) = private_redis();
    println!("scale: {NODES} node processes, {queues} queues, redis on {url}, audit logs in {}", dir.path().display());
    let cookie = format!("{:032x}{:032x}", rand::random::<u128>(), rand::random::<u128>());
    let started = Instant::now();
    let mut nodes = Vec::new();
    let outcome = async {
        for i in 1..=NODES {
            nodes.push(NodeProc::spawn(dir.path(), &format!("n{i}"), &url, &cookie, queues).await?);
        }
        let idle = measure(&nodes, &url, queues, started, sample).await?;
        let latency = idle_latency(&nodes, &url, queues, if quick { 50 } else { 200 }).await?;
        let rebalance = rebalance(&mut nodes, dir.path(), &url, &cookie, queues).await?;
        let active = super::scale_active::run(&nodes, &url, queues, quick).await?;
        Ok::<_, anyhow::Error>(format!("{idle} {latency} {rebalance} {active}"))
    }
    .await;
    for node in &mut nodes {
        node.stop(Duration::from_secs(60)).await;
    }
    redis.stop();
    match outcome {
        Ok(line) => {
            println!("{line}");
            Ok(())
        }
        Err(error) => {
            let kept = dir.keep();
            Err(error.context(format!("node logs kept in {}", kept.display())))
        }
    }
}

async fn measure(
    nodes: &[NodeProc],
    url: &str,
    queues: u32,
    started: Instant,
    sample: Duration,
) -> anyhow::Result<String> {
    let http = reqwest::Client::new();
    let deadline = started + Duration::from_secs(300);
    let mut last_report = Instant::now();
    let owned_ms = loop {
        let owned = match nodes[0].holders(&http).await {
            Some(held) => held.values().filter(|h| h.is_some()).count(),
            None => 0,
        };
        if owned == queues as usize {
            break started.elapsed().as_millis();
        }
        anyhow::ensure!(Instant::now() < deadline, "only {owned} of {queues} queues owned after 300 s");
        if last_report.elapsed() >= Duration::from_secs(5) {
            println!("scale: {owned} of {queues} queues owned after {} s", started.elapsed().as_secs());
            last_report = Instant::now();
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    // Balanced: every node holds its share (they differ by at most one).
    let balanced_ms = loop {
        let mut per_node: BTreeMap<String, usize> = BTreeMap::new();
        for holder in nodes[0].holders(&http).await.unwrap_or_default().into_values().flatten() {
            *per_node.entry(holder).or_default() += 1;
        }
        let (least, most) = (per_node.values().min().copied(), per_node.values().max().copied());
        if per_node.len() == nodes.len() && most.zip(least).is_some_and(|(most, least)| most - least <= 1) {
            break started.elapsed().as_millis();
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "the queues were not spread over the nodes after 300 s: {per_node:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    println!(
        "scale: all {queues} queues owned after {owned_ms} ms, spread after {balanced_ms} ms; sampling {} s idle",
        sample.as_secs()
    );
    // Let the last acquisitions settle.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let client = redis::Client::open(url).context("the bench's Redis client")?;
    let mut conn = client.get_multiplexed_async_connection().await.context("connecting to the bench's Redis")?;
    let ticks = clock_ticks();
    let before = (commandstats(&mut conn).await?, cpu_ticks(nodes)?, Instant::now());
    tokio::time::sleep(sample).await;
    let after = (commandstats(&mut conn).await?, cpu_ticks(nodes)?, Instant::now());
    let seconds = (after.2 - before.2).as_secs_f64();
    let mut rates: Vec<(String, f64)> = after
        .0
        .iter()
        .map(|(cmd, (calls, _))| (cmd.clone(), (calls - before.0.get(cmd).map_or(0, |c| c.0)) as f64 / seconds))
        .filter(|(cmd, rate)| cmd != "info" && *rate > 0.0)
        .collect();
    rates.sort_by(|a, b| b.1.total_cmp(&a.1));
    let total: f64 = rates.iter().map(|(_, r)| r).sum();
    let cpu_max =
        before.1.iter().zip(&after.1).map(|(b, a)| (a - b) as f64 / ticks / seconds * 100.0).fold(0.0, f64::max);
    let rss_max = nodes.iter().filter_map(|n| n.pid()).filter_map(rss_kib).max().unwrap_or(0);
    let clients = info_field(&mut conn, "clients", "connected_clients").await?.saturating_sub(1);
    let top: Vec<String> = rates.iter().take(6).map(|(cmd, rate)| format!("{cmd}:{rate:.0}")).collect();
    Ok(format!(
        "RESULT scenario=scale nodes={NODES} queues={queues} owned_ms={owned_ms} balanced_ms={balanced_ms} idle_cmds_per_sec={total:.0} \
         idle_cmds_per_queue_sec={:.2} redis_clients={clients} clients_per_node={:.1} node_cpu_pct_max={cpu_max:.1} \
         node_rss_mib_max={:.0} top={}",
        total / f64::from(queues),
        clients as f64 / NODES as f64,
        rss_max as f64 / 1024.0,
        top.join(",")
    ))
}

/// Produce-to-delivery latency on the idle cluster: `count` single events,
/// each into a stream of its own (so into a queue that was idle), 10 ms
/// apart, from this process through the Redis adapter as a producer does;
/// each is timed from just before its `XADD` to its audit line (written
/// by the delivering node before the delivery is acknowledged).
async fn idle_latency(nodes: &[NodeProc], url: &str, queues: u32, count: u64) -> anyhow::Result<String> {
    use tailrace::adapters::redis::{RedisAdapterFactory, RedisOptions};
    use tailrace::queue::QueueAdapterFactory;
    use tailrace::{Event, EventId, StreamId};
    let options = RedisOptions { url: url.to_string(), ..RedisOptions::default() };
    let adapter = RedisAdapterFactory::connect(queues, options).await?.create_adapter().await?;
    let mut sent = BTreeMap::new();
    for i in 0..count {
        let id = format!("idle-{i}");
        let event = Event::new(EventId::new(id.clone()), "idle");
        sent.insert(id.clone(), crate::now_us());
        adapter.enqueue(&StreamId::new(super::cluster::NAMESPACE, id), vec![event]).await?;
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut delivered: BTreeMap<String, u64> = BTreeMap::new();
    while delivered.len() < sent.len() {
        anyhow::ensure!(Instant::now() < deadline, "{} of {count} idle events delivered after 30 s", delivered.len());
        tokio::time::sleep(Duration::from_millis(50)).await;
        for node in nodes {
            let Ok(text) = std::fs::read_to_string(&node.audit) else { continue };
            for line in text.lines().filter_map(|l| tailrace::archive::AuditLine::parse(l).ok()) {
                if sent.contains_key(&line.event) {
                    delivered.entry(line.event).or_insert(line.at_us);
                }
            }
        }
    }
    let mut slowest: Vec<(f64, &String)> =
        sent.iter().map(|(id, at)| (delivered[id].saturating_sub(*at) as f64 / 1000.0, id)).collect();
    slowest.sort_by(|a, b| b.0.total_cmp(&a.0));
    let named: Vec<String> = slowest.iter().take(3).map(|(ms, id)| format!("{id} {ms:.1} ms")).collect();
    println!("scale: slowest idle events: {}", named.join(", "));
    // Slowest first, so ascending is the reverse.
    let latencies: Vec<f64> = slowest.iter().rev().map(|(ms, _)| *ms).collect();
    let at = |q: f64| latencies[((latencies.len() - 1) as f64 * q).round() as usize];
    println!("scale: idle produce-to-delivery over {count} events: p50 {:.2} ms, p99 {:.2} ms", at(0.5), at(0.99));
    Ok(format!("idle_latency_p50_ms={:.2} idle_latency_p99_ms={:.2}", at(0.5), at(0.99)))
}

/// A fourth node joins, then leaves (SIGTERM): how long until the queues
/// are spread over the new set each time (every node's count within one
/// of the others'), and how many queues changed holder: only the
/// newcomer's share should move (to it), then only its queues (from it).
async fn rebalance(
    nodes: &mut Vec<NodeProc>,
    dir: &std::path::Path,
    url: &str,
    cookie: &str,
    queues: u32,
) -> anyhow::Result<String> {
    let http = reqwest::Client::new();
    let newcomer = format!("n{}", NODES + 1);
    let before = nodes[0].holders(&http).await.context("the holders before the join")?;
    let joined = Instant::now();
    nodes.push(NodeProc::spawn(dir, &newcomer, url, cookie, queues).await?);
    let (join_ms, during) = spread(&nodes[0], &http, NODES + 1, joined).await?;
    let (join_moved, join_others) = moved(&before, &during, &newcomer);
    let left = Instant::now();
    if let Some(node) = nodes.last_mut() {
        node.stop(Duration::from_secs(120)).await;
    }
    let (leave_ms, after) = spread(&nodes[0], &http, NODES, left).await?;
    let (leave_moved, leave_others) = moved(&during, &after, &newcomer);
    println!(
        "scale: a fourth node spread in {join_ms} ms ({join_moved} queues moved, {join_others} of them not to it); \
         after it left, {leave_ms} ms ({leave_moved} moved, {leave_others} of them not from it)"
    );
    Ok(format!(
        "join_spread_ms={join_ms} join_moved={join_moved} join_moved_elsewhere={join_others} \
         leave_spread_ms={leave_ms} leave_moved={leave_moved} leave_moved_elsewhere={leave_others}"
    ))
}

/// Queues whose holder differs between `before` and `after`, and how many
/// of those moves did not involve `node` (neither from it nor to it).
fn moved(before: &Holders, after: &Holders, node: &str) -> (usize, usize) {
    let changed: Vec<(&Option<String>, &Option<String>)> = before
        .iter()
        .filter_map(|(queue, was)| after.get(queue).filter(|now| *now != was).map(|now| (was, now)))
        .collect();
    let elsewhere =
        changed.iter().filter(|(was, now)| was.as_deref() != Some(node) && now.as_deref() != Some(node)).count();
    (changed.len(), elsewhere)
}

type Holders = BTreeMap<u32, Option<String>>;

/// Milliseconds from `since` until every queue is held and `members` nodes
/// each hold their share (within one of each other), with the holders then.
async fn spread(
    node: &NodeProc,
    http: &reqwest::Client,
    members: usize,
    since: Instant,
) -> anyhow::Result<(u128, Holders)> {
    let deadline = since + Duration::from_secs(300);
    loop {
        if let Some(held) = node.holders(http).await {
            let mut per_node: BTreeMap<&str, usize> = BTreeMap::new();
            let all = held.values().all(Option::is_some);
            for holder in held.values().flatten() {
                *per_node.entry(holder).or_default() += 1;
            }
            let (least, most) = (per_node.values().min().copied(), per_node.values().max().copied());
            if all && per_node.len() == members && most.zip(least).is_some_and(|(most, least)| most - least <= 1) {
                return Ok((since.elapsed().as_millis(), held));
            }
        }
        anyhow::ensure!(Instant::now() < deadline, "the queues did not spread over {members} nodes within 300 s");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Calls and microseconds per command, from `INFO commandstats`.
pub(super) async fn commandstats(
    conn: &mut redis::aio::MultiplexedConnection,
) -> anyhow::Result<BTreeMap<String, (u64, u64)>> {
    let text: String = redis::cmd("INFO").arg("commandstats").query_async(conn).await.context("INFO commandstats")?;
    let mut stats = BTreeMap::new();
    for line in text.lines() {
        let Some((name, fields)) = line.strip_prefix("cmdstat_").and_then(|l| l.split_once(':')) else { continue };
        let field = |key: &str| fields.split(',').find_map(|kv| kv.strip_prefix(key)).and_then(|n| n.parse().ok());
        if let (Some(calls), Some(usec)) = (field("calls="), field("usec=")) {
            stats.insert(name.to_string(), (calls, usec));
        }
    }
    Ok(stats)
}

pub(super) async fn info_field(
    conn: &mut redis::aio::MultiplexedConnection,
    section: &str,
    field: &str,
) -> anyhow::Result<u64> {
    let text: String = redis::cmd("INFO").arg(section).query_async(conn).await.context("INFO")?;
    text.lines()
        .find_map(|l| l.strip_prefix(field).and_then(|r| r.strip_prefix(':')))
        .and_then(|v| v.trim().parse().ok())
        .with_context(|| format!("INFO {section} has no {field}"))
}

/// User plus system CPU of each live node so far, in clock ticks.
pub(super) fn cpu_ticks(nodes: &[NodeProc]) -> anyhow::Result<Vec<u64>> {
    nodes
        .iter()
        .filter(|node| node.alive)
        .map(|node| ticks_of(&node.pid().context("a node exited")?.to_string()))
        .collect()
}

/// The CPU time (user and system, in clock ticks) of process `pid`
/// (`self`: this one).
pub(super) fn ticks_of(pid: &str) -> anyhow::Result<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).context("reading /proc")?;
    // Fields after the command name: state is the first, utime the 12th,
    // stime the 13th.
    let fields: Vec<&str> = stat.rsplit_once(')').map_or("", |(_, rest)| rest).split_whitespace().collect();
    let field = |i: usize| fields.get(i).and_then(|f| f.parse::<u64>().ok()).unwrap_or(0);
    Ok(field(11) + field(12))
}

/// `VmRSS` of a process, in KiB.
fn rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status.lines().find_map(|l| l.strip_prefix("VmRSS:"))?.split_whitespace().next()?.parse().ok()
}

/// Clock ticks per second (`getconf CLK_TCK`; 100 on Linux unless told).
pub(super) fn clock_ticks() -> f64 {
    std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|out| String::from_utf8(out.stdout).ok())
        .and_then(|text| text.trim().parse().ok())
        .unwrap_or(100.0)
}
