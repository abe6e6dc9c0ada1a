//! The receiver of one file queue: sealed `.jsonl` files of the prefix, in
//! order, one container per batch. The file reading is blocking work and
//! runs on the blocking pool; the receiver lends its state to it.

use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use parking_lot::Mutex;
use tokio::sync::Notify;

use super::{FileOptions, NAME};
use crate::checkpoint::FileCheckpointer;
use crate::failure::{DeadLetter, DeadLetterSink, LogThrottle};
use crate::queue::{Checkpointer, QueueError, QueueReceiver, Wake};
use crate::stream::{BatchContainer, Event, EventId, QueueId, SequenceToken};

/// How often consumed files are looked for (needs a checkpoint load).
const DELETE_EVERY: Duration = Duration::from_secs(1);

mod files;

use files::{BadLine, Files};

/// Reads one file queue. See the module documentation.
pub(crate) struct FileReceiver {
    queue: QueueId,
    options: FileOptions,
    sealed: Arc<Notify>,
    checkpointer: Arc<FileCheckpointer>,
    dead_letters: Arc<dyn DeadLetterSink>,
    /// Keeps a flood of corrupt lines from flooding the log.
    logged: LogThrottle,
    /// Shared by the receivers of this queue in this process.
    acked: Arc<Mutex<Option<SequenceToken>>>,
    files: Option<Files>,
    /// Containers read and not yet done, in read order.
    outstanding: VecDeque<(SequenceToken, bool)>,
    last_delete: Instant,
    shut_down: bool,
}

impl FileReceiver {
    pub(crate) fn new(
        queue: QueueId,
        dir: PathBuf,
        options: FileOptions,
        sealed: Arc<Notify>,
        checkpointer: Arc<FileCheckpointer>,
        dead_letters: Arc<dyn DeadLetterSink>,
        acked: Arc<Mutex<Option<SequenceToken>>>,
    ) -> Self {
        let files = Files::new(dir, options.prefix.clone());
        Self {
            queue,
            options,
            sealed,
            checkpointer,
            dead_letters,
            logged: LogThrottle::new(5, Duration::from_secs(10)),
            acked,
            files: Some(files),
            outstanding: VecDeque::new(),
            last_delete: Instant::now(),
            shut_down: false,
        }
    }

    /// Runs blocking work on the reader's files.
    async fn with_files<T: Send + 'static>(
        &mut self,
        work: impl FnOnce(&mut Files) -> Result<T, QueueError> + Send + 'static,
    ) -> Result<T, QueueError> {
        if self.shut_down {
            return Err(QueueError::ShutDown(self.queue));
        }
        let Some(mut files) = self.files.take() else {
            return Err(QueueError::Backend {
                adapter: NAME.into(),
                message: "the reader was lost".into(),
                transient: false,
            });
        };
        let (files, result) = tokio::task::spawn_blocking(move || {
            let result = work(&mut files);
            (files, result)
        })
        .await
        .map_err(|e| QueueError::Backend {
            adapter: NAME.into(),
            message: format!("reading panicked: {e}"),
            transient: false,
        })?;
        self.files = Some(files);
        result
    }

    async fn read_once(&mut self, max: usize) -> Result<Vec<Arc<BatchContainer>>, QueueError> {
        let (batch, bad) = self
            .with_files(move |files| {
                let mut bad = Vec::new();
                let batch = files.read(max, &mut bad)?;
                Ok((batch, bad))
            })
            .await?;
        for line in bad {
            self.dead_letter(line).await;
        }
        self.outstanding.extend(batch.iter().map(|b| (b.token, false)));
        Ok(batch)
    }

    /// A line that is not an event goes to the dead-letter sink with its
    /// file and line, counted, and logged unless a flood of them was; the
    /// queue goes on.
    async fn dead_letter(&self, line: BadLine) {
        let file = format!("{}/{}-{}.jsonl", self.queue, self.options.prefix, line.token.major);
        metrics::counter!(crate::telemetry::QUEUE_UNREADABLE, "queue" => self.queue.to_string(), "reason" => "format")
            .increment(1);
        if let Some(not_logged) = self.logged.admit() {
            tracing::error!(queue = %self.queue, %file, line = line.token.minor, error = %line.error, not_logged,
                "corrupt line skipped to the dead-letter sink");
        }
        let letter = DeadLetter {
            subscription: None,
            origin: Some(format!("{file}:{}", line.token.minor)),
            stream: crate::stream::StreamId::new("tailrace.corrupt", &file),
            token: line.token,
            events: vec![Event {
                id: EventId::new(format!("{file}:{}", line.token.minor)),
                timestamp_ms: crate::stream::now_ms(),
                payload: line.bytes,
            }],
            error: line.error,
            attempts: 0,
        };
        if let Err(refusal) = self.dead_letters.dead_letter(letter).await {
            tracing::error!(queue = %self.queue, %refusal, "the dead-letter sink refused a corrupt line");
        }
    }

    /// Marks containers done; moves the shared acknowledged watermark.
    fn done(&mut self, tokens: &[SequenceToken]) {
        for token in tokens {
            if let Some(entry) = self.outstanding.iter_mut().find(|(t, _)| t == token) {
                entry.1 = true;
            }
        }
        let mut newest = None;
        while self.outstanding.front().is_some_and(|(_, done)| *done) {
            newest = self.outstanding.pop_front().map(|(t, _)| t);
        }
        if let Some(newest) = newest {
            let mut acked = self.acked.lock();
            *acked = (*acked).max(Some(newest));
        }
    }

    /// Deletes the files the stored checkpoint passed entirely.
    async fn delete_consumed(&mut self) {
        if !self.options.delete_consumed || self.last_delete.elapsed() < DELETE_EVERY {
            return;
        }
        self.last_delete = Instant::now();
        let Ok(Some(checkpoint)) = self.checkpointer.load(self.queue).await else { return };
        let Some(files) = self.files.as_mut() else { return };
        let consumed: Vec<u64> = files
            .finished
            .iter()
            .filter(|(n, last)| **n < checkpoint.major || last.is_none_or(|last| last <= checkpoint))
            .map(|(n, _)| *n)
            .collect();
        for n in consumed {
            let path = crate::handoff::sealed_path(&files.dir, &files.prefix, n);
            match std::fs::remove_file(&path) {
                Ok(()) => tracing::debug!(queue = %self.queue, file = %path.display(), "consumed file deleted"),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(error) => {
                    tracing::warn!(queue = %self.queue, file = %path.display(), %error, "could not delete a consumed file");
                    continue;
                }
            }
            files.finished.remove(&n);
        }
    }
}

