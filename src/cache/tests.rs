//! The cache's invariants: bounded, pressure-bucketed, purge never removes
//! what a cursor needs, failed items are not acked, cursors wait and wake.

use std::sync::Arc;

use super::*;
use crate::queue::CacheOptions;
use crate::stream::{BatchContainer, Event, EventId, SequenceToken, StreamId};

fn s(name: &str) -> StreamId {
    StreamId::new("test", name)
}

fn batch(stream: &StreamId, n: u64) -> Arc<BatchContainer> {
    Arc::new(BatchContainer {
        stream: stream.clone(),
        token: SequenceToken::new(n, 0),
        events: vec![Event::new(EventId::from_u64(n), "x")],
    })
}

fn tokens(batches: &[Arc<BatchContainer>]) -> Vec<u64> {
    batches.iter().map(|b| b.token.major).collect()
}

fn small(size: usize) -> QueueCache {
    QueueCache::new(CacheOptions { cache_size: size, buckets: 10 })
}

#[test]
fn cursors_see_only_their_stream_in_order_across_interleaving() {
    let (a, b) = (s("a"), s("b"));
    let mut cache = small(100);
    let ca = cache.create_cursor(&a, CursorStart::Earliest).unwrap();
    let cb = cache.create_cursor(&b, CursorStart::Earliest).unwrap();
    let added = cache.add((1..=10).map(|n| batch(if n % 2 == 0 { &a } else { &b }, n)).collect()).unwrap();
    assert_eq!(added.ready.len(), 2);
    assert_eq!(tokens(&cache.next_batch(ca, 3).unwrap()), vec![2, 4, 6]);
    assert!(cache.next_batch(ca, 3).is_none(), "one batch in flight at a time");
    assert!(cache.complete(ca, false));
    assert_eq!(tokens(&cache.next_batch(ca, 10).unwrap()), vec![8, 10]);
    assert!(!cache.complete(ca, false), "caught up");
    assert_eq!(tokens(&cache.next_batch(cb, 10).unwrap()), vec![1, 3, 5, 7, 9]);
}

#[test]
fn pressure_after_ten_buckets_and_reads_are_one_bucket() {
    let mut cache = small(100);
    assert_eq!(cache.max_add_count(), 10);
    let a = s("a");
    let _pin = cache.create_cursor(&a, CursorStart::Earliest).unwrap();
    for round in 0..10u64 {
        assert!(!cache.is_under_pressure(), "round {round}");
        cache.add((1..=10).map(|i| batch(&a, round * 10 + i)).collect()).unwrap();
    }
    assert!(cache.is_under_pressure());
    assert_eq!(cache.bucket_count(), 10);
    let err = cache.add(vec![batch(&a, 1000)]).unwrap_err();
    assert!(err.to_string().contains("cache full"), "{err}");
    assert_eq!(cache.len(), 100, "nothing dropped, nothing grew");
}

#[test]
fn purge_never_removes_what_a_cursor_needs() {
    let (a, b) = (s("a"), s("b"));
    let mut cache = small(100);
    let slow = cache.create_cursor(&a, CursorStart::Earliest).unwrap();
    cache.add(vec![batch(&a, 1)]).unwrap();
    cache.add((2..=30).map(|n| batch(&b, n)).collect()).unwrap();
    let purged = cache.purge();
    assert!(purged.is_empty(), "the slow cursor pins the oldest bucket");
    assert_eq!(cache.len(), 30);
    assert_eq!(tokens(&cache.next_batch(slow, 1).unwrap()), vec![1]);
    assert!(cache.purge().is_empty(), "in flight is still needed");
    cache.complete(slow, false);
    let purged = cache.purge();
    assert_eq!(purged.acked.len(), 30, "nobody needs anything now");
    assert!(cache.is_empty());
}

