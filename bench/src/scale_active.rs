//! The active phase of `bench scale`: every queue busy, the cluster
//! against a raw `XADD` client on the same Redis, in rounds (3 of 3 s
//! quick, 5 of 8 s). Each round produces through the Redis adapter from
//! 16 tasks (`TAILRACE_BENCH_PRODUCERS`; batches of `BATCH` events, streams spread over all
//! queues) while the nodes' agents read everything, and a probe sends one
//! audited event every 10 ms, timed to its delivery; then a raw client
//! appends entries of the same size from as many tasks for as long; then
//! the same work unfenced: raw appends to as many streams, read back and
//! acked by three raw consumers (`unfenced_*`: what fencing costs is the
//! gap between the cluster and this, while raw `XADD` only writes).
//!
//! Per round, from `INFO` before and after: Redis commands, read events
//! (round trips: one socket read carries a whole pipeline) and command
//! microseconds per event, Redis CPU, the nodes' CPU (from `/proc`). It
//! prints the median round's numbers (by ratio) and the ratio's spread:
//! `active_eps=… raw_xadd_eps=… active_ratio=… active_ratio_min=… active_ratio_max=… rounds=…
//! unfenced_eps=… unfenced_ratio=… unfenced_ratio_min=… unfenced_ratio_max=… unfenced_redis_cpu_pct=…
//! active_cmds_per_event=… active_round_trips_per_event=… active_redis_usec_per_event=…
//! active_redis_cpu_pct=… active_node_cpu_pct=… raw_redis_cpu_pct=… active_top=…
//! active_latency_p50_ms=… active_latency_p99_ms=…`.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use redis::aio::MultiplexedConnection;
use tailrace::adapters::redis::{RedisAdapterFactory, RedisOptions};
use tailrace::queue::{QueueAdapter, QueueAdapterFactory};
use tailrace::{Event, EventId, StreamId};

use super::cluster::{NAMESPACE, NodeProc};
use super::scale::{clock_ticks, commandstats, cpu_ticks};

/// CPU microseconds per event, from clock ticks over `events`.
fn usec_per_event(ticks: u64, events: f64) -> f64 {
    ticks as f64 / clock_ticks() * 1e6 / events.max(1.0)
}

/// Producer tasks, and events per batch.
const DEFAULT_PRODUCERS: usize = 16;

/// Producer tasks of every round: `TAILRACE_BENCH_PRODUCERS`, else 16.
/// Each waits for its append's reply, so a round's rate is at most the
/// producers over an append's round trip.
fn producers() -> usize {
    std::env::var("TAILRACE_BENCH_PRODUCERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|n| *n > 0)
        .unwrap_or(DEFAULT_PRODUCERS)
}
const BATCH: usize = 10;

/// What Redis and the nodes had done at one moment.
struct Snapshot {
    commands: BTreeMap<String, (u64, u64)>,
    reads: u64,
    redis_cpu: f64,
    node_ticks: Vec<u64>,
    /// This process's CPU (its producers), in clock ticks.
    bench_ticks: u64,
    at: Instant,
}

impl Snapshot {
    async fn take(conn: &mut MultiplexedConnection, nodes: &[NodeProc]) -> anyhow::Result<Self> {
        let info = |section: &'static str| {
            let mut conn = conn.clone();
            async move { redis::cmd("INFO").arg(section).query_async::<String>(&mut conn).await.context("INFO") }
        };
        let (stats, cpu) = (info("stats").await?, info("cpu").await?);
        let field = |text: &str, name: &str| -> f64 {
            text.lines().find_map(|l| l.strip_prefix(name)?.strip_prefix(':')?.trim().parse().ok()).unwrap_or(0.0)
        };
        Ok(Self {
            commands: commandstats(conn).await?,
            reads: field(&stats, "total_reads_processed") as u64,
            redis_cpu: field(&cpu, "used_cpu_user") + field(&cpu, "used_cpu_sys"),
            node_ticks: if nodes.is_empty() { Vec::new() } else { cpu_ticks(nodes)? },
            bench_ticks: super::scale::ticks_of("self")?,
            at: Instant::now(),
        })
    }
}

