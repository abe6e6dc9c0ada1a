//! The queue cache: what a pulling agent has read and not yet finished with,
//! plus one cursor per subscription.
//!
//! Orleans' `SimpleQueueCache` semantics, kept exactly where they matter:
//! - bounded: at most `cache_size` containers, held in buckets of
//!   `max(cache_size / buckets, 1)`; the agent reads at most one bucket's worth
//!   at a time ([`QueueCache::max_add_count`]);
//! - **pressure**: with `buckets` (10) or more buckets alive, or when one more
//!   read of [`QueueCache::max_add_count`] would not fit in `cache_size`, the
//!   cache is under pressure and the agent stops reading (it never drops);
//! - **purge** drains whole buckets from the oldest end, and only those that no
//!   cursor or pin points into; drained containers are returned for the ack,
//!   except those whose delivery failed, which are returned apart;
//! - cursors only move forward, one subscription each.
//!
//! Beyond Orleans: each container links to the next container of its stream,
//! so a cursor steps over other streams in O(1); a cursor that has caught up
//! waits with the token it last saw and is re-seated by [`QueueCache::add`]
//! when its stream gets a newer container (an idle stream never misses one);
//! [`QueueCache::progress`] gives the delivery progress for checkpoints.

use std::collections::VecDeque;

use rustc_hash::FxHashMap as HashMap;
use std::sync::Arc;

mod cursors;
mod types;

pub(crate) use types::{AddError, AddOutcome, CacheMiss, CursorId, CursorPosition, CursorStart, Purged};

use crate::queue::CacheOptions;
use crate::stream::{BatchContainer, SequenceToken, StreamId};

struct Item {
    batch: Arc<BatchContainer>,
    next_in_stream: Option<u64>,
    failed: bool,
    /// Cursors `At` this container.
    pins: u32,
}

struct Bucket {
    start: u64,
    len: u64,
}

/// First and last cached position of a stream.
#[derive(Clone, Copy)]
struct Span {
    first: u64,
    last: u64,
}

/// Per stream: where its containers are and which cursors wait for more.
/// Kept while the stream has cached containers or cursors, so waiting and
/// waking cursors does not allocate.
#[derive(Default)]
struct StreamIndex {
    span: Option<Span>,
    waiting: Vec<CursorId>,
    cursors: u32,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum CursorState {
    /// The next container to deliver is at this position (pinned).
    At(u64),
    /// Caught up: waits for a container of its stream newer than `after`.
    Waiting { after: Option<SequenceToken> },
}

struct Cursor {
    stream: StreamId,
    state: CursorState,
    /// Position of the last container of the batch being delivered.
    in_flight_last: Option<u64>,
}

/// One queue's cache. Owned by its pulling agent; not shared.
pub(crate) struct QueueCache {
    options: CacheOptions,
    bucket_size: u64,
    items: VecDeque<Item>,
    /// Absolute position of `items[0]`.
    first_pos: u64,
    buckets: VecDeque<Bucket>,
    index: HashMap<StreamId, StreamIndex>,
    cursors: HashMap<CursorId, Cursor>,
    /// Cursors `At` some container (each item counts its own).
    pinned: usize,
    /// No container below this position is pinned (cursors move forward,
    /// so the search for the oldest pin starts here).
    pin_floor: u64,
    next_id: u64,
    last_added: Option<SequenceToken>,
    purged_through: Option<SequenceToken>,
    /// The highest progress ever reported (see [`QueueCache::progress`]).
    done_through: Option<SequenceToken>,
}

impl QueueCache {
    /// An empty cache.
    pub(crate) fn new(options: CacheOptions) -> Self {
        let buckets = options.buckets.max(1);
        let cache_size = options.cache_size.max(1);
        let options = CacheOptions { cache_size, buckets };
        Self {
            bucket_size: (cache_size / buckets).max(1) as u64,
            options,
            items: VecDeque::new(),
            first_pos: 0,
            buckets: VecDeque::new(),
            index: HashMap::default(),
            cursors: HashMap::default(),
            pinned: 0,
            pin_floor: 0,
            next_id: 0,
            last_added: None,
            purged_through: None,
            done_through: None,
        }
    }

