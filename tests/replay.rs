//! Replay beyond the cache (Orleans #756): a subscription from a token far
//! older than anything the agent caches reads its history from the queue,
//! then goes on with live delivery, with no gap and no duplicate at the
//! switch, while producers keep writing. A token the queue no longer holds
//! is refused with an error naming the oldest position it still holds,
//! from which a subscription is served. On the memory and file adapters
//! here (the Redis and Kafka adapters have the same tests in their files):
//! 100 000 events back, and 1 000 random trials in a property test.
//!
//! `TAILRACE_REPLAY_CASES=N` runs N trials per adapter instead of 1 000.

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use common::{TestNode, quick_config};
use proptest::prelude::*;
use tailrace::adapters::file::{FileAdapterFactory, FileOptions};
use tailrace::adapters::memory::{MemoryAdapterFactory, MemoryOptions};
use tailrace::handoff::FsyncPolicy;
use tailrace::pubsub::{
    ConsumerError, Delivery, DeliveryOutcome, ImplicitSubscriptions, StartPosition, StreamConsumer, SubscriptionInfo,
};
use tailrace::queue::QueueAdapterFactory;
use tailrace::stream::{Event, EventId, StreamId};

const WAIT: Duration = Duration::from_secs(60);

/// What one subscription received: event ids in order, and any gap.
#[derive(Clone, Default)]
struct Tape {
    seen: Arc<Mutex<(Vec<String>, Vec<String>)>>,
}

impl Tape {
    fn ids(&self) -> Vec<String> {
        self.seen.lock().unwrap().0.clone()
    }

    fn len(&self) -> usize {
        self.seen.lock().unwrap().0.len()
    }

    fn gaps(&self) -> Vec<String> {
        self.seen.lock().unwrap().1.clone()
    }
}

#[async_trait]
impl StreamConsumer for Tape {
    async fn deliver(&self, delivery: &Delivery) -> Result<DeliveryOutcome, ConsumerError> {
        let mut seen = self.seen.lock().unwrap();
        if let Some(gap) = &delivery.gap {
            seen.1.push(gap.clone());
        }
        for batch in &delivery.batches {
            seen.0.extend(batch.events.iter().map(|e| e.id.to_string()));
        }
        Ok(DeliveryOutcome::Continue)
    }

    async fn handshake(&self, _info: &SubscriptionInfo) -> Result<Option<StartPosition>, ConsumerError> {
        Ok(None)
    }
}

/// Events `{stream key}-{i}` for `range`.
fn numbered(stream: &StreamId, range: std::ops::Range<u64>) -> Vec<Event> {
    range.map(|i| Event::new(EventId::new(format!("{}-{i}", stream.key())), format!("line {i}"))).collect()
}

/// One replay: `before` events of a new stream in containers of `per`
/// events, all read and acknowledged by the agent (so no cache holds
/// them); then a subscription from container `from` (`At` its token, or
/// `After` it) while `live` more events are written; it must get exactly
/// the events from there on, in order, once, with no gap.
#[derive(Clone, Debug)]
struct Trial {
    before: u64,
    per: u64,
    from: usize,
    after: bool,
    live: u64,
}

