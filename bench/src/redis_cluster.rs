//! `tailrace-bench redis --cluster`: the same node and load as `bench
//! redis`, once on a private Redis Cluster of three masters and once on a
//! private single Redis, in alternating rounds of one run: events per
//! second on three masters against one, and their ratio. The queues' hash
//! tags spread them over the masters' slots; nothing else differs (no
//! replicas, no persistence, `wait_replicas = 0`), so the ratio is what
//! sharding buys when Redis is the bottleneck.

use std::sync::Arc;
use std::time::Instant;

use anyhow::Context;
use tailrace::adapters::redis::{RedisAdapterFactory, RedisOptions};
use tailrace_testkit::redis_cluster::RedisCluster;
use tokio::process::Command;

use super::cluster::private_redis;
use super::pipeline::{Shape, run_node};

/// Masters of the private cluster.
const MASTERS: usize = 3;

fn shape(quick: bool) -> Shape {
    Shape {
        streams: 96,
        // Enough queues that every master serves several.
        queues: 12,
        batch: 64,
        events_per_stream: if quick { 1_024 } else { 4_096 },
        producers: 4,
        queue_capacity_events: 0,
    }
}

pub async fn run(quick: bool) -> anyhow::Result<()> {
    let shape = shape(quick);
    let (_single, single_url) = private_redis();
    let cluster = tokio::task::block_in_place(|| RedisCluster::start_masters(MASTERS));
    let seed = cluster.seeds()[0].clone();
    let total = shape.streams as u64 * shape.events_per_stream;
    println!(
        "redis --cluster: {} streams over {} queues, {} events each ({total} total), batches of {}, {} producers; \
         {MASTERS} masters ({seed}) against 1 ({single_url})",
        shape.streams, shape.queues, shape.events_per_stream, shape.batch, shape.producers
    );
    let master_ports = cluster.masters().iter().map(|m| port_of(m)).collect::<anyhow::Result<Vec<u16>>>()?;
    let single_port = port_of(&single_url)?;
    let (mut rounds, mut busy) = (Vec::new(), Vec::new());
    for round in 1..=(if quick { 1 } else { 3 }) {
        let prefix = format!("tailrace-bench:{round}");
        let on_cluster =
            RedisOptions { url: seed.clone(), cluster: true, key_prefix: prefix.clone(), ..Default::default() };
        let on_one = RedisOptions { url: single_url.clone(), key_prefix: prefix, ..Default::default() };
        let (cluster, cluster_busy) = measured(shape, on_cluster, &master_ports).await?;
        let (one, one_busy) = measured(shape, on_one, &[single_port]).await?;
        println!(
            "  round {round}: {MASTERS} masters {cluster:>10.0} events/s (Redis busy {cluster_busy:.2} cores)   \
             1 master {one:>10.0} events/s (Redis busy {one_busy:.2} cores)   ratio {:.3}",
            cluster / one.max(1e-9)
        );
        rounds.push((cluster, one));
        busy.push((cluster_busy, one_busy));
    }
    // Redis' CPU in the median round says whether one master was the
    // bottleneck (near one core busy) or the node and the machine were.
    let median = {
        let mut order: Vec<usize> = (0..rounds.len()).collect();
        order.sort_by(|&a, &b| (rounds[a].0 / rounds[a].1).total_cmp(&(rounds[b].0 / rounds[b].1)));
        order[order.len() / 2]
    };
    let (cluster_busy, one_busy) = busy[median];
    let extra = [
        ("events", total.to_string()),
        ("masters", MASTERS.to_string()),
        ("redis_cores_1", format!("{one_busy:.2}")),
        ("redis_cores_3", format!("{cluster_busy:.2}")),
        ("machine_cores", std::thread::available_parallelism().map_or(0, |n| n.get()).to_string()),
    ];
    println!("{}", super::median_line("redis-cluster", &rounds, &extra));
    Ok(())
}

/// One node's run on `options`: events per second, and the cores the
/// Redis servers on `ports` kept busy meanwhile.
async fn measured(shape: Shape, options: RedisOptions, ports: &[u16]) -> anyhow::Result<(f64, f64)> {
    let factory = Arc::new(RedisAdapterFactory::connect(shape.queues, options).await?);
    let (before, started) = (redis_cpu(ports).await, Instant::now());
    let rate = run_node(shape, factory).await?;
    Ok((rate, (redis_cpu(ports).await - before) / started.elapsed().as_secs_f64()))
}

fn port_of(url: &str) -> anyhow::Result<u16> {
    url.rsplit(':').next().and_then(|p| p.parse().ok()).with_context(|| format!("no port in {url}"))
}

/// CPU seconds (user and system) the servers on `ports` used so far.
async fn redis_cpu(ports: &[u16]) -> f64 {
    let mut total = 0.0;
    for port in ports {
        let info = cli(*port, &["INFO", "cpu"]).await.unwrap_or_default();
        for line in info.lines() {
            if let Some(("used_cpu_sys" | "used_cpu_user", value)) = line.trim().split_once(':') {
                total += value.parse::<f64>().unwrap_or(0.0);
            }
        }
    }
    total
}

async fn cli(port: u16, args: &[&str]) -> Option<String> {
    let out = Command::new("redis-cli").arg("-p").arg(port.to_string()).args(args).output().await.ok()?;
    Some(String::from_utf8_lossy(&out.stdout).into_owned())
}
