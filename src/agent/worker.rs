//! The agent's work lane: one task per agent that runs every piece of its
//! waiting work (pub-sub lookups, handshakes, deliveries, dead letters)
//! concurrently and reports what finished in batches, one message per batch.
//!
//! Each job is polled on its own: a consumer that never answers only holds
//! its own subscription. Compared with a task per job this saves a spawn and
//! an actor message per delivery.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::Arc;

use futures::stream::FuturesUnordered;
use futures::{FutureExt, StreamExt};
use ractor::ActorRef;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, Span};

use super::state::{InternalMsg, panic_text};
use super::{AgentMsg, Internal};

/// A unit of work: resolves to the message that reports it.
pub(crate) type Job = Pin<Box<dyn Future<Output = InternalMsg> + Send>>;

/// Wraps `work` so that a panic in it is reported through `on_panic`.
pub(crate) fn job<F>(work: F, on_panic: impl FnOnce(String) -> InternalMsg + Send + 'static) -> Job
where
    F: Future<Output = InternalMsg> + Send + 'static,
{
    Box::pin(
        AssertUnwindSafe(work)
            .catch_unwind()
            .map(|outcome| outcome.unwrap_or_else(|panic| on_panic(panic_text(&panic)))),
    )
}

/// Starts an agent's lane. The channel holds at most one job per
/// subscription and stream of the agent (bounded by `agent.max_streams` and
/// the pub-sub limits). The lane stops when `kill` fires, or when the agent
/// dropped its sender and nothing runs any more.
pub(crate) fn start(agent: ActorRef<AgentMsg>, kill: Arc<CancellationToken>, span: Span) -> mpsc::UnboundedSender<Job> {
    let (jobs, mut incoming) = mpsc::unbounded_channel::<Job>();
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
                    if agent.cast(AgentMsg::Internal(Internal(InternalMsg::Batch(done)))).is_err() {
                        return;
                    }
                }
                else => return,
            }
        }
    };
    tokio::spawn(lane.instrument(span));
    jobs
}
