//! One subscription as the agent serves it ([`Sub`]): where its consumer
//! is, where it starts, its cursor and pins, its catch-up from the queue,
//! what it has in flight, and the handshake that tells where to continue.
//!
//! The handshake runs on the work lane ([`HandshakeCall::start`]); its answer
//! comes back as a [`Handshaken`] for the stream table to apply.

use std::collections::VecDeque;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use ractor::RpcReplyPort;
use tokio_util::sync::CancellationToken;

use super::calls::{Attempted, RetryLimits, Revoke, call_with_retries};
use crate::cache::{CursorId, QueueCache};
use crate::pubsub::{
    ConsumerAddress, ConsumerError, ConsumerResolver, Origin, PubSubStore, StartPosition, StreamConsumer, Subscription,
    SubscriptionId, SubscriptionInfo,
};
use crate::queue::QueueError;
use crate::retry::Backoff;
use crate::stream::{BatchContainer, QueueId, SequenceToken, StreamId};

/// Why an attach did not happen.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum AttachError {
    /// The agent is shutting down (the queue is moving); retry.
    #[error("queue {0} is being handed over; retry")]
    NotServing(QueueId),
    /// The consumer could not be reached.
    #[error("the consumer of subscription {id} is unavailable: {reason}")]
    ConsumerUnavailable {
        /// The subscription.
        id: SubscriptionId,
        /// Why.
        reason: String,
    },
    /// The requested start position cannot be served (the adapter is not
    /// rewindable, or the queue no longer holds it: `oldest` then says
    /// where the queue's history starts now).
    #[error("subscription {id} cannot start at {requested}: {reason}")]
    CannotStart {
        /// The subscription.
        id: SubscriptionId,
        /// The position asked for.
        requested: String,
        /// Why.
        reason: String,
        /// The oldest position the queue still holds, when the start is
        /// older than its retention.
        oldest: Option<SequenceToken>,
    },
    /// The failure handler faulted the subscription during its handshake.
    #[error("subscription {id} was faulted: {reason}")]
    Faulted {
        /// The subscription.
        id: SubscriptionId,
        /// The cause.
        reason: String,
    },
    /// It was removed before its handshake finished.
    #[error("subscription {0} was removed before it attached")]
    Removed(SubscriptionId),
}

/// A subscription's catch-up from the queue (its start was older than the
/// cache): rewind reads from `next` up to `until`, then the cache.
pub(crate) struct CatchUp {
    pub next: SequenceToken,
    pub until: SequenceToken,
    pub requested: bool,
    /// The rewind reads reached `until`: what is buffered is the rest.
    pub exhausted: bool,
    /// Tells this catch-up from a later one of the same subscription.
    pub epoch: u64,
    /// Failed reads so far (for the backoff).
    pub retries: u32,
    pub buffer: VecDeque<Arc<BatchContainer>>,
}

impl CatchUp {
    /// A rewind read's containers: keeps this stream's up to `until`, and
    /// notes whether the queue has no more.
    pub(crate) fn absorb(&mut self, batches: Vec<Arc<BatchContainer>>, stream: &StreamId) {
        match batches.last().map(|b| b.token) {
            None => self.exhausted = true,
            Some(newest) => {
                let (from, until) = (self.next, self.until);
                let mine = batches.into_iter().filter(|b| &b.stream == stream && b.token >= from && b.token <= until);
                self.buffer.extend(mine);
                self.next = successor(newest);
                self.exhausted = newest >= until;
            }
        }
    }
}

/// One subscription the agent serves.
pub(crate) struct Sub {
    pub info: SubscriptionInfo,
    pub address: Option<ConsumerAddress>,
    pub start: StartPosition,
    /// The user asked for a token at subscribe time: refuse if unservable.
    pub strict_start: bool,
    pub consumer: Option<Arc<dyn StreamConsumer>>,
    pub cursor: Option<CursorId>,
    pub handshake_pin: Option<CursorId>,
    pub generation: u64,
    pub handshaking: bool,
    pub delivering: bool,
    /// A delivery failed during the shutdown drain: nothing more is tried.
    pub parked: bool,
    /// Cancelled to revoke the in-flight handshake or delivery. Shared by
    /// `Arc` so handing it to a task costs one increment, not a lock.
    pub revoke: Arc<Revoke>,
    pub catch_up: Option<CatchUp>,
    /// Why events may be missing before its next delivery, which carries
    /// it ([`crate::pubsub::Delivery::gap`]).
    pub gap: Option<String>,
    pub attach_replies: Vec<RpcReplyPort<Result<StartPosition, AttachError>>>,
}

