//! What one pump does on the receiver, as a task of its own: initialize
//! if needed, commit (acks, failures, checkpoint), serve rewinds, read;
//! every call bounded by the init timeout, a panic in the receiver caught.

use std::panic::AssertUnwindSafe;
use std::time::Duration;

use futures::FutureExt;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::{Io, PumpJob, PumpOutcome, PumpRun, RewindResult};
use crate::agent::worker::panic_text;
use crate::cache::Purged;
use crate::queue::{CheckpointError, QueueError};
use crate::stream::{QueueId, SequenceToken};

impl PumpRun {
    /// Whether this pump reads (a read call to count).
    pub(crate) fn reads(&self) -> bool {
        self.job.read_max > 0
    }

    /// Runs the pump; `None` if the node was killed meanwhile. A panic in
    /// the receiver comes back as an outcome without the receiver.
    pub(crate) async fn run(self, kill: &CancellationToken) -> Option<PumpOutcome> {
        let outcome = tokio::select! {
            _ = kill.cancelled() => return None,
            outcome = AssertUnwindSafe(run_pump(self.io, self.job)).catch_unwind() => outcome,
        };
        Some(outcome.unwrap_or_else(|panic| PumpOutcome {
            io: None,
            panic: Some(panic_text(&panic)),
            init_error: None,
            read: Ok(Vec::new()),
            rewinds: Vec::new(),
        }))
    }
}

async fn run_pump(mut io: Io, job: PumpJob) -> PumpOutcome {
    let mut outcome =
        PumpOutcome { io: None, panic: None, init_error: None, read: Ok(Vec::new()), rewinds: Vec::new() };
    // Every receiver call is bounded: a hung store must not hold the agent
    // (and its ordered shutdown) forever.
    let limit = job.init_timeout;
    let timeout = |operation: &'static str| QueueError::Timeout { operation, queue: job.queue, after: limit };
    if job.initialize {
        let init = tokio::time::timeout(limit, io.receiver.initialize(limit)).await;
        if let Some(error) = flatten(init, || timeout("initialize")) {
            outcome.init_error = Some(error);
            outcome.io = Some(io);
            return outcome;
        }
    }
    // A write the queue's fence refused ends the pump: a newer lease was
    // granted, so the agent stops with no further ack, checkpoint or read
    // (the read's answer carries the refusal to the agent).
    if commit(&mut io, job.queue, &job.purged, job.progress, limit).await.is_err() {
        outcome.read = Err(QueueError::Fenced(job.queue));
        outcome.io = Some(io);
        return outcome;
    }
    for job in job.rewinds {
        let result = match tokio::time::timeout(limit, io.receiver.rewind(job.from, job.max)).await {
            Ok(result) => result,
            Err(_) => Err(timeout("rewind")),
        };
        outcome.rewinds.push(RewindResult { stream: job.stream, id: job.id, epoch: job.epoch, result });
    }
    if job.read_max > 0 {
        outcome.read = match tokio::time::timeout(limit, io.receiver.read(job.read_max)).await {
            Ok(result) => result,
            Err(_) => Err(timeout("read")),
        };
    }
    outcome.io = Some(io);
    outcome
}

/// A write the queue's fence refused: a newer lease of it was granted.
#[derive(Debug)]
pub(crate) struct Fenced;

/// The commit step, the same for every pump and for the final handoff, in
/// this order: ack what every cursor passed, report what failed for good,
/// record the delivery progress (if known). Each call is bounded by
/// `limit`; the first write the queue's fence refuses ends it, and nothing
/// more is written. Other failures are logged: the queue redelivers what
/// was not acked, and the next checkpoint write (or the final flush)
/// retries.
pub(crate) async fn commit(
    io: &mut Io,
    queue: QueueId,
    purged: &Purged,
    progress: Option<SequenceToken>,
    limit: Duration,
) -> Result<(), Fenced> {
    let timeout = |operation: &'static str| QueueError::Timeout { operation, queue, after: limit };
    if !purged.acked.is_empty() {
        let acked = tokio::time::timeout(limit, io.receiver.delivered(&purged.acked)).await;
        match flatten(acked, || timeout("delivered")) {
            Some(QueueError::Fenced(_)) => return Err(Fenced),
            Some(error) => {
                tracing::warn!(%queue, %error, batches = purged.acked.len(), "ack failed; the queue may redeliver them")
            }
            None => {}
        }
    }
    if !purged.failed.is_empty() {
        let failed = tokio::time::timeout(limit, io.receiver.failed(&purged.failed)).await;
        match flatten(failed, || timeout("failed")) {
            Some(QueueError::Fenced(_)) => return Err(Fenced),
            Some(error) => tracing::warn!(%queue, %error, "reporting failed batches to the receiver failed"),
            None => {}
        }
    }
    if let Some(progress) = progress {
        match tokio::time::timeout(limit, io.checkpoint.update(progress, Instant::now())).await {
            Ok(Ok(_)) => {}
            Ok(Err(CheckpointError::Fenced { .. })) => return Err(Fenced),
            Ok(Err(error)) => {
                tracing::warn!(%queue, %error, "checkpoint write failed; the next write or the flush retries")
            }
            Err(_) => tracing::warn!(%queue, ?limit, "checkpoint write timed out; the next write or the flush retries"),
        }
    }
    Ok(())
}

/// The error of a bounded call, if it failed or timed out.
pub(crate) fn flatten(
    outcome: Result<Result<(), QueueError>, tokio::time::error::Elapsed>,
    timeout: impl FnOnce() -> QueueError,
) -> Option<QueueError> {
    match outcome {
        Ok(Ok(())) => None,
        Ok(Err(error)) => Some(error),
        Err(_) => Some(timeout()),
    }
}
