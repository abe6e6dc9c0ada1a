//! Who receives each stream: registration (the store lookup when a stream is
//! first seen), attach and detach of explicit subscriptions, the handshake,
//! and placing each subscription's cursor.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use ractor::RpcReplyPort;
use tokio_util::sync::CancellationToken;

use super::AttachError;
use super::delivery::{Attempted, RetryLimits, call_with_retries};
use super::state::{Agent, CatchUp, InternalMsg, StreamEntry, Sub};
use crate::failure::FailureAction;
use crate::pubsub::{
    ConsumerError, PubSubError, PubSubStore, StartPosition, StreamConsumer, Subscription, SubscriptionId,
    SubscriptionInfo, SubscriptionState,
};
use crate::retry::Backoff;
use crate::stream::{SequenceToken, StreamId};

impl Agent {
    /// A stream seen for the first time: pin its containers and look up its
    /// subscriptions. Reading goes on meanwhile (no head-of-line blocking).
    pub(crate) fn register_stream(&mut self, stream: StreamId) {
        let pin = self.cache.pin_stream(&stream);
        self.streams.insert(
            stream.clone(),
            StreamEntry {
                subs: BTreeMap::new(),
                registration_pin: Some(pin),
                registered: false,
                last_activity: self.clock,
            },
        );
        self.look_up_subscriptions(stream, Duration::ZERO);
    }

    /// Looks the stream's subscriptions up in the store (after `delay`),
    /// with retries.
    fn look_up_subscriptions(&mut self, stream: StreamId, delay: Duration) {
        let store = self.services.store.clone();
        let backoff = self.services.options.delivery_backoff;
        let attempt_timeout = self.services.options.delivery_attempt_timeout;
        let stop = self.stop_retries.clone();
        let (s1, s2) = (stream.clone(), stream);
        self.spawn_work(
            async move {
                tokio::time::sleep(delay).await;
                let result = lookup_with_retries(store.as_ref(), &s1, backoff, attempt_timeout, &stop).await;
                InternalMsg::Registered { stream: s1, result }
            },
            move |panic| InternalMsg::Registered {
                stream: s2,
                result: Err(PubSubError::Store(format!("lookup panicked: {panic}"))),
            },
        );
    }

    pub(crate) fn on_registered(&mut self, stream: StreamId, result: Result<Vec<Subscription>, PubSubError>) {
        self.work -= 1;
        if self.shutdown.is_some() {
            // Admission is closed; the pin keeps these containers unacked.
            return;
        }
        let Some(entry) = self.streams.get_mut(&stream) else {
            return;
        };
        let records = match result {
            Ok(records) => records,
            Err(error) => {
                // The pin keeps the stream's containers; look again.
                tracing::warn!(queue = %self.queue, %stream, %error, "subscription lookup failed; looking again");
                let delay = self.services.options.delivery_backoff.delay(0);
                self.look_up_subscriptions(stream, delay);
                return;
            }
        };
        entry.registered = true;
        for record in records {
            if record.state == SubscriptionState::Active && !entry.subs.contains_key(&record.id) {
                entry.subs.insert(record.id, Sub::explicit(&record, false));
            }
        }
        for factory in self.services.implicit.for_stream(&stream) {
            let id = SubscriptionId::implicit(factory.name(), &stream);
            entry.subs.entry(id).or_insert_with(|| Sub::implicit(id, &stream, factory.create(&stream)));
        }
        let waiting: Vec<SubscriptionId> =
            entry.subs.iter().filter(|(_, sub)| sub.cursor.is_none() && !sub.handshaking).map(|(id, _)| *id).collect();
        let unsubscribed = entry.subs.is_empty();
        let pin = entry.registration_pin.take();
        for id in waiting {
            self.start_handshake(&stream, id);
        }
        if let Some(pin) = pin {
            self.cache.remove_cursor(pin);
        }
        if unsubscribed {
            self.count_unsubscribed(self.cache.stream_events(&stream));
        }
    }

    /// Attaches an explicit subscription (new, or re-attached to resume).
    pub(crate) fn attach(
        &mut self,
        subscription: Subscription,
        reply: RpcReplyPort<Result<StartPosition, AttachError>>,
    ) {
        if self.shutdown.is_some() {
            let _ = reply.send(Err(AttachError::NotServing(self.queue)));
            return;
        }
        let stream = subscription.stream.clone();
        if !self.streams.contains_key(&stream) {
            self.register_stream(stream.clone());
        }
        let Some(entry) = self.streams.get_mut(&stream) else {
            return;
        };
        entry.last_activity = self.clock;
        let strict = matches!(subscription.start, StartPosition::At(_) | StartPosition::After(_));
        let sub = entry.subs.entry(subscription.id).or_insert_with(|| Sub::explicit(&subscription, strict));
        sub.address = Some(subscription.consumer.clone());
        sub.start = subscription.start;
        sub.strict_start = strict;
        sub.consumer = None;
        sub.attach_replies.push(reply);
        self.start_handshake(&stream, subscription.id);
    }

