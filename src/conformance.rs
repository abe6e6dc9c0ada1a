//! The conformance kit: checks any queue adapter, built-in or yours, against
//! the contract the runtime relies on.
//!
//! ```no_run
//! # async fn demo() -> Result<(), tailrace::conformance::Failure> {
//! use std::sync::Arc;
//! use tailrace::adapters::memory::{MemoryAdapterFactory, MemoryOptions};
//! let factory = Arc::new(MemoryAdapterFactory::new(4, MemoryOptions::default()));
//! let report = tailrace::conformance::run_all(factory).await?;
//! println!("{report}");
//! # Ok(()) }
//! ```
//!
//! Give it a fresh factory (empty queues): each check writes its own streams
//! and reads them back through receivers, and a queue is read by one
//! receiver at a time, as the runtime does. The checks:
//!
//! | check | what must hold |
//! |---|---|
//! | `ordering` | per stream, containers come back in enqueue order; tokens increase per queue; nothing is duplicated |
//! | `restart` | containers read but not acked are read again by the next receiver, in order; acked ones are not |
//! | `acks` | acking twice or acking unknown tokens is harmless |
//! | `rewind` | a rewindable adapter serves a past token without moving the live position; another refuses with an error |
//! | `shutdown` | `shutdown` twice is fine; reading after it is an error, not a panic |
//! | `bad_input` | an empty batch is refused with an error and nothing accepted before or after is lost |
//! | `direction` | a write-only adapter refuses receivers, a read-only one refuses writes |

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::queue::{Direction, QueueAdapter, QueueAdapterFactory, QueueError, QueueId, QueueMapper, QueueReceiver};
use crate::stream::{BatchContainer, Event, EventId, SequenceToken, StreamId};

/// A check that did not hold.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("conformance check `{check}` failed: {message}")]
pub struct Failure {
    /// The check's name.
    pub check: &'static str,
    /// What was seen.
    pub message: String,
}

/// The checks that passed (and the ones that did not apply).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Report {
    /// Checks that held.
    pub passed: Vec<&'static str>,
    /// Checks that do not apply to this adapter, with why.
    pub skipped: Vec<(&'static str, String)>,
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "passed: {}", self.passed.join(", "))?;
        for (check, why) in &self.skipped {
            write!(f, "; skipped {check} ({why})")?;
        }
        Ok(())
    }
}

/// How long a check waits for containers to become readable.
const READ_DEADLINE: Duration = Duration::from_secs(10);

fn fail(check: &'static str, message: impl Into<String>) -> Failure {
    Failure { check, message: message.into() }
}

/// Runs every check against the adapter `factory` builds.
pub async fn run_all(factory: Arc<dyn QueueAdapterFactory>) -> Result<Report, Failure> {
    let adapter = factory.create_adapter().await.map_err(|e| fail("setup", e.to_string()))?;
    let mapper = factory.queue_mapper();
    let mut report = Report::default();
    let kit = Kit { adapter, mapper };
    direction(&kit, &mut report).await?;
    if kit.adapter.direction() != Direction::ReadWrite {
        report.skipped.push(("ordering..bad_input", "they need a read-write adapter".into()));
        return Ok(report);
    }
    kit.ordering().await?;
    report.passed.push("ordering");
    kit.restart().await?;
    report.passed.push("restart");
    kit.acks().await?;
    report.passed.push("acks");
    kit.rewind().await?;
    report.passed.push("rewind");
    kit.shutdown().await?;
    report.passed.push("shutdown");
    kit.bad_input().await?;
    report.passed.push("bad_input");
    Ok(report)
}

