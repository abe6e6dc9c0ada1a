//! The cache's cursors: one per subscription, created at a start
//! position (or pinning a stream while a handshake is pending), stepping
//! forward through their stream's containers, completed (the container is
//! done with, or failed) and removed. A cursor that caught up waits with
//! the token it last saw; [`QueueCache::add`] re-seats it.

use std::sync::Arc;

use super::{CacheMiss, Cursor, CursorId, CursorPosition, CursorStart, CursorState, QueueCache, predecessor};
use crate::stream::{BatchContainer, StreamId};

impl QueueCache {
    /// Holds every container of `stream` cached now or added later until
    /// the pin is removed with [`Self::remove_cursor`] (a pending
    /// registration or handshake must not lose what arrives meanwhile). A
    /// pin is a cursor that never advances.
    pub(crate) fn pin_stream(&mut self, stream: &StreamId) -> CursorId {
        let state = match self.span(stream) {
            Some(span) => CursorState::At(span.first),
            None => CursorState::Waiting { after: None },
        };
        self.insert_cursor(stream, state)
    }

    /// Creates a cursor for `stream`.
    pub(crate) fn create_cursor(&mut self, stream: &StreamId, start: CursorStart) -> Result<CursorId, CacheMiss> {
        let state = self.locate(stream, start)?;
        Ok(self.insert_cursor(stream, state))
    }

    pub(super) fn insert_cursor(&mut self, stream: &StreamId, state: CursorState) -> CursorId {
        let id = CursorId(self.fresh_id());
        let index = self.index.entry(stream.clone()).or_default();
        index.cursors += 1;
        match state {
            CursorState::At(pos) => self.pin(pos),
            CursorState::Waiting { .. } => index.waiting.push(id),
        }
        self.cursors.insert(id, Cursor { stream: stream.clone(), state, in_flight_last: None });
        id
    }

    /// Re-seats a cursor (a handshake or a consumer's seek). Drops its
    /// in-flight batch, if any.
    pub(crate) fn seek(&mut self, cursor: CursorId, start: CursorStart) -> Result<(), CacheMiss> {
        let Some(stream) = self.cursors.get(&cursor).map(|c| c.stream.clone()) else {
            return Ok(());
        };
        let state = self.locate(&stream, start)?;
        if let Some(c) = self.cursors.get_mut(&cursor) {
            c.in_flight_last = None;
        }
        self.set_state(cursor, state);
        Ok(())
    }

    /// Removes a cursor; what it pinned may be purged.
    pub(crate) fn remove_cursor(&mut self, cursor: CursorId) {
        let Some(c) = self.cursors.remove(&cursor) else {
            return;
        };
        if let CursorState::At(pos) = c.state {
            self.unpin(pos);
        }
        if let Some(index) = self.index.get_mut(&c.stream) {
            index.waiting.retain(|w| *w != cursor);
            index.cursors -= 1;
            if index.span.is_none() && index.cursors == 0 {
                self.index.remove(&c.stream);
            }
        }
    }

    /// Whether the cursor has a container to deliver and none in flight.
    pub(crate) fn has_next(&self, cursor: CursorId) -> bool {
        self.cursors.get(&cursor).is_some_and(|c| c.in_flight_last.is_none() && matches!(c.state, CursorState::At(_)))
    }

    /// Takes the cursor's next batch (up to `max` containers of its stream)
    /// and marks it in flight; the cursor stays on its first container until
    /// [`Self::complete`]. `None` if caught up or a batch is in flight.
    pub(crate) fn next_batch(&mut self, cursor: CursorId, max: usize) -> Option<Vec<Arc<BatchContainer>>> {
        let c = self.cursors.get(&cursor)?;
        let CursorState::At(mut pos) = c.state else {
            return None;
        };
        if c.in_flight_last.is_some() {
            return None;
        }
        let mut batch = Vec::with_capacity(max.clamp(1, 64));
        let mut last = pos;
        while batch.len() < max.max(1) {
            let Some(item) = self.item(pos) else { break };
            batch.push(item.batch.clone());
            last = pos;
            match item.next_in_stream {
                Some(next) => pos = next,
                None => break,
            }
        }
        if batch.is_empty() {
            return None;
        }
        if let Some(c) = self.cursors.get_mut(&cursor) {
            c.in_flight_last = Some(last);
        }
        Some(batch)
    }

