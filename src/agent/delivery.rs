//! Delivering: one batch in flight per subscription, retried with backoff
//! within the max delivery time; then the failure handler skips (to the
//! dead-letter sink, with the original error) or faults. A subscription whose
//! start was older than the cache first catches up from rewind reads.

use std::future::Future;
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::AgentOptions;
use super::state::{Agent, InternalMsg};
use super::streams::successor;
use crate::failure::{DeadLetter, FailureAction};
use crate::pubsub::{
    ConsumerError, Delivery, DeliveryOutcome, StartPosition, StreamConsumer, SubscriptionId, SubscriptionInfo,
};
use crate::retry::Backoff;
use crate::stream::{BatchContainer, StreamId};

/// How a delivery ended.
pub(crate) type DeliveryReport = Attempted<DeliveryOutcome>;

/// The end of a call retried within limits.
pub(crate) enum Attempted<T> {
    /// It succeeded.
    Done(T),
    /// The consumer is gone; not retried.
    Unavailable(String),
    /// Retries ran out; the last error.
    Failed { error: String, attempts: u32 },
    /// The subscription was removed or re-handshaken meanwhile.
    Revoked,
}

/// Limits of one retried call.
pub(crate) struct RetryLimits {
    max_time: Duration,
    attempt_timeout: Duration,
    backoff: Backoff,
}

impl From<&AgentOptions> for RetryLimits {
    fn from(options: &AgentOptions) -> Self {
        Self {
            max_time: options.max_delivery_time,
            attempt_timeout: options.delivery_attempt_timeout,
            backoff: options.delivery_backoff,
        }
    }
}

/// Calls `call` until it succeeds, the consumer is unavailable, the time
/// runs out (no new attempt starts past `max_time`), the agent is stopping
/// (`stop`: the current attempt finishes, no retry) or the work is revoked.
pub(crate) async fn call_with_retries<T, F, Fut>(
    mut call: F,
    limits: &RetryLimits,
    stop: &CancellationToken,
    revoke: &CancellationToken,
) -> Attempted<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, ConsumerError>>,
{
    let mut started = None;
    let mut attempts = 0;
    loop {
        attempts += 1;
        if revoke.is_cancelled() {
            return Attempted::Revoked;
        }
        let call = call();
        tokio::pin!(call);
        // Most consumers answer on the first poll: only a call that waits
        // pays for a timer and for watching the revoke signal.
        let outcome = match std::future::poll_fn(|cx| Poll::Ready(call.as_mut().poll(cx))).await {
            Poll::Ready(outcome) => Ok(outcome),
            Poll::Pending => {
                started.get_or_insert_with(Instant::now);
                tokio::select! {
                    _ = revoke.cancelled() => return Attempted::Revoked,
                    outcome = tokio::time::timeout(limits.attempt_timeout, call) => outcome,
                }
            }
        };
        let error = match outcome {
            Ok(Ok(value)) => return Attempted::Done(value),
            Ok(Err(ConsumerError::Unavailable(reason))) => return Attempted::Unavailable(reason),
            Ok(Err(ConsumerError::Failed(error))) => error,
            Err(_) => format!("no answer within {:?}", limits.attempt_timeout),
        };
        let wait = limits.backoff.delay(attempts - 1);
        let started = *started.get_or_insert_with(Instant::now);
        if stop.is_cancelled() || started.elapsed() + wait > limits.max_time {
            return Attempted::Failed { error, attempts };
        }
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = stop.cancelled() => return Attempted::Failed { error, attempts },
            _ = revoke.cancelled() => return Attempted::Revoked,
        }
    }
}