async fn direction(kit: &Kit, report: &mut Report) -> Result<(), Failure> {
    let probe = StreamId::new("conformance-direction", "probe");
    match kit.adapter.direction() {
        Direction::WriteOnly => {
            if kit.adapter.create_receiver(QueueId(0)).await.is_ok() {
                return Err(fail("direction", "a write-only adapter handed out a receiver"));
            }
        }
        Direction::ReadOnly => {
            if kit.adapter.enqueue(&probe, events("d", 0..1)).await.is_ok() {
                return Err(fail("direction", "a read-only adapter accepted a write"));
            }
        }
        Direction::ReadWrite => {}
    }
    report.passed.push("direction");
    Ok(())
}

struct Kit {
    adapter: Arc<dyn QueueAdapter>,
    mapper: QueueMapper,
}

impl Kit {
    async fn receiver(&self, check: &'static str, queue: QueueId) -> Result<Box<dyn QueueReceiver>, Failure> {
        let mut receiver = self.adapter.create_receiver(queue).await.map_err(|e| fail(check, e.to_string()))?;
        receiver.initialize(Duration::from_secs(5)).await.map_err(|e| fail(check, format!("initialize: {e}")))?;
        Ok(receiver)
    }

    async fn write(&self, check: &'static str, stream: &StreamId, batch: Vec<Event>) -> Result<SequenceToken, Failure> {
        self.adapter.enqueue(stream, batch).await.map_err(|e| fail(check, format!("enqueue to {stream}: {e}")))
    }

