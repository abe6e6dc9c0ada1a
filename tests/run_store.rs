//! The run log stores (file and Redis) hold the same contract: appends are
//! idempotent by token, reads address lines by offset, states and listings
//! are kept; the file store survives a crash between its two writes.

use tailrace_testkit as common;

use std::sync::Arc;
use std::time::Duration;

use common::redis_server::{RedisServer, command_calls};
use tailrace::SequenceToken;
use tailrace::archive::{Append, FileRunLogStore, RedisRunLogStore, RunKey, RunLogStore, RunState};
use tailrace::queue::Fence;

fn token(major: u64, minor: u64) -> SequenceToken {
    SequenceToken::new(major, minor)
}

async fn contract(store: Arc<dyn RunLogStore>) {
    let run = RunKey::new("svc.etl", "r-1").unwrap();
    assert_eq!(store.info(&run).await.unwrap(), None);
    assert!(!store.pipeline_exists("svc.etl").await.unwrap());
    assert!(store.append(&run, token(1, 0), &["a", "b"], Append::new()).await.unwrap());
    assert!(store.append(&run, token(2, 5), &["c"], Append::new()).await.unwrap());
    assert!(
        !store.append(&run, token(2, 5), &["c"], Append::new()).await.unwrap(),
        "a redelivered container changes nothing"
    );
    assert!(!store.append(&run, token(1, 9), &["old"], Append::new()).await.unwrap(), "an older one neither");
    let info = store.info(&run).await.unwrap().unwrap();
    assert_eq!((info.lines, info.bytes, info.last_token, info.state), (3, 6, Some(token(2, 5)), None));
    assert_eq!(store.read(&run, 0, 10, usize::MAX).await.unwrap(), ["a", "b", "c"]);
    assert_eq!(store.read(&run, 1, 1, usize::MAX).await.unwrap(), ["b"]);
    assert_eq!(store.read(&run, 0, 10, 3).await.unwrap(), ["a"], "stops at the byte budget");
    assert_eq!(store.read(&run, 0, 10, 1).await.unwrap(), ["a"], "but always returns one line");
    assert!(store.read(&run, 3, 10, usize::MAX).await.unwrap().is_empty());
    assert!(store.read(&run, u64::MAX, 10, usize::MAX).await.unwrap().is_empty(), "an offset from a client");
    store.set_state(&run, RunState::Success).await.unwrap();
    assert_eq!(store.info(&run).await.unwrap().unwrap().state, Some(RunState::Success));
    // A run known only by its status, and a second pipeline.
    let other = RunKey::new("svc.etl", "r-2").unwrap();
    store.set_state(&other, RunState::Running).await.unwrap();
    // A container without lines (a status event's) creates its run too.
    let first = RunKey::new("a.first", "x").unwrap();
    assert!(store.append(&first, token(1, 0), &[], Append::new()).await.unwrap());
    assert_eq!(store.info(&first).await.unwrap().unwrap().last_token, Some(token(1, 0)), "and moves its token");
    assert!(!store.append(&first, token(1, 0), &[], Append::new()).await.unwrap());
    assert!(store.pipeline_exists("svc.etl").await.unwrap());
    assert_eq!(store.pipelines(10).await.unwrap(), ["a.first", "svc.etl"]);
    let runs: Vec<String> = store.runs("svc.etl", 10).await.unwrap().into_iter().map(|r| r.run).collect();
    assert_eq!(runs.len(), 2);
    assert_eq!(store.runs("svc.etl", 1).await.unwrap().len(), 1);
    // A producer's retried batch: same ids (fingerprint), a new token.
    let retry = RunKey::new("svc.retry", "r-1").unwrap();
    assert!(store.append(&retry, token(3, 0), &["r"], Append::new().batch(0xfeed)).await.unwrap());
    assert!(
        !store.append(&retry, token(3, 4), &["r"], Append::new().batch(0xfeed)).await.unwrap(),
        "the retry is dropped"
    );
    assert_eq!(store.info(&retry).await.unwrap().unwrap().last_token, Some(token(3, 4)), "its token is held");
    assert!(store.append(&retry, token(4, 0), &["s"], Append::new().batch(0xbeef)).await.unwrap());
    for i in 0..tailrace::archive::RECENT_BATCHES as u64 {
        assert!(store.append(&retry, token(5, i), &["w"], Append::new().batch(0x1000 + i)).await.unwrap());
    }
    assert!(
        store.append(&retry, token(6, 0), &["r"], Append::new().batch(0xfeed)).await.unwrap(),
        "remembered for a window only"
    );
    let total = 2 + tailrace::archive::RECENT_BATCHES as u64 + 1;
    assert_eq!(store.info(&retry).await.unwrap().unwrap().lines, total);
    let tail = store.read(&retry, 0, 2, usize::MAX).await.unwrap();
    assert_eq!(tail, ["r", "s"]);
    // Many lines: offsets stay exact across index entries.
    let big = RunKey::new("svc.etl", "big").unwrap();
    let lines: Vec<String> = (0..5_000).map(|i| format!("line {i}")).collect();
    for (n, chunk) in lines.chunks(700).enumerate() {
        let refs: Vec<&str> = chunk.iter().map(String::as_str).collect();
        assert!(store.append(&big, token(10 + n as u64, 0), &refs, Append::new()).await.unwrap());
    }
    assert_eq!(store.read(&big, 3_071, 3, usize::MAX).await.unwrap(), ["line 3071", "line 3072", "line 3073"]);
    assert_eq!(store.read(&big, 4_999, 5, usize::MAX).await.unwrap(), ["line 4999"]);
    // Tokens are ordered exactly over all of u64 (an adapter may number by
    // nanoseconds or offsets): none is taken for a redelivery of another.
    let wide = RunKey::new("svc.etl", "wide").unwrap();
    let top = 1u64 << 53;
    for (major, minor) in [(top, 0), (top + 1, 0), (top + 1, u64::MAX - 1), (top + 1, u64::MAX), (u64::MAX, 0)] {
        let line = format!("{major}-{minor}");
        assert!(store.append(&wide, token(major, minor), &[&line], Append::new()).await.unwrap(), "{line} was dropped");
    }
    assert!(!store.append(&wide, token(top + 1, u64::MAX), &["again"], Append::new()).await.unwrap());
    let info = store.info(&wide).await.unwrap().unwrap();
    assert_eq!((info.lines, info.last_token), (5, Some(token(u64::MAX, 0))));
    arrival_times(store.as_ref()).await;
}