    /// Stops serving a subscription (unsubscribe); what it had in flight is
    /// revoked.
    pub(crate) fn detach(&mut self, stream: &StreamId, id: SubscriptionId) {
        self.remove_sub(stream, id, AttachError::Removed(id));
        let drop_stream =
            self.streams.get(stream).is_some_and(|e| e.registered && e.subs.is_empty() && e.registration_pin.is_none());
        if drop_stream {
            self.streams.remove(stream);
        }
    }

    /// Asks the consumer where to continue. The newest handshake wins: it
    /// revokes the subscription's in-flight work, and older answers are
    /// ignored.
    pub(crate) fn start_handshake(&mut self, stream: &StreamId, id: SubscriptionId) {
        if self.shutdown.is_some() {
            return;
        }
        let pin_needed =
            self.streams.get(stream).and_then(|e| e.subs.get(&id)).is_some_and(|s| s.handshake_pin.is_none());
        let pin = pin_needed.then(|| self.cache.pin_stream(stream));
        let Some(sub) = self.streams.get_mut(stream).and_then(|e| e.subs.get_mut(&id)) else {
            if let Some(pin) = pin {
                self.cache.remove_cursor(pin);
            }
            return;
        };
        if pin.is_some() {
            sub.handshake_pin = pin;
        }
        sub.generation += 1;
        sub.handshaking = true;
        sub.revoke.cancel();
        sub.revoke = Arc::new(CancellationToken::new());
        let generation = sub.generation;
        let known = sub.consumer.clone();
        let address = sub.address.clone();
        let info = sub.info.clone();
        let revoke = sub.revoke.clone();
        let resolver = self.services.consumers.clone();
        let limits = RetryLimits::from(&self.services.options);
        let stop = self.stop_retries.clone();
        let (s1, s2) = (stream.clone(), stream.clone());
        self.spawn_work(
            async move {
                let consumer = known.or_else(|| address.as_ref().and_then(|a| resolver.resolve(a)));
                let Some(consumer) = consumer else {
                    let at = address.map(|a| format!("{}/{}", a.node, a.name)).unwrap_or_default();
                    return InternalMsg::HandshakeDone {
                        stream: s1,
                        id,
                        generation,
                        consumer: None,
                        result: Err(ConsumerError::Unavailable(format!("no consumer is registered at {at}"))),
                    };
                };
                let attempted = call_with_retries(|| consumer.handshake(&info), &limits, &stop, &revoke).await;
                let result = match attempted {
                    Attempted::Done(start) => Ok(start),
                    Attempted::Unavailable(reason) => Err(ConsumerError::Unavailable(reason)),
                    Attempted::Failed { error, .. } => Err(ConsumerError::Failed(error)),
                    Attempted::Revoked => Err(ConsumerError::Failed("revoked".into())),
                };
                InternalMsg::HandshakeDone { stream: s1, id, generation, consumer: Some(consumer), result }
            },
            move |panic| InternalMsg::HandshakeDone {
                stream: s2,
                id,
                generation,
                consumer: None,
                result: Err(ConsumerError::Failed(format!("handshake panicked: {panic}"))),
            },
        );
    }

    pub(crate) fn on_handshake_done(
        &mut self,
        stream: StreamId,
        id: SubscriptionId,
        generation: u64,
        consumer: Option<Arc<dyn StreamConsumer>>,
        result: Result<Option<StartPosition>, ConsumerError>,
    ) {
        self.work -= 1;
        let Some(sub) = self.streams.get_mut(&stream).and_then(|e| e.subs.get_mut(&id)) else {
            return;
        };
        if sub.generation != generation {
            return;
        }
        sub.handshaking = false;
        if consumer.is_some() {
            sub.consumer = consumer;
        }
        if self.shutdown.is_some() && result.is_err() {
            // Retries were cut short by the handoff: leave it unresolved (the
            // checkpoint stays put) for the next owner, not to the handler.
            return;
        }
        let start = match result {
            Ok(answer) => answer.unwrap_or(sub.start),
            Err(ConsumerError::Unavailable(reason)) => {
                tracing::warn!(queue = %self.queue, %stream, subscription = %id, %reason, "consumer unavailable; subscription detached");
                self.remove_sub(&stream, id, AttachError::ConsumerUnavailable { id, reason });
                return;
            }
            Err(ConsumerError::Failed(error)) => {
                let action = if id.is_implicit() {
                    FailureAction::Skip
                } else {
                    self.services.failure.on_subscription_failure(&sub.info, &error)
                };
                if action == FailureAction::Fault {
                    self.fault_sub(&stream, id, format!("handshake failed: {error}"));
                    return;
                }
                tracing::warn!(queue = %self.queue, %stream, subscription = %id, %error, "handshake failed; starting at the subscription's own position");
                sub.start
            }
        };
        self.place_cursor(&stream, id, start);
    }