    /// Reads until `want` containers of `namespace` came back (others are
    /// ignored) or the deadline passes.
    async fn read_until(
        &self,
        check: &'static str,
        receiver: &mut dyn QueueReceiver,
        namespace: &str,
        want: usize,
    ) -> Result<Vec<Arc<BatchContainer>>, Failure> {
        let deadline = tokio::time::Instant::now() + READ_DEADLINE;
        let mut got = Vec::new();
        while got.len() < want {
            if tokio::time::Instant::now() >= deadline {
                return Err(fail(
                    check,
                    format!("only {} of {want} containers came back within {READ_DEADLINE:?}", got.len()),
                ));
            }
            let batch = receiver.read(64).await.map_err(|e| fail(check, format!("read: {e}")))?;
            if batch.is_empty() {
                // Not every adapter waits for data inside `read`.
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            got.extend(batch.into_iter().filter(|b| b.stream.namespace() == namespace));
        }
        Ok(got)
    }

    /// Per stream in order, increasing tokens per queue, no duplicates.
    async fn ordering(&self) -> Result<(), Failure> {
        const CHECK: &str = "ordering";
        let streams: Vec<StreamId> = (0..6).map(|i| StreamId::new(CHECK, format!("s{i}"))).collect();
        let mut expected: BTreeMap<StreamId, Vec<String>> = BTreeMap::new();
        for round in 0..5u64 {
            for stream in &streams {
                let batch = events(&format!("{stream}-"), round * 3..round * 3 + 3);
                expected.entry(stream.clone()).or_default().extend(batch.iter().map(|e| e.id.to_string()));
                self.write(CHECK, stream, batch).await?;
            }
        }
        let mut seen: BTreeMap<StreamId, Vec<String>> = BTreeMap::new();
        let mut remaining = streams.len() * 5;
        for queue in self.mapper.all_queues() {
            let mine = streams.iter().filter(|s| self.mapper.queue_for(s) == queue).count() * 5;
            if mine == 0 {
                continue;
            }
            let mut receiver = self.receiver(CHECK, queue).await?;
            let got = self.read_until(CHECK, receiver.as_mut(), CHECK, mine).await?;
            check_tokens_increase(CHECK, &got)?;
            for batch in &got {
                seen.entry(batch.stream.clone()).or_default().extend(batch.events.iter().map(|e| e.id.to_string()));
            }
            finish(CHECK, receiver.as_mut(), &got).await?;
            remaining -= mine;
        }
        if remaining != 0 || seen != expected {
            return Err(fail(CHECK, format!("expected {expected:?}, read {seen:?}")));
        }
        Ok(())
    }

    /// Unacked containers come back to the next receiver; acked ones do not.
    async fn restart(&self) -> Result<(), Failure> {
        const CHECK: &str = "restart";
        let stream = StreamId::new(CHECK, "s");
        let queue = self.mapper.queue_for(&stream);
        for round in 0..6u64 {
            self.write(CHECK, &stream, events("r", round * 2..round * 2 + 2)).await?;
        }
        let mut first = self.receiver(CHECK, queue).await?;
        let got = self.read_until(CHECK, first.as_mut(), CHECK, 6).await?;
        let acked: Vec<SequenceToken> = got[..2].iter().map(|b| b.token).collect();
        ack(CHECK, first.as_mut(), &acked).await?;
        shut(CHECK, first.as_mut()).await?;
        drop(first);
        let mut second = self.receiver(CHECK, queue).await?;
        let again = self.read_until(CHECK, second.as_mut(), CHECK, 4).await?;
        let want: Vec<SequenceToken> = got[2..].iter().map(|b| b.token).collect();
        let have: Vec<SequenceToken> = again.iter().map(|b| b.token).collect();
        if have != want {
            return Err(fail(
                CHECK,
                format!("after a restart the unacked containers {want:?} should come back in order, got {have:?}"),
            ));
        }
        ack(CHECK, second.as_mut(), &have).await?;
        let extra = second.read(64).await.map_err(|e| fail(CHECK, format!("read: {e}")))?;
        if extra.iter().any(|b| b.stream == stream) {
            return Err(fail(CHECK, "containers came back after being acknowledged"));
        }
        shut(CHECK, second.as_mut()).await?;
        Ok(())
    }

    /// Acks are idempotent and unknown tokens are harmless.
    async fn acks(&self) -> Result<(), Failure> {
        const CHECK: &str = "acks";
        let stream = StreamId::new(CHECK, "s");
        let queue = self.mapper.queue_for(&stream);
        self.write(CHECK, &stream, events("a", 0..3)).await?;
        let mut receiver = self.receiver(CHECK, queue).await?;
        let got = self.read_until(CHECK, receiver.as_mut(), CHECK, 1).await?;
        let token = got[0].token;
        for attempt in ["first", "second"] {
            receiver.delivered(&[token]).await.map_err(|e| fail(CHECK, format!("{attempt} ack: {e}")))?;
        }
        let unknown = SequenceToken::new(u64::MAX - 7, 3);
        receiver
            .delivered(&[unknown])
            .await
            .map_err(|e| fail(CHECK, format!("ack of an unknown token failed: {e}")))?;
        shut(CHECK, receiver.as_mut()).await
    }

    /// Rewind serves past positions or refuses clearly.
    async fn rewind(&self) -> Result<(), Failure> {
        const CHECK: &str = "rewind";
        let stream = StreamId::new(CHECK, "s");
        let queue = self.mapper.queue_for(&stream);
        for round in 0..3u64 {
            self.write(CHECK, &stream, events("w", round..round + 1)).await?;
        }
        let mut receiver = self.receiver(CHECK, queue).await?;
        let got = self.read_until(CHECK, receiver.as_mut(), CHECK, 3).await?;
        receiver.delivered(&[got[0].token]).await.map_err(|e| fail(CHECK, format!("ack: {e}")))?;
        let rewound = receiver.rewind(got[1].token, 64).await;
        match (self.adapter.is_rewindable(), rewound) {
            (true, Ok(batch)) => {
                let mine: Vec<SequenceToken> = batch.iter().filter(|b| b.stream == stream).map(|b| b.token).collect();
                let want = vec![got[1].token, got[2].token];
                if mine != want {
                    return Err(fail(
                        CHECK,
                        format!("rewind to {} returned {mine:?}, expected {want:?}", got[1].token),
                    ));
                }
                let after = receiver.read(64).await.map_err(|e| fail(CHECK, format!("read: {e}")))?;
                if after.iter().any(|b| b.stream == stream) {
                    return Err(fail(CHECK, "a rewind moved the live read position back"));
                }
            }
            (true, Err(e)) => return Err(fail(CHECK, format!("rewindable adapter refused a recent token: {e}"))),
            (false, Ok(_)) => return Err(fail(CHECK, "a non-rewindable adapter served a rewind")),
            (false, Err(QueueError::NotRewindable { .. } | QueueError::CannotRewind { .. })) => {}
            (false, Err(other)) => {
                return Err(fail(CHECK, format!("refusal should say it cannot rewind, said: {other}")));
            }
        }
        finish(CHECK, receiver.as_mut(), &got).await?;
        Ok(())
    }

    /// Shutdown twice is fine; reads after it fail cleanly.
    async fn shutdown(&self) -> Result<(), Failure> {
        const CHECK: &str = "shutdown";
        let mut receiver = self.receiver(CHECK, QueueId(0)).await?;
        for attempt in ["first", "second"] {
            receiver
                .shutdown(Duration::from_secs(5))
                .await
                .map_err(|e| fail(CHECK, format!("{attempt} shutdown: {e}")))?;
        }
        if receiver.read(1).await.is_ok() {
            return Err(fail(CHECK, "a receiver still read after shutdown"));
        }
        Ok(())
    }

    /// Bad input is refused and loses nothing already accepted.
    async fn bad_input(&self) -> Result<(), Failure> {
        const CHECK: &str = "bad_input";
        let stream = StreamId::new(CHECK, "s");
        let queue = self.mapper.queue_for(&stream);
        self.write(CHECK, &stream, events("b", 0..1)).await?;
        match self.adapter.enqueue(&stream, Vec::new()).await {
            Err(QueueError::EmptyBatch(_)) => {}
            Err(other) => return Err(fail(CHECK, format!("an empty batch should be EmptyBatch, got: {other}"))),
            Ok(_) => return Err(fail(CHECK, "an empty batch was accepted")),
        }
        self.write(CHECK, &stream, events("b", 1..2)).await?;
        let mut receiver = self.receiver(CHECK, queue).await?;
        let got = self.read_until(CHECK, receiver.as_mut(), CHECK, 2).await?;
        let ids: Vec<String> = got.iter().flat_map(|b| b.events.iter().map(|e| e.id.to_string())).collect();
        if ids != ["b0", "b1"] {
            return Err(fail(CHECK, format!("accepted events around the refused batch should survive, got {ids:?}")));
        }
        finish(CHECK, receiver.as_mut(), &got).await?;
        Ok(())
    }
}

/// Acks `batches` (all of them) and shuts the receiver down.
async fn finish(
    check: &'static str,
    receiver: &mut dyn QueueReceiver,
    batches: &[Arc<BatchContainer>],
) -> Result<(), Failure> {
    let tokens: Vec<SequenceToken> = batches.iter().map(|b| b.token).collect();
    ack(check, receiver, &tokens).await?;
    shut(check, receiver).await
}

async fn ack(check: &'static str, receiver: &mut dyn QueueReceiver, tokens: &[SequenceToken]) -> Result<(), Failure> {
    receiver.delivered(tokens).await.map_err(|e| fail(check, format!("ack: {e}")))
}

async fn shut(check: &'static str, receiver: &mut dyn QueueReceiver) -> Result<(), Failure> {
    receiver.shutdown(Duration::from_secs(5)).await.map_err(|e| fail(check, format!("shutdown: {e}")))
}

fn check_tokens_increase(check: &'static str, batches: &[Arc<BatchContainer>]) -> Result<(), Failure> {
    for pair in batches.windows(2) {
        if pair[0].token >= pair[1].token {
            return Err(fail(
                check,
                format!("tokens must increase within a queue: {} then {}", pair[0].token, pair[1].token),
            ));
        }
    }
    Ok(())
}

fn events(prefix: &str, range: std::ops::Range<u64>) -> Vec<Event> {
    range.map(|i| Event::new(EventId::new(format!("{prefix}{i}")), format!("conformance {i}"))).collect()
}
