//! Orleans scenario 43 (the checkpointer contract), plus the file store.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use tailrace::checkpoint::*;
use tailrace::queue::{CheckpointError, Checkpointer, Fence};
use tailrace::{QueueId, SequenceToken};
use tokio::time::Instant;

fn q() -> QueueId {
    QueueId(3)
}

fn t(n: u64) -> SequenceToken {
    SequenceToken::new(n, 0)
}

fn opts(interval_ms: u64) -> CheckpointOptions {
    CheckpointOptions { persist_interval: Duration::from_millis(interval_ms), ..CheckpointOptions::default() }
}

async fn checkpoint(store: &Arc<MemoryCheckpointer>, options: CheckpointOptions) -> QueueCheckpoint {
    let dyn_store: Arc<dyn Checkpointer> = store.clone();
    QueueCheckpoint::load(dyn_store, q(), options).await.unwrap()
}

#[tokio::test(start_paused = true)]
async fn first_update_persists_then_updates_inside_the_interval_wait_for_flush() {
    let store = Arc::new(MemoryCheckpointer::new());
    let mut cp = checkpoint(&store, opts(1000)).await;
    let start = Instant::now();
    assert!(cp.update(t(1), start).await.unwrap());
    assert!(!cp.update(t(2), start + Duration::from_millis(10)).await.unwrap());
    assert!(!cp.update(t(3), start + Duration::from_millis(999)).await.unwrap());
    assert_eq!(store.get(q()), Some(t(1)));
    cp.flush().await.unwrap();
    // Only the latest of the throttled updates is written.
    assert_eq!(store.get(q()), Some(t(3)));
    assert_eq!(store.writes(q()), 2);
}

#[tokio::test(start_paused = true)]
async fn at_the_interval_boundary_it_persists_on_its_own() {
    let store = Arc::new(MemoryCheckpointer::new());
    let mut cp = checkpoint(&store, opts(1000)).await;
    let start = Instant::now();
    cp.update(t(1), start).await.unwrap();
    assert!(cp.update(t(2), start + Duration::from_millis(1000)).await.unwrap());
    assert_eq!(store.get(q()), Some(t(2)));
}

#[tokio::test(start_paused = true)]
async fn an_equal_checkpoint_is_not_rewritten() {
    let store = Arc::new(MemoryCheckpointer::new());
    let mut cp = checkpoint(&store, opts(0)).await;
    cp.update(t(5), Instant::now()).await.unwrap();
    assert!(!cp.update(t(5), Instant::now()).await.unwrap());
    cp.flush().await.unwrap();
    assert_eq!(store.writes(q()), 1);
}

#[tokio::test(start_paused = true)]
async fn a_regressed_checkpoint_is_ignored_by_default() {
    let store = Arc::new(MemoryCheckpointer::new());
    let mut cp = checkpoint(&store, opts(0)).await;
    cp.update(t(9), Instant::now()).await.unwrap();
    assert!(!cp.update(t(4), Instant::now()).await.unwrap());
    cp.flush().await.unwrap();
    assert_eq!(store.get(q()), Some(t(9)));
    assert_eq!(cp.latest(), Some(t(9)));
}

#[tokio::test(start_paused = true)]
async fn a_regressed_checkpoint_is_persisted_when_the_policy_says_so() {
    let store = Arc::new(MemoryCheckpointer::new());
    let options = CheckpointOptions { regress: RegressPolicy::Persist, ..opts(0) };
    let mut cp = checkpoint(&store, options).await;
    cp.update(t(9), Instant::now()).await.unwrap();
    assert!(cp.update(t(4), Instant::now()).await.unwrap());
    assert_eq!(store.get(q()), Some(t(4)));
}

#[tokio::test(start_paused = true)]
async fn load_resumes_from_what_was_stored() {
    let store = Arc::new(MemoryCheckpointer::new());
    store.save(q(), t(42), Fence::NONE).await.unwrap();
    let cp = checkpoint(&store, opts(0)).await;
    assert_eq!(cp.persisted(), Some(t(42)));
    assert_eq!(cp.latest(), Some(t(42)));
}

/// Fails the first `failures` saves, and can block every save.
struct Flaky {
    inner: MemoryCheckpointer,
    failures: Mutex<u32>,
    hang: AtomicBool,
}

#[async_trait]
impl Checkpointer for Flaky {
    async fn load(&self, queue: QueueId) -> Result<Option<SequenceToken>, CheckpointError> {
        self.inner.load(queue).await
    }

    async fn save(&self, queue: QueueId, token: SequenceToken, fence: Fence) -> Result<(), CheckpointError> {
        if self.hang.load(Ordering::SeqCst) {
            std::future::pending::<()>().await;
        }
        {
            let mut failures = self.failures.lock().unwrap();
            if *failures > 0 {
                *failures -= 1;
                return Err(CheckpointError::Backend("injected write failure".into()));
            }
        }
        self.inner.save(queue, token, fence).await
    }
}

