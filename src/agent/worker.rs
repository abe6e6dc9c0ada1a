//! The agent's work lane: one task per agent that runs every piece of its
//! waiting work (pub-sub lookups, handshakes, deliveries, dead letters)
//! concurrently and reports what finished in batches, one report per batch.
//!
//! Each job is polled on its own: a consumer that never answers only holds
//! its own subscription. Compared with a task per job this saves a spawn and
//! an actor message per delivery. The lane knows nothing of the agent: a job
//! resolves to a report `M`, and `report` hands finished ones on.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::Arc;

use futures::stream::FuturesUnordered;
use futures::{FutureExt, StreamExt};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, Span};

use crate::tasks::Tasks;

/// A unit of work: resolves to the report of what it did.
pub(crate) type Job<M> = Pin<Box<dyn Future<Output = M> + Send>>;

/// Wraps `work` so that a panic in it is reported through `on_panic`.
pub(crate) fn job<M, F>(work: F, on_panic: impl FnOnce(String) -> M + Send + 'static) -> Job<M>
where
    M: Send + 'static,
    F: Future<Output = M> + Send + 'static,
{
    Box::pin(
        AssertUnwindSafe(work)
            .catch_unwind()
            .map(|outcome| outcome.unwrap_or_else(|panic| on_panic(panic_text(&panic)))),
    )
}

/// Starts a lane, a task of `tasks` (the node's). The channel holds at
/// most one job per subscription and stream of the agent (bounded by
/// `agent.max_streams` and the pub-sub limits). The lane stops when `kill`
/// fires, when `report` says nobody listens any more, or when the sender is
/// dropped and nothing runs.
pub(crate) fn start<M: Send + 'static>(
    tasks: &Tasks,
    report: impl Fn(Vec<M>) -> bool + Send + 'static,
    kill: Arc<CancellationToken>,
    span: Span,
) -> mpsc::UnboundedSender<Job<M>> {
    let (jobs, mut incoming) = mpsc::unbounded_channel::<Job<M>>();
    let lane = async move {
        let mut running = FuturesUnordered::new();
        let mut open = true;
        loop {
            tokio::select! {
                biased;
                _ = kill.cancelled() => return,
                job = incoming.recv(), if open => match job {
                    Some(job) => running.push(job),
                    None => open = false,
                },
                Some(first) = running.next(), if !running.is_empty() => {
                    let mut done = vec![first];
                    while let Some(Some(more)) = running.next().now_or_never() {
                        done.push(more);
                    }
                    if !report(done) {
                        return;
                    }
                }
                else => return,
            }
        }
    };
    tasks.spawn("agent work lane", lane.instrument(span));
    jobs
}

/// The text of a caught panic.
pub(crate) fn panic_text(panic: &Box<dyn std::any::Any + Send>) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".into())
}
