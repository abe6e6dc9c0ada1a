//! Deliveries in flight: at most one batch per subscription, retried with
//! backoff within the max delivery time. This part decides what a
//! subscription delivers next ([`next_delivery`]: its catch-up buffer, a
//! rewind to ask for, or the cache), runs the delivery on the work lane
//! ([`DeliveryCall::start`]) and settles its end ([`settle`]): progress, a
//! seek, a detach, a park while handing over, or a batch given up (the
//! failure handler then skips it to the dead-letter sink or faults).

use std::collections::VecDeque;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt;
use tokio_util::sync::CancellationToken;

use super::calls::{Attempted, RetryLimits, Revoke, call_with_retries};
use super::settings::AgentServices;
use super::status::AgentMetrics;
use super::subscription::{Sub, successor};
use super::worker::panic_text;
use crate::cache::QueueCache;
use crate::failure::{DeadLetter, DeadLetterSink, FailureAction, FailureHandler};
use crate::pubsub::{Delivery, DeliveryOutcome, StreamConsumer, SubscriptionId, SubscriptionInfo};
use crate::queue::Fence;
use crate::stream::{BatchContainer, QueueId, SequenceToken, StreamId};

/// How a delivery ended.
pub(crate) type DeliveryReport = Attempted<DeliveryOutcome>;

/// What a subscription does next.
pub(crate) enum Dispatch {
    /// Nothing to deliver, or something in flight already.
    Idle,
    /// Its catch-up needs a rewind read first.
    Rewind,
    /// Deliver this.
    Deliver(DeliveryCall),
}

/// A delivery to run.
pub(crate) struct DeliveryCall {
    id: SubscriptionId,
    generation: u64,
    catch_up: bool,
    consumer: Arc<dyn StreamConsumer>,
    delivery: Arc<Delivery>,
    revoke: Arc<Revoke>,
}

/// A finished delivery, reported back to the agent.
pub(crate) struct Delivered {
    pub id: SubscriptionId,
    generation: u64,
    /// It came from the catch-up buffer, not the cache.
    catch_up: bool,
    /// What was delivered: its stream and containers.
    delivery: Arc<Delivery>,
    report: DeliveryReport,
}

impl Delivered {
    /// The stream delivered.
    pub(crate) fn stream(&self) -> &StreamId {
        &self.delivery.stream
    }

    /// Whether the consumer's node refused the agent's lease token.
    pub(crate) fn fenced(&self) -> bool {
        matches!(self.report, Attempted::Fenced(_))
    }
}

/// What the agent does about a finished delivery.
pub(crate) enum Settled {
    /// Deliver the subscription's next batch.
    Next,
    /// `events` were delivered; the consumer may ask to continue elsewhere.
    /// `more`: the subscription may have a next batch now.
    Delivered { events: usize, seek: Option<SequenceToken>, more: bool },
    /// The consumer is gone: detach the subscription.
    Unavailable(String),
    /// Failed while handing over: left for the next owner, nothing more.
    Parked,
    /// Retries ran out.
    GaveUp(GaveUp),
}

/// Deliveries that finished as they started, to settle in order (at most
/// one per subscription). A message settles a bounded number; one
/// `SettleMore` at a time brings the agent back for the rest.
#[derive(Default)]
pub(crate) struct Finished {
    queue: VecDeque<Delivered>,
    more_asked: bool,
}

impl Finished {
    pub(crate) fn push(&mut self, done: Delivered) {
        self.queue.push_back(done);
    }

    pub(crate) fn pop(&mut self) -> Option<Delivered> {
        self.queue.pop_front()
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }

    /// Whether to send a `SettleMore` now: some are left and none is on
    /// its way.
    pub(crate) fn ask_more(&mut self) -> bool {
        let ask = !self.queue.is_empty() && !self.more_asked;
        self.more_asked |= ask;
        ask
    }

    /// The `SettleMore` arrived.
    pub(crate) fn more_arrived(&mut self) {
        self.more_asked = false;
    }
}