#[async_trait]
impl QueueReceiver for FileReceiver {
    async fn initialize(&mut self, _timeout: Duration) -> Result<(), QueueError> {
        let stored = self.checkpointer.load(self.queue).await.map_err(|e| QueueError::Backend {
            adapter: NAME.into(),
            message: e.to_string(),
            transient: true,
        })?;
        let seen = *self.acked.lock();
        let after = stored.max(seen);
        self.outstanding.clear();
        self.with_files(move |files| files.position_after(after)).await
    }

    async fn read(&mut self, max: usize) -> Result<Vec<Arc<BatchContainer>>, QueueError> {
        let batch = self.read_once(max).await?;
        if !batch.is_empty() || self.options.read_wait.is_zero() {
            return Ok(batch);
        }
        // Idle: a good moment to drop what the checkpoint has passed.
        self.delete_consumed().await;
        // A seal's stored permit may be stale (that file was read since): a
        // wake that finds nothing waits again until `read_wait` has passed,
        // then reads once more (files another process writes are not
        // announced, only found).
        let deadline = tokio::time::Instant::now() + self.options.read_wait;
        loop {
            if tokio::time::timeout_at(deadline, self.sealed.notified()).await.is_err() {
                return self.read_once(max).await;
            }
            let batch = self.read_once(max).await?;
            if !batch.is_empty() {
                return Ok(batch);
            }
        }
    }

    /// Completes at this node's writer's next seal (or at once if one came
    /// since the last read: `Notify` keeps its permit). Files another
    /// process writes are polled for.
    /// Also completes when consumed files are due for deletion (reads
    /// delete them), so an idle queue does not keep them.
    fn wake_on_write(&mut self) -> Option<Wake> {
        let sealed = self.sealed.clone();
        let unfinished = self.files.as_ref().is_some_and(|files| !files.finished.is_empty());
        let cleanup = (self.options.delete_consumed && unfinished).then(|| self.last_delete + DELETE_EVERY);
        self.options.write.then(|| {
            Box::pin(async move {
                match cleanup {
                    Some(due) => drop(tokio::time::timeout_at(due.into(), sealed.notified()).await),
                    None => sealed.notified().await,
                }
            }) as Wake
        })
    }

    async fn delivered(&mut self, tokens: &[SequenceToken]) -> Result<(), QueueError> {
        self.done(tokens);
        self.delete_consumed().await;
        Ok(())
    }

    /// Dead-lettered containers are done: the checkpoint passes them.
    async fn failed(&mut self, tokens: &[SequenceToken]) -> Result<(), QueueError> {
        self.done(tokens);
        Ok(())
    }

    async fn rewind(&mut self, from: SequenceToken, max: usize) -> Result<Vec<Arc<BatchContainer>>, QueueError> {
        let queue = self.queue;
        self.with_files(move |files| files.rewind(queue, from, max)).await
    }

    async fn shutdown(&mut self, _timeout: Duration) -> Result<(), QueueError> {
        self.shut_down = true;
        Ok(())
    }
}
