//! Handshakes and cursor placement: a new subscription's consumer is asked
//! where to start (the newest handshake wins), and its cursor is placed in
//! the cache there, or, on a miss, a rewind is asked for.

use super::*;
use crate::cache::CursorPosition;

impl Streams {
    /// Pins the stream until the subscription's cursor is placed, and asks
    /// its consumer where to continue.
    pub(super) fn start_handshake(
        &mut self,
        stream: &StreamId,
        id: SubscriptionId,
        cache: &mut QueueCache,
        next: &mut Vec<Next>,
    ) {
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
                sub.gap =
                    Some(format!("the handshake failed ({error}): delivery starts at the subscription's own position"));
                sub.start
            }
        };
        tracing::debug!(%stream, subscription = %id, ?start, "handshake answered");
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
    pub(super) fn place_cursor(
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
                    let error = AttachError::CannotStart { id, requested: format!("{start:?}"), reason, oldest: None };
                    self.remove_sub(stream, id, error, cache);
                    return;
                } else {
                    tracing::warn!(%stream, subscription = %id, requested = %miss.requested, purged_through = %miss.purged_through,
                        "the adapter is not rewindable: resuming at the oldest cached event; events in between may be missed");
                    sub.gap = Some(format!(
                        "the adapter is not rewindable: events from {} through {} may be missing",
                        miss.requested, miss.purged_through
                    ));
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
        // The start made concrete, as the subscription's record keeps it: a
        // consumer that was detached before its first delivery is served
        // anew from here, never from a later agent's checkpoint.
        let concrete = match start {
            StartPosition::Latest => cache.last_added().map_or(StartPosition::EarliestAvailable, StartPosition::After),
            StartPosition::EarliestAvailable => match cache.cursor_position(cursor) {
                Some(CursorPosition::Next(token)) => StartPosition::At(token),
                Some(CursorPosition::CaughtUp(Some(token))) => StartPosition::After(token),
                _ => StartPosition::EarliestAvailable,
            },
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
}