/// One round's numbers.
struct Round {
    active_eps: f64,
    raw_eps: f64,
    cmds_per_event: f64,
    round_trips_per_event: f64,
    usec_per_event: f64,
    redis_cpu_pct: f64,
    node_cpu_pct: f64,
    /// CPU microseconds per event: the nodes', the producers' (with the
    /// probe), and the raw round's producers' and Redis'.
    node_usec_per_event: f64,
    producer_usec_per_event: f64,
    redis_cpu_usec_per_event: f64,
    raw_producer_usec_per_event: f64,
    raw_redis_usec_per_event: f64,
    raw_redis_cpu_pct: f64,
    unfenced_eps: f64,
    unfenced_redis_cpu_pct: f64,
    top: String,
    latencies_ms: Vec<f64>,
}

impl Round {
    fn ratio(&self) -> f64 {
        if self.raw_eps > 0.0 { self.active_eps / self.raw_eps } else { 0.0 }
    }

    fn unfenced_ratio(&self) -> f64 {
        if self.unfenced_eps > 0.0 { self.active_eps / self.unfenced_eps } else { 0.0 }
    }
}

pub(super) async fn run(nodes: &[NodeProc], url: &str, queues: u32, quick: bool) -> anyhow::Result<String> {
    let (rounds, seconds) = if quick { (3, 3) } else { (5, 8) };
    let options = RedisOptions { url: url.to_string(), ..RedisOptions::default() };
    let adapter = RedisAdapterFactory::connect(queues, options).await?.create_adapter().await?;
    let client = redis::Client::open(url)?;
    let mut conn = client.get_multiplexed_async_connection().await?;
    let mut done = Vec::new();
    for round in 0..rounds {
        let (active_eps, cluster) = cluster_round(nodes, &adapter, &mut conn, queues, seconds, round).await?;
        let (raw_eps, raw_cpu, raw_producer_usec, raw_redis_usec) = raw_round(&mut conn, seconds).await?;
        let (unfenced_eps, unfenced_cpu) = unfenced_round(&client, &mut conn, queues, seconds).await?;
        let result = Round {
            active_eps,
            raw_eps,
            raw_redis_cpu_pct: raw_cpu,
            raw_producer_usec_per_event: raw_producer_usec,
            raw_redis_usec_per_event: raw_redis_usec,
            unfenced_eps,
            unfenced_redis_cpu_pct: unfenced_cpu,
            ..cluster
        };
        println!(
            "scale: active round {}/{rounds}: cluster {active_eps:.0} events/s, raw XADD {raw_eps:.0}/s, ratio {:.3}; \
             unfenced raw XADD+XREADGROUP+XACK {unfenced_eps:.0}/s, ratio {:.3}; \
             {:.3} commands and {:.3} round trips per event, Redis CPU {:.0}% (raw {raw_cpu:.0}%, unfenced {unfenced_cpu:.0}%), nodes {:.0}%",
            round + 1,
            result.ratio(),
            result.unfenced_ratio(),
            result.cmds_per_event,
            result.round_trips_per_event,
            result.redis_cpu_pct,
            result.node_cpu_pct,
        );
        done.push(result);
    }
    done.sort_by(|a, b| a.ratio().total_cmp(&b.ratio()));
    let (min, max) = (done[0].ratio(), done[done.len() - 1].ratio());
    let mut latencies: Vec<f64> = done.iter().flat_map(|r| r.latencies_ms.iter().copied()).collect();
    latencies.sort_by(f64::total_cmp);
    let at = |q: f64| latencies.get(((latencies.len().max(1) - 1) as f64 * q).round() as usize).copied().unwrap_or(0.0);
    let m = &done[done.len() / 2];
    let mut unfenced: Vec<f64> = done.iter().map(Round::unfenced_ratio).collect();
    unfenced.sort_by(f64::total_cmp);
    let (unfenced_min, unfenced_max) = (unfenced[0], unfenced[unfenced.len() - 1]);
    println!(
        "scale: every queue active, median of {rounds} rounds: ratio {:.3} (spread {min:.3}..{max:.3}); \
         against unfenced raw reads {:.3} (spread {unfenced_min:.3}..{unfenced_max:.3}); \
         produce-to-delivery under load p50 {:.2} ms, p99 {:.2} ms over {} events",
        m.ratio(),
        unfenced[unfenced.len() / 2],
        at(0.5),
        at(0.99),
        latencies.len()
    );
    // What the machine's cores allow: every core busy with the CPU each
    // event takes of everyone on them (producers, Redis, nodes), against
    // what raw `XADD` did.
    let cluster_cpu = m.producer_usec_per_event + m.redis_cpu_usec_per_event + m.node_usec_per_event;
    let cores = std::thread::available_parallelism().map_or(1, usize::from) as f64;
    let ceiling = if cluster_cpu > 0.0 && m.raw_eps > 0.0 { cores * 1e6 / cluster_cpu / m.raw_eps } else { 0.0 };
    println!(
        "scale: CPU per event: producers {:.2} µs, Redis {:.2} µs, nodes {:.2} µs (raw XADD: producers {:.2}, Redis {:.2}); \
         {cores} cores busy with it would reach {ceiling:.3} of raw XADD",
        m.producer_usec_per_event,
        m.redis_cpu_usec_per_event,
        m.node_usec_per_event,
        m.raw_producer_usec_per_event,
        m.raw_redis_usec_per_event,
    );
    Ok(format!(
        "active_node_usec_per_event={:.2} active_producer_usec_per_event={:.2} active_redis_cpu_usec_per_event={:.2} \
         raw_producer_usec_per_event={:.2} raw_redis_cpu_usec_per_event={:.2} cpu_ceiling_ratio={ceiling:.3} \
         active_eps={:.0} raw_xadd_eps={:.0} active_ratio={:.3} active_ratio_min={min:.3} active_ratio_max={max:.3} \
         rounds={rounds} unfenced_eps={:.0} unfenced_ratio={:.3} unfenced_ratio_min={unfenced_min:.3} \
         unfenced_ratio_max={unfenced_max:.3} unfenced_redis_cpu_pct={:.0} active_cmds_per_event={:.3} active_round_trips_per_event={:.3} active_redis_usec_per_event={:.2} \
         active_redis_cpu_pct={:.0} active_node_cpu_pct={:.0} raw_redis_cpu_pct={:.0} active_top={} \
         active_latency_p50_ms={:.2} active_latency_p99_ms={:.2}",
        m.node_usec_per_event,
        m.producer_usec_per_event,
        m.redis_cpu_usec_per_event,
        m.raw_producer_usec_per_event,
        m.raw_redis_usec_per_event,
        m.active_eps,
        m.raw_eps,
        m.ratio(),
        m.unfenced_eps,
        unfenced[unfenced.len() / 2],
        m.unfenced_redis_cpu_pct,
        m.cmds_per_event,
        m.round_trips_per_event,
        m.usec_per_event,
        m.redis_cpu_pct,
        m.node_cpu_pct,
        m.raw_redis_cpu_pct,
        m.top,
        at(0.5),
        at(0.99),
    ))
}

