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