#[test]
fn purge_drains_whole_buckets_from_the_oldest_end_only() {
    let (a, b) = (s("a"), s("b"));
    let mut cache = small(100);
    cache.add((1..=10).map(|n| batch(&b, n)).collect()).unwrap();
    cache.add(vec![batch(&a, 11)]).unwrap();
    let cursor = cache.create_cursor(&a, CursorStart::Earliest).unwrap();
    cache.add((12..=20).map(|n| batch(&b, n)).collect()).unwrap();
    let purged = cache.purge();
    assert_eq!(purged.acked, (1..=10).map(|n| SequenceToken::new(n, 0)).collect::<Vec<_>>());
    assert_eq!(cache.len(), 10, "the bucket holding the cursor stays whole");
    assert_eq!(cache.progress(), Some(SequenceToken::new(10, 0)));
    assert_eq!(cache.cursor_position(cursor), Some(CursorPosition::Next(SequenceToken::new(11, 0))));
}

#[test]
fn failed_items_are_purged_but_not_acked() {
    let a = s("a");
    let mut cache = small(100);
    let c = cache.create_cursor(&a, CursorStart::Earliest).unwrap();
    cache.add((1..=3).map(|n| batch(&a, n)).collect()).unwrap();
    cache.next_batch(c, 1).unwrap();
    cache.complete(c, true);
    cache.next_batch(c, 2).unwrap();
    cache.complete(c, false);
    let purged = cache.purge();
    assert_eq!(purged.failed, vec![SequenceToken::new(1, 0)]);
    assert_eq!(purged.acked, vec![SequenceToken::new(2, 0), SequenceToken::new(3, 0)]);
    assert_eq!(cache.progress(), Some(SequenceToken::new(3, 0)), "failed items are done for progress");
}

#[test]
fn a_waiting_cursor_wakes_for_its_stream_even_after_everything_was_purged() {
    // Orleans scenarios 9 and 20: drained at 1, purged, then 2 arrives -> exactly [2].
    let (a, b) = (s("a"), s("b"));
    let mut cache = small(100);
    let c = cache.create_cursor(&a, CursorStart::Earliest).unwrap();
    cache.add(vec![batch(&a, 1)]).unwrap();
    cache.next_batch(c, 10).unwrap();
    cache.complete(c, false);
    cache.add((2..=40).map(|n| batch(&b, n)).collect()).unwrap();
    assert_eq!(cache.purge().acked.len(), 40);
    let woke = cache.add(vec![batch(&b, 41), batch(&a, 42)]).unwrap();
    assert_eq!(woke.ready, vec![c]);
    assert_eq!(tokens(&cache.next_batch(c, 10).unwrap()), vec![42]);
}

#[test]
fn start_positions() {
    let (a, b) = (s("a"), s("b"));
    let mut cache = small(100);
    cache.add(vec![batch(&a, 1), batch(&b, 2), batch(&a, 3), batch(&a, 5)]).unwrap();
    let at = cache.create_cursor(&a, CursorStart::At(SequenceToken::new(3, 0))).unwrap();
    assert_eq!(tokens(&cache.next_batch(at, 10).unwrap()), vec![3, 5], "At is inclusive");
    let after = cache.create_cursor(&a, CursorStart::After(SequenceToken::new(3, 0))).unwrap();
    assert_eq!(tokens(&cache.next_batch(after, 10).unwrap()), vec![5], "After is exclusive");
    let between = cache.create_cursor(&a, CursorStart::At(SequenceToken::new(4, 0))).unwrap();
    assert_eq!(tokens(&cache.next_batch(between, 10).unwrap()), vec![5]);
    let earliest = cache.create_cursor(&a, CursorStart::Earliest).unwrap();
    assert_eq!(tokens(&cache.next_batch(earliest, 10).unwrap()), vec![1, 3, 5]);
    let latest = cache.create_cursor(&a, CursorStart::Latest).unwrap();
    assert!(cache.next_batch(latest, 10).is_none());
    let future = cache.create_cursor(&a, CursorStart::At(SequenceToken::new(7, 0))).unwrap();
    cache.add(vec![batch(&a, 6), batch(&a, 7)]).unwrap();
    assert_eq!(tokens(&cache.next_batch(latest, 10).unwrap()), vec![6, 7]);
    assert_eq!(tokens(&cache.next_batch(future, 10).unwrap()), vec![7], "a future token waits for it");
}