impl Sub {
    fn new(info: SubscriptionInfo, start: StartPosition) -> Self {
        Self {
            info,
            address: None,
            start,
            strict_start: false,
            consumer: None,
            cursor: None,
            handshake_pin: None,
            generation: 0,
            handshaking: false,
            delivering: false,
            parked: false,
            revoke: Arc::new(Revoke::default()),
            catch_up: None,
            gap: None,
            attach_replies: Vec::new(),
        }
    }

    pub(crate) fn explicit(record: &Subscription, strict_start: bool) -> Self {
        let info = SubscriptionInfo { id: record.id, stream: record.stream.clone() };
        Self { address: Some(record.consumer.clone()), strict_start, ..Self::new(info, record.start) }
    }

    pub(crate) fn implicit(id: SubscriptionId, stream: &StreamId, consumer: Arc<dyn StreamConsumer>) -> Self {
        let info = SubscriptionInfo { id, stream: stream.clone() };
        Self { consumer: Some(consumer), ..Self::new(info, StartPosition::EarliestAvailable) }
    }

    /// Nothing in flight and its cursor caught up.
    pub(crate) fn is_idle(&self, cache: &QueueCache) -> bool {
        !self.delivering
            && !self.handshaking
            && self.catch_up.is_none()
            && self.cursor.is_some_and(|c| !cache.has_next(c))
    }

    /// Begins a handshake: the newest one wins, so it revokes what the
    /// subscription had in flight and older answers are ignored.
    pub(crate) fn handshake(&mut self, stream: &StreamId, id: SubscriptionId) -> HandshakeCall {
        self.generation += 1;
        self.handshaking = true;
        self.revoke.cancel();
        self.revoke = Arc::new(Revoke::default());
        HandshakeCall {
            stream: stream.clone(),
            id,
            generation: self.generation,
            known: self.consumer.clone(),
            address: self.address.clone(),
            info: self.info.clone(),
            revoke: self.revoke.clone(),
        }
    }
}

/// What a rewind read's answer means for a catching-up subscription.
pub(crate) enum Rewound {
    /// An answer for a catch-up that was replaced meanwhile.
    Stale,
    /// A transient failure: ask again after `after`; meanwhile nothing asks.
    Retry { after: Duration },
    /// Containers (or the end) came: deliver them.
    Served,
    /// The first answer failed for a strict attach: refuse it, for this
    /// reason (and the oldest position the queue still holds).
    Refused(String, Option<SequenceToken>),
    /// The queue cannot serve the catch-up: go on from the cache; the
    /// consumer is told what may be missing.
    Lost(String),
}

impl Sub {
    /// Applies a rewind read's answer to the subscription's catch-up `epoch`.
    /// The first answer also settles a strict attach.
    pub(crate) fn rewound(
        &mut self,
        stream: &StreamId,
        epoch: u64,
        result: Result<Vec<Arc<BatchContainer>>, QueueError>,
        backoff: Backoff,
    ) -> Rewound {
        let id = self.info.id;
        let Some(catch_up) = self.catch_up.as_mut().filter(|c| c.epoch == epoch) else {
            return Rewound::Stale;
        };
        catch_up.requested = false;
        // The agent read containers through `until` before it purged them:
        // a queue that now answers nothing from `next` on lost them (an
        // answer an adapter must not give, for whatever reason), and
        // carrying on from the cache would skip them silently.
        let nothing = match &result {
            Ok(batches) if batches.is_empty() && catch_up.next <= catch_up.until => Some(format!(
                "the queue answered nothing from {} though it held containers through {}",
                catch_up.next, catch_up.until
            )),
            _ => None,
        };
        if let Some(reason) = nothing {
            if !self.attach_replies.is_empty() {
                return Rewound::Refused(reason, None);
            }
            tracing::error!(%stream, subscription = %id, %reason, "catch-up from the queue came back empty; continuing from the cache");
            self.catch_up = None;
            self.gap = Some(format!("events may be missing: {reason}"));
            return Rewound::Lost(reason);
        }
        match result {
            Ok(batches) => {
                catch_up.absorb(batches, stream);
                let start = self.start;
                for reply in self.attach_replies.drain(..) {
                    let _ = reply.send(Ok(start));
                }
                Rewound::Served
            }
            Err(error) if error.is_transient() => {
                tracing::warn!(%stream, subscription = %id, %error, "catch-up read failed; retrying");
                catch_up.requested = true;
                catch_up.retries += 1;
                Rewound::Retry { after: backoff.delay(catch_up.retries - 1) }
            }
            Err(error) if !self.attach_replies.is_empty() => Rewound::Refused(error.to_string(), error.oldest_held()),
            Err(error) => {
                let reason = format!("events from {} on may be missing: {error}", catch_up.next);
                tracing::warn!(%stream, subscription = %id, %reason, "catch-up from the queue failed; continuing from the cache");
                self.catch_up = None;
                self.gap = Some(reason.clone());
                Rewound::Lost(reason)
            }
        }
    }
}

