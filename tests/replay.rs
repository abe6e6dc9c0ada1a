//! Replay beyond the cache (Orleans #756): a subscription from a token far
//! older than anything the agent caches reads its history from the queue,
//! then goes on with live delivery, with no gap and no duplicate at the
//! switch, while producers keep writing. A token the queue no longer holds
//! is refused with an error naming the oldest position it still holds,
//! from which a subscription is served. On the memory and file adapters
//! here (the Redis and Kafka adapters have the same tests in their files):
//! 100 000 events back, and 1 000 random trials in a property test.
//!
//! `TAILRACE_REPLAY_CASES=N` runs N trials per adapter instead of
//! [`TRIALS`] (`TAILRACE_REPLAY_CASES=1000` for a longer search).
//! The trials and checks are `common/replay.rs`'s.

use tailrace_testkit as common;

use std::sync::Arc;
use std::time::Duration;

use common::replay::{cases, hundred_thousand_back, node, numbered, past_retention, trial_life};
use tailrace::StreamId;
use tailrace::adapters::file::{FileAdapterFactory, FileOptions};
use tailrace::adapters::memory::{MemoryAdapterFactory, MemoryOptions};
use tailrace::handoff::FsyncPolicy;
use tailrace::queue::QueueAdapterFactory;

/// How long an empty read waits: the defaults (100 ms, and files sealed
/// every 50 ms), or short ones for the random trials, each of which waits
/// out one empty read at its start (a subscription that arrives while the
/// agent's read waits on a quiet queue is placed when the read answers).
/// Random trials per adapter: 300 keep a CI run within its time (the file
/// adapter's take about a minute on two cores with the rest running).
const TRIALS: u32 = 300;

#[derive(Clone, Copy)]
enum Waits {
    Defaults,
    Short,
}

fn memory_factory(history: usize, waits: Waits) -> Arc<dyn QueueAdapterFactory> {
    let mut options = MemoryOptions { history, ..MemoryOptions::default() };
    if let Waits::Short = waits {
        options.read_wait = Duration::from_millis(5);
    }
    Arc::new(MemoryAdapterFactory::new(1, options))
}

/// A file queue that keeps its consumed files (its history).
fn file_factory(dir: &std::path::Path, waits: Waits) -> Arc<dyn QueueAdapterFactory> {
    let mut options = FileOptions { dir: dir.to_path_buf(), delete_consumed: false, ..FileOptions::default() };
    options.writer.fsync = FsyncPolicy::Never;
    options.writer.max_file_bytes = 256 * 1024;
    if let Waits::Short = waits {
        options.read_wait = Duration::from_millis(5);
        options.writer.max_file_age = Some(Duration::from_millis(5));
    }
    Arc::new(FileAdapterFactory::new(1, options).unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_replays_100_000_events_back_then_goes_live_exactly() {
    hundred_thousand_back(memory_factory(500_000, Waits::Defaults)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn file_replays_100_000_events_back_then_goes_live_exactly() {
    let dir = tempfile::tempdir().unwrap();
    hundred_thousand_back(file_factory(dir.path(), Waits::Defaults)).await;
}

#[test]
fn memory_replays_exactly_in_random_trials() {
    trial_life(cases(TRIALS), async || memory_factory(100_000, Waits::Short));
}

#[test]
fn file_replays_exactly_in_random_trials() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_path_buf();
    trial_life(cases(TRIALS), async || {
        let trial_dir = tempfile::tempdir_in(&path).unwrap().keep();
        file_factory(&trial_dir, Waits::Short)
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_refuses_a_start_past_its_history_naming_the_oldest_it_holds() {
    let node = node(memory_factory(100, Waits::Defaults)).await;
    let stream = StreamId::new("replay", "retention");
    let mut tokens = Vec::new();
    for i in 0..300 {
        tokens.push(node.node.produce(&stream, numbered(&stream, i..i + 1)).await.unwrap());
    }
    node.wait_status(0, |s| s.acked >= 300).await;
    past_retention(node, stream, tokens[0], 300).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn file_refuses_a_start_in_a_removed_file_naming_the_oldest_it_holds() {
    let dir = tempfile::tempdir().unwrap();
    let mut options = FileOptions { dir: dir.path().to_path_buf(), delete_consumed: false, ..FileOptions::default() };
    options.writer.max_file_bytes = 4 * 1024;
    let node = node(Arc::new(FileAdapterFactory::new(1, options).unwrap())).await;
    let stream = StreamId::new("replay", "retention");
    let mut tokens = Vec::new();
    for i in 0..300 {
        tokens.push(node.node.produce(&stream, numbered(&stream, i..i + 1)).await.unwrap());
    }
    node.wait_status(0, |s| s.acked >= 300).await;
    // The oldest half of the files goes, as retention removes history.
    let queue_dir = dir.path().join("q0");
    let files = tailrace::handoff::list_prefix_files(&queue_dir, "events").unwrap();
    assert!(files.len() > 4, "small files: {}", files.len());
    for file in &files[..files.len() / 2] {
        std::fs::remove_file(&file.path).unwrap();
    }
    past_retention(node, stream, tokens[0], 300).await;
}