#[test]
fn a_token_below_the_purged_range_is_a_miss() {
    let a = s("a");
    let mut cache = small(100);
    cache.set_purged_through(Some(SequenceToken::new(10, 0)));
    let err = cache.create_cursor(&a, CursorStart::At(SequenceToken::new(10, 0))).unwrap_err();
    assert_eq!(err.purged_through, SequenceToken::new(10, 0));
    assert!(cache.create_cursor(&a, CursorStart::After(SequenceToken::new(10, 0))).is_ok());
    assert!(cache.create_cursor(&a, CursorStart::At(SequenceToken::new(11, 0))).is_ok());
}

#[test]
fn redeliveries_are_skipped_by_token() {
    let a = s("a");
    let mut cache = small(100);
    cache.add(vec![batch(&a, 1), batch(&a, 2)]).unwrap();
    let outcome = cache.add(vec![batch(&a, 2), batch(&a, 3)]).unwrap();
    assert_eq!(outcome.skipped, [SequenceToken::new(2, 0)], "returned to be acked");
    assert_eq!(cache.len(), 3);
}

#[test]
fn a_pin_holds_a_stream_including_what_arrives_later() {
    let (a, b) = (s("a"), s("b"));
    let mut cache = small(100);
    let pin = cache.pin_stream(&a);
    cache.add((1..=10).map(|n| batch(&b, n)).collect()).unwrap();
    cache.add(vec![batch(&a, 11)]).unwrap();
    cache.add((12..=30).map(|n| batch(&b, n)).collect()).unwrap();
    assert_eq!(cache.purge().acked.len(), 10, "only the bucket before the pinned item goes");
    let sub = cache.create_cursor(&a, CursorStart::After(SequenceToken::new(10, 0))).unwrap();
    cache.remove_cursor(pin);
    assert_eq!(tokens(&cache.next_batch(sub, 10).unwrap()), vec![11]);
}

#[test]
fn progress_is_just_below_the_oldest_needed_item() {
    let (a, b) = (s("a"), s("b"));
    let mut cache = small(100);
    assert_eq!(cache.progress(), None);
    cache.add(vec![batch(&b, 1), batch(&b, 2)]).unwrap();
    assert_eq!(cache.progress(), Some(SequenceToken::new(2, 0)), "nobody needs anything");
    let c = cache.create_cursor(&a, CursorStart::Earliest).unwrap();
    cache.add(vec![batch(&a, 3), batch(&b, 4)]).unwrap();
    assert_eq!(cache.progress(), Some(SequenceToken::new(2, 0)));
    cache.next_batch(c, 1).unwrap();
    cache.complete(c, false);
    assert_eq!(cache.progress(), Some(SequenceToken::new(4, 0)));
}

#[test]
fn seek_moves_a_cursor_and_drops_its_in_flight_batch() {
    let a = s("a");
    let mut cache = small(100);
    let c = cache.create_cursor(&a, CursorStart::Earliest).unwrap();
    cache.add((1..=5).map(|n| batch(&a, n)).collect()).unwrap();
    assert_eq!(tokens(&cache.next_batch(c, 2).unwrap()), vec![1, 2]);
    cache.seek(c, CursorStart::After(SequenceToken::new(3, 0))).unwrap();
    assert_eq!(tokens(&cache.next_batch(c, 10).unwrap()), vec![4, 5]);
}

mod model {
    //! Property: whatever the interleaving of adds, deliveries and purges,
    //! every container reaches every cursor of its stream exactly once and
    //! in order, nothing is acked before all cursors passed it, and the
    //! cache never exceeds its size.
    use super::*;
    use proptest::prelude::*;

