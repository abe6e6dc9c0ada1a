//! Run log retention: both stores remove old finished runs, oldest first,
//! until under the byte cap, never a running one; what is left is served as
//! before; a removed run reads as never seen. The stores are stamped by a
//! clock the test sets, and prunes are given their time, so nothing sleeps.

use tailrace_testkit as common;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use common::redis_server::RedisServer;
use tailrace::SequenceToken;
use tailrace::archive::{
    Append, Clock, FileRunLogStore, RedisRunLogStore, Retention, RetentionPolicy, RunKey, RunLogStore, RunState,
};
use tokio_util::sync::CancellationToken;

const DAY: u64 = 24 * 3600 * 1000;

/// A clock the test moves.
#[derive(Clone, Default)]
struct TestClock(Arc<AtomicU64>);

impl TestClock {
    fn at(start: u64) -> Self {
        let clock = Self::default();
        clock.set(start);
        clock
    }

    fn set(&self, ms: u64) {
        self.0.store(ms, Ordering::SeqCst);
    }

    fn clock(&self) -> Clock {
        let now = self.0.clone();
        Arc::new(move || now.load(Ordering::SeqCst))
    }
}

fn key(fqn: &str, run: &str) -> RunKey {
    RunKey::new(fqn, run).unwrap()
}

/// A policy with only the rules a test names.
fn policy() -> RetentionPolicy {
    RetentionPolicy {
        max_age: Duration::ZERO,
        max_total_bytes: 0,
        min_age: Duration::ZERO,
        abandoned_after: Duration::ZERO,
        interval: Duration::from_secs(60),
    }
}

/// Appends `lines` lines of 100 bytes (newline included) at `at`, then sets
/// `state` if given.
async fn run_at(
    store: &dyn RunLogStore,
    clock: &TestClock,
    at: u64,
    run: &RunKey,
    lines: usize,
    state: Option<RunState>,
) {
    clock.set(at);
    let line = "x".repeat(99);
    let refs: Vec<&str> = (0..lines).map(|_| line.as_str()).collect();
    assert!(store.append(run, SequenceToken::new(at, 0), &refs, Append::new()).await.unwrap());
    if let Some(state) = state {
        store.set_state(run, state).await.unwrap();
    }
}

async fn runs_of(store: &dyn RunLogStore, fqn: &str) -> Vec<String> {
    store.runs(fqn, 100).await.unwrap().into_iter().map(|r| r.run).collect()
}

async fn oldest_first_until_under_the_cap(store: Arc<dyn RunLogStore>, clock: TestClock) {
    let store = store.as_ref();
    let (a, b, c) = (key("svc.etl", "a"), key("svc.etl", "b"), key("other.pipe", "c"));
    let (live, d) = (key("svc.etl", "live"), key("svc.etl", "d"));
    // Created in this order; `b` finishes last of the three, so it is the
    // youngest of them by last activity.
    run_at(store, &clock, 1_000, &b, 1, None).await;
    run_at(store, &clock, 2_000, &a, 1, Some(RunState::Success)).await;
    run_at(store, &clock, 3_000, &c, 1, Some(RunState::Failed)).await;
    run_at(store, &clock, 4_000, &live, 3, Some(RunState::Running)).await;
    run_at(store, &clock, 5_000, &d, 1, Some(RunState::Stopped)).await;
    clock.set(6_000);
    store.set_state(&b, RunState::PartialSuccess).await.unwrap();
    assert_eq!(store.info(&b).await.unwrap().unwrap().last_activity_ms(), 6_000, "a status change is activity");

    // 700 bytes, cap 450: a (2 000), then c (3 000), then d (5 000) go;
    // b (6 000) and the running run stay.
    let capped = RetentionPolicy { max_total_bytes: 450, ..policy() };
    let report = store.prune(&capped, 10_000).await.unwrap();
    assert_eq!(report.removed, [a.clone(), c.clone(), d.clone()], "oldest last activity first");
    assert_eq!((report.runs_removed, report.bytes_freed), (3, 300));
    assert_eq!((report.runs_kept, report.bytes_kept), (2, 400));
    assert_eq!((report.changed, report.failed, report.more), (0, 0, false));

    // A removed run reads as never seen; its pipeline went with its last run.
    for gone in [&a, &c, &d] {
        assert_eq!(store.info(gone).await.unwrap(), None, "{gone}");
        assert!(store.read(gone, 0, 10, usize::MAX).await.unwrap().is_empty(), "{gone}");
    }
    assert!(!store.pipeline_exists("other.pipe").await.unwrap());
    assert!(runs_of(store, "other.pipe").await.is_empty());

    // What is left is served as before.
    assert_eq!(store.pipelines(10).await.unwrap(), ["svc.etl"]);
    assert_eq!(runs_of(store, "svc.etl").await, ["live", "b"], "newest first");
    assert_eq!(store.read(&live, 0, 10, usize::MAX).await.unwrap().len(), 3);
    assert_eq!(store.read(&b, 0, 10, usize::MAX).await.unwrap(), ["x".repeat(99)]);
    let info = store.info(&live).await.unwrap().unwrap();
    assert_eq!((info.lines, info.bytes, info.state), (3, 300, Some(RunState::Running)));

    // Still over a smaller cap: the finished run goes, the running one stays
    // even though the store is still above the cap.
    let tiny = RetentionPolicy { max_total_bytes: 100, ..policy() };
    let report = store.prune(&tiny, 10_000).await.unwrap();
    assert_eq!(report.removed, std::slice::from_ref(&b));
    assert_eq!((report.runs_kept, report.bytes_kept), (1, 300));
    let report = store.prune(&tiny, 10 * DAY).await.unwrap();
    assert_eq!((report.runs_removed, report.runs_kept), (0, 1), "a running run is never removed");
    assert_eq!(store.read(&live, 0, 10, usize::MAX).await.unwrap().len(), 3);

    // A removed run that receives lines again starts anew.
    run_at(store, &clock, 20_000, &a, 2, None).await;
    let info = store.info(&a).await.unwrap().unwrap();
    assert_eq!((info.lines, info.state, info.created_ms), (2, None, 20_000));
    assert!(store.pipeline_exists("svc.etl").await.unwrap());
}