/// Runs `trial` on a fresh stream `key` of `node`; `produced` counts the
/// containers its queue was given so far (one queue).
async fn run(node: &TestNode, key: &str, trial: &Trial, produced: &mut u64) -> Result<(), String> {
    let stream = StreamId::new("replay", key);
    let mut tokens = Vec::new();
    let mut first_of = Vec::new();
    let mut next = 0;
    while next < trial.before {
        let end = (next + trial.per).min(trial.before);
        tokens.push(node.node.produce(&stream, numbered(&stream, next..end)).await.map_err(|e| e.to_string())?);
        first_of.push(next);
        next = end;
    }
    *produced += tokens.len() as u64;
    let queue = node.node.mapper().queue_for(&stream).0;
    let want_acked = *produced;
    let agent = node.agent(queue).await;
    let acked = async || ractor::call!(agent, tailrace::agent::AgentMsg::GetStatus).map(|s| s.acked).unwrap_or(0);
    let deadline = tokio::time::Instant::now() + WAIT;
    while acked().await < want_acked {
        if tokio::time::Instant::now() >= deadline {
            return Err(format!("{trial:?}: the agent never acknowledged the {want_acked} containers written"));
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let from = trial.from.min(tokens.len().saturating_sub(1));
    let (start, first) = match (tokens.get(from), trial.after) {
        (Some(token), false) => (StartPosition::At(*token), first_of[from]),
        (Some(token), true) => (StartPosition::After(*token), first_of.get(from + 1).copied().unwrap_or(trial.before)),
        (None, _) => (StartPosition::EarliestAvailable, 0),
    };
    // Producers keep writing while the subscription catches up.
    let writer = async {
        for i in trial.before..trial.before + trial.live {
            node.node.produce(&stream, numbered(&stream, i..i + 1)).await.map_err(|e| e.to_string())?;
            if i % 7 == 0 {
                tokio::task::yield_now().await;
            }
        }
        Ok::<u64, String>(trial.live)
    };
    let tape = Tape::default();
    let subscribe = node.node.subscribe(&stream, Arc::new(tape.clone()), start);
    let (sent, handle) = tokio::join!(writer, subscribe);
    let (sent, handle) = (sent?, handle.map_err(|e| e.to_string())?);
    *produced += sent;
    let expected: Vec<String> =
        numbered(&stream, first..trial.before + trial.live).into_iter().map(|e| e.id.to_string()).collect();
    let deadline = tokio::time::Instant::now() + WAIT;
    while tape.len() < expected.len() && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let done = tape.len() >= expected.len();
    node.node.unsubscribe(&handle).await.map_err(|e| e.to_string())?;
    let got = tape.ids();
    if !done || got != expected {
        let at = got.iter().zip(&expected).position(|(a, b)| a != b).unwrap_or(got.len().min(expected.len()));
        return Err(format!(
            "{trial:?} from {start:?}: got {} events, expected {}; first difference at {at}: got {:?}, expected {:?}",
            got.len(),
            expected.len(),
            got.get(at),
            expected.get(at)
        ));
    }
    if !tape.gaps().is_empty() {
        return Err(format!("{trial:?}: deliveries flagged gaps: {:?}", tape.gaps()));
    }
    Ok(())
}

/// How long an empty read waits: the defaults (100 ms, and files sealed
/// every 50 ms), or short ones for the thousand trials, each of which waits
/// out one empty read at its start (a subscription that arrives while the
/// agent's read waits on a quiet queue is placed when the read answers).
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

async fn node(factory: Arc<dyn QueueAdapterFactory>) -> TestNode {
    let mut config = quick_config();
    config.queues.count = 1;
    // A small cache: every trial's history is far beyond it.
    config.cache.cache_size = 64;
    config.cache.buckets = 4;
    TestNode::start(factory, config, ImplicitSubscriptions::new()).await
}

/// 100 000 events back, then 20 000 written during the catch-up.
async fn hundred_thousand_back(factory: Arc<dyn QueueAdapterFactory>) {
    let node = node(factory).await;
    let trial = Trial { before: 100_000, per: 4, from: 0, after: false, live: 20_000 };
    run(&node, "far", &trial, &mut 0).await.unwrap();
    // And from the middle, after a token.
    let mut produced = 25_000 + 20_000;
    let trial = Trial { before: 40_000, per: 1, from: 12_345, after: true, live: 5_000 };
    run(&node, "middle", &trial, &mut produced).await.unwrap();
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

fn cases() -> u32 {
    std::env::var("TAILRACE_REPLAY_CASES").ok().and_then(|n| n.parse().ok()).unwrap_or(1_000)
}

fn trials(cases: u32) -> impl Strategy<Value = Vec<Trial>> {
    let trial = (1u64..120, 1u64..4, 0usize..120, any::<bool>(), 0u64..40)
        .prop_map(|(before, per, from, after, live)| Trial { before, per, from, after, live });
    proptest::collection::vec(trial, cases as usize..=cases as usize)
}

/// Every trial on one node, each on its own stream of the one queue (the
/// others' events are the queue's other traffic).
fn trial_life(factory: impl Fn() -> Arc<dyn QueueAdapterFactory>) {
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig { cases: 1, ..ProptestConfig::default() });
    let result = runner.run(&trials(cases()), |trials| {
        let outcome: Result<(), String> = runtime.block_on(async {
            let node = node(factory()).await;
            let mut produced = 0;
            for (n, trial) in trials.iter().enumerate() {
                run(&node, &format!("t{n}"), trial, &mut produced).await.map_err(|e| format!("trial {n}: {e}"))?;
            }
            Ok(())
        });
        outcome.map_err(TestCaseError::fail)
    });
    result.unwrap();
}

#[test]
fn memory_replays_exactly_in_a_thousand_random_trials() {
    trial_life(|| memory_factory(100_000, Waits::Short));
}

#[test]
fn file_replays_exactly_in_a_thousand_random_trials() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_path_buf();
    trial_life(move || {
        let trial_dir = tempfile::tempdir_in(&path).unwrap().keep();
        file_factory(&trial_dir, Waits::Short)
    });
}

/// A start older than what the queue holds is refused, naming the oldest
/// position it still holds; a subscription from there gets everything
/// from there on, exactly.
async fn past_retention(node: TestNode, stream: StreamId, old: tailrace::stream::SequenceToken, written: u64) {
    let refused = node.node.subscribe(&stream, Arc::new(Tape::default()), StartPosition::At(old)).await.unwrap_err();
    let oldest = refused.oldest_held().unwrap_or_else(|| panic!("the refusal names no oldest position: {refused}"));
    assert!(oldest > old, "{refused}");
    let text = refused.to_string();
    assert!(text.contains(&format!("the oldest position it holds is {oldest}")), "{text}");
    assert!(node.node.subscriptions(&stream).await.unwrap().is_empty(), "a refused subscribe leaves nothing behind");
    let tape = Tape::default();
    node.node.subscribe(&stream, Arc::new(tape.clone()), StartPosition::At(oldest)).await.unwrap();
    node.node.produce(&stream, numbered(&stream, written..written + 10)).await.unwrap();
    assert!(common::eventually(WAIT, || tape.ids().last() == Some(&format!("{}-{}", stream.key(), written + 9))).await);
    let got = tape.ids();
    let first: u64 = got[0].rsplit('-').next().unwrap().parse().unwrap();
    assert!(first > 0, "the start past retention was not served from later data: {got:?}");
    let want: Vec<String> = (first..written + 10).map(|i| format!("{}-{i}", stream.key())).collect();
    assert_eq!(got, want, "from the oldest held position on, every event once, in order");
    assert!(tape.gaps().is_empty(), "{:?}", tape.gaps());
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
