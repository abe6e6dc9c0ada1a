//! A cluster's life through the faults that are not a kill: three
//! `tailrace node` processes on the defaults, each reaching Redis through
//! its own fault proxy and dialed by its peers through another
//! (`testkit/src/tcp_proxy.rs`), runs posted through random live nodes and
//! watched by viewers that resume with their cursors on random live nodes
//! (`testkit/src/chaos.rs`); beside them a `tailrace serve` whose data
//! directory is on the test file system (`testkit/src/powercut.rs`), with
//! its own producer and viewer. The phases, in turn:
//!
//! 1. one node's packets to Redis dropped for twice the lease TTL (its
//!    queues move; the path heals; it takes its share back);
//! 2. the same node's peer port refused (a firewall rejecting it; the
//!    links to the others reset): the others evict it, it rejoins. One node
//!    cut from its peers while they still reach each other, with its own
//!    Redis path intact, is what a proxy in front of each node's advertised
//!    address can build: the others cannot dial it and what was open closes;
//!    `server/tests/link_faults.rs` holds the case where every peer link drops
//!    packets past the TTL without anybody being evicted;
//! 3. every node's Redis answering in 2 s for longer than a lease TTL;
//! 4. the `serve`'s disk full (`ENOSPC`) for a few seconds.
//!
//! What must hold, as in the chaos life: every acknowledged line stored
//! once, in order; every viewer saw exactly the stored log; no truncation
//! notice, no cursor jump, no `500`; and every node holds queues again at
//! the end, none restarted. `cargo test` runs each phase once; the same
//! code runs the cluster phases `TAILRACE_FAULT_ROUNDS=N` times.

use tailrace_testkit as common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::chaos::{Cluster, END_RULES, NAMES, PATIENCE, Refusals, Seen, Tab, from_env, line, run_id, url};
use common::cluster::{Proc, node_on_defaults_linked, settle_shape};
use common::life::ServeNode;
use common::powercut::PowerCutFs;
use common::redis_server::RedisServer;
use common::tcp_proxy::{Fault, PeerLink, TcpProxy};
use rand::RngExt;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

const RUNS: usize = 6;
/// `lease.ttl`, the default.
const LEASE_TTL: Duration = Duration::from_secs(8);
/// How long the serve's disk stays full.
const DISK_FULL: Duration = Duration::from_secs(4);

/// The proxies in front of each node: to its Redis, and from its peers.
struct Faults {
    redis: Vec<TcpProxy>,
    peers: Vec<PeerLink>,
}

/// Redis and three nodes on it, each behind its proxies.
async fn faulty_cluster() -> (Cluster, Faults) {
    let server = RedisServer::start();
    let (mut redis, mut peers) = (Vec::new(), Vec::new());
    for _ in NAMES {
        redis.push(TcpProxy::start(server.port).await);
        peers.push(PeerLink::start().await);
    }
    let configs: Vec<(String, String)> =
        redis.iter().zip(&peers).map(|(r, p)| (format!("redis://127.0.0.1:{}", r.port), p.cluster.clone())).collect();
    let spawn = Box::new(move |name: &str| {
        let (redis, cluster) = &configs[NAMES.iter().position(|n| *n == name).unwrap()];
        tokio::task::block_in_place(|| node_on_defaults_linked(redis, name, cluster, END_RULES))
    });
    (Cluster::start(server, spawn), Faults { redis, peers })
}

async fn evictions(nodes: &[Proc]) -> f64 {
    let mut evicted = 0.0;
    for node in nodes {
        evicted += node.metric_sum("tailrace_nodes_evicted_total", None).await.unwrap_or(0.0);
    }
    evicted
}

