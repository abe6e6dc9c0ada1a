//! The conformance kit catches broken adapters: each mutant wraps the good
//! memory adapter and breaks one rule, and the kit must fail it on the
//! check that names that rule.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use tailrace::adapters::memory::{MemoryAdapter, MemoryAdapterFactory, MemoryOptions};
use tailrace::conformance::{self, Claims};
use tailrace::queue::{
    Checkpointer, Direction, Fence, QueueAdapter, QueueAdapterFactory, QueueError, QueueMapper, QueueReceiver,
};
use tailrace::{BatchContainer, Event, QueueId, SequenceToken, StreamId};

/// One broken rule.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fault {
    /// Hands containers out newest first.
    Reorders,
    /// Changes one payload byte on the way out.
    FlipsPayloadByte,
    /// Answers `enqueue` with a token other than the one read back.
    WrongToken,
    /// Acks do nothing: everything comes back after a restart.
    ForgetsAcks,
    /// An ack acknowledges everything up to it (an offset commit).
    CumulativeAcks,
    /// Acks what it reads at once: a crash loses what was in flight.
    AutoAcksOnRead,
    /// An ack of a token it never handed out acknowledges everything.
    UnknownAckAcksAll,
    /// `failed` acknowledges everything read.
    FailedReleasesAll,
    /// A fenced receiver keeps reading (nothing), so two own the queue.
    SharesQueue,
    /// `read(max)` returns more than `max`.
    IgnoresMax,
    /// A rewind moves the live position back.
    RewindMovesLive,
    /// A rewind past retention answers with nothing instead of refusing.
    ServesPastRetention,
    /// A queue far larger than the bound it claims.
    GrowsWithoutBound,
    /// A full queue answers `enqueue` but drops the batch.
    DropsWhenFull,
    /// A second `shutdown` fails.
    ShutdownTwiceFails,
    /// `shutdown` does nothing: reads go on.
    ReadsAfterShutdown,
    /// An empty batch is accepted.
    AcceptsEmptyBatch,
    /// Claims durability, but a fresh factory starts empty.
    NotDurable,
}

const CAPACITY: usize = 256;

fn options(fault: Fault) -> MemoryOptions {
    let capacity_events = if fault == Fault::GrowsWithoutBound { 1_000_000 } else { CAPACITY };
    MemoryOptions { capacity_events, history: 16, read_wait: Duration::from_millis(20) }
}

struct BrokenFactory {
    inner: Arc<MemoryAdapterFactory>,
    fault: Fault,
}

#[async_trait]
impl QueueAdapterFactory for BrokenFactory {
    fn name(&self) -> &str {
        "broken-memory"
    }

    fn queue_mapper(&self) -> QueueMapper {
        self.inner.queue_mapper()
    }

    async fn create_adapter(&self) -> Result<Arc<dyn QueueAdapter>, QueueError> {
        Ok(Arc::new(Broken { inner: self.inner.adapter(), fault: self.fault }))
    }

    async fn create_checkpointer(&self) -> Result<Arc<dyn Checkpointer>, QueueError> {
        self.inner.create_checkpointer().await
    }
}

struct Broken {
    inner: Arc<MemoryAdapter>,
    fault: Fault,
}

#[async_trait]
impl QueueAdapter for Broken {
    fn name(&self) -> &str {
        "broken-memory"
    }

    fn direction(&self) -> Direction {
        Direction::ReadWrite
    }

    fn is_rewindable(&self) -> bool {
        true
    }

    async fn enqueue(&self, stream: &StreamId, events: Vec<Event>) -> Result<SequenceToken, QueueError> {
        match self.fault {
            Fault::AcceptsEmptyBatch if events.is_empty() => Ok(SequenceToken::new(u64::MAX, 0)),
            Fault::WrongToken => {
                self.inner.enqueue(stream, events).await.map(|t| SequenceToken::new(t.major, t.minor + 1))
            }
            Fault::DropsWhenFull => match self.inner.try_enqueue(stream, events) {
                Err(QueueError::Full { .. }) => Ok(SequenceToken::new(u64::MAX / 2, 0)),
                other => other,
            },
            _ => self.inner.enqueue(stream, events).await,
        }
    }

