//! The `file` adapter: the embedded durable default (no server). Queue `n`
//! is the directory `{dir}/q{n}`, fed through the file handoff
//! ([`crate::handoff`]): this node writes with a [`LoggingConsumer`](crate::handoff::LoggingConsumer) of
//! prefix `prefix` (or an external writer does, with `write = false`), and
//! the queue's receiver reads the sealed `.jsonl` files of that prefix in
//! order. Checkpoints live in `{dir}/checkpoints`.
//!
//! - A container is one enqueued batch (its lines carry the batch size); its
//!   token is `(file number, first line)`.
//! - The receiver reads sealed files only, waits briefly for the next seal
//!   (this node's writer signals it), hands a corrupt line to the
//!   dead-letter sink with its file and line, and deletes a sealed file once
//!   the stored checkpoint passed its last line.
//! - A new receiver resumes after the later of the stored checkpoint and
//!   what earlier receivers of this process saw acknowledged.
//! - File numbers never go back: the writer starts past the prefix's
//!   recorded numbers and the stored checkpoint, so nothing written after a
//!   restart can land below the checkpoint.
//! - Opened by the holder of the data directory's lock
//!   ([`FileAdapterFactory::new_owned`]), the factory first recovers what a
//!   crash left in the queue directories: the complete lines of `.open`
//!   files are republished, torn tails quarantined, stale locks removed.

mod reader;
mod writer;

use backon::Retryable;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use tokio::sync::Notify;

use super::{BuiltInFactory, MappedAdapter};
use crate::checkpoint::FileCheckpointer;
use crate::failure::{DeadLetterSink, LogDeadLetters};
use crate::handoff::{DataDirLock, HandoffError, RecoveryReport, WriterOptions, validate_prefix};
use crate::queue::{Direction, Fence, QueueAdapter, QueueError, QueueMapper, QueueReceiver};
use crate::retry::Backoff;
use crate::stream::{Event, QueueId, SequenceToken, StreamId};
use crate::telemetry;

const NAME: &str = "file";

/// How often a full queue is tried again while `enqueue` waits for room.
const BUDGET_WAIT: Backoff = Backoff::fixed(Duration::from_millis(50));

/// Settings of the file adapter (`[adapters.file]`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct FileOptions {
    /// The root: queue `n` is `{dir}/q{n}`, checkpoints `{dir}/checkpoints`.
    pub dir: PathBuf,
    /// The writer prefix in each queue directory.
    pub prefix: String,
    /// Whether this node writes (`enqueue`); false when another process
    /// feeds the queues with a `LoggingConsumer` of the same prefix.
    pub write: bool,
    /// The writer's settings (`[adapters.file.writer]`); keys left out keep
    /// this adapter's defaults (not the standalone writer's).
    #[serde(deserialize_with = "writer_over_adapter_defaults")]
    pub writer: WriterOptions,
    /// How long `enqueue` waits for room in the prefix's budget.
    #[serde(with = "humantime_serde")]
    pub enqueue_timeout: Duration,
    /// How long a read with nothing new waits for the next sealed file.
    #[serde(with = "humantime_serde")]
    pub read_wait: Duration,
    /// Delete a sealed file once the checkpoint passed its last line.
    pub delete_consumed: bool,
}

impl Default for FileOptions {
    fn default() -> Self {
        Self {
            dir: PathBuf::from("data/queues"),
            prefix: "events".into(),
            write: true,
            writer: WriterOptions {
                max_file_bytes: 8 * 1024 * 1024,
                max_total_bytes: 1024 * 1024 * 1024,
                max_file_age: Some(Duration::from_millis(50)),
                ..WriterOptions::default()
            },
            enqueue_timeout: Duration::from_secs(30),
            read_wait: Duration::from_millis(100),
            delete_consumed: true,
        }
    }
}

/// Reads `[adapters.file.writer]` over the adapter's writer defaults, so a
/// section that sets one key (say `max_file_bytes`) does not turn off the
/// age-based sealing readers rely on.
fn writer_over_adapter_defaults<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<WriterOptions, D::Error> {
    use serde::de::Error;
    let given = toml::Table::deserialize(deserializer)?;
    let mut merged = toml::Table::try_from(FileOptions::default().writer).map_err(D::Error::custom)?;
    merged.extend(given);
    WriterOptions::deserialize(toml::Value::Table(merged)).map_err(D::Error::custom)
}

/// Builds the file adapter (one per process and directory).
pub type FileAdapterFactory = BuiltInFactory<FileAdapter, FileCheckpointer>;

impl FileAdapterFactory {
    /// Opens (and creates) the queue directories. With `write`, takes every
    /// queue's prefix now, so a crash's leftovers stop it with a
    /// recovery-required error naming the files (see
    /// [`new_owned`](Self::new_owned) for a node that owns its directory).
    pub fn new(queue_count: u32, options: FileOptions) -> Result<Self, QueueError> {
        Self::open(queue_count, options, None)
    }