/// Phases 1 to 3 on node `i`, each healed before the next.
async fn cluster_faults(cluster: &Cluster, faults: &Faults, i: usize) {
    eprintln!("fault: {} cut from Redis", NAMES[i]);
    cluster.mark(i, false);
    faults.redis[i].set(Fault::Drop);
    tokio::time::sleep(2 * LEASE_TTL).await;
    faults.redis[i].set(Fault::Pass);
    cluster.mark(i, true);
    tokio::time::sleep(Duration::from_secs(3)).await;

    eprintln!("fault: {} cut from its peers", NAMES[i]);
    cluster.mark(i, false);
    let before = evictions(&cluster.nodes).await;
    faults.peers[i].reject().await;
    for (j, link) in faults.peers.iter().enumerate() {
        if j != i {
            link.reset().await;
        }
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    while evictions(&cluster.nodes).await == before {
        assert!(Instant::now() < deadline, "a refused dial evicts the peer");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    faults.peers[i].mend();
    cluster.mark(i, true);
    tokio::time::sleep(Duration::from_secs(3)).await;

    eprintln!("fault: Redis answers in 2 s");
    for proxy in &faults.redis {
        proxy.set(Fault::Delay(Duration::from_secs(1)));
    }
    tokio::time::sleep(LEASE_TTL + Duration::from_secs(4)).await;
    for proxy in &faults.redis {
        proxy.set(Fault::Pass);
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
}

/// The `serve` on the test disk, its producer and viewer of run 0.
struct Served {
    _dir: tempfile::TempDir,
    fs: PowerCutFs,
    node: ServeNode,
    live: common::chaos::Live,
    refusals: Arc<Refusals>,
    producer: tokio::task::JoinHandle<usize>,
    viewer: tokio::task::JoinHandle<Seen>,
}

/// `None` where FUSE cannot be mounted (that part is skipped, saying why).
fn serve_on_the_test_disk(client: &reqwest::Client, stop: &CancellationToken, until: Instant) -> Option<Served> {
    let dir = tempfile::tempdir().unwrap();
    let mnt = dir.path().join("mnt");
    std::fs::create_dir(&mnt).unwrap();
    let fs = PowerCutFs::mount_or_skip(&mnt)?;
    let mut node = ServeNode::with_data_dir(&format!("[queues]\ncount = 1\n{END_RULES}"), mnt.join("data"));
    tokio::task::block_in_place(|| node.start());
    let port: u16 = node.url("").rsplit(':').next()?.parse().ok()?;
    let live: common::chaos::Live = Arc::new(Mutex::new(vec![Some(port)]));
    let refusals = Arc::new(Refusals::default());
    let producer =
        tokio::spawn(common::chaos::produce(client.clone(), live.clone(), refusals.clone(), 0, 0, stop.clone()));
    let viewer = tokio::spawn(common::chaos::view(client.clone(), live.clone(), 0, until, Tab::Sticky));
    Some(Served { _dir: dir, fs, node, live, refusals, producer, viewer })
}

impl Served {
    /// Ends run 0 once its producer stopped; what went wrong, if anything.
    async fn finish(mut self, client: &reqwest::Client) -> Result<String, String> {
        let lines = self.producer.await.unwrap();
        let path = format!("/api/v1/logs/{}/runs/{}/status", common::chaos::FQN, run_id(0));
        common::chaos::until_accepted(&self.live, &self.refusals, |port| {
            client.put(url(port, &path)).json(&serde_json::json!({ "state": "success" }))
        })
        .await;
        let expected: Vec<String> = (0..lines).map(|i| line(0, i)).collect();
        let store = common::chaos::stored(client, &self.live, 0, lines).await;
        let seen = self.viewer.await.unwrap();
        let refused = self.refusals.of(503).map_or(0, |(n, _)| n);
        let mut problems = Vec::new();
        if store != expected {
            problems.push(format!("serve: {} lines stored of {lines} acknowledged", store.len()));
        }
        if seen.lines != expected || !seen.completed || seen.truncated > 0 || !seen.jumps.is_empty() {
            problems.push(format!(
                "serve: the viewer saw {} lines of {lines}, completed {}, {} truncation notices, jumps {:?}",
                seen.lines.len(),
                seen.completed,
                seen.truncated,
                seen.jumps
            ));
        }
        if refused == 0 {
            problems.push("serve: no batch was refused while its disk was full".into());
        }
        if let Some((count, sample)) = self.refusals.of(500) {
            problems.push(format!("serve: {count} requests answered 500, e.g. {sample}"));
        }
        let summary = format!("serve: {lines} lines acknowledged, {refused} batches refused while its disk was full");
        self.node.stop();
        if problems.is_empty() {
            Ok(summary)
        } else {
            Err(format!("{}\n{}", problems.join("\n"), self.node.log_tail()))
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_acked_line_and_every_viewer_stay_exact_through_cut_refused_and_slow_links_and_a_full_disk() {
    let rounds = from_env("TAILRACE_FAULT_ROUNDS").unwrap_or(1);
    let (cluster, faults) = faulty_cluster().await;
    let stop = CancellationToken::new();
    let until = Instant::now() + PATIENCE + Duration::from_secs(60 * rounds as u64);
    let served = serve_on_the_test_disk(&cluster.client, &stop, until);
    let mut producers = Vec::new();
    for run in 0..RUNS {
        producers.push(cluster.producer(run, &stop).await);
    }
    let tab = |run: usize| if run.is_multiple_of(2) { Tab::Roaming } else { Tab::Sticky };
    let viewers = (0..RUNS).map(|run| (run, cluster.viewer(run, until, tab(run)))).collect();
    for _ in 0..rounds {
        tokio::time::sleep(Duration::from_secs(2)).await;
        cluster_faults(&cluster, &faults, rand::rng().random_range(0..NAMES.len())).await;
    }
    if let Some(served) = &served {
        eprintln!("fault: the serve's disk is full");
        served.fs.fail_writes(Some(libc::ENOSPC));
        tokio::time::sleep(DISK_FULL).await;
        served.fs.fail_writes(None);
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    // Every node back without a restart (nothing here starts one again):
    // each holds its share.
    settle_shape(&cluster.nodes[0], &NAMES, &[3, 3, 2]).await;
    let client = cluster.client.clone();
    let outcome = cluster.finish(stop, producers, viewers).await;
    let served = match served {
        Some(served) => served.finish(&client).await,
        None => Ok("serve: skipped (no FUSE here)".into()),
    };
    match (outcome, served) {
        (Ok(summary), Ok(serve)) => eprintln!("{summary}\n{serve}"),
        (outcome, served) => panic!("{}\n{}", outcome.err().unwrap_or_default(), served.err().unwrap_or_default()),
    }
}
