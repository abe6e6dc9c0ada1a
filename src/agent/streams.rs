//! The stream table: which streams the agent tracks and who receives each.
//! It owns registration (the store lookup when a stream is first seen),
//! attach and detach, applying handshake answers, placing each
//! subscription's cursor, catch-up requests and their answers, and
//! forgetting idle streams.
//!
//! Its methods change the table and the cache's cursors only; everything
//! that waits or reaches outside comes back as [`Next`] steps for the agent
//! to carry out, in order.

mod handshake;
mod rewind;
mod subs;

use std::collections::VecDeque;
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
use crate::queue::QueueError;
use crate::retry::Backoff;
use crate::stream::{BatchContainer, QueueId, StreamId};
use subs::Subs;

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
    subs: Subs,
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
            subs: Subs::default(),
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
        tracing::debug!(%stream, stored = ?records.iter().map(|r| (r.id.to_string(), &r.state)).collect::<Vec<_>>(), "stream registered: its subscriptions looked up");
        for record in records {
            if record.state == SubscriptionState::Active {
                entry.subs.get_or_insert_with(record.id, || Sub::explicit(&record, false));
            }
        }
        for factory in implicit.for_stream(&stream) {
            let id = SubscriptionId::implicit(factory.name(), &stream);
            entry.subs.get_or_insert_with(id, || Sub::implicit(id, &stream, factory.create(&stream)));
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
        let sub = entry.subs.get_or_insert_with(subscription.id, || Sub::explicit(&subscription, strict));
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
}

/// The streams of `batch` in first-appearance order, with their event counts.
pub(crate) fn appearance(batch: &[Arc<BatchContainer>]) -> Vec<(StreamId, usize)> {
    // Where each stream is in `order` (a read holds up to a bucket of
    // containers of as many streams: a search of `order` for each was
    // quadratic). Sized for a stream per container: growing it rehashed.
    let mut order: Vec<(StreamId, usize)> = Vec::with_capacity(batch.len());
    let mut at: HashMap<&StreamId, usize> = HashMap::with_capacity_and_hasher(batch.len(), Default::default());
    for container in batch {
        match at.get(&container.stream) {
            Some(&i) => order[i].1 += container.events.len(),
            None => {
                at.insert(&container.stream, order.len());
                order.push((container.stream.clone(), container.events.len()));
            }
        }
    }
    order
}