    /// Declares that everything at or below `token` is already done (the
    /// queue's checkpoint): a cursor asking for older positions is a miss.
    pub(crate) fn set_purged_through(&mut self, token: Option<SequenceToken>) {
        self.purged_through = token;
        self.last_added = self.last_added.max(token);
        self.done_through = self.done_through.max(token);
    }

    /// Containers cached now.
    pub(crate) fn len(&self) -> usize {
        self.items.len()
    }

    /// Whether nothing is cached.
    #[cfg(test)]
    pub(crate) fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// Buckets alive now.
    pub(crate) fn bucket_count(&self) -> usize {
        self.buckets.len()
    }

    /// Most containers the agent may read at once (one bucket).
    pub(crate) fn max_add_count(&self) -> usize {
        self.bucket_size as usize
    }

    /// Under pressure the agent must not read (Orleans: 10+ buckets alive).
    pub(crate) fn is_under_pressure(&self) -> bool {
        self.buckets.len() >= self.options.buckets || self.items.len() + self.max_add_count() > self.options.cache_size
    }

    /// The newest token ever added (or declared purged).
    pub(crate) fn last_added(&self) -> Option<SequenceToken> {
        self.last_added
    }

    /// Adds containers read from the queue, in queue order. Containers whose
    /// token is not newer than the last one added are redeliveries and are
    /// skipped (their tokens are returned, to be acked). Returns too the
    /// cursors that were waiting and now have something to deliver. Offered
    /// more than the free space, it adds nothing and fails.
    pub(crate) fn add(&mut self, batches: Vec<Arc<BatchContainer>>) -> Result<AddOutcome, AddError> {
        let free = self.options.cache_size - self.items.len();
        if batches.len() > free {
            return Err(AddError::Full { offered: batches.len(), free, capacity: self.options.cache_size });
        }
        let mut outcome = AddOutcome::default();
        for batch in batches {
            if self.last_added.is_some_and(|last| batch.token <= last) {
                outcome.skipped.push(batch.token);
                continue;
            }
            self.last_added = Some(batch.token);
            let pos = self.first_pos + self.items.len() as u64;
            match self.buckets.back_mut() {
                Some(bucket) if bucket.len < self.bucket_size => bucket.len += 1,
                _ => self.buckets.push_back(Bucket { start: pos, len: 1 }),
            }
            let index = match self.index.get_mut(&batch.stream) {
                Some(index) => index,
                None => self.index.entry(batch.stream.clone()).or_default(),
            };
            match &mut index.span {
                Some(span) => {
                    let prev = span.last;
                    span.last = pos;
                    if let Some(item) = prev.checked_sub(self.first_pos).and_then(|i| self.items.get_mut(i as usize)) {
                        item.next_in_stream = Some(pos);
                    }
                }
                None => index.span = Some(Span { first: pos, last: pos }),
            }
            let mut pins = 0;
            if !index.waiting.is_empty() {
                // Every cursor waiting for something older than this wakes here.
                let token = batch.token;
                let cursors = &mut self.cursors;
                let ready = &mut outcome.ready;
                index.waiting.retain(|id| {
                    let Some(cursor) = cursors.get_mut(id) else { return false };
                    let wake =
                        matches!(cursor.state, CursorState::Waiting { after } if after.is_none_or(|a| a < token));
                    if wake {
                        cursor.state = CursorState::At(pos);
                        pins += 1;
                        ready.push(*id);
                    }
                    !wake
                });
            }
            self.pinned += pins as usize;
            self.items.push_back(Item { batch, next_in_stream: None, failed: false, pins });
        }
        Ok(outcome)
    }

    /// Whether [`QueueCache::purge`] would release anything now.
    pub(crate) fn purgeable(&self) -> bool {
        let limit = self.oldest_pin().unwrap_or(u64::MAX);
        self.buckets.front().is_some_and(|bucket| bucket.start + bucket.len <= limit)
    }

