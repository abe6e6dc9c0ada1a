//! How one container is written to the run log store ([`Append`]: its
//! fence, its producer batch's fingerprint, when its lines arrived) and
//! the wait for a container to be stored ([`STORED_POLL`] and the loop the
//! stores' `wait_stored` share).

use std::time::Duration;

use super::{RunKey, RunLogStore};
use crate::queue::Fence;
use crate::stream::SequenceToken;

/// How [`RunLogStore::append`] writes one container: under which fence,
/// the fingerprint of a producer's batch (the hash of its events' ids, to
/// drop a retried batch), and when its lines arrived (the edge's ingest
/// time, kept for [`RunLogStore::times`]).
///
/// ```
/// use tailrace::archive::Append;
/// use tailrace::queue::Fence;
///
/// let how = Append::new().fenced(Fence::lease(3)).batch(0xfeed).arrived(1_700_000_000_000);
/// assert_eq!((how.fence, how.fingerprint), (Fence::lease(3), Some(0xfeed)));
/// assert_eq!(how.arrived_ms, Some(1_700_000_000_000));
/// assert_eq!(Append::new(), Append::default());
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Append {
    /// The writer's lease, if any.
    pub fence: Fence,
    /// The batch's fingerprint, if it is a producer's batch.
    pub fingerprint: Option<u64>,
    /// When the container's lines arrived (ms since the Unix epoch).
    pub arrived_ms: Option<u64>,
}

impl Append {
    /// Unfenced, no fingerprint.
    pub const fn new() -> Self {
        Self { fence: Fence::NONE, fingerprint: None, arrived_ms: None }
    }

    /// Written under `fence`.
    pub const fn fenced(mut self, fence: Fence) -> Self {
        self.fence = fence;
        self
    }

    /// A producer's batch with this fingerprint.
    pub const fn batch(mut self, fingerprint: u64) -> Self {
        self.fingerprint = Some(fingerprint);
        self
    }

    /// Lines that arrived at `ms` (ms since the Unix epoch).
    pub const fn arrived(mut self, ms: u64) -> Self {
        self.arrived_ms = Some(ms);
        self
    }
}

/// How often [`RunLogStore::wait_stored`] looks when nothing tells it of
/// writes.
pub const STORED_POLL: Duration = Duration::from_millis(100);

/// Looks at `run` in `store` until it holds `token` or `within` passed. Each
/// look is preceded by `arm()`, a wait that ends when the run may have
/// changed (`None`: none, look again after [`STORED_POLL`]); arming first
/// means a write between the arm and the look still ends the wait.
pub(crate) async fn stored_within<S, W>(
    store: &S,
    run: &RunKey,
    token: SequenceToken,
    within: Duration,
    mut arm: impl FnMut() -> Option<W> + Send,
) -> bool
where
    S: RunLogStore + ?Sized,
    W: std::future::Future<Output = ()> + Send,
{
    let deadline = tokio::time::Instant::now() + within;
    loop {
        let changed = arm();
        if let Ok(Some(info)) = store.info(run).await
            && info.last_token.is_some_and(|last| last >= token)
        {
            return true;
        }
        let now = tokio::time::Instant::now();
        if now >= deadline {
            return false;
        }
        let left = deadline - now;
        match changed {
            Some(changed) => drop(tokio::time::timeout(left, changed).await),
            None => tokio::time::sleep(left.min(STORED_POLL)).await,
        }
    }
}
