//! Replay beyond the cache, the same on every adapter that keeps history:
//! a subscription from a token far older than the agent's cache reads the
//! queue from there, then goes on live with no gap and no duplicate at the
//! switch, while producers keep writing; a token the queue no longer holds
//! is refused, naming the oldest position it still holds.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use proptest::prelude::*;
use tailrace::pubsub::{
    ConsumerError, Delivery, DeliveryOutcome, ImplicitSubscriptions, StartPosition, StreamConsumer, SubscriptionInfo,
};
use tailrace::queue::QueueAdapterFactory;
use tailrace::{Event, EventId, QueueId, StreamId};

use super::{TestNode, quick_config};

const WAIT: Duration = Duration::from_secs(60);

/// What one subscription received: event ids in order, and any gap.
#[derive(Clone, Default)]
pub struct Tape {
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
pub fn numbered(stream: &StreamId, range: std::ops::Range<u64>) -> Vec<Event> {
    range.map(|i| Event::new(EventId::new(format!("{}-{i}", stream.key())), format!("line {i}"))).collect()
}

/// One replay: `before` events of a new stream in containers of `per`
/// events, all read and acknowledged by the agent (so no cache holds
/// them); then a subscription from container `from` (`At` its token, or
/// `After` it) while `live` more events are written; it must get exactly
/// the events from there on, in order, once, with no gap.
#[derive(Clone, Debug)]
pub struct Trial {
    pub before: u64,
    pub per: u64,
    pub from: usize,
    pub after: bool,
    pub live: u64,
}

/// Runs `trial` on a fresh stream `key` of `node`; `produced` counts the
/// containers its queue was given so far (one queue).
pub async fn run(node: &TestNode, key: &str, trial: &Trial, produced: &mut u64) -> Result<(), String> {
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
    node.agent(queue).await;
    let acked = async || node.node.agent_status(QueueId(queue)).await.map_or(0, |s| s.acked);
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

pub async fn node(factory: Arc<dyn QueueAdapterFactory>) -> TestNode {
    let mut config = quick_config();
    config.queues.count = 1;
    // A small cache: every trial's history is far beyond it.
    config.cache.cache_size = 64;
    config.cache.buckets = 4;
    TestNode::start(factory, config, ImplicitSubscriptions::new()).await
}

/// 100 000 events back, then 20 000 written during the catch-up.
pub async fn hundred_thousand_back(factory: Arc<dyn QueueAdapterFactory>) {
    let node = node(factory).await;
    let trial = Trial { before: 100_000, per: 4, from: 0, after: false, live: 20_000 };
    run(&node, "far", &trial, &mut 0).await.unwrap();
    // And from the middle, after a token.
    let mut produced = 25_000 + 20_000;
    let trial = Trial { before: 40_000, per: 1, from: 12_345, after: true, live: 5_000 };
    run(&node, "middle", &trial, &mut produced).await.unwrap();
}

/// `TAILRACE_REPLAY_CASES`, or `default`.
pub fn cases(default: u32) -> u32 {
    std::env::var("TAILRACE_REPLAY_CASES").ok().and_then(|n| n.parse().ok()).unwrap_or(default)
}

fn trials(cases: u32) -> impl Strategy<Value = Vec<Trial>> {
    let trial = (1u64..120, 1u64..4, 0usize..120, any::<bool>(), 0u64..40)
        .prop_map(|(before, per, from, after, live)| Trial { before, per, from, after, live });
    proptest::collection::vec(trial, cases as usize..=cases as usize)
}

/// `cases` random trials on one node of one queue on the factory `open`
/// makes, each on its own stream (the others' events are the queue's other
/// traffic).
pub fn trial_life<F, Fut>(cases: u32, open: F)
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Arc<dyn QueueAdapterFactory>>,
{
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig { cases: 1, ..ProptestConfig::default() });
    let result = runner.run(&trials(cases), |trials| {
        let outcome: Result<(), String> = runtime.block_on(async {
            let node = node(open().await).await;
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

/// A start older than what the queue holds is refused, naming the oldest
/// position it still holds; a subscription from there gets everything
/// from there on, exactly.
pub async fn past_retention(node: TestNode, stream: StreamId, old: tailrace::SequenceToken, written: u64) {
    let refused = node.node.subscribe(&stream, Arc::new(Tape::default()), StartPosition::At(old)).await.unwrap_err();
    let oldest = refused.oldest_held().unwrap_or_else(|| panic!("the refusal names no oldest position: {refused}"));
    assert!(oldest > old, "{refused}");
    let text = refused.to_string();
    assert!(text.contains(&format!("the oldest position it holds is {oldest}")), "{text}");
    assert!(node.node.subscriptions(&stream).await.unwrap().is_empty(), "a refused subscribe leaves nothing behind");
    let tape = Tape::default();
    node.node.subscribe(&stream, Arc::new(tape.clone()), StartPosition::At(oldest)).await.unwrap();
    node.node.produce(&stream, numbered(&stream, written..written + 10)).await.unwrap();
    assert!(super::eventually(WAIT, || tape.ids().last() == Some(&format!("{}-{}", stream.key(), written + 9))).await);
    let got = tape.ids();
    let first: u64 = got[0].rsplit('-').next().unwrap().parse().unwrap();
    assert!(first > 0, "the start past retention was not served from later data: {got:?}");
    let want: Vec<String> = (first..written + 10).map(|i| format!("{}-{i}", stream.key())).collect();
    assert_eq!(got, want, "from the oldest held position on, every event once, in order");
    assert!(tape.gaps().is_empty(), "{:?}", tape.gaps());
}