    /// Like [`new`](Self::new), for the holder of the data directory's lock:
    /// with `write`, what a crash left in the queue directories is recovered
    /// first (logged, and counted in `/metrics`).
    pub fn new_owned(queue_count: u32, options: FileOptions, owner: &DataDirLock) -> Result<Self, QueueError> {
        Self::open(queue_count, options, Some(owner))
    }

    fn open(queue_count: u32, options: FileOptions, owner: Option<&DataDirLock>) -> Result<Self, QueueError> {
        validate_prefix(&options.prefix).map_err(|e| QueueError::Config(e.to_string()))?;
        let mapper = QueueMapper::new(queue_count);
        let checkpointer = Arc::new(
            FileCheckpointer::new(options.dir.join("checkpoints")).map_err(|e| QueueError::Config(e.to_string()))?,
        );
        let mut queues = Vec::new();
        for queue in mapper.all_queues() {
            let dir = options.dir.join(queue.to_string());
            crate::atomic_file::create_dir_all(&dir, crate::atomic_file::Durability::Synced)
                .map_err(|source| QueueError::Io { context: format!("creating {}", dir.display()), source })?;
            let sealed = Arc::new(Notify::new());
            let writer = if options.write {
                // Numbers past the checkpoint too: a directory emptied by
                // deletions and missing its state file must not go back.
                let stored = checkpointer.load_blocking(queue).map_err(|e| QueueError::Backend {
                    adapter: NAME.into(),
                    message: e.to_string(),
                    transient: false,
                })?;
                let first_file = stored.map_or(1, |t| t.major.saturating_add(1));
                if let Some(owner) = owner {
                    let report =
                        owner.recover(&dir, &options.prefix, first_file).map_err(|e| handoff_error(queue, &dir, e))?;
                    if !report.is_empty() {
                        log_recovery(queue, &report);
                    }
                }
                Some(
                    writer::QueueWriter::start(queue, &dir, &options, first_file, sealed.clone())
                        .map_err(|e| handoff_error(queue, &dir, e))?,
                )
            } else {
                None
            };
            let disk_full = Default::default();
            queues.push(QueueFiles { id: queue, dir, sealed, acked: Arc::default(), writer, disk_full });
        }
        let adapter = Arc::new(FileAdapter {
            mapper,
            options,
            queues,
            checkpointer: checkpointer.clone(),
            dead_letters: Mutex::new(Arc::new(LogDeadLetters)),
        });
        Ok(Self::from_parts(adapter, checkpointer))
    }

    /// Where corrupt lines go (default: the log).
    pub fn with_dead_letters(self, sink: Arc<dyn DeadLetterSink>) -> Self {
        *self.adapter.dead_letters.lock() = sink;
        self
    }
}

/// One queue's directory and what the adapter keeps about it.
pub(crate) struct QueueFiles {
    id: QueueId,
    dir: PathBuf,
    /// Signalled when this process seals a file of the queue.
    sealed: Arc<Notify>,
    /// The newest token this process's receivers saw acknowledged with
    /// everything before it.
    acked: Arc<Mutex<Option<SequenceToken>>>,
    writer: Option<writer::QueueWriter>,
    /// Its last append found the disk full (logged once, and in `/metrics`).
    disk_full: std::sync::atomic::AtomicBool,
}

impl MappedAdapter for FileAdapter {
    fn mapper(&self) -> QueueMapper {
        self.mapper
    }
}

/// Writes to and reads from the queue directories.
pub struct FileAdapter {
    mapper: QueueMapper,
    options: FileOptions,
    queues: Vec<QueueFiles>,
    checkpointer: Arc<FileCheckpointer>,
    dead_letters: Mutex<Arc<dyn DeadLetterSink>>,
}

impl FileAdapter {
    fn queue(&self, id: QueueId) -> Result<&QueueFiles, QueueError> {
        self.queues
            .get(id.0 as usize)
            .ok_or_else(|| QueueError::Config(format!("queue {id} does not exist (there are {})", self.queues.len())))
    }

    /// The options.
    pub fn options(&self) -> &FileOptions {
        &self.options
    }

    /// Seals every active file and releases every prefix (the clean way
    /// out; the next start needs no recovery). Enqueues after this fail.
    pub async fn close(&self) -> Result<(), QueueError> {
        for queue in &self.queues {
            if let Some(writer) = &queue.writer {
                writer.close().await.map_err(|e| handoff_error(queue.id, &queue.dir, e))?;
            }
        }
        Ok(())
    }
}

#[async_trait]
impl QueueAdapter for FileAdapter {
    fn name(&self) -> &str {
        NAME
    }

    fn direction(&self) -> Direction {
        if self.options.write { Direction::ReadWrite } else { Direction::ReadOnly }
    }

    fn is_rewindable(&self) -> bool {
        true
    }