impl Agent {
    /// Starts the subscription's next delivery if it has something to
    /// deliver and nothing in flight. During the ordered shutdown only what
    /// is cached is delivered (the drain), never a catch-up.
    pub(crate) fn dispatch(&mut self, stream: &StreamId, id: SubscriptionId) {
        let draining = self.shutdown.is_some();
        let max = self.services.options.max_delivery_batch.max(1);
        let Some(sub) = self.streams.get_mut(stream).and_then(|e| e.subs.get_mut(&id)) else {
            return;
        };
        if sub.handshaking || sub.delivering || sub.parked || (draining && sub.catch_up.is_some()) {
            return;
        }
        let Some(consumer) = sub.consumer.clone() else {
            return;
        };
        let mut from_catch_up = false;
        let mut batches = None;
        if let Some(catch_up) = sub.catch_up.as_mut() {
            if !catch_up.buffer.is_empty() {
                let n = catch_up.buffer.len().min(max);
                batches = Some(catch_up.buffer.drain(..n).collect::<Vec<_>>());
                from_catch_up = true;
            } else if !catch_up.exhausted {
                if !catch_up.requested {
                    catch_up.requested = true;
                    self.rewinds.push_back((stream.clone(), id));
                    self.schedule_pump(Duration::ZERO);
                }
                return;
            } else {
                sub.catch_up = None;
            }
        }
        let batches = match batches {
            Some(batches) => batches,
            None => match sub.cursor.and_then(|c| self.cache.next_batch(c, max)) {
                Some(batches) => batches,
                None => return,
            },
        };
        sub.delivering = true;
        let delivery = Arc::new(Delivery { subscription: id, stream: stream.clone(), batches });
        sub.in_flight = Some(delivery.clone());
        let generation = sub.generation;
        let revoke = sub.revoke.clone();
        let last = delivery.last_token();
        let limits = RetryLimits::from(&self.services.options);
        let stop = self.stop_retries.clone();
        let (s1, s2) = (stream.clone(), stream.clone());
        self.spawn_work(
            async move {
                let report = call_with_retries(|| consumer.deliver(&delivery), &limits, &stop, &revoke).await;
                InternalMsg::Delivered { stream: s1, id, generation, catch_up: from_catch_up, last, report }
            },
            move |panic| InternalMsg::Delivered {
                stream: s2,
                id,
                generation,
                catch_up: from_catch_up,
                last,
                report: Attempted::Failed { error: format!("consumer panicked: {panic}"), attempts: 1 },
            },
        );
    }

    pub(crate) fn on_delivered(
        &mut self,
        stream: StreamId,
        id: SubscriptionId,
        generation: u64,
        catch_up: bool,
        last: Option<crate::stream::SequenceToken>,
        report: DeliveryReport,
    ) {
        self.work -= 1;
        let Some(entry) = self.streams.get_mut(&stream) else {
            return;
        };
        entry.last_activity = self.clock;
        let Some(sub) = entry.subs.get_mut(&id) else {
            return;
        };
        sub.delivering = false;
        let delivery = sub.in_flight.take();
        if sub.generation == generation {
            let cursor = sub.cursor;
            let info = sub.info.clone();
            let consumer = sub.consumer.clone();
            let mut moved = |failed: bool, agent_cache: &mut crate::cache::QueueCache| {
                if catch_up {
                    if let (Some(c), Some(last)) = (sub.catch_up.as_mut(), last) {
                        c.next = c.next.max(successor(last));
                    }
                } else if let Some(cursor) = cursor {
                    agent_cache.complete(cursor, failed);
                }
            };
            match report {
                Attempted::Done(outcome) => {
                    moved(false, &mut self.cache);
                    let events = delivery.as_ref().map_or(0, |d| d.event_count());
                    self.status.events_delivered += events as u64;
                    self.metrics.events_delivered.increment(events as u64);
                    if let DeliveryOutcome::SeekAfter(token) = outcome {
                        self.place_cursor(&stream, id, StartPosition::After(token));
                        return;
                    }
                }
                Attempted::Unavailable(reason) => {
                    tracing::warn!(queue = %self.queue, %stream, subscription = %id, %reason, "consumer unavailable; subscription detached");
                    self.remove_sub(&stream, id, super::AttachError::ConsumerUnavailable { id, reason });
                    return;
                }
                Attempted::Failed { error, .. } if self.shutdown.is_some() => {
                    // Draining: no retry and no dead letter; the next owner
                    // delivers these again.
                    if let (Some(cursor), false) = (cursor, catch_up) {
                        self.cache.abandon(cursor);
                    }
                    sub.parked = true;
                    tracing::info!(queue = %self.queue, %stream, subscription = %id, %error, "delivery failed while handing over; left for the next owner");
                    return;
                }
                Attempted::Failed { error, attempts } => {
                    moved(true, &mut self.cache);
                    self.metrics.delivery_failures.increment(1);
                    let batches = delivery.map(|d| d.batches.clone()).unwrap_or_default();
                    let first = batches.first().map(|b| b.token).unwrap_or_default();
                    let action = if id.is_implicit() {
                        FailureAction::Skip
                    } else {
                        self.services.failure.on_delivery_failure(&info, first, &error)
                    };
                    tracing::warn!(queue = %self.queue, %stream, subscription = %id, %error, attempts, ?action, "delivery given up");
                    self.dead_letter(info, batches, error.clone(), attempts, consumer);
                    if action == FailureAction::Fault {
                        self.fault_sub(&stream, id, format!("delivery failed after {attempts} attempts: {error}"));
                        return;
                    }
                }
                Attempted::Revoked => {}
            }
        }
        self.dispatch(&stream, id);
        // Progress may free queue capacity (acks) and cache room: pump now
        // (coalesced: at most one pump is arranged or in flight).
        self.pump.empty_reads = 0;
        self.schedule_pump(Duration::ZERO);
    }

