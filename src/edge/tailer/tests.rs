//! The snapshot read without the lock answers every viewer exactly what the
//! window read under the lock answers, through a life of chunks pushed, the
//! window overflowing, and the end.

use std::sync::Arc;

use bytes::Bytes;
use proptest::prelude::*;

use super::{Phase, Pull, Tailer};
use crate::archive::RunKey;
use crate::config::LogStreamSettings;
use crate::edge::frames::EndReason;
use crate::stream::{BatchContainer, Event, EventId, SequenceToken, StreamId};

fn same(a: &Pull, b: &Pull) -> bool {
    match (a, b) {
        (Pull::Frame(x, n), Pull::Frame(y, m)) => x == y && n == m,
        (Pull::Behind { until: x }, Pull::Behind { until: y }) => x == y,
        (Pull::Wait, Pull::Wait) => true,
        (Pull::End(x), Pull::End(y)) => x == y,
        _ => false,
    }
}

fn describe(pull: &Pull) -> String {
    match pull {
        Pull::Frame(frame, next) => format!("Frame({:?}, {next})", String::from_utf8_lossy(frame)),
        Pull::Behind { until } => format!("Behind({until})"),
        Pull::Wait => "Wait".into(),
        Pull::End(frame) => format!("End({:?})", frame.as_ref().map(|f| String::from_utf8_lossy(f).into_owned())),
    }
}

/// Every viewer position around the window, from a replay boundary at 0, in
/// the middle and at the head.
fn check_every_viewer(tailer: &Tailer) -> Result<u64, TestCaseError> {
    let head = tailer.head();
    let mut checked = 0;
    for replay_until in [0, head / 2, head] {
        for at in 0..=head + 1 {
            let (fast, slow) = (tailer.pull(at, replay_until), tailer.pull_from_window(at, replay_until));
            prop_assert!(
                same(&fast, &slow),
                "at {} (replay until {}): snapshot {} but window {}",
                at,
                replay_until,
                describe(&fast),
                describe(&slow)
            );
            checked += 1;
        }
    }
    Ok(checked)
}

fn batch(token: u64, lines: usize) -> Arc<BatchContainer> {
    let events = (0..lines)
        .map(|i| Event {
            id: EventId::new(format!("{token}-{i}")),
            timestamp_ms: 0,
            payload: Bytes::from(format!("line {i} of batch {token}")),
        })
        .collect();
    Arc::new(BatchContainer { stream: StreamId::new("logs", "run"), token: SequenceToken::new(token, 0), events })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn the_snapshot_answers_what_the_locked_window_answers(
        batches in prop::collection::vec(1usize..6, 1..24),
        window_bytes in 40usize..600,
        failed in any::<bool>(),
    ) {
        let key = RunKey::new("sample.etl_daily", "run-1").map_err(|e| TestCaseError::fail(e.to_string()))?;
        let settings = LogStreamSettings { max_replay_bytes: window_bytes, ..LogStreamSettings::default() };
        let tailer = Tailer::new(key, Arc::new(settings));
        // Before it is live, a viewer reads nothing from an empty snapshot.
        check_every_viewer(&tailer)?;
        {
            let mut state = tailer.state.lock();
            state.phase = Phase::Live;
            tailer.publish_snapshot(&state);
        }
        let mut checked = check_every_viewer(&tailer)?;
        for (n, lines) in batches.iter().enumerate() {
            tailer.publish(&[batch(n as u64 + 1, *lines)]).map_err(|e| TestCaseError::fail(e.to_string()))?;
            checked += check_every_viewer(&tailer)?;
        }
        let pushed: usize = batches.iter().sum();
        prop_assert_eq!(tailer.head(), pushed as u64);
        if failed {
            tailer.fail("the store is gone");
        } else {
            tailer.complete(EndReason::RunFinished);
        }
        checked += check_every_viewer(&tailer)?;
        // At the head of an ended tailer the viewer gets the terminal frame.
        prop_assert!(matches!(tailer.pull(pushed as u64, 0), Pull::End(Some(_))));
        prop_assert!(checked > batches.len() as u64);
    }
}