/// When lines arrived: one mark per container with lines and a time, read
/// back for any range from the mark its first line is under.
async fn arrival_times(store: &dyn RunLogStore) {
    let run = RunKey::new("svc.times", "r-1").unwrap();
    assert!(store.times(&run, 0, 10).await.unwrap().is_empty(), "no run, no times");
    let at = |ms| Append::new().arrived(ms);
    assert!(store.append(&run, token(1, 0), &["a", "b"], at(1_000)).await.unwrap());
    assert!(store.append(&run, token(2, 0), &[], at(1_500)).await.unwrap(), "a status: no lines, no mark");
    assert!(store.append(&run, token(3, 0), &["c"], at(2_000)).await.unwrap());
    assert!(store.append(&run, token(4, 0), &["d", "e", "f"], Append::new()).await.unwrap(), "no time: no mark");
    assert!(store.append(&run, token(5, 0), &["g"], at(3_000)).await.unwrap());
    assert!(!store.append(&run, token(5, 0), &["g"], at(3_000)).await.unwrap(), "redelivered");
    assert_eq!(store.times(&run, 0, 7).await.unwrap(), [(0, 1_000), (2, 2_000), (6, 3_000)]);
    assert_eq!(store.times(&run, 1, 2).await.unwrap(), [(0, 1_000)], "the mark line 1 is under");
    assert_eq!(store.times(&run, 3, 6).await.unwrap(), [(2, 2_000)]);
    assert_eq!(store.times(&run, 6, 100).await.unwrap(), [(6, 3_000)]);
    assert!(store.times(&run, 4, 4).await.unwrap().len() <= 1);
    assert!(store.times(&run, u64::MAX - 1, u64::MAX).await.unwrap().len() <= 1, "an offset from a client");
}