    async fn create_receiver(&self, queue: QueueId, fence: Fence) -> Result<Box<dyn QueueReceiver>, QueueError> {
        let inner = self.inner.create_receiver(queue, fence).await?;
        Ok(Box::new(BrokenReceiver { inner, fault: self.fault, read: BTreeSet::new(), stash: Vec::new(), shut: 0 }))
    }
}

struct BrokenReceiver {
    inner: Box<dyn QueueReceiver>,
    fault: Fault,
    read: BTreeSet<SequenceToken>,
    stash: Vec<Arc<BatchContainer>>,
    shut: u32,
}

fn flip_last_byte(batch: &BatchContainer) -> Arc<BatchContainer> {
    let mut batch = batch.clone();
    if let Some(event) = batch.events.iter_mut().find(|e| !e.payload.is_empty()) {
        let mut bytes = event.payload.to_vec();
        if let Some(last) = bytes.last_mut() {
            *last ^= 0x20;
        }
        event.payload = Bytes::from(bytes);
    }
    Arc::new(batch)
}

#[async_trait]
impl QueueReceiver for BrokenReceiver {
    async fn initialize(&mut self, timeout: Duration) -> Result<(), QueueError> {
        self.inner.initialize(timeout).await
    }

    async fn read(&mut self, max: usize) -> Result<Vec<Arc<BatchContainer>>, QueueError> {
        if self.fault == Fault::RewindMovesLive && !self.stash.is_empty() {
            return Ok(std::mem::take(&mut self.stash));
        }
        let asked = if self.fault == Fault::IgnoresMax { max + 2 } else { max };
        let mut batch = match self.inner.read(asked).await {
            Err(QueueError::Fenced(_)) if self.fault == Fault::SharesQueue => Vec::new(),
            other => other?,
        };
        self.read.extend(batch.iter().map(|b| b.token));
        match self.fault {
            Fault::Reorders => batch.reverse(),
            Fault::FlipsPayloadByte => batch = batch.iter().map(|b| flip_last_byte(b)).collect(),
            Fault::AutoAcksOnRead => {
                let tokens: Vec<SequenceToken> = batch.iter().map(|b| b.token).collect();
                self.inner.delivered(&tokens).await?;
            }
            _ => {}
        }
        Ok(batch)
    }

    async fn delivered(&mut self, tokens: &[SequenceToken]) -> Result<(), QueueError> {
        match self.fault {
            Fault::ForgetsAcks => Ok(()),
            Fault::CumulativeAcks => {
                let newest = tokens.iter().max().copied();
                let upto: Vec<SequenceToken> = self.read.iter().filter(|t| Some(**t) <= newest).copied().collect();
                self.inner.delivered(&upto).await
            }
            Fault::UnknownAckAcksAll if tokens.iter().any(|t| !self.read.contains(t)) => {
                let all: Vec<SequenceToken> = self.read.iter().copied().collect();
                self.inner.delivered(&all).await
            }
            _ => self.inner.delivered(tokens).await,
        }
    }

    async fn failed(&mut self, tokens: &[SequenceToken]) -> Result<(), QueueError> {
        if self.fault == Fault::FailedReleasesAll {
            let all: Vec<SequenceToken> = self.read.iter().copied().collect();
            return self.inner.failed(&all).await;
        }
        self.inner.failed(tokens).await
    }

    async fn rewind(&mut self, from: SequenceToken, max: usize) -> Result<Vec<Arc<BatchContainer>>, QueueError> {
        match self.inner.rewind(from, max).await {
            Err(QueueError::CannotRewind { .. }) if self.fault == Fault::ServesPastRetention => Ok(Vec::new()),
            Ok(batch) if self.fault == Fault::RewindMovesLive => {
                self.stash = batch.clone();
                Ok(batch)
            }
            other => other,
        }
    }

    async fn shutdown(&mut self, timeout: Duration) -> Result<(), QueueError> {
        self.shut += 1;
        match self.fault {
            Fault::ShutdownTwiceFails if self.shut > 1 => Err(QueueError::ShutDown(QueueId(0))),
            Fault::ReadsAfterShutdown => Ok(()),
            _ => self.inner.shutdown(timeout).await,
        }
    }
}