/// A batch given up after its retries.
pub(crate) struct GaveUp {
    pub error: String,
    pub attempts: u32,
    info: SubscriptionInfo,
    batches: Vec<Arc<BatchContainer>>,
    consumer: Option<Arc<dyn StreamConsumer>>,
}

/// Picks the subscription's next delivery if it has something to deliver
/// and nothing in flight. During the ordered shutdown (`draining`) only what
/// is cached is delivered, never a catch-up.
pub(crate) fn next_delivery(
    sub: &mut Sub,
    stream: &StreamId,
    id: SubscriptionId,
    cache: &mut QueueCache,
    max: usize,
    draining: bool,
    fence: Option<u64>,
) -> Dispatch {
    if sub.handshaking || sub.delivering || sub.parked || (draining && sub.catch_up.is_some()) {
        return Dispatch::Idle;
    }
    let Some(consumer) = sub.consumer.clone() else {
        return Dispatch::Idle;
    };
    let mut from_catch_up = false;
    let mut batches = None;
    if let Some(catch_up) = sub.catch_up.as_mut() {
        if !catch_up.buffer.is_empty() {
            let n = catch_up.buffer.len().min(max);
            batches = Some(catch_up.buffer.drain(..n).collect::<Vec<_>>());
            from_catch_up = true;
        } else if !catch_up.exhausted {
            if catch_up.requested {
                return Dispatch::Idle;
            }
            catch_up.requested = true;
            return Dispatch::Rewind;
        } else {
            sub.catch_up = None;
        }
    }
    let batches = match batches {
        Some(batches) => batches,
        None => match sub.cursor.and_then(|c| cache.next_batch(c, max)) {
            Some(batches) => batches,
            None => return Dispatch::Idle,
        },
    };
    sub.delivering = true;
    let delivery = Delivery::new(id, stream.clone(), batches).fenced(Fence::from(fence));
    let delivery = Arc::new(match sub.gap.take() {
        Some(reason) => delivery.after_gap(reason),
        None => delivery,
    });
    Dispatch::Deliver(DeliveryCall {
        id,
        generation: sub.generation,
        catch_up: from_catch_up,
        consumer,
        delivery,
        revoke: sub.revoke.clone(),
    })
}

impl DeliveryCall {
    /// The delivery as work, boxed once: it keeps what it delivers for the
    /// report, and a panic in the consumer is a failed attempt.
    pub(crate) fn start(
        self,
        limits: Arc<RetryLimits>,
        stop: Arc<CancellationToken>,
    ) -> Pin<Box<dyn Future<Output = Delivered> + Send>> {
        let Self { id, generation, catch_up, consumer, delivery, revoke } = self;
        Box::pin(async move {
            let call = call_with_retries(|| consumer.deliver(&delivery), &limits, &stop, &revoke);
            let report = AssertUnwindSafe(call).catch_unwind().await.unwrap_or_else(|panic| Attempted::Failed {
                error: format!("consumer panicked: {}", panic_text(&panic)),
                attempts: 1,
            });
            Delivered { id, generation, catch_up, delivery, report }
        })
    }
}

