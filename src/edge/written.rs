//! Read your writes: the runs this edge accepted writes for lately, each
//! with the token of its last container, so that a read through this edge
//! after its own `POST` or `PUT` waits (a little) for the archiver to have
//! stored it. The archiver stores asynchronously (a run even becomes known
//! only with its first container), so without this a client could post a
//! line, read the run at once and be told it does not exist.
//!
//! Bounded by `edge.max_written_runs`: the least recently written run is
//! forgotten first, and a forgotten run is read as the store has it.

use std::num::NonZeroUsize;

use lru::LruCache;
use parking_lot::Mutex;

use crate::archive::RunKey;
use crate::stream::SequenceToken;

/// See the module docs.
pub(crate) struct Written {
    last: Mutex<LruCache<RunKey, SequenceToken>>,
}

impl Written {
    /// Remembers at most `capacity` runs (at least one).
    pub(crate) fn new(capacity: usize) -> Self {
        let capacity = NonZeroUsize::new(capacity).unwrap_or(NonZeroUsize::MIN);
        Self { last: Mutex::new(LruCache::new(capacity)) }
    }

    /// The edge's write to `run` was accepted as container `token`.
    pub(crate) fn accepted(&self, run: &RunKey, token: SequenceToken) {
        let mut last = self.last.lock();
        match last.get_mut(run) {
            Some(held) => *held = (*held).max(token),
            None => drop(last.put(run.clone(), token)),
        }
    }

    /// The last container this edge wrote to `run`, if it remembers one.
    pub(crate) fn last(&self, run: &RunKey) -> Option<SequenceToken> {
        self.last.lock().peek(run).copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(name: &str) -> RunKey {
        RunKey::new("svc.etl", name).unwrap()
    }

    #[test]
    fn the_last_token_is_the_highest_and_old_runs_are_forgotten() {
        let written = Written::new(2);
        written.accepted(&run("a"), SequenceToken::new(2, 0));
        written.accepted(&run("a"), SequenceToken::new(1, 5));
        assert_eq!(written.last(&run("a")), Some(SequenceToken::new(2, 0)), "a late answer does not go back");
        written.accepted(&run("b"), SequenceToken::new(3, 0));
        written.accepted(&run("a"), SequenceToken::new(4, 0));
        written.accepted(&run("c"), SequenceToken::new(5, 0));
        assert_eq!(written.last(&run("b")), None, "the least recently written goes first");
        assert_eq!(written.last(&run("a")), Some(SequenceToken::new(4, 0)));
        assert_eq!(written.last(&run("c")), Some(SequenceToken::new(5, 0)));
    }
}