    /// Puts the subscription's cursor at `start`, catching up from the queue
    /// when the cache no longer holds it, then answers waiting attaches and
    /// starts delivering.
    pub(crate) fn place_cursor(&mut self, stream: &StreamId, id: SubscriptionId, start: StartPosition) {
        if start == StartPosition::Latest && !self.read_once {
            // Before the first read the agent cannot say where "now" is in
            // the queue; decide after it.
            self.deferred_latest.push((stream.clone(), id));
            return;
        }
        let rewindable = self.services.adapter.is_rewindable();
        self.catch_up_epoch += 1;
        let epoch = self.catch_up_epoch;
        let Some(sub) = self.streams.get_mut(stream).and_then(|e| e.subs.get_mut(&id)) else { return };
        let placed = match sub.cursor {
            Some(cursor) => self.cache.seek(cursor, start.cursor_start()).map(|()| cursor),
            None => self.cache.create_cursor(stream, start.cursor_start()),
        };
        sub.catch_up = None;
        let cursor = match placed {
            Ok(cursor) => cursor,
            Err(miss) => {
                self.metrics.cache_misses.increment(1);
                if rewindable {
                    let next = match start {
                        StartPosition::After(t) => successor(t),
                        _ => miss.requested,
                    };
                    sub.catch_up = Some(CatchUp {
                        next,
                        until: miss.purged_through,
                        requested: false,
                        exhausted: false,
                        epoch,
                        retries: 0,
                        buffer: VecDeque::new(),
                    });
                } else if sub.strict_start {
                    let reason = crate::queue::QueueError::NotRewindable { requested: miss.requested }.to_string();
                    let error = AttachError::CannotStart { id, requested: format!("{start:?}"), reason };
                    self.remove_sub(stream, id, error);
                    return;
                } else {
                    tracing::warn!(queue = %self.queue, %stream, subscription = %id, requested = %miss.requested, purged_through = %miss.purged_through,
                        "the adapter is not rewindable: resuming at the oldest cached event; events in between may be missed");
                }
                let fallback = if rewindable {
                    crate::cache::CursorStart::After(miss.purged_through)
                } else {
                    crate::cache::CursorStart::Earliest
                };
                let placed = match sub.cursor {
                    Some(cursor) => self.cache.seek(cursor, fallback).map(|()| cursor),
                    None => self.cache.create_cursor(stream, fallback),
                };
                // Neither fallback can miss; keep a waiting cursor regardless.
                placed.unwrap_or_else(|_| self.cache.pin_stream(stream))
            }
        };
        sub.cursor = Some(cursor);
        self.cursor_owner.insert(cursor, (stream.clone(), id));
        if let Some(pin) = sub.handshake_pin.take() {
            self.cache.remove_cursor(pin);
        }
        let concrete = match start {
            StartPosition::Latest => {
                self.cache.last_added().map_or(StartPosition::EarliestAvailable, StartPosition::After)
            }
            other => other,
        };
        sub.start = concrete;
        // A strict start is answered once the queue showed it can serve it
        // (the first rewind read); everything else now.
        if sub.catch_up.is_none() || !sub.strict_start {
            for reply in sub.attach_replies.drain(..) {
                let _ = reply.send(Ok(concrete));
            }
        }
        // Only the start asked for at subscribe time is strict.
        sub.strict_start = false;
        self.dispatch(stream, id);
    }

    /// After the first read: place the cursors that asked for `Latest`.
    pub(crate) fn place_deferred_latest(&mut self) {
        for (stream, id) in std::mem::take(&mut self.deferred_latest) {
            self.place_cursor(&stream, id, StartPosition::Latest);
        }
    }