    /// The in-flight batch is finished: moves the cursor past it. With
    /// `failed`, its containers are flagged so purge does not ack them.
    /// Returns whether the cursor has more to deliver.
    pub(crate) fn complete(&mut self, cursor: CursorId, failed: bool) -> bool {
        let Some(c) = self.cursors.get_mut(&cursor) else {
            return false;
        };
        let (CursorState::At(first), Some(last)) = (c.state, c.in_flight_last.take()) else {
            return false;
        };
        if failed {
            let mut pos = Some(first);
            while let Some(p) = pos.filter(|p| *p <= last) {
                let item = self.item_mut(p);
                pos = item.as_ref().and_then(|i| i.next_in_stream);
                if let Some(item) = item {
                    item.failed = true;
                }
            }
        }
        let next = match self.item(last) {
            Some(item) => match item.next_in_stream {
                Some(next) => CursorState::At(next),
                None => CursorState::Waiting { after: Some(item.batch.token) },
            },
            None => CursorState::Waiting { after: None },
        };
        self.set_state(cursor, next);
        matches!(next, CursorState::At(_))
    }

    /// Events of `stream` cached now.
    pub(crate) fn stream_events(&self, stream: &StreamId) -> usize {
        let mut total = 0;
        let mut pos = self.span(stream).map(|s| s.first);
        while let Some(item) = pos.and_then(|p| self.item(p)) {
            total += item.batch.events.len();
            pos = item.next_in_stream;
        }
        total
    }

    /// Forgets the in-flight batch without moving the cursor: its containers
    /// stay needed (a delivery abandoned while handing the queue over).
    pub(crate) fn abandon(&mut self, cursor: CursorId) {
        if let Some(c) = self.cursors.get_mut(&cursor) {
            c.in_flight_last = None;
        }
    }

    /// The token of the container the cursor will deliver next, or the last
    /// token it saw when caught up.
    pub(crate) fn cursor_position(&self, cursor: CursorId) -> Option<CursorPosition> {
        let c = self.cursors.get(&cursor)?;
        Some(match c.state {
            CursorState::At(pos) => CursorPosition::Next(self.item(pos)?.batch.token),
            CursorState::Waiting { after } => CursorPosition::CaughtUp(after),
        })
    }

    pub(super) fn locate(&self, stream: &StreamId, start: CursorStart) -> Result<CursorState, CacheMiss> {
        // Below this, containers are done: a new cursor asking for them is
        // served from the queue, never from what is left in the cache.
        let floor = self.purged_through.max(self.done_through);
        let (token, inclusive) = match start {
            CursorStart::Latest => return Ok(CursorState::Waiting { after: self.last_added }),
            CursorStart::Earliest => {
                let mut pos = self.span(stream).map(|s| s.first);
                while let Some(p) = pos {
                    let Some(item) = self.item(p) else { break };
                    if floor.is_none_or(|f| item.batch.token > f) {
                        return Ok(CursorState::At(p));
                    }
                    pos = item.next_in_stream;
                }
                return Ok(CursorState::Waiting { after: floor.max(self.last_added) });
            }
            CursorStart::At(t) => (t, true),
            CursorStart::After(t) => (t, false),
        };
        if let Some(floor) = floor {
            let missed = if inclusive { token <= floor } else { token < floor };
            if missed {
                return Err(CacheMiss { requested: token, purged_through: floor });
            }
        }
        let mut pos = self.span(stream).map(|s| s.first);
        while let Some(p) = pos {
            let Some(item) = self.item(p) else { break };
            let wanted = if inclusive { item.batch.token >= token } else { item.batch.token > token };
            if wanted {
                return Ok(CursorState::At(p));
            }
            pos = item.next_in_stream;
        }
        // Nothing cached at or after the token: wait for newer containers.
        let after = if inclusive { predecessor(token).max(self.last_added) } else { Some(token).max(self.last_added) };
        Ok(CursorState::Waiting { after })
    }

    pub(super) fn set_state(&mut self, id: CursorId, state: CursorState) {
        let Some(cursor) = self.cursors.get_mut(&id) else {
            return;
        };
        let old = std::mem::replace(&mut cursor.state, state);
        match (old, state) {
            (CursorState::Waiting { .. }, CursorState::At(_)) => {
                if let Some(index) = self.index.get_mut(&cursor.stream) {
                    index.waiting.retain(|w| *w != id);
                }
            }
            (CursorState::At(_), CursorState::Waiting { .. }) => {
                if let Some(index) = self.index.get_mut(&cursor.stream) {
                    index.waiting.push(id);
                }
            }
            _ => {}
        }
        if let CursorState::At(pos) = old {
            self.unpin(pos);
        }
        if let CursorState::At(pos) = state {
            self.pin(pos);
        }
    }
}