    /// Drains every bucket from the oldest end that no cursor or pin points
    /// into.
    pub(crate) fn purge(&mut self) -> Purged {
        let limit = self.oldest_pin().unwrap_or(u64::MAX);
        self.pin_floor = self.pin_floor.max(limit.min(self.first_pos + self.items.len() as u64));
        let mut purged = Purged::default();
        while let Some(bucket) = self.buckets.front() {
            if bucket.start + bucket.len > limit {
                break;
            }
            for _ in 0..bucket.len {
                let Some(item) = self.items.pop_front() else {
                    break;
                };
                let pos = self.first_pos;
                self.first_pos += 1;
                if let Some(index) = self.index.get_mut(&item.batch.stream)
                    && index.span.is_some_and(|span| span.first == pos)
                {
                    match (item.next_in_stream, &mut index.span) {
                        (Some(next), Some(span)) => span.first = next,
                        _ => index.span = None,
                    }
                    if index.span.is_none() && index.cursors == 0 {
                        self.index.remove(&item.batch.stream);
                    }
                }
                self.purged_through = Some(item.batch.token);
                if item.failed {
                    purged.failed.push(item.batch.token);
                } else {
                    purged.acked.push(item.batch.token);
                }
            }
            self.buckets.pop_front();
        }
        purged
    }

    /// Delivery progress: every container at or below the returned token is
    /// done with (delivered, skipped or wanted by nobody). Never moves back:
    /// it is also the floor below which no new cursor is placed (asking for
    /// older positions is a miss, served from the queue).
    pub(crate) fn progress(&mut self) -> Option<SequenceToken> {
        let oldest = self.oldest_pin();
        if let Some(pos) = oldest {
            self.pin_floor = pos;
        }
        let now = match oldest {
            Some(min) if min > self.first_pos => self.item(min - 1).map(|i| i.batch.token),
            Some(_) => self.purged_through,
            None => self.last_added,
        };
        self.done_through = self.done_through.max(now);
        self.done_through
    }

    /// Whether any container of `stream` is cached.
    pub(crate) fn holds(&self, stream: &StreamId) -> bool {
        self.span(stream).is_some()
    }

    fn span(&self, stream: &StreamId) -> Option<Span> {
        self.index.get(stream).and_then(|i| i.span)
    }

    /// A cursor is `At` `pos` now.
    fn pin(&mut self, pos: u64) {
        if let Some(item) = self.item_mut(pos) {
            item.pins += 1;
            self.pinned += 1;
            self.pin_floor = self.pin_floor.min(pos);
        }
    }

    /// A cursor left `pos`.
    fn unpin(&mut self, pos: u64) {
        if let Some(item) = self.item_mut(pos)
            && item.pins > 0
        {
            item.pins -= 1;
            self.pinned -= 1;
        }
    }

    /// The oldest position a cursor is `At`, searched from `pin_floor`
    /// (below it nothing is pinned).
    fn oldest_pin(&self) -> Option<u64> {
        if self.pinned == 0 {
            return None;
        }
        let from = self.pin_floor.max(self.first_pos);
        let skip = (from - self.first_pos) as usize;
        let found = self.items.range(skip..).position(|item| item.pins > 0)?;
        Some(from + found as u64)
    }

    fn item(&self, pos: u64) -> Option<&Item> {
        self.items.get(pos.checked_sub(self.first_pos)? as usize)
    }

    fn item_mut(&mut self, pos: u64) -> Option<&mut Item> {
        self.items.get_mut(pos.checked_sub(self.first_pos)? as usize)
    }

    fn fresh_id(&mut self) -> u64 {
        self.next_id += 1;
        self.next_id
    }
}

/// The token just before `t`, if any.
fn predecessor(t: SequenceToken) -> Option<SequenceToken> {
    match (t.major, t.minor) {
        (0, 0) => None,
        (major, 0) => Some(SequenceToken::new(major - 1, u64::MAX)),
        (major, minor) => Some(SequenceToken::new(major, minor - 1)),
    }
}

#[cfg(test)]
mod tests;