async fn the_age_rule(store: Arc<dyn RunLogStore>, clock: TestClock) {
    let store = store.as_ref();
    let fqn = "svc.age";
    let [old, recent, running, queued, silent, late, fresh] =
        ["old", "recent", "running", "queued", "silent", "late", "fresh"].map(|r| key(fqn, r));
    run_at(store, &clock, DAY, &old, 2, Some(RunState::Success)).await;
    run_at(store, &clock, DAY, &running, 2, Some(RunState::Running)).await;
    run_at(store, &clock, DAY, &queued, 2, Some(RunState::Queued)).await;
    run_at(store, &clock, DAY, &silent, 2, None).await;
    run_at(store, &clock, DAY, &late, 2, Some(RunState::Failed)).await;
    run_at(store, &clock, 30 * DAY, &recent, 2, Some(RunState::Success)).await;
    let now = 40 * DAY;
    // A finished run that still receives a line is active again.
    run_at(store, &clock, now - 60_000, &late, 1, None).await;
    run_at(store, &clock, now - 60_000, &fresh, 1, Some(RunState::Success)).await;

    let thirty_days =
        RetentionPolicy { max_age: Duration::from_secs(30 * 24 * 3600), min_age: Duration::from_secs(600), ..policy() };
    let report = store.prune(&thirty_days, now).await.unwrap();
    assert_eq!(report.removed, std::slice::from_ref(&old), "only the finished run past max_age");
    assert_eq!(store.info(&old).await.unwrap(), None);
    assert_eq!(runs_of(store, fqn).await.len(), 6);

    // min_age holds even over the byte cap: only `recent` (10 days) may go.
    let capped = RetentionPolicy { max_total_bytes: 1, ..thirty_days.clone() };
    let report = store.prune(&capped, now).await.unwrap();
    assert_eq!(report.removed, std::slice::from_ref(&recent));
    assert_eq!(store.read(&late, 0, 10, usize::MAX).await.unwrap().len(), 3, "the late line kept its run");
    assert!(store.info(&fresh).await.unwrap().is_some());

    // Unfinished runs stay forever, unless `abandoned_after` says otherwise.
    let report = store.prune(&thirty_days, 1_000 * DAY).await.unwrap();
    assert_eq!(report.removed, [late.clone(), fresh.clone()]);
    assert_eq!(runs_of(store, fqn).await.len(), 3);
    let abandoning = RetentionPolicy { abandoned_after: Duration::from_secs(90 * 24 * 3600), ..thirty_days };
    assert_eq!(store.prune(&abandoning, 80 * DAY).await.unwrap().runs_removed, 0, "silent for 79 days only");
    let report = store.prune(&abandoning, 92 * DAY).await.unwrap();
    assert_eq!(report.runs_removed, 3);
    assert!(!store.pipeline_exists(fqn).await.unwrap());
    for run in [&running, &queued, &silent] {
        assert_eq!(store.info(run).await.unwrap(), None, "{run}");
    }
}