/// Names of any valid length: a 256-byte run id whose encoding would be
/// 768 bytes, and 29-character CJK pipeline names (261 bytes encoded)
/// that differ only in their last character.
async fn long_names(store: Arc<dyn RunLogStore>) {
    let base = "数据管道".repeat(7);
    let (first, second) = (format!("{base}甲"), format!("{base}乙"));
    assert_eq!(first.chars().count(), 29);
    let long_id = format!("scheduled__{}", ":".repeat(245));
    assert_eq!(long_id.len(), 256);
    let runs = [
        RunKey::new(&first, &long_id).unwrap(),
        RunKey::new(&first, &"r".repeat(256)).unwrap(),
        RunKey::new(&second, &long_id).unwrap(),
    ];
    for (n, run) in runs.iter().enumerate() {
        let line = format!("line of {n}");
        assert!(store.append(run, token(1, n as u64), &[&line], Append::new()).await.unwrap(), "{run}");
        store.set_state(run, RunState::Success).await.unwrap();
    }
    for (n, run) in runs.iter().enumerate() {
        assert_eq!(store.read(run, 0, 10, usize::MAX).await.unwrap(), [format!("line of {n}")], "{run}");
        let info = store.info(run).await.unwrap().unwrap();
        assert_eq!((info.lines, info.state), (1, Some(RunState::Success)));
    }
    let pipelines = store.pipelines(100).await.unwrap();
    assert!(pipelines.contains(&first) && pipelines.contains(&second), "full names listed: {pipelines:?}");
    assert!(store.pipeline_exists(&first).await.unwrap());
    let mut ids: Vec<String> = store.runs(&first, 10).await.unwrap().into_iter().map(|r| r.run).collect();
    ids.sort();
    assert_eq!(ids, ["r".repeat(256), long_id.clone()]);
    let ids: Vec<String> = store.runs(&second, 10).await.unwrap().into_iter().map(|r| r.run).collect();
    assert_eq!(ids, [long_id]);
    // Retention finds them by their full names and removes them whole.
    let policy = tailrace::archive::RetentionPolicy {
        max_total_bytes: 1,
        min_age: std::time::Duration::ZERO,
        ..Default::default()
    };
    let mut removed = Vec::new();
    loop {
        let report = store.prune(&policy, u64::MAX).await.unwrap();
        removed.extend(report.removed);
        if !report.more {
            break;
        }
    }
    for run in &runs {
        assert!(removed.contains(run), "{run} not removed: {removed:?}");
        assert_eq!(store.info(run).await.unwrap(), None);
    }
    assert!(!store.pipeline_exists(&first).await.unwrap() && !store.pipeline_exists(&second).await.unwrap());
}

#[tokio::test]
async fn the_file_store_takes_names_of_any_valid_length() {
    let dir = tempfile::tempdir().unwrap();
    long_names(Arc::new(FileRunLogStore::open(dir.path(), false).unwrap())).await;
    // Short names keep the folders they always had.
    let store = FileRunLogStore::open(dir.path(), false).unwrap();
    let run = RunKey::new("svc.etl", "scheduled__2026-08-10T00:00:00").unwrap();
    store.append(&run, token(1, 0), &["a"], Append::new()).await.unwrap();
    assert!(dir.path().join("svc.etl").join("scheduled__2026-08-10T00%3A00%3A00").join("meta.json").is_file());
}

#[tokio::test]
async fn the_redis_store_takes_names_of_any_valid_length() {
    let server = RedisServer::start();
    long_names(Arc::new(RedisRunLogStore::connect(&server.url(), "test").await.unwrap())).await;
}

#[tokio::test]
async fn the_file_store_keeps_the_contract() {
    let dir = tempfile::tempdir().unwrap();
    contract(Arc::new(FileRunLogStore::open(dir.path(), true).unwrap())).await;
}

#[tokio::test]
async fn the_redis_store_keeps_the_contract() {
    let server = RedisServer::start();
    contract(Arc::new(RedisRunLogStore::connect(&server.url(), "test").await.unwrap())).await;
}

/// The same contract on a Redis Cluster: a run's keys share a hash tag
/// (one slot, one script), its listings are written apart; waits are told by
/// the run's shard, as on one server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_redis_store_keeps_the_contract_on_a_redis_cluster() {
    let cluster = common::redis_cluster::RedisCluster::start();
    let endpoint = cluster.endpoint();
    let store = |prefix: &'static str| {
        let endpoint = endpoint.clone();
        async move { Arc::new(RedisRunLogStore::connect_to(&endpoint, prefix).await.unwrap()) }
    };
    contract(store("contract").await).await;
    long_names(store("long").await).await;
    waits(store("waits").await, store("waits").await).await;
}