/// Runs the kit on the mutant with every claim the memory adapter makes
/// (plus durability for [`Fault::NotDurable`]) and returns the failed checks.
async fn failed_checks(fault: Fault) -> Vec<&'static str> {
    let claims = Claims {
        durable: fault == Fault::NotDurable,
        rewindable: true,
        exclusive_receivers: true,
        bounded: Some(CAPACITY),
        trims: true,
    };
    let shared = Arc::new(MemoryAdapterFactory::new(4, options(fault)));
    let started = std::time::Instant::now();
    let result = conformance::run_with_deadline(claims, Duration::from_secs(2), move || {
        // A durable store would be opened again; this one starts afresh.
        let inner = if fault == Fault::NotDurable {
            Arc::new(MemoryAdapterFactory::new(4, options(fault)))
        } else {
            shared.clone()
        };
        async move { Ok(Arc::new(BrokenFactory { inner, fault }) as Arc<dyn QueueAdapterFactory>) }
    })
    .await;
    match result {
        Ok(report) => {
            println!("the kit passed the mutant {fault:?}: {report}");
            Vec::new()
        }
        Err(failures) => {
            println!("{fault:?} ({:.1?}): {}", started.elapsed(), failures.0);
            failures.0.failed_checks()
        }
    }
}

/// The memory adapter itself passes with the same claims (so the mutants
/// fail because of their fault, not of the set-up).
#[tokio::test]
async fn the_unbroken_wrapper_passes() {
    let shared = Arc::new(MemoryAdapterFactory::new(4, options(Fault::Reorders)));
    let claims =
        Claims { durable: false, rewindable: true, exclusive_receivers: true, bounded: Some(CAPACITY), trims: true };
    let report = conformance::run(claims, move || {
        let shared = shared.clone();
        async move { Ok(shared as Arc<dyn QueueAdapterFactory>) }
    })
    .await
    .unwrap_or_else(|f| panic!("{f}"));
    assert_eq!(report.failed, []);
}

/// Every mutant with the check that must catch it.
const MUTANTS: &[(Fault, &str)] = &[
    (Fault::Reorders, "ordering"),
    (Fault::FlipsPayloadByte, "payloads"),
    (Fault::WrongToken, "tokens"),
    (Fault::ForgetsAcks, "restart"),
    (Fault::CumulativeAcks, "ack_gaps"),
    (Fault::AutoAcksOnRead, "takeover"),
    (Fault::UnknownAckAcksAll, "acks"),
    (Fault::FailedReleasesAll, "failed"),
    (Fault::SharesQueue, "exclusive"),
    (Fault::IgnoresMax, "read_max"),
    (Fault::RewindMovesLive, "rewind"),
    (Fault::ServesPastRetention, "retention"),
    (Fault::GrowsWithoutBound, "back_pressure"),
    (Fault::DropsWhenFull, "back_pressure"),
    (Fault::ShutdownTwiceFails, "shutdown"),
    (Fault::ReadsAfterShutdown, "shutdown"),
    (Fault::AcceptsEmptyBatch, "bad_input"),
    (Fault::NotDurable, "durability"),
];

/// All mutants run at once (each on its own queues): a mutant that loses
/// containers makes the kit wait out its read deadline, so one after the
/// other would take minutes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_kit_fails_every_mutant_on_the_check_that_names_its_fault() {
    let runs = MUTANTS.iter().map(|(fault, check)| async move { (*fault, *check, failed_checks(*fault).await) });
    let mut missed = Vec::new();
    for (fault, check, failed) in futures::future::join_all(runs).await {
        if !failed.contains(&check) {
            missed.push(format!("{fault:?} should fail `{check}`, failed {failed:?}"));
        }
    }
    assert!(missed.is_empty(), "{missed:#?}");
    println!("{} mutants, each caught by the check that names its fault", MUTANTS.len());
}

#[test]
fn every_mutant_names_a_check_of_the_kit() {
    for (fault, check) in MUTANTS {
        assert!(tailrace::conformance::CHECKS.contains(check), "{fault:?} names {check}, which the kit does not have");
    }
    println!("{} mutants, each naming a check of the kit", MUTANTS.len());
}