    /// A rewind read for a catching-up subscription came back. The first
    /// answer also settles a strict attach: served, or refused clearly.
    pub(crate) fn on_rewind(&mut self, rewind: super::pump::RewindResult) {
        let super::pump::RewindResult { stream, id, epoch, result } = rewind;
        let Some(sub) = self.streams.get_mut(&stream).and_then(|e| e.subs.get_mut(&id)) else { return };
        let Some(catch_up) = sub.catch_up.as_mut().filter(|c| c.epoch == epoch) else {
            // An answer for a catch-up that was replaced meanwhile.
            return;
        };
        catch_up.requested = false;
        match result {
            Ok(batches) => {
                match batches.last().map(|b| b.token) {
                    None => catch_up.exhausted = true,
                    Some(newest) => {
                        let (from, until) = (catch_up.next, catch_up.until);
                        let mine =
                            batches.into_iter().filter(|b| b.stream == stream && b.token >= from && b.token <= until);
                        catch_up.buffer.extend(mine);
                        catch_up.next = successor(newest);
                        catch_up.exhausted = newest >= until;
                    }
                }
                let start = sub.start;
                for reply in sub.attach_replies.drain(..) {
                    let _ = reply.send(Ok(start));
                }
            }
            Err(error) if error.is_transient() => {
                // Ask again later; meanwhile nothing else asks.
                tracing::warn!(queue = %self.queue, %stream, subscription = %id, %error, "catch-up read failed; retrying");
                catch_up.requested = true;
                catch_up.retries += 1;
                let wait = self.services.options.reader_backoff.delay(catch_up.retries - 1);
                self.send_self_after(wait, move || InternalMsg::RewindDue { stream, id, epoch });
                return;
            }
            Err(error) => {
                self.metrics.cache_misses.increment(1);
                if !sub.attach_replies.is_empty() {
                    let refusal = super::AttachError::CannotStart {
                        id,
                        requested: format!("{:?}", sub.start),
                        reason: error.to_string(),
                    };
                    self.remove_sub(&stream, id, refusal);
                    return;
                }
                let reason = format!("events from {} on may be missing: {error}", catch_up.next);
                tracing::warn!(queue = %self.queue, %stream, subscription = %id, %reason, "catch-up from the queue failed; continuing from the cache");
                sub.catch_up = None;
                self.tell(&stream, id, reason);
            }
        }
        self.dispatch(&stream, id);
    }

    /// A delayed rewind is due: ask again (unless the catch-up changed).
    pub(crate) fn on_rewind_due(&mut self, stream: StreamId, id: SubscriptionId, epoch: u64) {
        let catch_up =
            self.streams.get_mut(&stream).and_then(|e| e.subs.get_mut(&id)).and_then(|s| s.catch_up.as_mut());
        if let Some(catch_up) = catch_up.filter(|c| c.epoch == epoch) {
            catch_up.requested = false;
            self.dispatch(&stream, id);
        }
    }

    /// Tells a subscription's consumer about a problem it should know of.
    pub(crate) fn tell(&mut self, stream: &StreamId, id: SubscriptionId, error: String) {
        let Some(sub) = self.streams.get(stream).and_then(|e| e.subs.get(&id)) else { return };
        let (Some(consumer), info) = (sub.consumer.clone(), sub.info.clone()) else { return };
        let timeout = self.services.options.delivery_attempt_timeout;
        self.spawn_work(
            async move {
                let _ = tokio::time::timeout(timeout, consumer.on_error(&info, &error)).await;
                InternalMsg::SideWorkDone
            },
            |_| InternalMsg::SideWorkDone,
        );
    }

    /// Sends given-up batches to the dead-letter sink and tells the consumer.
    fn dead_letter(
        &mut self,
        info: SubscriptionInfo,
        batches: Vec<Arc<BatchContainer>>,
        error: String,
        attempts: u32,
        consumer: Option<Arc<dyn StreamConsumer>>,
    ) {
        self.metrics.dead_letters.increment(batches.len() as u64);
        let sink = self.services.dead_letters.clone();
        let timeout = self.services.options.delivery_attempt_timeout;
        self.spawn_work(
            async move {
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
                        Err(_) => tracing::error!(stream = %info.stream, token = %batch.token, "the dead-letter sink did not answer"),
                    }
                }
                if let Some(consumer) = consumer {
                    let _ = tokio::time::timeout(timeout, consumer.on_error(&info, &error)).await;
                }
                InternalMsg::SideWorkDone
            },
            |_| InternalMsg::SideWorkDone,
        );
    }
}