async fn nothing_goes_when_the_rules_are_off(store: Arc<dyn RunLogStore>, clock: TestClock) {
    let run = key("svc.off", "r");
    run_at(store.as_ref(), &clock, DAY, &run, 5, Some(RunState::Success)).await;
    let report = store.prune(&policy(), 1_000 * DAY).await.unwrap();
    assert_eq!((report.runs_removed, report.runs_kept, report.bytes_kept), (0, 1, 500));
    assert!(store.info(&run).await.unwrap().is_some());
}

fn file_store(dir: &std::path::Path, clock: &TestClock) -> Arc<dyn RunLogStore> {
    Arc::new(FileRunLogStore::open_with_clock(dir, false, clock.clock()).unwrap())
}

async fn redis_store(server: &RedisServer, clock: &TestClock) -> Arc<dyn RunLogStore> {
    Arc::new(RedisRunLogStore::connect(&server.url(), "test").await.unwrap().with_clock(clock.clock()))
}

#[tokio::test]
async fn the_file_store_removes_the_oldest_finished_runs_until_under_the_cap() {
    let dir = tempfile::tempdir().unwrap();
    let clock = TestClock::default();
    oldest_first_until_under_the_cap(file_store(dir.path(), &clock), clock).await;
}

#[tokio::test]
async fn the_file_store_removes_finished_runs_past_max_age_only() {
    let dir = tempfile::tempdir().unwrap();
    let clock = TestClock::default();
    the_age_rule(file_store(dir.path(), &clock), clock).await;
}

#[tokio::test]
async fn the_file_store_keeps_everything_when_retention_is_off() {
    let dir = tempfile::tempdir().unwrap();
    let clock = TestClock::default();
    nothing_goes_when_the_rules_are_off(file_store(dir.path(), &clock), clock).await;
}

#[tokio::test]
async fn the_redis_store_removes_the_oldest_finished_runs_until_under_the_cap() {
    let server = RedisServer::start();
    let clock = TestClock::default();
    oldest_first_until_under_the_cap(redis_store(&server, &clock).await, clock).await;
}

#[tokio::test]
async fn the_redis_store_removes_finished_runs_past_max_age_only() {
    let server = RedisServer::start();
    let clock = TestClock::default();
    the_age_rule(redis_store(&server, &clock).await, clock).await;
}

#[tokio::test]
async fn the_redis_store_keeps_everything_when_retention_is_off() {
    let server = RedisServer::start();
    let clock = TestClock::default();
    nothing_goes_when_the_rules_are_off(redis_store(&server, &clock).await, clock).await;
}

/// The same rules on a Redis Cluster, where a run's keys share a hash tag
/// and the listings live in other slots: removing a run takes it out of
/// the listings in separate commands.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_redis_store_prunes_by_the_same_rules_on_a_redis_cluster() {
    let cluster = common::redis_cluster::RedisCluster::start();
    for (prefix, rule) in [("cap", 0), ("age", 1), ("off", 2)] {
        let clock = TestClock::default();
        let store = RedisRunLogStore::connect_to(&cluster.endpoint(), prefix).await.unwrap().with_clock(clock.clock());
        let store: Arc<dyn RunLogStore> = Arc::new(store);
        match rule {
            0 => oldest_first_until_under_the_cap(store, clock).await,
            1 => the_age_rule(store, clock).await,
            _ => nothing_goes_when_the_rules_are_off(store, clock).await,
        }
    }
}