/// The cluster's round: produced and read events per second (over the
/// time until all was read), and what it cost.
async fn cluster_round(
    nodes: &[NodeProc],
    adapter: &Arc<dyn QueueAdapter>,
    conn: &mut MultiplexedConnection,
    queues: u32,
    seconds: u64,
    round: usize,
) -> anyhow::Result<(f64, Round)> {
    let read = || async {
        let mut total = 0.0;
        for node in nodes.iter().filter(|n| n.alive) {
            total += node.metric_sum(tailrace::telemetry::AGENT_EVENTS_READ).await.unwrap_or(0.0);
        }
        total as u64
    };
    let read_before = read().await;
    let streams: Arc<Vec<StreamId>> =
        Arc::new((0..queues.max(1) * 4).map(|i| StreamId::new("active", format!("s{i}"))).collect());
    let payload = "x".repeat(100);
    let produced = Arc::new(AtomicU64::new(0));
    let before = Snapshot::take(conn, nodes).await?;
    let until = before.at + Duration::from_secs(seconds);
    let mut tasks = Vec::new();
    let producers = producers();
    for task in 0..producers {
        let (adapter, streams, produced, payload) =
            (adapter.clone(), streams.clone(), produced.clone(), payload.clone());
        tasks.push(tokio::spawn(async move {
            let mut n = task;
            while Instant::now() < until {
                let events =
                    (0..BATCH).map(|i| Event::new(EventId::new(format!("a{n}-{i}")), payload.clone())).collect();
                adapter.enqueue(&streams[n % streams.len()], events).await?;
                produced.fetch_add(BATCH as u64, Ordering::Relaxed);
                n += producers;
            }
            Ok::<_, anyhow::Error>(())
        }));
    }
    let probe = tokio::spawn(probe(adapter.clone(), until, round));
    for task in tasks {
        task.await??;
    }
    let sent = probe.await??;
    let produced = produced.load(Ordering::Relaxed);
    let deadline = Instant::now() + Duration::from_secs(120);
    while read().await.saturating_sub(read_before) < produced {
        anyhow::ensure!(Instant::now() < deadline, "the agents did not read the {produced} events within 120 s");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let after = Snapshot::take(conn, nodes).await?;
    let elapsed = (after.at - before.at).as_secs_f64();
    let mut by_usec: Vec<(String, u64, u64)> = after
        .commands
        .iter()
        .filter(|(cmd, _)| !cmd.starts_with("info"))
        .map(|(cmd, (calls, usec))| {
            let (c0, u0) = before.commands.get(cmd).copied().unwrap_or((0, 0));
            (cmd.clone(), calls - c0, usec - u0)
        })
        .filter(|(_, calls, _)| *calls > 0)
        .collect();
    by_usec.sort_by_key(|c| std::cmp::Reverse(c.2));
    let events = produced.max(1) as f64;
    let calls: u64 = by_usec.iter().map(|c| c.1).sum();
    let usec: u64 = by_usec.iter().map(|c| c.2).sum();
    let ticks: u64 = before.node_ticks.iter().zip(&after.node_ticks).map(|(b, a)| a - b).sum();
    let top = by_usec.iter().take(5).map(|(cmd, calls, usec)| format!("{cmd}:{calls}/{usec}us")).collect::<Vec<_>>();
    let latencies_ms = delivered(nodes, &sent).await?;
    Ok((
        produced as f64 / elapsed,
        Round {
            active_eps: 0.0,
            raw_eps: 0.0,
            cmds_per_event: calls as f64 / events,
            round_trips_per_event: after.reads.saturating_sub(before.reads) as f64 / events,
            usec_per_event: usec as f64 / events,
            redis_cpu_pct: (after.redis_cpu - before.redis_cpu) / elapsed * 100.0,
            node_cpu_pct: ticks as f64 / clock_ticks() / elapsed * 100.0,
            node_usec_per_event: usec_per_event(ticks, events),
            producer_usec_per_event: usec_per_event(after.bench_ticks - before.bench_ticks, events),
            redis_cpu_usec_per_event: (after.redis_cpu - before.redis_cpu) * 1e6 / events,
            raw_producer_usec_per_event: 0.0,
            raw_redis_usec_per_event: 0.0,
            raw_redis_cpu_pct: 0.0,
            unfenced_eps: 0.0,
            unfenced_redis_cpu_pct: 0.0,
            top: top.join(","),
            latencies_ms,
        },
    ))
}

/// One audited event every 10 ms until `until`: event id → when sent (µs).
async fn probe(adapter: Arc<dyn QueueAdapter>, until: Instant, round: usize) -> anyhow::Result<BTreeMap<String, u64>> {
    let mut sent = BTreeMap::new();
    let mut tick = tokio::time::interval(Duration::from_millis(10));
    for i in 0.. {
        tick.tick().await;
        if Instant::now() >= until {
            break;
        }
        let id = format!("load-{round}-{i}");
        sent.insert(id.clone(), crate::now_us());
        adapter.enqueue(&StreamId::new(NAMESPACE, id.clone()), vec![Event::new(EventId::new(id), "probe")]).await?;
    }
    Ok(sent)
}

/// Produce-to-delivery milliseconds of the probe's events, from the
/// nodes' audit lines (waits up to 30 s for the last).
async fn delivered(nodes: &[NodeProc], sent: &BTreeMap<String, u64>) -> anyhow::Result<Vec<f64>> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let mut at: BTreeMap<&str, u64> = BTreeMap::new();
        for node in nodes {
            let Ok(text) = std::fs::read_to_string(&node.audit) else { continue };
            for line in text.lines().filter_map(|l| tailrace::archive::AuditLine::parse(l).ok()) {
                if let Some((id, _)) = sent.get_key_value(&line.event) {
                    at.entry(id.as_str()).or_insert(line.at_us);
                }
            }
        }
        if at.len() == sent.len() {
            return Ok(sent.iter().map(|(id, t)| at[id.as_str()].saturating_sub(*t) as f64 / 1000.0).collect());
        }
        anyhow::ensure!(Instant::now() < deadline, "{} of {} probe events delivered after 30 s", at.len(), sent.len());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Readers of the unfenced baseline (one per node of the cluster).
const RAW_READERS: usize = 3;

/// The same work as the cluster's, unfenced, from a raw client on the same
/// Redis: the producers append entries of a batch's size round-robin to
/// `queues` streams, and [`RAW_READERS`] tasks (each a third of the
/// streams, its own consumer group) read them with one blocking
/// `XREADGROUP` over all their streams, their acks pipelined with it, as
/// an efficient hand-written consumer would. Events per second until all
/// were read, and Redis's CPU; the keys are deleted afterwards.
async fn unfenced_round(
    client: &redis::Client,
    conn: &mut MultiplexedConnection,
    queues: u32,
    seconds: u64,
) -> anyhow::Result<(f64, f64)> {
    let payload = "x".repeat(100);
    let body = serde_json::to_string(&(0..BATCH).map(|i| (format!("a0-{i}"), payload.clone())).collect::<Vec<_>>())?;
    let keys: Vec<String> = (0..queues.max(1)).map(|q| format!("bench:scale:unfenced:{q}")).collect();
    for key in &keys {
        let _: () =
            redis::cmd("XGROUP").arg("CREATE").arg(key).arg("g").arg("0").arg("MKSTREAM").query_async(conn).await?;
    }
    let (produced, read) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let before = Snapshot::take(conn, &[]).await?;
    let until = before.at + Duration::from_secs(seconds);
    let mut readers = Vec::new();
    for r in 0..RAW_READERS {
        let mine: Vec<String> = keys.iter().skip(r).step_by(RAW_READERS).cloned().collect();
        // A connection of its own: a blocking read holds up every other
        // command on its connection.
        let mut conn = client.get_multiplexed_async_connection().await?;
        let (read, stop) = (read.clone(), stop.clone());
        readers.push(tokio::spawn(async move {
            let mut acks: Vec<(String, Vec<String>)> = Vec::new();
            while !(stop.load(Ordering::Relaxed) && acks.is_empty()) {
                let mut pipe = redis::pipe();
                for (key, ids) in &acks {
                    pipe.cmd("XACK").arg(key).arg("g").arg(ids).ignore();
                }
                pipe.cmd("XREADGROUP").arg("GROUP").arg("g").arg("c").arg("COUNT").arg(100).arg("BLOCK").arg(20);
                pipe.arg("STREAMS").arg(&mine).arg(vec![">"; mine.len()]);
                let (reply,): (Option<redis::streams::StreamReadReply>,) = pipe.query_async(&mut conn).await?;
                acks = reply
                    .map(|r| r.keys.into_iter().map(|k| (k.key, k.ids.into_iter().map(|e| e.id).collect())).collect())
                    .unwrap_or_default();
                let entries: usize = acks.iter().map(|(_, ids)| ids.len()).sum();
                read.fetch_add((entries * BATCH) as u64, Ordering::Relaxed);
            }
            Ok::<_, redis::RedisError>(())
        }));
    }
    let mut producers = Vec::new();
    let count = self::producers();
    for task in 0..count {
        let (mut conn, produced, body, keys) = (conn.clone(), produced.clone(), body.clone(), keys.clone());
        producers.push(tokio::spawn(async move {
            let mut n = task;
            while Instant::now() < until {
                let _: String = redis::cmd("XADD")
                    .arg(&keys[n % keys.len()])
                    .arg("*")
                    .arg("b")
                    .arg(&body)
                    .query_async(&mut conn)
                    .await?;
                produced.fetch_add(BATCH as u64, Ordering::Relaxed);
                n += count;
            }
            Ok::<_, redis::RedisError>(())
        }));
    }
    for task in producers {
        task.await??;
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    while read.load(Ordering::Relaxed) < produced.load(Ordering::Relaxed) {
        anyhow::ensure!(Instant::now() < deadline, "the unfenced readers did not read everything within 60 s");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let after = Snapshot::take(conn, &[]).await?;
    stop.store(true, Ordering::Relaxed);
    for task in readers {
        task.await??;
    }
    let elapsed = (after.at - before.at).as_secs_f64();
    let _: i64 = redis::cmd("DEL").arg(&keys).query_async(conn).await?;
    Ok((produced.load(Ordering::Relaxed) as f64 / elapsed, (after.redis_cpu - before.redis_cpu) / elapsed * 100.0))
}

/// A raw client's round on the same Redis: events per second (entries
/// of a batch's size, one key, deleted afterwards) and Redis's CPU.
/// Raw `XADD`s: events/s, Redis CPU %, and CPU µs per event of the
/// producers and of Redis.
async fn raw_round(conn: &mut MultiplexedConnection, seconds: u64) -> anyhow::Result<(f64, f64, f64, f64)> {
    let payload = "x".repeat(100);
    let body = serde_json::to_string(&(0..BATCH).map(|i| (format!("a0-{i}"), payload.clone())).collect::<Vec<_>>())?;
    let raw = Arc::new(AtomicU64::new(0));
    let before = Snapshot::take(conn, &[]).await?;
    let until = before.at + Duration::from_secs(seconds);
    let mut tasks = Vec::new();
    for _ in 0..producers() {
        let (mut conn, raw, body) = (conn.clone(), raw.clone(), body.clone());
        tasks.push(tokio::spawn(async move {
            while Instant::now() < until {
                let _: String = redis::cmd("XADD")
                    .arg("bench:scale:raw")
                    .arg("*")
                    .arg("b")
                    .arg(&body)
                    .query_async(&mut conn)
                    .await?;
                raw.fetch_add(BATCH as u64, Ordering::Relaxed);
            }
            Ok::<_, redis::RedisError>(())
        }));
    }
    for task in tasks {
        task.await??;
    }
    let after = Snapshot::take(conn, &[]).await?;
    let elapsed = (after.at - before.at).as_secs_f64();
    let _: i64 = redis::cmd("DEL").arg("bench:scale:raw").query_async(conn).await?;
    let events = raw.load(Ordering::Relaxed) as f64;
    let redis_cpu = after.redis_cpu - before.redis_cpu;
    Ok((
        events / elapsed,
        redis_cpu / elapsed * 100.0,
        usec_per_event(after.bench_ticks - before.bench_ticks, events),
        redis_cpu * 1e6 / events.max(1.0),
    ))
}