    async fn enqueue(&self, stream: &StreamId, events: Vec<Event>) -> Result<SequenceToken, QueueError> {
        let queue = self.queue(self.mapper.queue_for(stream))?;
        let Some(writer) = &queue.writer else {
            return Err(QueueError::WrongDirection {
                adapter: NAME.into(),
                direction: self.direction(),
                operation: "enqueue",
            });
        };
        if events.is_empty() {
            return Err(QueueError::EmptyBatch(stream.clone()));
        }
        let events = Arc::new(events);
        // Room comes back as readers delete consumed files: wait for it.
        let appended = (|| writer.append(stream.clone(), events.clone()))
            .retry(BUDGET_WAIT.within(self.options.enqueue_timeout))
            .when(|error| matches!(error, HandoffError::BudgetExceeded { .. }))
            .await
            .map(|position| SequenceToken::new(position.file, position.line))
            .map_err(|error| handoff_error(queue.id, &queue.dir, error));
        queue.note_disk(&appended);
        appended
    }

    async fn create_receiver(&self, queue: QueueId, _fence: Fence) -> Result<Box<dyn QueueReceiver>, QueueError> {
        let files = self.queue(queue)?;
        let dead_letters = self.dead_letters.lock().clone();
        Ok(Box::new(reader::FileReceiver::new(
            queue,
            files.dir.clone(),
            self.options.clone(),
            files.sealed.clone(),
            self.checkpointer.clone(),
            dead_letters,
            files.acked.clone(),
        )))
    }

    async fn close(&self) -> Result<(), QueueError> {
        FileAdapter::close(self).await
    }
}

/// Says what a start-up recovery did, in the log and in `/metrics`.
fn log_recovery(queue: QueueId, report: &RecoveryReport) {
    for file in &report.files {
        tracing::warn!(
            %queue,
            file = %file.original.display(),
            quarantined = %file.quarantined.display(),
            complete_lines = file.complete_lines,
            republished = file.republished,
            truncated_tail_bytes = file.truncated_tail_bytes,
            "recovered what a crash left: complete lines republished, the file kept in quarantine"
        );
    }
    if let Some(lock) = &report.stale_lock {
        tracing::warn!(%queue, lock = %lock.display(), "removed a stale writer lock left by a crash");
    }
    metrics::counter!(telemetry::RECOVERED_FILES).increment(report.files.len() as u64);
    metrics::counter!(telemetry::RECOVERED_EVENTS).increment(report.republished());
    metrics::counter!(telemetry::RECOVERED_TAIL_BYTES).increment(report.truncated_tail_bytes());
}

impl QueueFiles {
    /// Says when the disk fills and when it takes writes again: a line in
    /// the log and `tailrace_queue_disk_full{queue}`.
    fn note_disk(&self, appended: &Result<SequenceToken, QueueError>) {
        use std::sync::atomic::Ordering;
        let full = matches!(appended, Err(QueueError::DiskFull { .. }));
        if self.disk_full.swap(full, Ordering::Relaxed) == full {
            return;
        }
        let queue = self.id.to_string();
        metrics::gauge!(telemetry::QUEUE_DISK_FULL, "queue" => queue.clone()).set(if full { 1.0 } else { 0.0 });
        match appended {
            Err(error) => {
                tracing::error!(%queue, dir = %self.dir.display(), %error, "the disk is full: the queue takes no writes until there is room")
            }
            Ok(_) => tracing::warn!(%queue, "the disk takes the queue's writes again"),
        }
    }
}

/// Free bytes on the file system holding `dir`, for an unprivileged writer.
fn free_bytes(dir: &std::path::Path) -> Option<u64> {
    use std::os::unix::ffi::OsStrExt;
    let path = std::ffi::CString::new(dir.as_os_str().as_bytes()).ok()?;
    let mut stats: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: a NUL-terminated path and a statvfs for the call to fill.
    let done = unsafe { libc::statvfs(path.as_ptr(), &mut stats) };
    // (`c_ulong`: 64 bits here, 32 on other targets.)
    #[allow(clippy::unnecessary_cast)]
    let (blocks, size) = (stats.f_bavail as u64, stats.f_frsize as u64);
    (done == 0).then(|| blocks.saturating_mul(size))
}

/// A handoff error as a queue error.
fn handoff_error(queue: QueueId, dir: &std::path::Path, error: HandoffError) -> QueueError {
    match error {
        HandoffError::BudgetExceeded { .. } => QueueError::Refused { queue, reason: error.to_string() },
        HandoffError::Io { source, .. } if source.kind() == std::io::ErrorKind::StorageFull => {
            QueueError::DiskFull { queue, free_bytes: free_bytes(dir) }
        }
        HandoffError::Io { context, source } => QueueError::Io { context, source },
        other => QueueError::Backend { adapter: NAME.into(), message: other.to_string(), transient: false },
    }
}
