//! The consumer side of a subscription: what the agent calls.

use std::sync::Arc;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use super::{StartPosition, SubscriptionId};
use crate::queue::Fence;
use crate::stream::{BatchContainer, Event, SequenceToken, StreamId};

/// What a consumer is told about the subscription it serves.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SubscriptionInfo {
    /// The subscription.
    pub id: SubscriptionId,
    /// Its stream.
    pub stream: StreamId,
}

/// One in-order delivery: consecutive containers of one stream.
///
/// ```
/// use std::sync::Arc;
/// use tailrace::pubsub::{Delivery, SubscriptionId};
/// use tailrace::queue::Fence;
/// use tailrace::{BatchContainer, Event, SequenceToken, StreamId};
///
/// let stream = StreamId::new("logs", "etl/run-1");
/// let batch = BatchContainer {
///     stream: stream.clone(),
///     token: SequenceToken::new(1, 0),
///     events: vec![Event::new("e-1", "one"), Event::new("e-2", "two")],
/// };
/// let delivery = Delivery::new(SubscriptionId(1), stream, vec![Arc::new(batch)]).fenced(Fence::lease(4));
/// assert_eq!(delivery.event_count(), 2);
/// assert_eq!(delivery.last_token(), Some(SequenceToken::new(1, 0)));
/// assert_eq!(delivery.fence.token(), Some(4));
/// ```
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct Delivery {
    /// The subscription delivered to.
    pub subscription: SubscriptionId,
    /// The stream.
    pub stream: StreamId,
    /// Containers in queue order (at least one).
    pub batches: Vec<Arc<BatchContainer>>,
    /// The queue lease the delivering agent runs under, if its writes are
    /// fenced: a consumer that writes to a store may pass it along so that
    /// the store refuses a paused old owner's writes (the archiver does,
    /// see `RunLogStore::append` and `Append::fenced`).
    pub fence: Fence,
    /// Set when events of the stream may be missing between the
    /// subscription's previous delivery and this one, with why: a batch
    /// given up after its retries (it went to the dead-letter sink), a
    /// catch-up the queue could no longer serve (its events were trimmed
    /// or expired), a start the adapter could not rewind to, a handshake
    /// that failed. A consumer that numbers what it receives (a line
    /// offset, a running count) must not carry its numbering across a
    /// gap: it re-reads its own state first (the edge's tailers re-read
    /// the run log store). `None` on every delivery that follows the
    /// previous one without a hole.
    pub gap: Option<String>,
}

impl Delivery {
    /// `batches` (consecutive containers of `stream`, in queue order, at
    /// least one) for `subscription`, under no lease.
    pub fn new(subscription: SubscriptionId, stream: StreamId, batches: Vec<Arc<BatchContainer>>) -> Self {
        Self { subscription, stream, batches, fence: Fence::NONE, gap: None }
    }

    /// The same, delivered under `fence`.
    pub fn fenced(mut self, fence: Fence) -> Self {
        self.fence = fence;
        self
    }

    /// The same, after a gap in the subscription's deliveries, for
    /// `reason` (see [`Delivery::gap`]).
    pub fn after_gap(mut self, reason: impl Into<String>) -> Self {
        self.gap = Some(reason.into());
        self
    }

    /// Every event with its container's token, in order.
    pub fn events(&self) -> impl Iterator<Item = (&Event, SequenceToken)> {
        self.batches.iter().flat_map(|b| b.events.iter().map(move |e| (e, b.token)))
    }

    /// Number of events in the delivery.
    pub fn event_count(&self) -> usize {
        self.batches.iter().map(|b| b.events.len()).sum()
    }

    /// The token of the last container.
    pub fn last_token(&self) -> Option<SequenceToken> {
        self.batches.last().map(|b| b.token)
    }
}

/// What the consumer wants after a delivery.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "outcome", content = "token")]
pub enum DeliveryOutcome {
    /// Go on with the next batch.
    Continue,
    /// Continue just after this token instead (rewind to re-read, or skip
    /// ahead). Delivery progress follows it.
    SeekAfter(SequenceToken),
}

/// Why a consumer could not take a delivery or a handshake. More kinds
/// may come (the cluster transport added two), so a match needs a `_` arm.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "error", content = "reason")]
#[non_exhaustive]
pub enum ConsumerError {
    /// It failed; the agent retries within the max delivery time.
    #[error("{0}")]
    Failed(String),
    /// It is gone (its node left, it unsubscribed); no retry.
    #[error("consumer unavailable: {0}")]
    Unavailable(String),
    /// It cannot take the batch now through no fault of the batch: its
    /// node is a live member that cannot be reached (a link down, a peer
    /// busy), or what it writes to is unavailable (the archiver's store on
    /// a full disk or a Redis that is down). The agent retries without a
    /// time limit and never dead-letters for it, until it answers, leaves
    /// the cluster, or the queue moves.
    #[error("consumer unreachable: {0}")]
    Unreachable(String),
    /// Its node refused the delivering agent's lease token: a newer owner
    /// runs the queue. The agent stops as on a lost lease (no ack, no
    /// checkpoint).
    #[error("refused as a stale owner: {0}")]
    Fenced(String),
}

impl ConsumerError {
    /// A failure carrying `error`'s text and the texts of its sources.
    pub fn failed(error: impl std::fmt::Display) -> Self {
        ConsumerError::Failed(error.to_string())
    }
}

/// Receives a subscription's events. Calls for one subscription never
/// overlap: the next delivery starts after the previous one returned.
#[async_trait]
pub trait StreamConsumer: Send + Sync + 'static {
    /// The handshake: where this subscription continues. `None` means "the
    /// subscription's own start position". Asked when the agent first serves
    /// the subscription and after each re-attach.
    async fn handshake(&self, subscription: &SubscriptionInfo) -> Result<Option<StartPosition>, ConsumerError> {
        let _ = subscription;
        Ok(None)
    }

    /// Processes one batch, in order. An error is retried with backoff
    /// within the max delivery time, then handed to the failure handler.
    async fn deliver(&self, delivery: &Delivery) -> Result<DeliveryOutcome, ConsumerError>;

    /// Told when the runtime gave up on a batch (it went to the dead-letter
    /// sink) or faulted the subscription. `error` is the original cause.
    async fn on_error(&self, subscription: &SubscriptionInfo, error: &str) {
        let _ = (subscription, error);
    }
}

/// Makes the consumer of an implicit subscription, one per stream, on the
/// node whose agent serves the stream.
pub trait ConsumerFactory: Send + Sync + 'static {
    /// A stable name; part of the implicit subscription's id.
    fn name(&self) -> &str;

    /// The consumer for `stream`.
    fn create(&self, stream: &StreamId) -> Arc<dyn StreamConsumer>;
}