/// A delivery after a gap (containers the subscription skipped, which the
/// store holds) re-bases the tailer on the store: the viewer at the old
/// head reads the skipped lines from the store at their own offsets, and
/// what follows lands where the store puts it. Without the re-base the
/// next container would be numbered right after the old head.
#[tokio::test]
async fn a_delivery_after_a_gap_rebases_the_tailer_on_the_store() {
    use super::consumer::TailerConsumer;
    use crate::archive::{Append, Archiver, FileRunLogStore, RunLogStore};
    use crate::node::SubscriptionHandle;
    use crate::pubsub::{Delivery, StartPosition, StreamConsumer, SubscriptionId};

    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(FileRunLogStore::open(dir.path(), false).unwrap());
    let key = RunKey::new("svc.etl", "run").unwrap();
    let stored = |token: u64, lines: usize| {
        let (store, key) = (store.clone(), key.clone());
        async move {
            let texts: Vec<String> = (0..lines).map(|i| format!("line {i} of batch {token}")).collect();
            let lines: Vec<&str> = texts.iter().map(String::as_str).collect();
            store.append(&key, SequenceToken::new(token, 0), &lines, Append::new()).await.unwrap();
        }
    };
    stored(1, 10).await;
    let tailer = Tailer::new(key.clone(), Arc::new(LogStreamSettings::default()));
    let handle =
        SubscriptionHandle { id: SubscriptionId(1), stream: key.stream(), start: StartPosition::EarliestAvailable };
    assert!(tailer.go_live(handle, 10, Some(SequenceToken::new(1, 0)), Vec::new()));
    let consumer = TailerConsumer { tailer: Arc::downgrade(&tailer), store: Archiver::new(store.clone()).reader() };
    let deliver = |token: u64, lines: usize, gap: bool| {
        let delivery = Delivery::new(SubscriptionId(1), key.stream(), vec![batch(token, lines)]);
        if gap { delivery.after_gap("a catch-up the queue could no longer serve") } else { delivery }
    };

    stored(2, 5).await;
    consumer.deliver(&deliver(2, 5, false)).await.unwrap();
    assert_eq!(tailer.head(), 15);
    // Batches 3 and 4 reach the store but not this tailer; 5 comes after the gap.
    for (token, lines) in [(3, 4), (4, 6), (5, 3)] {
        stored(token, lines).await;
    }
    consumer.deliver(&deliver(5, 3, true)).await.unwrap();
    assert_eq!(tailer.head(), 28, "the head is the store's end");
    assert_eq!(tailer.pull(15, 15), Pull::Behind { until: 28 }, "the skipped lines come from the store");
    consumer.deliver(&deliver(6, 2, false)).await.unwrap();
    let Pull::Frame(frame, next) = tailer.pull(28, 15) else { panic!("the next chunk follows the store's end") };
    assert_eq!(next, 30);
    assert!(String::from_utf8_lossy(&frame).contains("line 0 of batch 6"));
}

/// After a gap, a delivery whose first container the store does not hold
/// yet fails (its agent retries it) and changes nothing.
#[tokio::test(start_paused = true)]
async fn a_delivery_after_a_gap_waits_for_the_store() {
    use super::consumer::TailerConsumer;
    use crate::archive::{Archiver, FileRunLogStore};
    use crate::node::SubscriptionHandle;
    use crate::pubsub::{ConsumerError, Delivery, StartPosition, StreamConsumer, SubscriptionId};

    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(FileRunLogStore::open(dir.path(), false).unwrap());
    let key = RunKey::new("svc.etl", "run").unwrap();
    let tailer = Tailer::new(key.clone(), Arc::new(LogStreamSettings::default()));
    let handle =
        SubscriptionHandle { id: SubscriptionId(1), stream: key.stream(), start: StartPosition::EarliestAvailable };
    assert!(tailer.go_live(handle, 0, None, Vec::new()));
    let consumer = TailerConsumer { tailer: Arc::downgrade(&tailer), store: Archiver::new(store).reader() };
    let delivery = Delivery::new(SubscriptionId(1), key.stream(), vec![batch(7, 3)]).after_gap("a batch was given up");
    let refused = consumer.deliver(&delivery).await;
    assert!(matches!(refused, Err(ConsumerError::Failed(_))), "{refused:?}");
    assert_eq!(tailer.head(), 0, "nothing published before the store caught up");
}
