//! Crash tests on the Redis adapter, as separate processes:
//!
//! 1. a node pulling Redis is killed with SIGKILL mid-delivery while Redis
//!    itself restarts, then started again;
//! 2. a node lives several lives on one Redis while producers run: killed,
//!    stopped in order, Redis restarted under it, again and again.
//!
//! Every acknowledged event is delivered, in order per stream; an event is
//! delivered again only if it was past the checkpoint the node resumed from
//! (never after an ordered stop), and at most once per life.

use tailrace_testkit as common;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::crash::*;
use common::redis_server::RedisServer;
use common::*;
use tailrace::adapters::redis::{RedisAdapterFactory, RedisOptions};
use tailrace::queue::{QueueAdapter, QueueAdapterFactory, QueueMapper};
use tailrace::{Event, StreamId};

const QUEUES: u32 = 2;

fn options(url: String) -> RedisOptions {
    RedisOptions { url, ..RedisOptions::default() }
}

/// Child: a node pulling Redis, auditing every delivery, until killed or
/// told to stop (its stdin closed), then stopped in order.
#[test]
#[ignore = "a child process of the crash tests"]
fn child_redis_node() {
    let dir = crash_dir();
    let url = std::env::var("TAILRACE_CRASH_REDIS").expect("run by the crash test");
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    runtime.block_on(async move {
        let audit = Audit::open(&dir, QueueMapper::new(QUEUES));
        let factory = Arc::new(RedisAdapterFactory::connect(QUEUES, options(url)).await.unwrap());
        let mut config = quick_config();
        config.checkpoint.persist_interval = Duration::from_millis(100);
        config.agent.max_delivery_batch = 1;
        config.agent.reader_backoff = tailrace::config::Backoff::fixed(Duration::from_millis(100));
        let node = TestNode::start(factory, config, audit.implicit("crash")).await;
        println!("\n{READY}");
        until_told_to_stop().await;
        node.node.shutdown().await.unwrap();
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_killed_mid_delivery_during_a_redis_restart_loses_nothing() {
    let mut server = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    let factory = RedisAdapterFactory::connect(QUEUES, options(server.url())).await.unwrap();
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
    let auditor = RedisAdapterFactory::connect(QUEUES, options(server.url())).await.unwrap();
    let checkpoints = auditor.create_checkpointer().await.unwrap();
    wait_for_checkpoints(checkpoints.as_ref(), QUEUES, &BTreeMap::new()).await;
    node.kill().unwrap(); // SIGKILL
    node.wait().unwrap();
    let mut lives = Lives::default();
    lives.ended(dir.path(), checkpoints.as_ref(), QUEUES, End::Killed).await;
    assert!(deliveries(dir.path()).len() < produced.len(), "the kill came before the end");

    let node = child("child_redis_node", &env);
    restart_delivers_everything(node, dir.path(), &produced, &lives).await;
}

/// Appends one event at a time to six streams until stopped, retrying
/// what Redis refuses while it restarts; each attempt has its own id, so a
/// retried append whose first reply was lost is two events, not one twice.
struct Producer {
    stop: Arc<std::sync::atomic::AtomicBool>,
    acked: Arc<std::sync::Mutex<BTreeSet<String>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Producer {
    fn start(adapter: Arc<tailrace::adapters::redis::RedisAdapter>) -> Self {
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let acked = Arc::new(std::sync::Mutex::new(BTreeSet::new()));
        let streams: Vec<StreamId> = (0..6).map(|i| StreamId::new("crash", format!("s{i}"))).collect();
        let (flag, ids) = (stop.clone(), acked.clone());
        let task = tokio::spawn(async move {
            for n in 0u64.. {
                if flag.load(std::sync::atomic::Ordering::SeqCst) {
                    return;
                }
                let id = format!("p{n}");
                match adapter.enqueue(&streams[(n % 6) as usize], vec![Event::new(id.as_str(), "x")]).await {
                    Ok(_) => {
                        ids.lock().unwrap().insert(id);
                        tokio::time::sleep(Duration::from_millis(2)).await;
                    }
                    Err(error) if error.is_transient() => tokio::time::sleep(Duration::from_millis(20)).await,
                    Err(error) => panic!("append {id}: {error}"),
                }
            }
        });
        Self { stop, acked, task }
    }

    fn acked(&self) -> usize {
        self.acked.lock().unwrap().len()
    }

    async fn finish(self) -> BTreeSet<String> {
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
        self.task.await.unwrap();
        Arc::try_unwrap(self.acked).unwrap().into_inner().unwrap()
    }
}

/// Polls (every 20 ms, at most 60 s) until the audit log holds `n` lines.
async fn wait_deliveries(dir: &std::path::Path, n: usize) {
    let started = Instant::now();
    while deliveries(dir).len() < n {
        assert!(started.elapsed() < Duration::from_secs(60), "fewer than {n} deliveries after 60 s");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_through_several_lives_on_one_redis_loses_nothing() {
    let mut server = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    let factory = RedisAdapterFactory::connect(QUEUES, options(server.url())).await.unwrap();
    let checkpoints = factory.create_checkpointer().await.unwrap();
    let producer = Producer::start(factory.adapter());
    let env = vec![("TAILRACE_CRASH_DIR", dir.path().display().to_string()), ("TAILRACE_CRASH_REDIS", server.url())];
    let mut lives = Lives::default();
    for round in 0..3 {
        for how in [End::Killed, End::Stopped] {
            let mut node = child("child_redis_node", &env);
            wait_ready(&mut node);
            let from = deliveries(dir.path()).len();
            wait_deliveries(dir.path(), from + 300).await;
            if how == End::Killed {
                server.restart(); // under the node and the producer
                wait_deliveries(dir.path(), from + 600).await;
            }
            // Progress saved on every queue past where this life began.
            wait_for_checkpoints(checkpoints.as_ref(), QUEUES, &lives.last_checkpoints()).await;
            match how {
                End::Killed => {
                    node.kill().unwrap(); // SIGKILL
                    node.wait().unwrap();
                }
                End::Stopped => stop_gracefully(&mut node),
            }
            lives.ended(dir.path(), checkpoints.as_ref(), QUEUES, how).await;
            if round == 1 && how == End::Stopped {
                server.restart(); // while no node runs, under the producer
            }
        }
    }
    assert!(producer.acked() > 0);
    let acked = producer.finish().await;

    // The last life delivers every acknowledged event, then stops.
    let mut node = child("child_redis_node", &env);
    wait_ready(&mut node);
    let started = Instant::now();
    let delivered = || deliveries(dir.path()).into_iter().map(|d| d.id).collect::<BTreeSet<_>>();
    while !delivered().is_superset(&acked) {
        let missing: Vec<_> = acked.difference(&delivered()).take(10).cloned().collect();
        assert!(started.elapsed() < Duration::from_secs(60), "lost: {missing:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    stop_gracefully(&mut node);
    let (repeats, window) = lives.check(dir.path());
    println!(
        "{} acknowledged events over {} lives; {repeats} delivered again, of {window} in unacknowledged windows",
        acked.len(),
        lives.count() + 1
    );
}

/// The checks above fail when they must: a life that saved no checkpoint
/// or delivered nothing, a repeat from before the checkpoint a life resumed
/// from or after a graceful stop, a repeat within a life, a stream out of
/// order within a life or across lives.
#[tokio::test]
async fn the_restart_checks_catch_what_they_are_for() {
    use tailrace::checkpoint::MemoryCheckpointer;
    use tailrace::queue::{Checkpointer, Fence};
    use tailrace::{QueueId, SequenceToken};

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
        std::panic::AssertUnwindSafe(Lives::default().ended(dir.path(), &checkpoints, 1, End::Killed))
            .catch_unwind()
            .await
            .is_err()
    };
    assert!(refused().await, "a life that delivered nothing");
    write(dir.path(), &["0 1-0 crash/s0 a"]);
    assert!(refused().await, "a life without a checkpoint");

    // Life 1 delivered a, b, c; its checkpoint is b's token.
    checkpoints.save(QueueId(0), SequenceToken::new(2, 0), Fence::NONE).await.unwrap();
    write(dir.path(), &["0 1-0 crash/s0 a", "0 2-0 crash/s0 b", "0 3-0 crash/s0 c"]);
    let mut lives = Lives::default();
    lives.ended(dir.path(), &checkpoints, 1, End::Killed).await;
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
    write(dir.path(), &with(&["0 4-0 crash/s1 x", "0 5-0 crash/s0 e"]));
    assert_eq!(lives.check(dir.path()), (0, 1), "streams are ordered each on its own");

    // Life 1 skipped b and delivered c: b coming later is out of order.
    write(dir.path(), &["0 1-0 crash/s0 a", "0 3-0 crash/s0 c"]);
    let mut skipped = Lives::default();
    checkpoints.save(QueueId(0), SequenceToken::new(3, 0), Fence::NONE).await.unwrap();
    skipped.ended(dir.path(), &checkpoints, 1, End::Killed).await;
    write(dir.path(), &["0 1-0 crash/s0 a", "0 3-0 crash/s0 c", "0 2-0 crash/s0 b"]);
    assert!(fails(&skipped, dir.path()), "b after c");

    // After an ordered stop nothing comes again, not even past the checkpoint.
    checkpoints.save(QueueId(0), SequenceToken::new(2, 0), Fence::NONE).await.unwrap();
    write(dir.path(), &life_one);
    let mut stopped = Lives::default();
    stopped.ended(dir.path(), &checkpoints, 1, End::Stopped).await;
    write(dir.path(), &with(&["0 4-0 crash/s0 d"]));
    assert_eq!(stopped.check(dir.path()), (0, 1));
    write(dir.path(), &with(&["0 3-0 crash/s0 c"]));
    assert!(fails(&stopped, dir.path()), "c again after a graceful stop");
}
