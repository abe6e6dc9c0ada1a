//! A whole chaotic life of a cluster, as its viewers see it: three
//! `tailrace node` processes on one Redis, runs posted through random live
//! nodes, one viewer per run on a random live node that resumes with its
//! last cursor (half of them reload every few seconds, half stay until
//! their stream ends), and rounds of chaos: a node killed with
//! SIGKILL, a node leaving with SIGTERM, a node paused past its leases
//! (SIGSTOP, then SIGCONT), Redis killed and started again. Then every run
//! ends (`success`) and every viewer reads on to its `complete`.
//!
//! The same life runs with the queues in Redis streams and with the
//! queues on a Kafka topic (a Kafka-wire broker that is never killed;
//! checkpoints, leases, membership and run logs stay in the Redis that
//! is), with shorter leases there (ttl 6 s, renew 2 s).
//!
//! What must hold: every acknowledged line is stored once, in order; every
//! viewer saw exactly the stored log, line by line, and no cursor it was
//! handed skipped a line; no viewer got a truncation notice (the store
//! holds every line, so none is ever due); no request was answered `500`.
//!
//! `cargo test` runs a short life of each (each kind of chaos once). The
//! same code runs long ones with `TAILRACE_CHAOS_ROUNDS=N` (N rounds, the
//! kinds in turn in a random order), `TAILRACE_CHAOS_LIVES=M` times.

use tailrace_testkit as common;

use std::time::Duration;

use common::chaos::{Cluster, END_RULES, NAMES, PATIENCE, Tab, from_env};
use common::cluster::Proc;
use common::kafka_broker::KafkaBroker;
use common::redis_server::RedisServer;
use rand::RngExt;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

const RUNS: usize = 8;
/// A paused node stays stopped past its lease TTL (8 s, the default).
const PAUSE: Duration = Duration::from_secs(11);
/// How long Redis stays down: past the membership TTL (5 s, the
/// default), so every member's record lapses with it.
const REDIS_DOWN: Duration = Duration::from_secs(6);

#[derive(Clone, Copy, Debug)]
enum Chaos {
    Kill,
    Term,
    Pause,
    RedisKill,
}

const KINDS: [Chaos; 4] = [Chaos::Pause, Chaos::Kill, Chaos::RedisKill, Chaos::Term];

/// Where the cluster's queues live.
#[derive(Clone, Copy, Debug)]
enum Queues {
    Redis,
    Kafka,
}

/// Leases of the Kafka life: shorter than the default 8 s, as a deployment
/// that wants a dead node's partitions to move sooner sets them.
const KAFKA_LEASES: &str = "[lease]\nttl = \"6s\"\nrenew = \"2s\"\n";

fn start(redis: &str, name: &str) -> Proc {
    tokio::task::block_in_place(|| common::cluster::node_on_defaults(redis, name, END_RULES))
}

/// Redis and three nodes on it, on the defaults.
fn cluster() -> Cluster {
    let server = RedisServer::start();
    let url = server.url();
    Cluster::start(server, Box::new(move |name| start(&url, name)))
}

/// The same with the queues on a Kafka broker (kept for the life), or
/// `None` when there is no broker to run.
fn kafka_cluster() -> Option<(Cluster, KafkaBroker)> {
    let broker = KafkaBroker::start()?;
    let server = RedisServer::start();
    let (url, brokers) = (server.url(), broker.address());
    let extra = format!("{END_RULES}{KAFKA_LEASES}");
    let spawn = move |name: &str| {
        tokio::task::block_in_place(|| common::kafka_broker::node(&url, &brokers, "chaos", name, &extra))
    };
    Some((Cluster::start(server, Box::new(spawn)), broker))
}

/// One round of chaos on a random node of `cluster`; it is back when this
/// returns.
async fn chaos(cluster: &mut Cluster, kind: Chaos) {
    let i = rand::rng().random_range(0..cluster.nodes.len());
    let name = if matches!(kind, Chaos::RedisKill) { "redis" } else { &cluster.nodes[i].name };
    eprintln!("chaos: {kind:?} {name}");
    match kind {
        Chaos::Kill => cluster.bounce(i, "KILL").await,
        Chaos::Term => cluster.bounce(i, "TERM").await,
        Chaos::Pause => cluster.pause(i, PAUSE).await,
        Chaos::RedisKill => {
            cluster.server.stop();
            tokio::time::sleep(REDIS_DOWN).await;
            tokio::task::block_in_place(|| cluster.server.restart());
        }
    }
}