/// A crash after the lines were written but before the meta was replaced
/// leaves junk past the meta's length; it is never read, and the next
/// append (the redelivered container) replaces it.
#[tokio::test]
async fn the_file_store_recovers_from_a_crash_between_its_writes() {
    let dir = tempfile::tempdir().unwrap();
    let store = FileRunLogStore::open(dir.path(), false).unwrap();
    let run = RunKey::new("svc.etl", "r-1").unwrap();
    store.append(&run, token(1, 0), &["kept"], Append::new()).await.unwrap();
    let run_dir = dir.path().join("svc.etl").join("r-1");
    let log = run_dir.join("log.txt");
    let mut bytes = std::fs::read(&log).unwrap();
    bytes.extend_from_slice(b"half-written\nlines\n");
    std::fs::write(&log, bytes).unwrap();
    std::fs::remove_file(run_dir.join("log.idx")).unwrap();
    assert_eq!(store.read(&run, 0, 10, usize::MAX).await.unwrap(), ["kept"], "junk past the meta is not read");
    assert!(store.append(&run, token(2, 0), &["redelivered"], Append::new()).await.unwrap());
    assert_eq!(store.read(&run, 0, 10, usize::MAX).await.unwrap(), ["kept", "redelivered"]);
    assert_eq!(std::fs::read_to_string(&log).unwrap(), "kept\nredelivered\n");
}

/// Redis crashed while writing an append to its append-only file (the file
/// ends inside it). An append is one script, written as one transaction,
/// and Redis drops a transaction cut short when it loads the file: the run
/// holds all of an append's lines with its token, or none of them, and the
/// redelivered container lands at the right offset.
#[tokio::test]
async fn a_redis_append_cut_short_by_a_crash_leaves_nothing_half_written() {
    let mut server = RedisServer::start();
    let store = RedisRunLogStore::connect(&server.url(), "test").await.unwrap();
    let run = RunKey::new("svc.etl", "r-1").unwrap();
    assert!(store.append(&run, token(1, 0), &["a", "b"], Append::new()).await.unwrap());
    let aof = server.aof_tail();
    let before = std::fs::metadata(&aof).unwrap().len();
    let lines: Vec<String> = (0..100).map(|i| format!("line {i}")).collect();
    let refs: Vec<&str> = lines.iter().map(String::as_str).collect();
    assert!(store.append(&run, token(2, 0), &refs, Append::new()).await.unwrap());
    let after = std::fs::metadata(&aof).unwrap().len();
    let text = String::from_utf8_lossy(&std::fs::read(&aof).unwrap()[before as usize..]).into_owned();
    assert!(text.contains("MULTI") && text.contains("EXEC"), "one transaction per append: {text:.200}");
    server.restart_with(|_| {
        let file = std::fs::OpenOptions::new().write(true).open(&aof).unwrap();
        file.set_len(before + (after - before) / 2).unwrap();
    });

    let store = RedisRunLogStore::connect(&server.url(), "test").await.unwrap();
    let info = store.info(&run).await.unwrap().unwrap();
    assert_eq!((info.lines, info.bytes, info.last_token), (2, 4, Some(token(1, 0))));
    assert_eq!(store.read(&run, 0, 200, usize::MAX).await.unwrap(), ["a", "b"]);
    assert!(
        store.append(&run, token(2, 0), &refs, Append::new()).await.unwrap(),
        "the redelivered container is new again"
    );
    assert_eq!(store.read(&run, 2, 1, usize::MAX).await.unwrap(), ["line 0"]);
    assert_eq!(store.info(&run).await.unwrap().unwrap().lines, 102);
}

