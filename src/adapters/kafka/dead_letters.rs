//! A partition's unreadable records to the dead-letter sink: each with its
//! place (`kafka:{topic}/{partition}@{offset}`), its raw value and why,
//! counted in `tailrace_queue_unreadable_total` and said in the log (a few
//! times per ten seconds at most) when it is found. The queue goes on past
//! them; they stay in the topic.
//!
//! A slow sink does not hold the queue up: letters wait here (the records
//! of one fetch at most: the receiver fetches again only once they are
//! sent), and each read spends at most [`SEND_BUDGET`] sending them. A
//! letter the sink does not keep within `response_timeout` is given up,
//! with an error naming it.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use tokio::time::Instant;

use super::connect::token;
use super::records::{Reason, Unreadable};
use crate::failure::{DeadLetter, DeadLetterSink, LogThrottle};
use crate::stream::{Event, EventId, QueueId, StreamId};
use crate::telemetry;

/// The namespace of a dead letter whose record named no stream (the file
/// adapter's corrupt lines are in it too).
const UNREADABLE_NAMESPACE: &str = "tailrace.corrupt";

/// The most one read spends sending letters; the rest wait for the next.
const SEND_BUDGET: Duration = Duration::from_secs(1);

/// Where one receiver's unreadable records go.
pub(super) struct DeadLetters {
    queue: QueueId,
    topic: String,
    sink: Arc<dyn DeadLetterSink>,
    /// How long the sink may take to keep a letter.
    limit: Duration,
    logged: LogThrottle,
    /// Found and not yet sent.
    pending: VecDeque<DeadLetter>,
}

impl DeadLetters {
    pub(super) fn new(queue: QueueId, topic: String, sink: Arc<dyn DeadLetterSink>, limit: Duration) -> Self {
        let logged = LogThrottle::new(5, Duration::from_secs(10));
        Self { queue, topic, sink, limit, logged, pending: VecDeque::new() }
    }

    /// Whether letters wait to be sent.
    pub(super) fn is_empty(&self) -> bool {
        self.pending.is_empty()
    }

    /// Drops the letters not sent (the receiver reads from its checkpoint
    /// again, and finds them again).
    pub(super) fn forget(&mut self) {
        self.pending.clear();
    }

    /// Counts `records`, logs them unless a flood was logged already, and
    /// keeps their letters to send.
    pub(super) fn found(&mut self, records: Vec<Unreadable>) {
        for Unreadable { offset, reason, error, stream, record } in records {
            let origin = format!("kafka:{}/{}@{offset}", self.topic, self.queue.0);
            metrics::counter!(telemetry::QUEUE_UNREADABLE, "queue" => self.queue.to_string(), "reason" => reason.as_str())
                .increment(1);
            if let Some(not_logged) = self.logged.admit() {
                tracing::error!(queue = %self.queue, %origin, reason = reason.as_str(), %error, not_logged,
                    "unreadable record skipped to the dead-letter sink (it stays in the topic)");
            }
            let stream = stream.unwrap_or_else(|| StreamId::new(UNREADABLE_NAMESPACE, format!("kafka:{}", self.topic)));
            self.pending.push_back(DeadLetter {
                subscription: None,
                origin: Some(origin.clone()),
                stream,
                token: token(offset),
                events: vec![Event {
                    id: EventId::new(origin),
                    timestamp_ms: record.timestamp_ms,
                    payload: record.value.unwrap_or_else(Bytes::new),
                }],
                error: match reason {
                    Reason::Format => format!("unreadable record: {error}"),
                    Reason::Misplaced => format!("misplaced record: {error}"),
                },
                attempts: 0,
            });
        }
    }

    /// Sends what waits, in order, for at most [`SEND_BUDGET`].
    pub(super) async fn send(&mut self) {
        let until = Instant::now() + SEND_BUDGET;
        while Instant::now() < until {
            let Some(letter) = self.pending.pop_front() else { return };
            let origin = letter.origin.clone().unwrap_or_default();
            match tokio::time::timeout(self.limit, self.sink.dead_letter(letter)).await {
                Ok(Ok(())) => {}
                Ok(Err(refusal)) => {
                    if let Some(not_logged) = self.logged.admit() {
                        tracing::error!(queue = %self.queue, %origin, %refusal, not_logged,
                            "the dead-letter sink refused a record (it stays in the topic)");
                    }
                }
                Err(_) => tracing::error!(queue = %self.queue, %origin, limit = ?self.limit,
                    "the dead-letter sink did not keep a record in time; given up (it stays in the topic)"),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use async_trait::async_trait;

    use super::*;
    use crate::adapters::kafka::records::Fetched;
    use crate::failure::MemoryDeadLetters;
    use crate::stream::SequenceToken;

    fn unreadable(offset: i64, reason: Reason) -> Unreadable {
        let record = Fetched { key: None, value: Some(Bytes::from("junk")), headers: BTreeMap::new(), timestamp_ms: 7 };
        Unreadable { offset, reason, error: "why".into(), stream: None, record }
    }

    /// A letter says where the record is, holds its value, and says why.
    #[tokio::test]
    async fn a_letter_names_the_records_place_and_holds_its_value() {
        let sink = Arc::new(MemoryDeadLetters::new(10));
        let mut letters = DeadLetters::new(QueueId(3), "logs".into(), sink.clone(), Duration::from_secs(1));
        letters.found(vec![unreadable(41, Reason::Format), unreadable(42, Reason::Misplaced)]);
        assert!(!letters.is_empty());
        letters.send().await;
        assert!(letters.is_empty());
        let sent = sink.letters();
        assert_eq!(sent.len(), 2);
        assert_eq!(sent[0].origin.as_deref(), Some("kafka:logs/3@41"));
        assert_eq!(sent[0].token, SequenceToken::new(41, 0));
        assert_eq!(sent[0].stream, StreamId::new("tailrace.corrupt", "kafka:logs"));
        assert_eq!((sent[0].events[0].payload.as_ref(), sent[0].events[0].timestamp_ms), (&b"junk"[..], 7));
        assert_eq!(sent[0].error, "unreadable record: why");
        assert_eq!(sent[1].error, "misplaced record: why");
    }

    /// Never answers.
    struct Stuck;

    #[async_trait]
    impl DeadLetterSink for Stuck {
        async fn dead_letter(&self, _: DeadLetter) -> Result<(), String> {
            std::future::pending().await
        }
    }

    /// A sink that does not answer costs a read its budget at most, and
    /// each letter its limit: the queue goes on.
    #[tokio::test(start_paused = true)]
    async fn a_stuck_sink_does_not_hold_the_queue() {
        let limit = Duration::from_millis(400);
        let mut letters = DeadLetters::new(QueueId(0), "t".into(), Arc::new(Stuck), limit);
        letters.found((0..5).map(|i| unreadable(i, Reason::Format)).collect());
        let start = Instant::now();
        letters.send().await;
        assert!(start.elapsed() <= SEND_BUDGET + limit, "{:?}", start.elapsed());
        assert_eq!(letters.pending.len(), 2, "three given up in one read's budget, two left for the next");
        letters.send().await;
        assert!(letters.is_empty());
    }
}