/// One life of `rounds` rounds of chaos; what went wrong, if anything.
async fn life(queues: Queues, rounds: usize) -> Result<String, String> {
    let (mut cluster, _broker) = match queues {
        Queues::Redis => (cluster(), None),
        Queues::Kafka => match kafka_cluster() {
            Some((cluster, broker)) => (cluster, Some(broker)),
            None => return Ok("skipped: no Kafka broker".into()),
        },
    };
    let stop = CancellationToken::new();
    let mut producers = Vec::new();
    for run in 0..RUNS {
        producers.push(cluster.producer(run, &stop).await);
    }
    let until = Instant::now() + PATIENCE + Duration::from_secs(60 * rounds as u64);
    // Half the tabs reload every few seconds, half stay where they are.
    let tab = |run: usize| if run.is_multiple_of(2) { Tab::Roaming } else { Tab::Sticky };
    let viewers = (0..RUNS).map(|run| (run, cluster.viewer(run, until, tab(run)))).collect();
    let mut kinds: Vec<Chaos> = Vec::new();
    while kinds.len() < rounds {
        let mut turn = KINDS.to_vec();
        if rounds > KINDS.len() {
            rand::seq::SliceRandom::shuffle(turn.as_mut_slice(), &mut rand::rng());
        }
        kinds.extend(turn);
    }
    kinds.truncate(rounds);
    for kind in kinds {
        tokio::time::sleep(Duration::from_millis(rand::rng().random_range(2_000..6_000))).await;
        chaos(&mut cluster, kind).await;
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    cluster.finish(stop, producers, viewers).await
}

/// `TAILRACE_CHAOS_LIVES` lives of `TAILRACE_CHAOS_ROUNDS` rounds (one of
/// each kind by default) with the queues in `queues`.
async fn lives(queues: Queues) {
    let rounds = from_env("TAILRACE_CHAOS_ROUNDS").unwrap_or(KINDS.len());
    let lives = from_env("TAILRACE_CHAOS_LIVES").unwrap_or(1);
    let mut failed = Vec::new();
    for number in 0..lives {
        eprintln!("life {number} ({queues:?} queues)");
        match life(queues, rounds).await {
            Ok(summary) => eprintln!("life {number} of {rounds} rounds: {summary}"),
            Err(problems) => {
                eprintln!("life {number} of {rounds} rounds failed: {problems}");
                failed.push(problems);
            }
        }
    }
    assert!(failed.is_empty(), "{} of {lives} lives failed; the first:\n{}", failed.len(), failed[0]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_viewer_sees_every_stored_line_once_through_kills_pauses_handoffs_and_a_redis_restart() {
    lives(Queues::Redis).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_kafka_queues_every_acknowledged_line_is_stored_and_seen_through_the_same_chaos() {
    lives(Queues::Kafka).await;
}

/// The transition under the gap, on purpose: a viewer stays on a node that
/// is paused past its membership TTL (the run's owner lets its tailer's
/// subscription go: the node is not a member), lines keep coming while the
/// owner checkpoints and trims its stream past what the tailer had, and
/// then the owner dies (its successor attaches the stored subscription
/// again, from a position the queue no longer holds). The viewer must end
/// on `complete` with every stored line, once, in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_viewer_on_a_node_paused_past_its_membership_misses_no_line_when_the_owner_dies() {
    let mut cluster = cluster();
    let stop = CancellationToken::new();
    let run = 0;
    let owner = cluster.holder_of(run).await;
    let watcher = (owner + 1) % NAMES.len();
    let producer = cluster.producer(run, &stop).await;
    let until = Instant::now() + 2 * PATIENCE;
    let viewer = cluster.viewer(run, until, Tab::On(cluster.nodes[watcher].port));
    let watching = async {
        while cluster.nodes[watcher].metric_sum("tailrace_edge_connections", None).await != Some(1.0) {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    tokio::time::timeout(PATIENCE, watching).await.expect("the viewer attached");
    tokio::time::sleep(Duration::from_secs(1)).await;
    cluster.pause(watcher, PAUSE).await;
    // Past a checkpoint write and a trim of the owner's stream.
    tokio::time::sleep(Duration::from_secs(16)).await;
    cluster.bounce(owner, "KILL").await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    let outcome = cluster.finish(stop, vec![producer], vec![(run, viewer)]).await;
    match outcome {
        Ok(summary) => eprintln!("{summary}"),
        Err(problems) => panic!("{problems}"),
    }
}
