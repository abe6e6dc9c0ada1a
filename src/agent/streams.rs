//! The stream table: which streams the agent tracks and who receives each.
//! It owns registration (the store lookup when a stream is first seen),
//! attach and detach, applying handshake answers, placing each
//! subscription's cursor, catch-up requests and their answers, and
//! forgetting idle streams.
//!
//! Its methods change the table and the cache's cursors only; everything
//! that waits or reaches outside comes back as [`Next`] steps for the agent
//! to carry out, in order.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use ractor::RpcReplyPort;
use rustc_hash::FxHashMap as HashMap;
use tokio::time::Instant;

use super::lookup::Registered;
use super::pump::{RewindJob, RewindResult};
use super::settings::AgentOptions;
use super::subscription::{AttachError, CatchUp, Faulted, HandshakeCall, Handshaken, Rewound, Sub, successor};
use crate::cache::{CursorId, CursorStart, QueueCache};
use crate::failure::{FailureAction, FailureHandler};
use crate::pubsub::{
    ConsumerError, ImplicitSubscriptions, StartPosition, StreamConsumer, Subscription, SubscriptionId,
    SubscriptionInfo, SubscriptionState,
};
use crate::queue::{QueueError, QueueId};
use crate::retry::Backoff;
use crate::stream::StreamId;

/// What the agent should do after a change to the table.
pub(crate) enum Next {
    /// Look the stream's subscriptions up in the store after `after`.
    LookUp { stream: StreamId, after: Duration },
    /// Run a handshake.
    Handshake(HandshakeCall),
    /// Deliver the subscription's next batch, if it has one.
    Dispatch(StreamId, SubscriptionId),
    /// Mark a subscription faulted in the store and tell its consumer.
    Fault(Faulted),
    /// Tell a consumer about a problem it should know of.
    Tell { consumer: Arc<dyn StreamConsumer>, info: SubscriptionInfo, error: String },
    /// Ask for a failed catch-up read again after `after`.
    RewindLater { stream: StreamId, id: SubscriptionId, epoch: u64, after: Duration },
    /// Events of a stream nobody subscribes to (counted, then acked).
    Unsubscribed(usize),
    /// A start position the cache no longer held.
    CacheMiss,
}

/// One tracked stream.
struct StreamEntry {
    subs: BTreeMap<SubscriptionId, Sub>,
    /// Holds the stream's containers while its subscriptions are looked up.
    registration_pin: Option<CursorId>,
    registered: bool,
    last_activity: Instant,
}

/// The stream table.
pub(crate) struct Streams {
    entries: HashMap<StreamId, StreamEntry>,
    /// Which subscription owns each cursor.
    cursor_owner: HashMap<CursorId, (StreamId, SubscriptionId)>,
    /// Subscriptions waiting for a rewind read.
    rewinds: VecDeque<(StreamId, SubscriptionId)>,
    /// Whether a read has completed (before it, `Latest` cannot be placed).
    read_once: bool,
    /// Subscriptions that asked for `Latest` before the first read.
    deferred_latest: Vec<(StreamId, SubscriptionId)>,
    /// Numbers catch-ups, so a late rewind answer is not applied to a newer one.
    catch_up_epoch: u64,
    last_cleanup: Instant,
    /// The time as of the last pump: a cheap clock for stream activity.
    clock: Instant,
}

impl Streams {
    pub(crate) fn new() -> Self {
        Self {
            entries: HashMap::default(),
            cursor_owner: HashMap::default(),
            rewinds: VecDeque::new(),
            read_once: false,
            deferred_latest: Vec::new(),
            catch_up_epoch: 0,
            last_cleanup: Instant::now(),
            clock: Instant::now(),
        }
    }

