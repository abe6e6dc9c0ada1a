//! This node's writer of one queue: a task that owns the queue's
//! `LoggingConsumer`, takes every append waiting at the moment as one group
//! (one write, one flush, one fsync as the policy says), and seals files as
//! they age.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::sync::{Notify, mpsc, oneshot};

use super::FileOptions;
use crate::handoff::{HandoffError, LinePosition, LoggingConsumer};
use crate::stream::{Event, QueueId, StreamId};

/// Appends waiting to be written at most (the rest wait to be queued).
const QUEUE_DEPTH: usize = 1024;
/// Appends taken as one group at most.
const GROUP: usize = 256;

enum Request {
    Append { stream: StreamId, events: Arc<Vec<Event>>, reply: oneshot::Sender<Result<LinePosition, HandoffError>> },
    Close(oneshot::Sender<Result<(), HandoffError>>),
}

pub(crate) struct QueueWriter {
    requests: mpsc::Sender<Request>,
    task: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

impl QueueWriter {
    /// Takes the queue's prefix now (a crash's leftovers fail here).
    pub(crate) fn start(
        queue: QueueId,
        dir: &Path,
        options: &FileOptions,
        first_file: u64,
        sealed: Arc<Notify>,
    ) -> Result<Self, HandoffError> {
        let runtime = tokio::runtime::Handle::try_current()
            .map_err(|_| HandoffError::Failed("the file adapter must be created inside a tokio runtime".into()))?;
        let writer = LoggingConsumer::open_from(dir, &options.prefix, options.writer.clone(), first_file)?;
        let (requests, incoming) = mpsc::channel(QUEUE_DEPTH);
        let task = runtime.spawn(run(queue, writer, incoming, sealed));
        Ok(Self { requests, task: Mutex::new(Some(task)) })
    }

    pub(crate) async fn append(&self, stream: StreamId, events: Arc<Vec<Event>>) -> Result<LinePosition, HandoffError> {
        let (reply, answer) = oneshot::channel();
        self.requests.send(Request::Append { stream, events, reply }).await.map_err(|_| closed())?;
        answer.await.map_err(|_| closed())?
    }

    /// Seals and releases the prefix; waits until done.
    pub(crate) async fn close(&self) -> Result<(), HandoffError> {
        let (reply, answer) = oneshot::channel();
        if self.requests.send(Request::Close(reply)).await.is_err() {
            return Ok(());
        }
        let outcome = answer.await.unwrap_or(Ok(()));
        let task = self.task.lock().take();
        if let Some(task) = task {
            let _ = task.await;
        }
        outcome
    }
}

fn closed() -> HandoffError {
    HandoffError::Failed("the queue's writer is closed".into())
}

async fn run(queue: QueueId, writer: LoggingConsumer, mut incoming: mpsc::Receiver<Request>, sealed: Arc<Notify>) {
    let mut writer = Some(writer);
    loop {
        let Some(current) = writer.as_ref() else { return };
        // A failed writer has nothing due; it only answers with its failure.
        let due = match current.failure() {
            Some(_) => None,
            None => [current.seal_due_in(), current.sync_due_in()].into_iter().flatten().min(),
        };
        let first = tokio::select! {
            request = incoming.recv() => request,
            _ = sleep_until_due(due) => {
                writer = housekeeping(queue, writer.take(), &sealed).await;
                continue;
            }
        };
        let mut appends = Vec::new();
        let mut close = None;
        match first {
            None => close = Some(None),
            Some(Request::Close(reply)) => close = Some(Some(reply)),
            Some(request @ Request::Append { .. }) => {
                appends.push(request);
                while appends.len() < GROUP {
                    match incoming.try_recv() {
                        Ok(request @ Request::Append { .. }) => appends.push(request),
                        Ok(Request::Close(reply)) => {
                            close = Some(Some(reply));
                            break;
                        }
                        Err(_) => break,
                    }
                }
            }
        }
        if !appends.is_empty() {
            writer = write_group(writer.take(), appends, &sealed).await;
        }
        if let Some(reply) = close {
            let outcome = match writer.take() {
                Some(w) => tokio::task::spawn_blocking(move || w.close())
                    .await
                    .unwrap_or_else(|e| Err(HandoffError::Failed(format!("closing the writer panicked: {e}")))),
                None => Ok(()),
            };
            sealed.notify_one();
            if let Err(error) = &outcome {
                tracing::error!(%queue, %error, "closing the queue's writer failed");
            }
            if let Some(reply) = reply {
                let _ = reply.send(outcome);
            }
            return;
        }
    }
}

async fn sleep_until_due(due: Option<Duration>) {
    match due {
        Some(due) => tokio::time::sleep(due).await,
        None => std::future::pending().await,
    }
}

/// Appends a group, flushes once, seals by age; answers every caller.
async fn write_group(
    writer: Option<LoggingConsumer>,
    appends: Vec<Request>,
    sealed: &Notify,
) -> Option<LoggingConsumer> {
    let mut writer = writer?;
    let outcome = tokio::task::spawn_blocking(move || {
        let before = writer.sealed_files();
        let mut answers = Vec::with_capacity(appends.len());
        for request in appends {
            if let Request::Append { stream, events, reply } = request {
                answers.push((writer.append_batch(&stream, &events), reply));
            }
        }
        // One flush (and fsync, per the policy) for the whole group: an
        // append is answered once it is as durable as the policy promises.
        // A failed flush refuses the whole group (the writer cuts it off
        // at its next call), each caller with the error as it was.
        if let Err(error) = writer.flush() {
            for (answer, _) in &mut answers {
                if answer.is_ok() {
                    *answer = Err(error.copy());
                }
            }
        }
        let _ = writer.seal_if_due();
        let sealed_now = writer.sealed_files() > before;
        (writer, answers, sealed_now)
    })
    .await;
    match outcome {
        Ok((writer, answers, sealed_now)) => {
            for (answer, reply) in answers {
                let _ = reply.send(answer);
            }
            if sealed_now {
                sealed.notify_one();
            }
            Some(writer)
        }
        // The callers' reply channels went with the panicking task.
        Err(e) => {
            tracing::error!(error = %e, "the queue's writer panicked; it accepts nothing more");
            None
        }
    }
}

/// Seals an aged file and runs a due group sync.
async fn housekeeping(queue: QueueId, writer: Option<LoggingConsumer>, sealed: &Notify) -> Option<LoggingConsumer> {
    let mut writer = writer?;
    let outcome = tokio::task::spawn_blocking(move || {
        let sealed = writer.seal_if_due();
        let synced = writer.flush();
        (writer, sealed, synced)
    })
    .await;
    match outcome {
        Ok((writer, sealed_now, synced)) => {
            for error in [sealed_now.as_ref().err(), synced.as_ref().err()].into_iter().flatten() {
                tracing::error!(%queue, %error, "the queue's writer failed");
            }
            if matches!(sealed_now, Ok(true)) {
                sealed.notify_one();
            }
            Some(writer)
        }
        Err(e) => {
            tracing::error!(%queue, error = %e, "the queue's writer panicked; it accepts nothing more");
            None
        }
    }
}
