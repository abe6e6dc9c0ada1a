//! The cache's public vocabulary: options, cursor ids, starts and positions,
//! what `add` and `purge` report, and their errors.

use crate::stream::SequenceToken;

/// Identifies one cursor of one cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct CursorId(pub(super) u64);

/// Where a new cursor starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum CursorStart {
    /// At the first container of the stream with a token `>=` this one.
    At(SequenceToken),
    /// At the first container of the stream with a token `>` this one.
    After(SequenceToken),
    /// At the oldest container of the stream still cached.
    Earliest,
    /// After everything read so far: only containers added later.
    Latest,
}

/// A cursor could not be placed: containers it needs may have been purged.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("cache miss: {requested} is at or below {purged_through}, the newest position already purged from the cache")]
pub(crate) struct CacheMiss {
    /// The token asked for.
    pub requested: SequenceToken,
    /// Everything at or below this token has left the cache.
    pub purged_through: SequenceToken,
}

/// `add` was offered more than fits (containers out of queue order are not
/// an error: they are skipped as redeliveries, see [`AddOutcome::skipped`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub(crate) enum AddError {
    /// More containers than the free space (the agent reads at most `max_add_count`).
    #[error("cache full: {offered} containers offered, {free} free of {capacity}")]
    Full {
        /// Containers offered.
        offered: usize,
        /// Free slots.
        free: usize,
        /// The cache's capacity.
        capacity: usize,
    },
}

/// What [`QueueCache::purge`](super::QueueCache::purge) drained, oldest first.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Purged {
    /// Done by every cursor: acknowledge these.
    pub acked: Vec<SequenceToken>,
    /// Their delivery failed (skipped to the dead-letter sink): not acked.
    pub failed: Vec<SequenceToken>,
}

impl Purged {
    /// Nothing was drained.
    #[cfg(test)]
    pub(crate) fn is_empty(&self) -> bool {
        self.acked.is_empty() && self.failed.is_empty()
    }
}

/// What `add` changed.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct AddOutcome {
    /// Cursors that were caught up and now have something to deliver.
    pub ready: Vec<CursorId>,
    /// Containers skipped as redeliveries (token not newer than the last
    /// added): they are already done, so they are to be acked.
    pub skipped: Vec<SequenceToken>,
}

/// Where a cursor stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CursorPosition {
    /// The next container to deliver has this token.
    Next(SequenceToken),
    /// Caught up; the last token seen (if any).
    CaughtUp(Option<SequenceToken>),
}
