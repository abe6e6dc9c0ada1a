//! Owned tasks: every task the library spawns belongs to the [`Tasks`] of
//! a node or of an edge, so that stopping either one can tell when its work
//! is really over.
//!
//! A [`Tasks`] is a [`TaskTracker`] with a [`CancellationToken`] (a child of
//! the owner's own token, so stopping the owner reaches every task) and a
//! count of the running tasks by kind. Long-lived tasks watch
//! [`Tasks::token`]; short ones simply end. [`Tasks::stop`] cancels, closes
//! the tracker and waits for it at most a given bound (the owners use
//! [`STOP_TIMEOUT`]); what is still running then is logged by kind and left
//! to the runtime.

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use parking_lot::Mutex;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// How long a node's `shutdown` and an edge's server wait for their tasks
/// once they cancelled them. By then a node's agents have finished their
/// ordered shutdown and an edge's streams have ended, so what is left are
/// short calls (a lease, an unsubscribe) that end within their own
/// timeouts; a task still running after this bound is logged and left.
pub(crate) const STOP_TIMEOUT: Duration = Duration::from_secs(2);

/// Polls `future` once, here and now, with a waker that does nothing, so
/// that work which finishes without waiting costs no task. A future still
/// pending has registered that waker: whoever takes it over must poll it
/// next (a spawned task's first poll does), or its wake-up is lost.
pub(crate) fn poll_now<F: Future + ?Sized>(future: Pin<&mut F>) -> Poll<F::Output> {
    future.poll(&mut Context::from_waker(Waker::noop()))
}

/// A set of owned tasks; clones share it. See the module documentation.
#[derive(Clone, Debug)]
pub(crate) struct Tasks {
    tracker: TaskTracker,
    token: CancellationToken,
    running: Arc<Mutex<BTreeMap<&'static str, usize>>>,
}

impl Default for Tasks {
    fn default() -> Self {
        Self::new(CancellationToken::new())
    }
}

impl Tasks {
    /// An empty set whose tasks stop with `token` (give a child token to
    /// stop them apart from the rest).
    pub(crate) fn new(token: CancellationToken) -> Self {
        Self { tracker: TaskTracker::new(), token, running: Arc::default() }
    }

    /// Cancelled when the owner stops: long-lived tasks end on it.
    pub(crate) fn token(&self) -> &CancellationToken {
        &self.token
    }

    /// Runs `future` as a task of this set, counted under `kind` (a short,
    /// fixed name such as `"tailer"`) until it ends or is dropped.
    pub(crate) fn spawn<F>(&self, kind: &'static str, future: F) -> JoinHandle<F::Output>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        *self.running.lock().entry(kind).or_default() += 1;
        let counted = Counted { kind, running: self.running.clone() };
        // Not `async move { future.await }`: such a block stores the future
        // twice (as captured, and as awaited), which doubled every
        // connection's task. The guard goes when the task ends or is dropped.
        self.tracker.spawn(futures::FutureExt::map(future, move |output| {
            drop(counted);
            output
        }))
    }

    /// Tasks of this set running now.
    pub(crate) fn len(&self) -> usize {
        self.tracker.len()
    }

    /// Whether no task of this set runs.
    #[cfg(test)]
    pub(crate) fn is_empty(&self) -> bool {
        self.tracker.is_empty()
    }

    /// Running tasks by kind (kinds with none left out).
    pub(crate) fn running(&self) -> Vec<(&'static str, usize)> {
        self.running.lock().iter().filter(|(_, n)| **n > 0).map(|(k, n)| (*k, *n)).collect()
    }

    /// Cancels the token, closes the set and waits until every task ended,
    /// at most `bound`. Returns whether they all did; if not, logs which
    /// kinds still run (they are left to the runtime). Tasks spawned after
    /// this are still tracked; a second `stop` waits for them too.
    pub(crate) async fn stop(&self, owner: &str, bound: Duration) -> bool {
        self.token.cancel();
        self.tracker.close();
        if tokio::time::timeout(bound, self.tracker.wait()).await.is_ok() {
            return true;
        }
        let left = self.running();
        tracing::warn!(%owner, ?bound, ?left, "tasks still running after the stop bound; left behind");
        false
    }
}

/// Counts a task as running under its kind for as long as it lives.
struct Counted {
    kind: &'static str,
    running: Arc<Mutex<BTreeMap<&'static str, usize>>>,
}

impl Drop for Counted {
    fn drop(&mut self) {
        let mut running = self.running.lock();
        if let Some(n) = running.get_mut(self.kind) {
            *n = n.saturating_sub(1);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn stop_waits_for_tasks_that_watch_the_token() {
        let tasks = Tasks::default();
        let token = tasks.token().clone();
        tasks.spawn("watcher", async move { token.cancelled().await });
        tasks.spawn("short", tokio::time::sleep(Duration::from_millis(300)));
        assert_eq!(tasks.running(), vec![("short", 1), ("watcher", 1)]);
        let started = tokio::time::Instant::now();
        assert!(tasks.stop("test", Duration::from_secs(5)).await);
        assert_eq!(started.elapsed(), Duration::from_millis(300), "it waited for the short one, no longer");
        assert!(tasks.is_empty());
        assert_eq!(tasks.running(), Vec::new());
    }

    #[tokio::test(start_paused = true)]
    async fn stop_gives_up_after_its_bound_and_names_what_is_left() {
        let tasks = Tasks::default();
        tasks.spawn("stubborn", futures::future::pending::<()>());
        let started = tokio::time::Instant::now();
        assert!(!tasks.stop("test", Duration::from_secs(2)).await);
        assert_eq!(started.elapsed(), Duration::from_secs(2));
        assert_eq!(tasks.running(), vec![("stubborn", 1)]);
        assert_eq!(tasks.len(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_child_token_stops_with_its_parent() {
        let parent = CancellationToken::new();
        let tasks = Tasks::new(parent.child_token());
        let token = tasks.token().clone();
        let task = tasks.spawn("watcher", async move { token.cancelled().await });
        parent.cancel();
        assert!(task.await.is_ok());
        assert!(tasks.is_empty());
    }
}