#[tokio::test(start_paused = true)]
async fn flush_retries_a_failed_write() {
    let flaky =
        Arc::new(Flaky { inner: MemoryCheckpointer::new(), failures: Mutex::new(2), hang: AtomicBool::new(false) });
    let mut cp = QueueCheckpoint::load(flaky.clone(), q(), opts(60_000)).await.unwrap();
    let err = cp.update(t(7), Instant::now()).await.unwrap_err();
    assert!(err.to_string().contains("injected write failure"));
    cp.flush().await.unwrap();
    assert_eq!(flaky.inner.get(q()), Some(t(7)));
}

#[tokio::test(start_paused = true)]
async fn flush_gives_up_after_its_attempts_with_the_cause() {
    let flaky =
        Arc::new(Flaky { inner: MemoryCheckpointer::new(), failures: Mutex::new(10), hang: AtomicBool::new(false) });
    let mut cp = QueueCheckpoint::load(flaky.clone(), q(), opts(60_000)).await.unwrap();
    let _ = cp.update(t(7), Instant::now()).await;
    let err = cp.flush().await.unwrap_err();
    assert!(err.to_string().contains("injected write failure"));
    assert_eq!(flaky.inner.get(q()), None);
}

#[tokio::test(start_paused = true)]
async fn flush_is_cancellable() {
    let flaky =
        Arc::new(Flaky { inner: MemoryCheckpointer::new(), failures: Mutex::new(0), hang: AtomicBool::new(false) });
    let mut cp = QueueCheckpoint::load(flaky.clone(), q(), opts(60_000)).await.unwrap();
    cp.update(t(1), Instant::now()).await.unwrap();
    flaky.hang.store(true, Ordering::SeqCst);
    cp.update(t(2), Instant::now()).await.unwrap();
    let outcome = tokio::time::timeout(Duration::from_secs(1), cp.flush()).await;
    assert!(outcome.is_err(), "a hanging store must not hang the caller past its timeout");
    assert_eq!(cp.persisted(), Some(t(1)));
    assert_eq!(cp.latest(), Some(t(2)), "the newest progress is kept for the next flush");
}

#[tokio::test]
async fn file_checkpoints_survive_a_restart_and_are_replaced_atomically() {
    let dir = tempfile::tempdir().unwrap();
    let store = FileCheckpointer::new(dir.path()).unwrap();
    assert_eq!(store.load(q()).await.unwrap(), None);
    store.save(q(), t(10), Fence::NONE).await.unwrap();
    store.save(q(), SequenceToken::new(11, u64::MAX), Fence::NONE).await.unwrap();
    let reopened = FileCheckpointer::new(dir.path()).unwrap();
    assert_eq!(reopened.load(q()).await.unwrap(), Some(SequenceToken::new(11, u64::MAX)));
    assert!(!dir.path().join("checkpoint-q3.json.tmp").exists());
    let text = std::fs::read_to_string(dir.path().join("checkpoint-q3.json")).unwrap();
    assert_eq!(text, r#"{"version":"1","queue":3,"token":"11-18446744073709551615"}"#);
}

#[tokio::test]
async fn a_complete_leftover_temp_file_wins_and_a_torn_one_is_ignored() {
    let dir = tempfile::tempdir().unwrap();
    let store = FileCheckpointer::new(dir.path()).unwrap();
    store.save(q(), t(10), Fence::NONE).await.unwrap();
    let temp = dir.path().join("checkpoint-q3.json.tmp");
    std::fs::write(&temp, r#"{"version":"1","queue":3,"token":"12-0"}"#).unwrap();
    assert_eq!(store.load(q()).await.unwrap(), Some(t(12)));
    std::fs::write(&temp, r#"{"version":"1","queue":3,"tok"#).unwrap();
    assert_eq!(store.load(q()).await.unwrap(), Some(t(10)));
}

#[tokio::test]
async fn a_corrupt_or_foreign_checkpoint_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let store = FileCheckpointer::new(dir.path()).unwrap();
    std::fs::write(dir.path().join("checkpoint-q3.json"), "garbage").unwrap();
    let err = store.load(q()).await.unwrap_err().to_string();
    assert!(err.contains("checkpoint-q3.json is corrupt"), "{err}");
    std::fs::write(dir.path().join("checkpoint-q3.json"), r#"{"version":"1","queue":4,"token":"1-0"}"#).unwrap();
    let err = store.load(q()).await.unwrap_err().to_string();
    assert!(err.contains("belongs to queue q4"), "{err}");
}