/// Settles a finished delivery of `sub`: moves its cursor (or catch-up) on,
/// and says what the agent does next. An answer for an older handshake
/// (another generation) or a revoked delivery only frees the slot.
pub(crate) fn settle(sub: &mut Sub, cache: &mut QueueCache, done: Delivered, draining: bool) -> Settled {
    let Delivered { id, generation, catch_up, delivery, report } = done;
    let (stream, last) = (&delivery.stream, delivery.last_token());
    sub.delivering = false;
    if sub.generation != generation {
        return Settled::Next;
    }
    let cursor = sub.cursor;
    // Moves past the batch; whether a next one may be waiting (a catch-up
    // always has to look).
    let mut moved = |failed: bool, cache: &mut QueueCache| {
        if catch_up {
            if let (Some(c), Some(last)) = (sub.catch_up.as_mut(), last) {
                c.next = c.next.max(successor(last));
            }
            true
        } else if let Some(cursor) = cursor {
            cache.complete(cursor, failed)
        } else {
            false
        }
    };
    match report {
        Attempted::Done(outcome) => {
            let more = moved(false, cache);
            let events = delivery.event_count();
            let seek = match outcome {
                DeliveryOutcome::SeekAfter(token) => Some(token),
                _ => None,
            };
            Settled::Delivered { events, seek, more }
        }
        // The agent stops before settling a fenced delivery
        // (`Delivered::fenced`); were it settled, it is as gone.
        Attempted::Unavailable(reason) | Attempted::Fenced(reason) => Settled::Unavailable(reason),
        Attempted::Failed { error, .. } if draining => {
            // Draining: no retry and no dead letter; the next owner
            // delivers these again.
            if let (Some(cursor), false) = (cursor, catch_up) {
                cache.abandon(cursor);
            }
            sub.parked = true;
            tracing::info!(%stream, subscription = %id, %error, "delivery failed while handing over; left for the next owner");
            Settled::Parked
        }
        Attempted::Failed { error, attempts } => {
            moved(true, cache);
            // Skipped (or faulted, and then gone): the next delivery says so.
            sub.gap = Some(format!("a batch was given up after {attempts} attempts: {error}"));
            let batches = delivery.batches.clone();
            Settled::GaveUp(GaveUp { error, attempts, info: sub.info.clone(), batches, consumer: sub.consumer.clone() })
        }
        Attempted::Revoked => Settled::Next,
    }
}

impl GaveUp {
    /// The failure handler's decision (implicit subscriptions always skip).
    fn decide(&self, handler: &dyn FailureHandler) -> FailureAction {
        if self.info.id.is_implicit() {
            return FailureAction::Skip;
        }
        let first = self.batches.first().map(|b| b.token).unwrap_or_default();
        handler.on_delivery_failure(&self.info, first, &self.error)
    }

    /// What the agent does with a batch given up on `queue`: counts and
    /// logs it, sends it to the dead-letter sink (the returned side work)
    /// and says why the subscription faults, if the handler decided so.
    pub(crate) fn give_up(
        self,
        services: &AgentServices,
        metrics: &AgentMetrics,
        queue: QueueId,
    ) -> (impl Future<Output = ()> + Send + 'static, Option<String>) {
        metrics.delivery_failures.increment(1);
        let action = self.decide(services.failure.as_ref());
        let (error, attempts, info) = (&self.error, self.attempts, &self.info);
        tracing::warn!(%queue, stream = %info.stream, subscription = %info.id, %error, attempts, ?action, "delivery given up");
        metrics.dead_letters.increment(self.batches.len() as u64);
        let fault =
            (action == FailureAction::Fault).then(|| format!("delivery failed after {attempts} attempts: {error}"));
        (self.dead_letter(services.dead_letters.clone(), services.options.delivery_attempt_timeout), fault)
    }

    /// Sends the batches to the dead-letter sink and tells the consumer,
    /// each call bounded by `timeout`.
    async fn dead_letter(self, sink: Arc<dyn DeadLetterSink>, timeout: Duration) {
        let Self { error, attempts, info, batches, consumer } = self;
        for batch in batches {
            let letter = DeadLetter {
                subscription: Some(info.id),
                origin: None,
                stream: batch.stream.clone(),
                token: batch.token,
                events: batch.events.clone(),
                error: error.clone(),
                attempts,
            };
            match tokio::time::timeout(timeout, sink.dead_letter(letter)).await {
                Ok(Ok(())) => {}
                Ok(Err(refusal)) => {
                    tracing::error!(stream = %info.stream, token = %batch.token, %refusal, "the dead-letter sink refused a batch")
                }
                Err(_) => {
                    tracing::error!(stream = %info.stream, token = %batch.token, "the dead-letter sink did not answer")
                }
            }
        }
        if let Some(consumer) = consumer {
            let _ = tokio::time::timeout(timeout, consumer.on_error(&info, &error)).await;
        }
    }
}