/// The Redis store leaves no key of a removed run behind.
#[tokio::test]
async fn the_redis_store_deletes_every_key_of_a_removed_run() {
    let server = RedisServer::start();
    let clock = TestClock::default();
    let store = redis_store(&server, &clock).await;
    let (gone, kept) = (key("svc.etl", "gone"), key("svc.keep", "kept"));
    run_at(store.as_ref(), &clock, DAY, &gone, 3, Some(RunState::Success)).await;
    run_at(store.as_ref(), &clock, DAY, &kept, 3, Some(RunState::Running)).await;
    let report = store.prune(&RetentionPolicy { max_age: Duration::from_secs(1), ..policy() }, 2 * DAY).await.unwrap();
    assert_eq!(report.removed, [gone]);
    let client = redis::Client::open(server.url()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let mut keys: Vec<String> = redis::cmd("KEYS").arg("test:*").query_async(&mut conn).await.unwrap();
    keys.sort();
    assert_eq!(
        keys,
        ["test:log:8:svc.keep:kept", "test:pipelines", "test:run:8:svc.keep:kept", "test:runs:8:svc.keep"]
    );
}

/// A crash between the rename and the delete leaves a `.trash-*` directory:
/// it is no pipeline, and the next prune deletes it. A meta written before
/// `updated_ms` existed still loads, and ages from its creation.
#[tokio::test]
async fn the_file_store_cleans_up_after_a_crash_and_reads_old_metas() {
    let dir = tempfile::tempdir().unwrap();
    let clock = TestClock::at(DAY);
    let store = file_store(dir.path(), &clock);
    let old = key("svc.etl", "old");
    run_at(store.as_ref(), &clock, DAY, &old, 1, Some(RunState::Success)).await;
    clock.set(5 * DAY);
    store.set_state(&old, RunState::Failed).await.unwrap();
    let meta_path = dir.path().join("svc.etl").join("old").join("meta.json");
    let mut meta: serde_json::Value = serde_json::from_slice(&std::fs::read(&meta_path).unwrap()).unwrap();
    assert_eq!(meta["updated_ms"], 5 * DAY);
    meta.as_object_mut().unwrap().remove("updated_ms");
    std::fs::write(&meta_path, serde_json::to_vec(&meta).unwrap()).unwrap();
    let info = store.info(&old).await.unwrap().unwrap();
    assert_eq!((info.updated_ms, info.last_activity_ms(), info.state), (0, DAY, Some(RunState::Failed)));

    let trash = dir.path().join(".trash-123-0");
    std::fs::create_dir_all(trash.join("log-dir")).unwrap();
    std::fs::write(trash.join("log-dir").join("log.txt"), "half a run\n").unwrap();
    assert_eq!(store.pipelines(10).await.unwrap(), ["svc.etl"], "trash is no pipeline");

    let max_age = RetentionPolicy { max_age: Duration::from_secs(10 * 24 * 3600), ..policy() };
    let report = store.prune(&max_age, 12 * DAY).await.unwrap();
    assert_eq!(report.removed, [old], "aged from its creation (day 1), not its last status (day 5)");
    assert!(!trash.exists());
    let left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
    assert!(left.is_empty(), "no trash and no empty pipeline directory left: {left:?}");
}

/// The task prunes at once, then every interval, counts what it removed,
/// and stops when cancelled.
#[tokio::test(start_paused = true)]
async fn the_retention_task_prunes_every_interval_until_cancelled() {
    let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
    let handle = recorder.handle();
    let _local = metrics::set_default_local_recorder(&recorder);
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn RunLogStore> = Arc::new(FileRunLogStore::open(dir.path(), false).unwrap());
    let (first, second, live) = (key("svc.etl", "first"), key("svc.etl", "second"), key("svc.etl", "live"));
    store.append(&first, SequenceToken::new(1, 0), &["a", "b"], Append::new()).await.unwrap();
    store.set_state(&first, RunState::Success).await.unwrap();
    store.append(&live, SequenceToken::new(1, 0), &["c"], Append::new()).await.unwrap();
    store.set_state(&live, RunState::Running).await.unwrap();
    let policy = RetentionPolicy { max_total_bytes: 1, ..policy() };
    let cancel = CancellationToken::new();
    let task = Retention::spawn(store.clone(), policy, cancel.clone());

    let gone = |run: RunKey| {
        let store = store.clone();
        async move {
            for _ in 0..1_000 {
                if store.info(&run).await.unwrap().is_none() {
                    return true;
                }
                tokio::task::yield_now().await;
            }
            false
        }
    };
    assert!(gone(first.clone()).await, "the first prune runs at once");
    store.append(&second, SequenceToken::new(1, 0), &["d"], Append::new()).await.unwrap();
    store.set_state(&second, RunState::Stopped).await.unwrap();
    tokio::time::sleep(Duration::from_secs(30)).await;
    assert!(store.info(&second).await.unwrap().is_some(), "not before the interval");
    tokio::time::sleep(Duration::from_secs(31)).await;
    assert!(gone(second).await, "pruned again after the interval");
    assert!(store.info(&live).await.unwrap().is_some());

    cancel.cancel();
    tokio::time::timeout(Duration::from_secs(1), task).await.unwrap().unwrap();
    let text = handle.render();
    assert!(text.contains("tailrace_archive_runs_pruned_total 2"), "{text}");
    assert!(text.contains("tailrace_archive_bytes_pruned_total 6"), "{text}");
}