    #[derive(Debug, Clone)]
    enum Op {
        Read(u8),
        Deliver(usize, usize, bool),
        Purge,
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            (1u8..20).prop_map(Op::Read),
            (0usize..4, 1usize..5, any::<bool>()).prop_map(|(c, m, f)| Op::Deliver(c, m, f)),
            Just(Op::Purge),
        ]
    }

    proptest! {
        #[test]
        fn every_cursor_sees_its_stream_once_in_order(ops in proptest::collection::vec(op(), 1..200)) {
            let streams = [s("a"), s("b"), s("c")];
            let mut cache = small(40);
            // Two cursors on stream a, one on b, one on c.
            let owners = [0usize, 0, 1, 2];
            let cursors: Vec<CursorId> = owners.iter().map(|&i| cache.create_cursor(&streams[i], CursorStart::Earliest).unwrap()).collect();
            let mut seen: Vec<Vec<u64>> = vec![Vec::new(); 4];
            let mut in_flight: Vec<Vec<u64>> = vec![Vec::new(); 4];
            let mut written: Vec<Vec<u64>> = vec![Vec::new(); 3];
            let mut acked = std::collections::BTreeSet::new();
            let mut next = 1u64;
            for op in ops {
                match op {
                    Op::Read(n) => {
                        if cache.is_under_pressure() { continue; }
                        let n = (n as usize).min(cache.max_add_count());
                        let batch: Vec<_> = (0..n).map(|i| {
                            let si = (next as usize * 7 + i) % 3;
                            written[si].push(next);
                            next += 1;
                            super::batch(&streams[si], next - 1)
                        }).collect();
                        cache.add(batch).unwrap();
                    }
                    Op::Deliver(c, max, fail) => {
                        if in_flight[c].is_empty() {
                            if let Some(b) = cache.next_batch(cursors[c], max) {
                                in_flight[c] = tokens(&b);
                            }
                        } else {
                            seen[c].append(&mut in_flight[c]);
                            cache.complete(cursors[c], fail);
                        }
                    }
                    Op::Purge => {
                        let purged = cache.purge();
                        for t in purged.acked.iter().chain(&purged.failed) {
                            // Nothing leaves the cache before every cursor of its stream saw it.
                            for (c, &owner) in owners.iter().enumerate() {
                                if written[owner].contains(&t.major) {
                                    prop_assert!(seen[c].contains(&t.major), "{} left before cursor {c} saw it", t.major);
                                }
                            }
                            acked.insert(t.major);
                        }
                    }
                }
                prop_assert!(cache.len() <= 40);
            }
            // Drain everything.
            for (c, cursor) in cursors.iter().enumerate() {
                if !in_flight[c].is_empty() {
                    seen[c].append(&mut in_flight[c]);
                    cache.complete(*cursor, false);
                }
                while let Some(b) = cache.next_batch(*cursor, 100) {
                    seen[c].extend(tokens(&b));
                    cache.complete(*cursor, false);
                }
            }
            for (c, &owner) in owners.iter().enumerate() {
                prop_assert_eq!(&seen[c], &written[owner], "cursor {}", c);
            }
        }
    }
}

#[test]
fn no_new_cursor_starts_below_recorded_progress() {
    let (a, b) = (s("a"), s("b"));
    let mut cache = small(100);
    let slow = cache.create_cursor(&b, CursorStart::Earliest).unwrap();
    cache.add(vec![batch(&a, 1), batch(&a, 2), batch(&b, 3), batch(&a, 4)]).unwrap();
    // Nobody needs 1 and 2, but the slow cursor pins their bucket.
    assert_eq!(cache.progress(), Some(SequenceToken::new(2, 0)));
    assert_eq!(cache.len(), 4, "still cached");
    let late = cache.create_cursor(&a, CursorStart::Earliest).unwrap();
    assert_eq!(tokens(&cache.next_batch(late, 10).unwrap()), vec![4], "1 and 2 are done: not handed out again");
    let err = cache.create_cursor(&a, CursorStart::At(SequenceToken::new(2, 0))).unwrap_err();
    assert_eq!(err.purged_through, SequenceToken::new(2, 0), "older positions are a miss, served from the queue");
    cache.next_batch(slow, 1).unwrap();
    cache.complete(slow, false);
    assert_eq!(cache.progress(), Some(SequenceToken::new(3, 0)), "progress never moves back");
}