    /// Streams tracked, streams still registering, subscriptions served.
    pub(crate) fn counts(&self) -> (usize, usize, usize) {
        let registering = self.entries.values().filter(|s| !s.registered).count();
        let subscriptions = self.entries.values().map(|s| s.subs.len()).sum();
        (self.entries.len(), registering, subscriptions)
    }

    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether a registration or handshake never resolved (the final
    /// checkpoint then stays where it was).
    pub(crate) fn unresolved(&self) -> bool {
        self.entries.values().any(|e| !e.registered || e.subs.values().any(|s| s.cursor.is_none() || s.handshaking))
    }

    pub(crate) fn sub_mut(&mut self, stream: &StreamId, id: SubscriptionId) -> Option<&mut Sub> {
        self.entries.get_mut(stream).and_then(|e| e.subs.get_mut(&id))
    }

    /// The subscription a delivery finished for; its stream was active now.
    pub(crate) fn touched(&mut self, stream: &StreamId, id: SubscriptionId) -> Option<&mut Sub> {
        let entry = self.entries.get_mut(stream)?;
        entry.last_activity = self.clock;
        entry.subs.get_mut(&id)
    }

    /// The subscription a cursor belongs to.
    pub(crate) fn owner(&self, cursor: CursorId) -> Option<(StreamId, SubscriptionId)> {
        self.cursor_owner.get(&cursor).cloned()
    }

    /// The streams of a read, in first-appearance order with their event
    /// counts: known ones were active; new ones are registered.
    pub(crate) fn saw(&mut self, streams: Vec<(StreamId, usize)>, cache: &mut QueueCache) -> Vec<Next> {
        let mut next = Vec::new();
        for (stream, events) in streams {
            match self.entries.get_mut(&stream) {
                Some(entry) => {
                    entry.last_activity = self.clock;
                    if entry.registered && entry.subs.is_empty() {
                        next.push(Next::Unsubscribed(events));
                    }
                }
                None => self.register(stream, cache, &mut next),
            }
        }
        next
    }

    /// A stream seen for the first time: pin its containers and look up its
    /// subscriptions. Reading goes on meanwhile (no head-of-line blocking).
    fn register(&mut self, stream: StreamId, cache: &mut QueueCache, next: &mut Vec<Next>) {
        let pin = cache.pin_stream(&stream);
        let entry = StreamEntry {
            subs: BTreeMap::new(),
            registration_pin: Some(pin),
            registered: false,
            last_activity: self.clock,
        };
        self.entries.insert(stream.clone(), entry);
        next.push(Next::LookUp { stream, after: Duration::ZERO });
    }

    /// The store answered a lookup: the stream's subscriptions (explicit and
    /// implicit) start their handshakes. Not called once closing (admission
    /// is closed; the pin keeps these containers unacked).
    pub(crate) fn on_registered(
        &mut self,
        registered: Registered,
        cache: &mut QueueCache,
        implicit: &ImplicitSubscriptions,
        backoff: Backoff,
    ) -> Vec<Next> {
        let mut next = Vec::new();
        let Registered { stream, result } = registered;
        let Some(entry) = self.entries.get_mut(&stream) else {
            return next;
        };
        let records = match result {
            Ok(records) => records,
            Err(error) => {
                // The pin keeps the stream's containers; look again.
                tracing::warn!(%stream, %error, "subscription lookup failed; looking again");
                next.push(Next::LookUp { stream, after: backoff.delay(0) });
                return next;
            }
        };
        entry.registered = true;
        for record in records {
            if record.state == SubscriptionState::Active && !entry.subs.contains_key(&record.id) {
                entry.subs.insert(record.id, Sub::explicit(&record, false));
            }
        }
        for factory in implicit.for_stream(&stream) {
            let id = SubscriptionId::implicit(factory.name(), &stream);
            entry.subs.entry(id).or_insert_with(|| Sub::implicit(id, &stream, factory.create(&stream)));
        }
        let waiting: Vec<SubscriptionId> =
            entry.subs.iter().filter(|(_, sub)| sub.cursor.is_none() && !sub.handshaking).map(|(id, _)| *id).collect();
        let unsubscribed = entry.subs.is_empty();
        let pin = entry.registration_pin.take();
        for id in waiting {
            self.start_handshake(&stream, id, cache, &mut next);
        }
        if let Some(pin) = pin {
            cache.remove_cursor(pin);
        }
        if unsubscribed {
            next.push(Next::Unsubscribed(cache.stream_events(&stream)));
        }
        next
    }

    /// Attaches an explicit subscription (new, or re-attached to resume).
    /// Not called once closing.
    pub(crate) fn attach(
        &mut self,
        subscription: Subscription,
        reply: RpcReplyPort<Result<StartPosition, AttachError>>,
        cache: &mut QueueCache,
    ) -> Vec<Next> {
        let mut next = Vec::new();
        let stream = subscription.stream.clone();
        if !self.entries.contains_key(&stream) {
            self.register(stream.clone(), cache, &mut next);
        }
        let Some(entry) = self.entries.get_mut(&stream) else {
            return next;
        };
        entry.last_activity = self.clock;
        let strict = matches!(subscription.start, StartPosition::At(_) | StartPosition::After(_));
        let sub = entry.subs.entry(subscription.id).or_insert_with(|| Sub::explicit(&subscription, strict));
        sub.address = Some(subscription.consumer.clone());
        sub.start = subscription.start;
        sub.strict_start = strict;
        sub.consumer = None;
        sub.attach_replies.push(reply);
        self.start_handshake(&stream, subscription.id, cache, &mut next);
        next
    }

    /// Stops serving a subscription (unsubscribe); what it had in flight is
    /// revoked.
    pub(crate) fn detach(&mut self, stream: &StreamId, id: SubscriptionId, cache: &mut QueueCache) {
        self.remove_sub(stream, id, AttachError::Removed(id), cache);
        let drop_stream =
            self.entries.get(stream).is_some_and(|e| e.registered && e.subs.is_empty() && e.registration_pin.is_none());
        if drop_stream {
            self.entries.remove(stream);
        }
    }

    /// Pins the stream until the subscription's cursor is placed, and asks
    /// its consumer where to continue.
    fn start_handshake(&mut self, stream: &StreamId, id: SubscriptionId, cache: &mut QueueCache, next: &mut Vec<Next>) {
        let pin_needed = self.sub_mut(stream, id).is_some_and(|s| s.handshake_pin.is_none());
        let pin = pin_needed.then(|| cache.pin_stream(stream));
        let Some(sub) = self.sub_mut(stream, id) else {
            if let Some(pin) = pin {
                cache.remove_cursor(pin);
            }
            return;
        };
        if pin.is_some() {
            sub.handshake_pin = pin;
        }
        next.push(Next::Handshake(sub.handshake(stream, id)));
    }

    /// A handshake answered: place the cursor where the consumer asked, or
    /// drop or fault the subscription.
    pub(crate) fn on_handshake_done(
        &mut self,
        done: Handshaken,
        closing: bool,
        cache: &mut QueueCache,
        failure: &dyn FailureHandler,
        rewindable: bool,
    ) -> Vec<Next> {
        let mut next = Vec::new();
        let Handshaken { stream, id, generation, consumer, result } = done;
        let Some(sub) = self.sub_mut(&stream, id) else {
            return next;
        };
        if sub.generation != generation {
            return next;
        }
        sub.handshaking = false;
        if consumer.is_some() {
            sub.consumer = consumer;
        }
        if closing && result.is_err() {
            // Retries were cut short by the handoff: leave it unresolved (the
            // checkpoint stays put) for the next owner, not to the handler.
            return next;
        }
        let start = match result {
            Ok(answer) => answer.unwrap_or(sub.start),
            Err(ConsumerError::Unavailable(reason) | ConsumerError::Fenced(reason)) => {
                tracing::warn!(%stream, subscription = %id, %reason, "consumer unavailable; subscription detached");
                self.remove_sub(&stream, id, AttachError::ConsumerUnavailable { id, reason }, cache);
                return next;
            }
            Err(ConsumerError::Failed(error) | ConsumerError::Unreachable(error)) => {
                let action = if id.is_implicit() {
                    FailureAction::Skip
                } else {
                    failure.on_subscription_failure(&sub.info, &error)
                };
                if action == FailureAction::Fault {
                    self.fault_sub(&stream, id, format!("handshake failed: {error}"), cache, &mut next);
                    return next;
                }
                tracing::warn!(%stream, subscription = %id, %error, "handshake failed; starting at the subscription's own position");
                sub.start
            }
        };
        self.place_cursor(&stream, id, start, cache, rewindable, &mut next);
        next
    }

    /// A delivery asked to continue after `token`.
    pub(crate) fn seek(
        &mut self,
        stream: &StreamId,
        id: SubscriptionId,
        start: StartPosition,
        cache: &mut QueueCache,
        rewindable: bool,
    ) -> Vec<Next> {
        let mut next = Vec::new();
        self.place_cursor(stream, id, start, cache, rewindable, &mut next);
        next
    }

    /// Puts the subscription's cursor at `start`, catching up from the queue
    /// when the cache no longer holds it, then answers waiting attaches and
    /// starts delivering.
    fn place_cursor(
        &mut self,
        stream: &StreamId,
        id: SubscriptionId,
        start: StartPosition,
        cache: &mut QueueCache,
        rewindable: bool,
        next: &mut Vec<Next>,
    ) {
        if start == StartPosition::Latest && !self.read_once {
            // Before the first read the agent cannot say where "now" is in
            // the queue; decide after it.
            self.deferred_latest.push((stream.clone(), id));
            return;
        }
        self.catch_up_epoch += 1;
        let epoch = self.catch_up_epoch;
        let Some(sub) = self.entries.get_mut(stream).and_then(|e| e.subs.get_mut(&id)) else { return };
        let placed = match sub.cursor {
            Some(cursor) => cache.seek(cursor, start.cursor_start()).map(|()| cursor),
            None => cache.create_cursor(stream, start.cursor_start()),
        };
        sub.catch_up = None;
        let cursor = match placed {
            Ok(cursor) => cursor,
            Err(miss) => {
                next.push(Next::CacheMiss);
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
                    let reason = QueueError::NotRewindable { requested: miss.requested }.to_string();
                    let error = AttachError::CannotStart { id, requested: format!("{start:?}"), reason };
                    self.remove_sub(stream, id, error, cache);
                    return;
                } else {
                    tracing::warn!(%stream, subscription = %id, requested = %miss.requested, purged_through = %miss.purged_through,
                        "the adapter is not rewindable: resuming at the oldest cached event; events in between may be missed");
                }
                let fallback = if rewindable { CursorStart::After(miss.purged_through) } else { CursorStart::Earliest };
                let placed = match sub.cursor {
                    Some(cursor) => cache.seek(cursor, fallback).map(|()| cursor),
                    None => cache.create_cursor(stream, fallback),
                };
                // Neither fallback can miss; keep a waiting cursor regardless.
                placed.unwrap_or_else(|_| cache.pin_stream(stream))
            }
        };
        sub.cursor = Some(cursor);
        self.cursor_owner.insert(cursor, (stream.clone(), id));
        if let Some(pin) = sub.handshake_pin.take() {
            cache.remove_cursor(pin);
        }
        let concrete = match start {
            StartPosition::Latest => cache.last_added().map_or(StartPosition::EarliestAvailable, StartPosition::After),
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
        next.push(Next::Dispatch(stream.clone(), id));
    }

    /// A read completed. After the first, the cursors that asked for
    /// `Latest` are placed.
    pub(crate) fn read_completed(&mut self, cache: &mut QueueCache, rewindable: bool) -> Vec<Next> {
        let mut next = Vec::new();
        if !self.read_once {
            self.read_once = true;
            for (stream, id) in std::mem::take(&mut self.deferred_latest) {
                self.place_cursor(&stream, id, StartPosition::Latest, cache, rewindable, &mut next);
            }
        }
        next
    }

    /// Drops a subscription from this agent (not from the store): revokes
    /// its work, frees its cursor and pins, answers waiting attaches.
    pub(crate) fn remove_sub(
        &mut self,
        stream: &StreamId,
        id: SubscriptionId,
        error: AttachError,
        cache: &mut QueueCache,
    ) -> Option<Sub> {
        let mut sub = self.entries.get_mut(stream)?.subs.remove(&id)?;
        sub.revoke.cancel();
        for cursor in sub.cursor.take().into_iter().chain(sub.handshake_pin.take()) {
            cache.remove_cursor(cursor);
            self.cursor_owner.remove(&cursor);
        }
        for reply in sub.attach_replies.drain(..) {
            let _ = reply.send(Err(error.clone()));
        }
        Some(sub)
    }

    /// The failure handler faulted a subscription: it is marked in the store,
    /// told why, and gets no more events.
    pub(crate) fn fault(
        &mut self,
        stream: &StreamId,
        id: SubscriptionId,
        reason: String,
        cache: &mut QueueCache,
    ) -> Vec<Next> {
        let mut next = Vec::new();
        self.fault_sub(stream, id, reason, cache, &mut next);
        next
    }

    fn fault_sub(
        &mut self,
        stream: &StreamId,
        id: SubscriptionId,
        reason: String,
        cache: &mut QueueCache,
        next: &mut Vec<Next>,
    ) {
        tracing::warn!(%stream, subscription = %id, %reason, "subscription faulted");
        let refusal = AttachError::Faulted { id, reason: reason.clone() };
        let Some(sub) = self.remove_sub(stream, id, refusal, cache) else {
            return;
        };
        next.push(Next::Fault(Faulted::new(stream.clone(), id, reason, sub)));
    }

    /// Forgets streams idle for the inactivity period (or any idle stream
    /// when over `max_streams`): registered, nothing of it cached (so its
    /// next container is the first a new cursor sees), every subscription
    /// idle. Their subscriptions are found again, with a
    /// handshake, on their next event. `now` becomes the table's clock.
    pub(crate) fn clean_up(&mut self, now: Instant, cache: &mut QueueCache, options: &AgentOptions, queue: QueueId) {
        self.clock = now;
        let period = options.stream_inactivity;
        let crowded = self.entries.len() >= options.max_streams;
        let every = if crowded { options.poll_period } else { period / 10 };
        if now.saturating_duration_since(self.last_cleanup) < every {
            return;
        }
        self.last_cleanup = now;
        let threshold = if crowded { Duration::ZERO } else { period };
        let idle: Vec<StreamId> = self
            .entries
            .iter()
            .filter(|(stream, entry)| {
                now.saturating_duration_since(entry.last_activity) >= threshold
                    && entry.registered
                    && !cache.holds(stream)
                    && entry.subs.values().all(|sub| sub.is_idle(cache))
            })
            .map(|(stream, _)| stream.clone())
            .collect();
        for stream in idle {
            tracing::debug!(%stream, "stream inactive; forgetting it until its next event");
            self.forget_stream(&stream, cache, queue);
        }
    }

    /// Forgets a stream: every subscription's cursor and the pins go.
    fn forget_stream(&mut self, stream: &StreamId, cache: &mut QueueCache, queue: QueueId) {
        let ids: Vec<SubscriptionId> =
            self.entries.get(stream).map(|e| e.subs.keys().copied().collect()).unwrap_or_default();
        for id in ids {
            self.remove_sub(stream, id, AttachError::NotServing(queue), cache);
        }
        if let Some(pin) = self.entries.remove(stream).and_then(|e| e.registration_pin) {
            cache.remove_cursor(pin);
        }
    }

    /// A catching-up subscription needs a rewind read (by the next pump).
    pub(crate) fn request_rewind(&mut self, stream: StreamId, id: SubscriptionId) {
        self.rewinds.push_back((stream, id));
    }

    pub(crate) fn rewinds_waiting(&self) -> bool {
        !self.rewinds.is_empty()
    }

    /// The rewind reads of the next pump: at most `most`, each up to `room`.
    pub(crate) fn take_rewinds(&mut self, most: usize, room: usize) -> Vec<RewindJob> {
        let mut jobs = Vec::new();
        while jobs.len() < most {
            let Some((stream, id)) = self.rewinds.pop_front() else {
                break;
            };
            let catch_up = self.sub_mut(&stream, id).and_then(|s| s.catch_up.as_ref());
            if let Some(catch_up) = catch_up {
                let (from, epoch) = (catch_up.next, catch_up.epoch);
                jobs.push(RewindJob { stream, id, epoch, from, max: room });
            }
        }
        jobs
    }

    /// A rewind read for a catching-up subscription came back. The first
    /// answer also settles a strict attach: served, or refused clearly.
    pub(crate) fn on_rewind(
        &mut self,
        rewind: RewindResult,
        cache: &mut QueueCache,
        reader_backoff: Backoff,
    ) -> Vec<Next> {
        let mut next = Vec::new();
        let RewindResult { stream, id, epoch, result } = rewind;
        let Some(sub) = self.sub_mut(&stream, id) else { return next };
        match sub.rewound(&stream, epoch, result, reader_backoff) {
            Rewound::Stale => return next,
            Rewound::Retry { after } => {
                next.push(Next::RewindLater { stream, id, epoch, after });
                return next;
            }
            Rewound::Served => {}
            Rewound::Refused(reason) => {
                next.push(Next::CacheMiss);
                let refusal = AttachError::CannotStart { id, requested: format!("{:?}", sub.start), reason };
                self.remove_sub(&stream, id, refusal, cache);
                return next;
            }
            Rewound::Lost(reason) => {
                next.push(Next::CacheMiss);
                if let Some(consumer) = sub.consumer.clone() {
                    next.push(Next::Tell { consumer, info: sub.info.clone(), error: reason });
                }
            }
        }
        next.push(Next::Dispatch(stream, id));
        next
    }

    /// A delayed rewind is due: ask again (unless the catch-up changed).
    pub(crate) fn on_rewind_due(&mut self, stream: StreamId, id: SubscriptionId, epoch: u64) -> Vec<Next> {
        let catch_up = self.sub_mut(&stream, id).and_then(|s| s.catch_up.as_mut());
        match catch_up.filter(|c| c.epoch == epoch) {
            Some(catch_up) => {
                catch_up.requested = false;
                vec![Next::Dispatch(stream, id)]
            }
            None => Vec::new(),
        }
    }
}
