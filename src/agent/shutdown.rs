//! The ordered shutdown that hands a queue over. This part owns who waits
//! for it and its final I/O; the agent closes admission and tells it when
//! nothing is in flight any more.
//!
//! 1. close admission (no read, attach, registration or handshake starts)
//!    and stop the pump timer;
//! 2. wait for in-flight work: the pump (receiver init and read), pub-sub
//!    lookups, handshakes, deliveries and dead letters, with no new retry;
//!    meanwhile deliver what the cache already holds (the drain), so that a
//!    graceful move delivers nothing twice. A delivery that fails now is
//!    left, unacked, for the next owner;
//! 3. ack what every cursor passed and record the final delivery progress
//!    (kept unchanged if a registration or handshake never resolved);
//! 4. flush the checkpoint and shut the receiver down;
//! 5. answer, and stop. Only then may the queue be released to a new owner.
//!
//! Every call of steps 3 and 4 is bounded by the agent's init timeout, as
//! the pump bounds the same calls: a hung store delays a handoff, it does
//! not hold it forever.

use std::time::Duration;

use ractor::RpcReplyPort;
use tokio_util::sync::CancellationToken;

use super::pump::{Io, commit, flatten};
use crate::cache::Purged;
use crate::queue::{CheckpointError, QueueError};
use crate::stream::{QueueId, SequenceToken};

/// The stop reason of an agent that finished its ordered shutdown.
pub(crate) const HANDED_OVER: &str = "handed over";

/// An ordered shutdown under way.
pub(crate) struct Shutdown {
    waiters: Vec<RpcReplyPort<()>>,
    done: bool,
}

impl Shutdown {
    /// Step 1, on every request to stop: the first closes admission and
    /// stops retries (`stop`); the rest wait for the same shutdown.
    pub(crate) fn begin(
        shutdown: &mut Option<Shutdown>,
        reply: Option<RpcReplyPort<()>>,
        stop: &CancellationToken,
        queue: QueueId,
    ) {
        match shutdown {
            Some(shutdown) => shutdown.waiters.extend(reply),
            None => {
                tracing::info!(%queue, "ordered shutdown begins");
                *shutdown = Some(Self { waiters: reply.into_iter().collect(), done: false });
                stop.cancel();
            }
        }
    }

    /// Once nothing is in flight: the waiters to answer after the final I/O
    /// (only once).
    pub(crate) fn finish_if_idle(&mut self, busy: bool) -> Option<Vec<RpcReplyPort<()>>> {
        if self.done || busy {
            return None;
        }
        self.done = true;
        Some(std::mem::take(&mut self.waiters))
    }
}

/// Steps 3 and 4: ack `purged`, record `progress` (if the final progress is
/// known), flush the checkpoint and shut the receiver down, each bounded by
/// `limit`. Answers the checkpoint left behind.
pub(crate) async fn release(
    mut io: Io,
    queue: QueueId,
    purged: Purged,
    progress: Option<SequenceToken>,
    limit: Duration,
) -> Option<SequenceToken> {
    let timeout = |operation: &'static str| QueueError::Timeout { operation, queue, after: limit };
    // Once the queue's fence refuses a write (a newer lease was granted),
    // nothing more is written: no ack, no checkpoint.
    let mut fenced = commit(&mut io, queue, &purged, progress, limit).await.is_err();
    if !fenced {
        match tokio::time::timeout(limit, io.checkpoint.flush()).await {
            Ok(Ok(())) => {}
            Ok(Err(CheckpointError::Fenced { .. })) => fenced = true,
            Ok(Err(error)) => tracing::error!(%queue, %error, "checkpoint flush failed; the next owner replays more"),
            Err(_) => tracing::error!(%queue, ?limit, "checkpoint flush timed out"),
        }
    }
    if fenced {
        tracing::warn!(%queue, "handoff cut short: a newer lease of the queue was granted; nothing more is written");
    }
    let checkpoint = io.checkpoint.latest();
    // The receiver bounds its own shutdown by `limit`; the margin lets it.
    let shutdown = tokio::time::timeout(limit + Duration::from_millis(100), io.receiver.shutdown(limit)).await;
    if let Some(error) = flatten(shutdown, || timeout("shutdown")) {
        tracing::warn!(%queue, %error, "receiver shutdown failed");
    }
    checkpoint
}
