//! The memory adapter: the conformance kit, bounded back-pressure, fencing.

use tailrace_testkit as common;

use std::sync::Arc;
use std::time::Duration;

use common::*;
use tailrace::QueueId;
use tailrace::adapters::memory::{MemoryAdapterFactory, MemoryOptions};
use tailrace::conformance::{self, Claims};
use tailrace::queue::{Fence, QueueAdapter, QueueAdapterFactory, QueueError};

fn factory(options: MemoryOptions) -> Arc<MemoryAdapterFactory> {
    Arc::new(MemoryAdapterFactory::new(4, options))
}

/// The kit with everything the memory adapter claims: rewindable (with a
/// short history so retention is reached), exclusive receivers, bounded.
#[tokio::test]
async fn passes_the_conformance_kit() {
    let options = MemoryOptions { capacity_events: 256, history: 16, ..MemoryOptions::default() };
    let f = factory(options);
    let claims =
        Claims { rewindable: true, exclusive_receivers: true, bounded: Some(256), trims: true, durable: false };
    let report = conformance::run(claims, move || {
        let f = f.clone();
        async move { Ok(f as Arc<dyn QueueAdapterFactory>) }
    })
    .await
    .unwrap_or_else(|failures| panic!("{failures}"));
    println!("{report}");
    assert_eq!(report.checks_run(), 16, "{report}");
    assert_eq!(report.not_claimed, [("durability", "durable")]);
}

#[tokio::test]
async fn passes_the_conformance_kit_without_history() {
    // Not rewindable: the kit checks the refusal instead.
    let options = MemoryOptions { history: 0, ..MemoryOptions::default() };
    let f = factory(options);
    assert!(!f.adapter().is_rewindable());
    let claims = Claims { exclusive_receivers: true, ..Claims::default() };
    let report = conformance::run(claims, move || {
        let f = f.clone();
        async move { Ok(f as Arc<dyn QueueAdapterFactory>) }
    })
    .await
    .unwrap_or_else(|failures| panic!("{failures}"));
    println!("{report}");
    assert!(report.passed.contains(&"rewind"), "the refusal is checked: {report}");
}

#[tokio::test]
async fn a_full_queue_makes_producers_wait_and_never_drops() {
    let f = factory(MemoryOptions { capacity_events: 10, read_wait: Duration::ZERO, ..MemoryOptions::default() });
    let adapter = f.adapter();
    let s = stream("t", "a");
    let queue = f.adapter().options().capacity_events;
    assert_eq!(queue, 10);
    adapter.enqueue(&s, events("e", 0..6)).await.unwrap();
    let err = adapter.try_enqueue(&s, events("e", 6..11)).unwrap_err();
    assert!(matches!(err, QueueError::Full { capacity: 10, .. }), "{err}");
    assert!(err.to_string().contains("nothing was written"));
    // A waiting producer completes only once a reader took some events.
    let waiting = {
        let adapter = adapter.clone();
        let s = s.clone();
        tokio::spawn(async move { adapter.enqueue(&s, events("e", 6..11)).await })
    };
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(!waiting.is_finished(), "the producer must wait for room");
    let q = tailrace::queue::QueueMapper::new(4).queue_for(&s);
    let mut receiver = adapter.create_receiver(q, Fence::NONE).await.unwrap();
    receiver.initialize(Duration::from_secs(1)).await.unwrap();
    let first = receiver.read(10).await.unwrap();
    assert_eq!(first.len(), 1);
    waiting.await.unwrap().unwrap();
    let second = receiver.read(10).await.unwrap();
    let ids: Vec<String> =
        first.iter().chain(&second).flat_map(|b| b.events.iter().map(|e| e.id.to_string())).collect();
    assert_eq!(ids, ids_of("e", 0..11));
}

fn ids_of(prefix: &str, range: std::ops::Range<u64>) -> Vec<String> {
    ids(prefix, range)
}

#[tokio::test]
async fn a_batch_larger_than_the_queue_is_refused_clearly() {
    let f = factory(MemoryOptions { capacity_events: 10, ..MemoryOptions::default() });
    let err = f.adapter().enqueue(&stream("t", "a"), events("e", 0..11)).await.unwrap_err();
    assert_eq!(
        err.to_string(),
        format!(
            "a batch of 11 events can never fit queue {} (capacity 10 events); split it",
            tailrace::queue::QueueMapper::new(4).queue_for(&stream("t", "a"))
        )
    );
}

#[tokio::test]
async fn a_new_receiver_fences_the_old_one_and_rereads_what_was_not_acked() {
    let f = factory(MemoryOptions { read_wait: Duration::ZERO, ..MemoryOptions::default() });
    let adapter = f.adapter();
    let s = stream("t", "fence");
    let q = tailrace::queue::QueueMapper::new(4).queue_for(&s);
    adapter.enqueue(&s, events("e", 0..2)).await.unwrap();
    let mut old = adapter.create_receiver(q, Fence::NONE).await.unwrap();
    old.initialize(Duration::from_secs(1)).await.unwrap();
    assert_eq!(old.read(10).await.unwrap().len(), 1);
    let mut new = adapter.create_receiver(q, Fence::NONE).await.unwrap();
    new.initialize(Duration::from_secs(1)).await.unwrap();
    assert!(matches!(old.read(10).await, Err(QueueError::Fenced(fenced)) if fenced == q));
    let again = new.read(10).await.unwrap();
    assert_eq!(again.len(), 1, "the unacked container is read again by the new owner");
    assert_ne!(q, QueueId(99));
}

/// A read of a drained queue waits for the next write, even when an
/// earlier write left a wake behind that the reader no longer needs: an
/// empty answer only after `read_wait` passed with nothing written. (It used
/// to answer empty at once there, and the agent went into its idle backoff
/// while producers filled the queue.)
#[tokio::test(start_paused = true)]
async fn a_read_of_a_drained_queue_waits_for_the_next_write_despite_a_stale_wake() {
    let read_wait = Duration::from_millis(100);
    let f = factory(MemoryOptions { read_wait, ..MemoryOptions::default() });
    let adapter = f.adapter();
    let s = stream("t", "stale");
    let q = tailrace::queue::QueueMapper::new(4).queue_for(&s);
    let mut receiver = adapter.create_receiver(q, Fence::NONE).await.unwrap();
    receiver.initialize(Duration::from_secs(1)).await.unwrap();
    for life in 0..3u64 {
        // Written while the reader is not waiting: the queue stores a wake.
        adapter.enqueue(&s, events("e", life * 10..life * 10 + 2)).await.unwrap();
        adapter.enqueue(&s, events("e", life * 10 + 2..life * 10 + 4)).await.unwrap();
        assert_eq!(receiver.read(10).await.unwrap().len(), 2, "life {life}: both containers");
        let started = tokio::time::Instant::now();
        let writer = enqueue_after(&adapter, &s, events("late", life..life + 1), Duration::from_millis(40));
        let next = receiver.read(10).await.unwrap();
        writer.await.unwrap();
        assert_eq!(
            read_ids(&next),
            ids("late", life..life + 1),
            "life {life}: the read answered before the next write"
        );
        assert!(started.elapsed() >= Duration::from_millis(40));
    }
    // Nothing more written: empty, once `read_wait` has passed.
    let started = tokio::time::Instant::now();
    assert!(receiver.read(10).await.unwrap().is_empty());
    assert!(started.elapsed() >= read_wait);
}
