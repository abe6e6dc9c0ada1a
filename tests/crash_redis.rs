//! Crash test on the Redis adapter, as separate processes: a node pulling
//! Redis is killed with SIGKILL mid-delivery while Redis itself restarts,
//! then started again. Every event is delivered at least once, duplicates
//! only after the last checkpoint, none lost.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::crash::*;
use common::redis_server::RedisServer;
use common::*;
use tailrace::adapters::redis::{RedisAdapterFactory, RedisOptions};
use tailrace::queue::{QueueAdapter, QueueAdapterFactory, QueueId, QueueMapper};
use tailrace::stream::{Event, StreamId};

const QUEUES: u32 = 2;

fn options(url: String) -> RedisOptions {
    RedisOptions { url, block: Duration::from_millis(20), ..RedisOptions::default() }
}

/// Child: a node pulling Redis, auditing every delivery, until killed.
#[test]
#[ignore = "a child process of the crash tests"]
fn child_redis_node() {
    let dir = crash_dir();
    let url = std::env::var("TAILRACE_CRASH_REDIS").expect("run by the crash test");
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    runtime.block_on(async move {
        let audit = Audit::open(&dir, QueueMapper::new(QUEUES));
        let factory = Arc::new(RedisAdapterFactory::connect(QUEUES, options(url), "crash-node").await.unwrap());
        let mut config = quick_config();
        config.checkpoint.persist_interval = Duration::from_millis(100);
        config.agent.max_delivery_batch = 1;
        config.agent.reader_backoff = tailrace::retry::Backoff::fixed(Duration::from_millis(100));
        let _node = TestNode::start(factory, config, audit.implicit("crash")).await;
        println!("\n{READY}");
        std::future::pending::<()>().await;
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_killed_mid_delivery_during_a_redis_restart_loses_nothing() {
    let mut server = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    let factory = RedisAdapterFactory::connect(QUEUES, options(server.url()), "producer").await.unwrap();
    let adapter = factory.adapter();
    let streams: Vec<StreamId> = (0..6).map(|i| StreamId::new("crash", format!("s{i}"))).collect();
    let mut produced = BTreeSet::new();
    for n in 0..3_000u64 {
        let id = format!("p{n}");
        adapter.enqueue(&streams[(n % 6) as usize], vec![Event::new(id.as_str(), "x")]).await.unwrap();
        produced.insert(id);
    }
    let env = vec![("TAILRACE_CRASH_DIR", dir.path().display().to_string()), ("TAILRACE_CRASH_REDIS", server.url())];
    let mut node = child("child_redis_node", &env);
    wait_ready(&mut node);
    let started = Instant::now();
    while deliveries(dir.path()).len() < 700 {
        assert!(started.elapsed() < Duration::from_secs(60), "the node delivers too slowly");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    server.restart(); // Redis goes away and comes back under the node
    while deliveries(dir.path()).len() < 1_400 {
        assert!(started.elapsed() < Duration::from_secs(60), "the node did not recover from the Redis restart");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    node.kill().unwrap(); // SIGKILL, mid-delivery
    node.wait().unwrap();
    // The producer's connection died with the restart: read the checkpoints
    // the node stored over a fresh one.
    let factory = RedisAdapterFactory::connect(QUEUES, options(server.url()), "auditor").await.unwrap();
    let checkpoints = factory.create_checkpointer().await.unwrap();
    let mut at_kill = BTreeMap::new();
    for q in 0..QUEUES {
        at_kill.insert(q, checkpoints.load(QueueId(q)).await.unwrap());
    }
    assert!(deliveries(dir.path()).len() < produced.len(), "the kill came before the end");

    let node = child("child_redis_node", &env);
    restart_delivers_everything(node, dir.path(), &produced, &at_kill).await;
}