/// The archiver appends under its agent's lease token: once a delivery
/// under a newer token reached a run, a paused old owner's delivery is
/// refused and appends nothing, and the new owner's later containers are
/// all stored (none skipped as older than a zombie's).
#[tokio::test]
async fn a_zombie_archiver_cannot_append_after_a_newer_lease_wrote_the_run() {
    use tailrace::archive::{Archiver, StoreError};
    use tailrace::pubsub::{ConsumerFactory, Delivery, SubscriptionId};
    use tailrace::{BatchContainer, Event, EventId};

    let server = RedisServer::start();
    let store = Arc::new(RedisRunLogStore::connect(&server.url(), "test").await.unwrap());
    let run = RunKey::new("svc.etl", "r-1").unwrap();
    let consumer = Archiver::new(store.clone()).create(&run.stream());
    let delivery = |major: u64, line: &str, fence: u64| {
        let batch = BatchContainer {
            stream: run.stream(),
            token: token(major, 0),
            events: vec![Event::new(EventId::new(format!("id-{major}")), line.to_string())],
        };
        Delivery::new(SubscriptionId::random(), run.stream(), vec![Arc::new(batch)]).fenced(Fence::lease(fence))
    };
    consumer.deliver(&delivery(1, "one", 5)).await.unwrap();
    consumer.deliver(&delivery(2, "two", 6)).await.unwrap();
    assert!(consumer.deliver(&delivery(3, "zombie", 5)).await.is_err(), "an older token is refused");
    assert!(matches!(
        store.append(&run, token(4, 0), &["zombie"], Append::new().fenced(Fence::lease(5))).await,
        Err(StoreError::Fenced { token: 5, .. })
    ));
    consumer.deliver(&delivery(3, "three", 6)).await.unwrap();
    assert_eq!(store.read(&run, 0, 10, usize::MAX).await.unwrap(), ["one", "two", "three"]);
    assert_eq!(store.info(&run).await.unwrap().unwrap().last_token, Some(token(3, 0)));
    assert!(
        store.append(&run, token(4, 0), &["unfenced"], Append::new()).await.unwrap(),
        "an unfenced writer is not checked"
    );
}

/// A status wait answers at once for a container already stored, ends as
/// one lands (written by another process's store), and says no when its
/// time is up with nothing stored.
async fn waits(waiter: Arc<dyn RunLogStore>, writer: Arc<dyn RunLogStore>) {
    let run = RunKey::new("svc.wait", "r-1").unwrap();
    assert!(!waiter.wait_stored(&run, token(1, 0), Duration::from_millis(50)).await, "nothing is stored");
    writer.append(&run, token(1, 0), &["a"], Append::new()).await.unwrap();
    assert!(waiter.wait_stored(&run, token(1, 0), Duration::ZERO).await, "already stored");
    assert!(!waiter.wait_stored(&run, token(2, 0), Duration::from_millis(50)).await, "a later one is not");
    let late = tokio::spawn({
        let (writer, run) = (writer.clone(), run.clone());
        async move {
            tokio::time::sleep(Duration::from_millis(1_000)).await;
            writer.append(&run, token(2, 0), &[], Append::new()).await.unwrap();
        }
    });
    assert!(waiter.wait_stored(&run, token(2, 0), Duration::from_secs(60)).await, "the status landed");
    late.await.unwrap();
}

#[tokio::test]
async fn the_file_store_tells_waits_of_its_writes() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(FileRunLogStore::open(dir.path(), false).unwrap());
    waits(store.clone(), store).await;
}

/// The wait of a node whose archiver is elsewhere is told by Redis (client
/// side tracking of the run's hash), not found by looking every 100 ms: over
/// the second the write takes to come, it reads the run's hash a handful of
/// times, not ten.
#[tokio::test]
async fn a_redis_store_wait_is_told_of_another_nodes_write() {
    let server = RedisServer::start();
    let waiter = Arc::new(RedisRunLogStore::connect(&server.url(), "test").await.unwrap());
    let writer = Arc::new(RedisRunLogStore::connect(&server.url(), "test").await.unwrap());
    let mut conn = redis::Client::open(server.url()).unwrap().get_connection_manager().await.unwrap();
    let before = command_calls(&mut conn).await;
    waits(waiter, writer).await;
    let after = command_calls(&mut conn).await;
    let looks = after.get("hgetall").copied().unwrap_or(0) - before.get("hgetall").copied().unwrap_or(0);
    let tracked = after.get("hmget").copied().unwrap_or(0) - before.get("hmget").copied().unwrap_or(0);
    assert!(looks <= 8, "{looks} looks at the run: the wait polled");
    assert!(tracked >= 1, "the wait registered the run's key ({tracked} HMGET)");
}