    /// Drops a subscription from this agent (not from the store): revokes
    /// its work, frees its cursor and pins, answers waiting attaches.
    pub(crate) fn remove_sub(&mut self, stream: &StreamId, id: SubscriptionId, error: AttachError) -> Option<Sub> {
        let mut sub = self.streams.get_mut(stream)?.subs.remove(&id)?;
        sub.revoke.cancel();
        for cursor in sub.cursor.take().into_iter().chain(sub.handshake_pin.take()) {
            self.cache.remove_cursor(cursor);
            self.cursor_owner.remove(&cursor);
        }
        for reply in sub.attach_replies.drain(..) {
            let _ = reply.send(Err(error.clone()));
        }
        Some(sub)
    }

    /// The failure handler faulted a subscription: it is marked in the store,
    /// told why, and gets no more events.
    pub(crate) fn fault_sub(&mut self, stream: &StreamId, id: SubscriptionId, reason: String) {
        tracing::warn!(queue = %self.queue, %stream, subscription = %id, %reason, "subscription faulted");
        let Some(sub) = self.remove_sub(stream, id, AttachError::Faulted { id, reason: reason.clone() }) else {
            return;
        };
        let store = self.services.store.clone();
        let timeout = self.services.options.delivery_attempt_timeout;
        let (stream, info, consumer) = (stream.clone(), sub.info, sub.consumer);
        self.spawn_work(
            async move {
                match tokio::time::timeout(timeout, store.fault(&stream, id, &reason)).await {
                    Ok(Ok(())) => {}
                    Ok(Err(error)) => {
                        tracing::error!(%stream, subscription = %id, %error, "could not mark the subscription faulted")
                    }
                    Err(_) => {
                        tracing::error!(%stream, subscription = %id, "the pub-sub store did not answer the fault")
                    }
                }
                if let Some(consumer) = consumer {
                    let _ = tokio::time::timeout(
                        timeout,
                        consumer.on_error(&info, &format!("subscription faulted: {reason}")),
                    )
                    .await;
                }
                InternalMsg::SideWorkDone
            },
            |_| InternalMsg::SideWorkDone,
        );
    }

    /// Forgets a stream: every subscription's cursor and the pins go.
    pub(crate) fn forget_stream(&mut self, stream: &StreamId) {
        let ids: Vec<SubscriptionId> =
            self.streams.get(stream).map(|e| e.subs.keys().copied().collect()).unwrap_or_default();
        for id in ids {
            self.remove_sub(stream, id, AttachError::NotServing(self.queue));
        }
        if let Some(pin) = self.streams.remove(stream).and_then(|e| e.registration_pin) {
            self.cache.remove_cursor(pin);
        }
    }
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
            in_flight: None,
            revoke: Arc::new(CancellationToken::new()),
            catch_up: None,
            attach_replies: Vec::new(),
        }
    }

    fn explicit(record: &Subscription, strict_start: bool) -> Self {
        let info = SubscriptionInfo { id: record.id, stream: record.stream.clone() };
        Self { address: Some(record.consumer.clone()), strict_start, ..Self::new(info, record.start) }
    }

    fn implicit(id: SubscriptionId, stream: &StreamId, consumer: Arc<dyn StreamConsumer>) -> Self {
        let info = SubscriptionInfo { id, stream: stream.clone() };
        Self { consumer: Some(consumer), ..Self::new(info, StartPosition::EarliestAvailable) }
    }
}

/// The token just after `t`.
pub(crate) fn successor(t: SequenceToken) -> SequenceToken {
    match t.minor.checked_add(1) {
        Some(minor) => SequenceToken::new(t.major, minor),
        None => SequenceToken::new(t.major.saturating_add(1), 0),
    }
}

async fn lookup_with_retries(
    store: &dyn PubSubStore,
    stream: &StreamId,
    backoff: Backoff,
    attempt_timeout: Duration,
    stop: &CancellationToken,
) -> Result<Vec<Subscription>, PubSubError> {
    let mut attempt = 0;
    loop {
        let error = match tokio::time::timeout(attempt_timeout, store.subscriptions(stream)).await {
            Ok(Ok(subs)) => return Ok(subs),
            Ok(Err(error)) => error,
            Err(_) => PubSubError::Store(format!("no answer within {attempt_timeout:?}")),
        };
        if stop.is_cancelled() {
            return Err(error);
        }
        let wait: Duration = backoff.delay(attempt);
        tracing::warn!(%stream, %error, ?wait, "pub-sub lookup failed; retrying");
        attempt += 1;
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = stop.cancelled() => return Err(error),
        }
    }
}
