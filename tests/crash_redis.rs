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
use tailrace::queue::{QueueAdapter, QueueAdapterFactory, QueueMapper};
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
    // The producer's connection died with the restart: read the checkpoints
    // the node stores over a fresh one. Kill it mid-delivery once every
    // queue has a checkpoint saved.
    let auditor = RedisAdapterFactory::connect(QUEUES, options(server.url()), "auditor").await.unwrap();
    let checkpoints = auditor.create_checkpointer().await.unwrap();
    wait_for_checkpoints(checkpoints.as_ref(), QUEUES, &BTreeMap::new()).await;
    node.kill().unwrap(); // SIGKILL
    node.wait().unwrap();
    let mut lives = Lives::default();
    lives.ended(dir.path(), checkpoints.as_ref(), QUEUES).await;
    assert!(deliveries(dir.path()).len() < produced.len(), "the kill came before the end");

    let node = child("child_redis_node", &env);
    restart_delivers_everything(node, dir.path(), &produced, &lives).await;
}

/// The checks above fail when they must: a life that saved no checkpoint
/// or delivered nothing, a repeat from before the checkpoint a life resumed
/// from, a repeat within a life, a stream out of order.
#[tokio::test]
async fn the_restart_checks_catch_what_they_are_for() {
    use tailrace::checkpoint::{Checkpointer, MemoryCheckpointer};
    use tailrace::queue::QueueId;
    use tailrace::stream::SequenceToken;

    let fails = |lives: &Lives, dir: &std::path::Path| {
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| lives.check(dir))).is_err()
    };
    let write = |dir: &std::path::Path, lines: &[&str]| {
        std::fs::write(dir.join("deliveries.log"), lines.iter().map(|l| format!("{l}\n")).collect::<String>()).unwrap()
    };
    let dir = tempfile::tempdir().unwrap();
    let checkpoints = MemoryCheckpointer::new();

    // Nothing delivered, or no checkpoint: the life is refused.
    use futures::FutureExt;
    let refused = || async {
        std::panic::AssertUnwindSafe(Lives::default().ended(dir.path(), &checkpoints, 1)).catch_unwind().await.is_err()
    };
    assert!(refused().await, "a life that delivered nothing");
    write(dir.path(), &["0 1-0 crash/s0 a"]);
    assert!(refused().await, "a life without a checkpoint");

    // Life 1 delivered a, b, c; its checkpoint is b's token.
    checkpoints.save(QueueId(0), SequenceToken::new(2, 0)).await.unwrap();
    write(dir.path(), &["0 1-0 crash/s0 a", "0 2-0 crash/s0 b", "0 3-0 crash/s0 c"]);
    let mut lives = Lives::default();
    lives.ended(dir.path(), &checkpoints, 1).await;
    let life_one = ["0 1-0 crash/s0 a", "0 2-0 crash/s0 b", "0 3-0 crash/s0 c"];
    let with = |next: &[&'static str]| -> Vec<&'static str> { [&life_one[..], next].concat() };
    write(dir.path(), &with(&["0 3-0 crash/s0 c", "0 4-0 crash/s0 d"]));
    assert_eq!(lives.check(dir.path()), (1, 1), "c was in the window");
    write(dir.path(), &with(&["0 2-0 crash/s0 b", "0 3-0 crash/s0 c"]));
    assert!(fails(&lives, dir.path()), "b was at the checkpoint");
    write(dir.path(), &with(&["0 4-0 crash/s0 d", "0 5-0 crash/s0 d"]));
    assert!(fails(&lives, dir.path()), "d twice in one life");
    write(dir.path(), &with(&["0 5-0 crash/s0 e", "0 4-0 crash/s0 d"]));
    assert!(fails(&lives, dir.path()), "out of order");
}