/// A handshake to run: find the consumer, ask it where to continue.
pub(crate) struct HandshakeCall {
    stream: StreamId,
    id: SubscriptionId,
    generation: u64,
    known: Option<Arc<dyn StreamConsumer>>,
    address: Option<ConsumerAddress>,
    info: SubscriptionInfo,
    revoke: Arc<Revoke>,
}

/// A handshake's answer.
pub(crate) struct Handshaken {
    pub stream: StreamId,
    pub id: SubscriptionId,
    pub generation: u64,
    pub consumer: Option<Arc<dyn StreamConsumer>>,
    pub result: Result<Option<StartPosition>, ConsumerError>,
}

impl HandshakeCall {
    /// The handshake as work for the lane, and the answer if it panics.
    pub(crate) fn start(
        self,
        resolver: Arc<dyn ConsumerResolver>,
        origin: Origin,
        limits: RetryLimits,
        stop: Arc<CancellationToken>,
    ) -> (impl Future<Output = Handshaken> + Send + 'static, impl FnOnce(String) -> Handshaken + Send + 'static) {
        let (stream, id, generation) = (self.stream.clone(), self.id, self.generation);
        let panicked = move |panic: String| Handshaken {
            stream,
            id,
            generation,
            consumer: None,
            result: Err(ConsumerError::Failed(format!("handshake panicked: {panic}"))),
        };
        (self.run(resolver, origin, limits, stop), panicked)
    }

    async fn run(
        self,
        resolver: Arc<dyn ConsumerResolver>,
        origin: Origin,
        limits: RetryLimits,
        stop: Arc<CancellationToken>,
    ) -> Handshaken {
        let Self { stream, id, generation, known, address, info, revoke } = self;
        let consumer = known.or_else(|| address.as_ref().and_then(|a| resolver.resolve_from(a, origin)));
        let Some(consumer) = consumer else {
            let at = address.map(|a| format!("{}/{}", a.node, a.name)).unwrap_or_default();
            let result = Err(ConsumerError::Unavailable(format!("no consumer is registered at {at}")));
            return Handshaken { stream, id, generation, consumer: None, result };
        };
        let attempted = call_with_retries(|| consumer.handshake(&info), &limits, &stop, &revoke).await;
        let result = match attempted {
            Attempted::Done(start) => Ok(start),
            Attempted::Unavailable(reason) => Err(ConsumerError::Unavailable(reason)),
            Attempted::Fenced(reason) => Err(ConsumerError::Fenced(reason)),
            Attempted::Failed { error, .. } => Err(ConsumerError::Failed(error)),
            Attempted::Revoked => Err(ConsumerError::Failed("revoked".into())),
        };
        Handshaken { stream, id, generation, consumer: Some(consumer), result }
    }
}

/// A subscription the failure handler faulted.
pub(crate) struct Faulted {
    stream: StreamId,
    id: SubscriptionId,
    reason: String,
    info: SubscriptionInfo,
    consumer: Option<Arc<dyn StreamConsumer>>,
}

impl Faulted {
    /// `sub`, removed from the table, faulted for `reason`.
    pub(crate) fn new(stream: StreamId, id: SubscriptionId, reason: String, sub: Sub) -> Self {
        Self { stream, id, reason, info: sub.info, consumer: sub.consumer }
    }

    /// Marks the subscription faulted in the store and tells its consumer,
    /// each bounded by `timeout`.
    pub(crate) async fn report(self, store: Arc<dyn PubSubStore>, timeout: Duration) {
        let Self { stream, id, reason, info, consumer } = self;
        match tokio::time::timeout(timeout, store.fault(&stream, id, &reason)).await {
            Ok(Ok(())) => {}
            Ok(Err(error)) => {
                tracing::error!(%stream, subscription = %id, %error, "could not mark the subscription faulted")
            }
            Err(_) => tracing::error!(%stream, subscription = %id, "the pub-sub store did not answer the fault"),
        }
        if let Some(consumer) = consumer {
            let message = format!("subscription faulted: {reason}");
            let _ = tokio::time::timeout(timeout, consumer.on_error(&info, &message)).await;
        }
    }
}

/// The token just after `t`.
pub(crate) fn successor(t: SequenceToken) -> SequenceToken {
    match t.minor.checked_add(1) {
        Some(minor) => SequenceToken::new(t.major, minor),
        None => SequenceToken::new(t.major.saturating_add(1), 0),
    }
}
