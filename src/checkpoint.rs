//! Checkpoints: per queue, the token at or below which every subscription is
//! done. A new owner of the queue resumes just after it.
//!
//! - [`Checkpointer`] is the storage trait (`load`/`save` per queue), with
//!   [`MemoryCheckpointer`] and [`FileCheckpointer`] (write a temp file, fsync,
//!   rename, fsync the directory) here and a Redis one with its adapter.
//! - [`QueueCheckpoint`] is what a pulling agent holds: it follows delivery
//!   progress, writes at most once per `persist_interval` (throttled), never
//!   rewrites an equal token, and [`QueueCheckpoint::flush`] writes the latest
//!   on ordered shutdown, retrying a failed write.

use backon::Retryable;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use tokio::time::Instant;

use crate::atomic_file::{self, Durability};
use crate::retry::Backoff;
use crate::stream::{QueueId, SequenceToken};
use crate::telemetry;

use crate::queue::{CheckpointError, Checkpointer, Fence};

/// Checkpoints in memory (tests, the memory adapter). Counts writes.
#[derive(Default)]
pub struct MemoryCheckpointer {
    state: Mutex<HashMap<QueueId, (SequenceToken, u64)>>,
}

impl MemoryCheckpointer {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    /// How many times `queue`'s checkpoint was written.
    pub fn writes(&self, queue: QueueId) -> u64 {
        self.state.lock().get(&queue).map_or(0, |(_, n)| *n)
    }

    /// The stored checkpoint, without going through the async trait.
    pub fn get(&self, queue: QueueId) -> Option<SequenceToken> {
        self.state.lock().get(&queue).map(|(t, _)| *t)
    }
}

#[async_trait]
impl Checkpointer for MemoryCheckpointer {
    async fn load(&self, queue: QueueId) -> Result<Option<SequenceToken>, CheckpointError> {
        Ok(self.get(queue))
    }

    async fn save(&self, queue: QueueId, token: SequenceToken, _fence: Fence) -> Result<(), CheckpointError> {
        let mut state = self.state.lock();
        let entry = state.entry(queue).or_insert((token, 0));
        entry.0 = token;
        entry.1 += 1;
        Ok(())
    }
}

/// On-disk form of one checkpoint file; versioned.
#[derive(Serialize, Deserialize)]
#[serde(tag = "version")]
enum CheckpointFile {
    #[serde(rename = "1")]
    V1 { queue: QueueId, token: SequenceToken },
}

/// Checkpoints as one small JSON file per queue in a directory:
/// `checkpoint-q{n}.json`, replaced atomically (temp file, fsync, rename,
/// directory fsync). A complete `checkpoint-q{n}.json.tmp`, which an older
/// release left when it crashed between its fsync and its rename, is newer
/// and is preferred on load; the next save removes it.
pub struct FileCheckpointer {
    dir: PathBuf,
}

impl FileCheckpointer {
    /// Uses (and creates) `dir`.
    pub fn new(dir: impl Into<PathBuf>) -> Result<Self, CheckpointError> {
        let dir = dir.into();
        atomic_file::create_dir_all(&dir, Durability::Synced)
            .map_err(|source| CheckpointError::Io { path: dir.clone(), source })?;
        Ok(Self { dir })
    }

    fn path(&self, queue: QueueId) -> PathBuf {
        self.dir.join(format!("checkpoint-{queue}.json"))
    }

    fn temp_path(&self, queue: QueueId) -> PathBuf {
        self.dir.join(format!("checkpoint-{queue}.json.tmp"))
    }

    /// The stored checkpoint of `queue`, read on this thread (blocking I/O).
    pub fn load_blocking(&self, queue: QueueId) -> Result<Option<SequenceToken>, CheckpointError> {
        load_file(&self.temp_path(queue), &self.path(queue), queue)
    }
}

/// A complete temp file is newer than the main one; a torn one is ignored.
fn load_file(temp: &Path, path: &Path, queue: QueueId) -> Result<Option<SequenceToken>, CheckpointError> {
    if let Ok(Some(token)) = read_checkpoint(temp, queue) {
        return Ok(Some(token));
    }
    read_checkpoint(path, queue)
}

fn read_checkpoint(path: &Path, queue: QueueId) -> Result<Option<SequenceToken>, CheckpointError> {
    let bytes = match std::fs::read(path) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => {
            return Err(CheckpointError::Io { path: path.into(), source });
        }
    };
    let corrupt = |reason: String| CheckpointError::Corrupt { path: path.into(), reason };
    match serde_json::from_slice::<CheckpointFile>(&bytes).map_err(|e| corrupt(e.to_string()))? {
        CheckpointFile::V1 { queue: q, token } if q == queue => Ok(Some(token)),
        CheckpointFile::V1 { queue: q, .. } => Err(corrupt(format!("it belongs to queue {q}, not {queue}"))),
    }
}

fn write_checkpoint(
    dir: &Path,
    temp: &Path,
    path: &Path,
    queue: QueueId,
    token: SequenceToken,
) -> Result<(), CheckpointError> {
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| CheckpointError::Io { path, source }
    };
    let body = serde_json::to_vec(&CheckpointFile::V1 { queue, token }).map_err(CheckpointError::Encode)?;
    atomic_file::replace(path, &body, Durability::Synced).map_err(io(path))?;
    // A temp file an older release left behind would shadow this one on load.
    match std::fs::remove_file(temp) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(io(temp)(e)),
        _ => atomic_file::sync_dir(dir).map_err(io(dir)),
    }
}

#[async_trait]
impl Checkpointer for FileCheckpointer {
    async fn load(&self, queue: QueueId) -> Result<Option<SequenceToken>, CheckpointError> {
        let (temp, path) = (self.temp_path(queue), self.path(queue));
        tokio::task::spawn_blocking(move || load_file(&temp, &path, queue))
            .await
            .map_err(|e| CheckpointError::Task("reader", e))?
    }

    async fn save(&self, queue: QueueId, token: SequenceToken, _fence: Fence) -> Result<(), CheckpointError> {
        let (dir, temp, path) = (self.dir.clone(), self.temp_path(queue), self.path(queue));
        tokio::task::spawn_blocking(move || write_checkpoint(&dir, &temp, &path, queue, token))
            .await
            .map_err(|e| CheckpointError::Task("writer", e))?
    }
}

/// What to do with a checkpoint older than one already recorded.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum RegressPolicy {
    /// Keep the newer one (the default: progress only moves forward).
    #[default]
    Ignore,
    /// Record it (a consumer rewound on purpose).
    Persist,
}

/// Checkpoint settings.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CheckpointOptions {
    /// At most one write per interval while running (Orleans: 1 min; ours is
    /// shorter so a new owner replays less).
    #[serde(with = "humantime_serde")]
    pub persist_interval: Duration,
    /// What to do with a regressed checkpoint.
    pub regress: RegressPolicy,
    /// Attempts a flush makes before giving up.
    pub flush_attempts: u32,
}

impl Default for CheckpointOptions {
    fn default() -> Self {
        Self { persist_interval: Duration::from_secs(5), regress: RegressPolicy::Ignore, flush_attempts: 3 }
    }
}

/// Waits between the attempts of a flush.
const FLUSH_BACKOFF: Backoff =
    Backoff::new(Duration::from_millis(100), Duration::from_secs(2), Duration::from_millis(100));

/// One queue's checkpoint as its agent sees it: throttled writes of the
/// newest progress, and a flush.
pub struct QueueCheckpoint {
    store: Arc<dyn Checkpointer>,
    queue: QueueId,
    options: CheckpointOptions,
    latest: Option<SequenceToken>,
    persisted: Option<SequenceToken>,
    last_write: Option<Instant>,
    fence: Fence,
}

impl QueueCheckpoint {
    /// Reads `queue`'s stored checkpoint.
    pub async fn load(
        store: Arc<dyn Checkpointer>,
        queue: QueueId,
        options: CheckpointOptions,
    ) -> Result<Self, CheckpointError> {
        let persisted = store.load(queue).await?;
        Ok(Self { store, queue, options, latest: persisted, persisted, last_write: None, fence: Fence::NONE })
    }

    /// Writes under `fence`: the fencing token of the lease the writer
    /// holds, if any (see [`Checkpointer::save`]).
    pub fn fenced(mut self, fence: Fence) -> Self {
        self.fence = fence;
        self
    }

    /// The newest progress recorded (persisted or not).
    pub fn latest(&self) -> Option<SequenceToken> {
        self.latest
    }

    /// The last token written to the store.
    pub fn persisted(&self) -> Option<SequenceToken> {
        self.persisted
    }

    /// Records progress; writes if the interval since the last write passed.
    /// Returns whether it wrote.
    pub async fn update(&mut self, token: SequenceToken, now: Instant) -> Result<bool, CheckpointError> {
        if self.options.regress == RegressPolicy::Ignore && self.latest.is_some_and(|l| token < l) {
            return Ok(false);
        }
        self.latest = Some(token);
        let due = self.last_write.is_none_or(|at| now.saturating_duration_since(at) >= self.options.persist_interval);
        if !due || self.persisted == self.latest {
            return Ok(false);
        }
        self.write(token, now).await?;
        Ok(true)
    }

    /// Writes the newest progress if it is not stored yet, retrying a failed
    /// write up to `flush_attempts` times. Cancel it by dropping the future.
    pub async fn flush(&mut self) -> Result<(), CheckpointError> {
        let Some(token) = self.latest else {
            return Ok(());
        };
        if self.persisted == self.latest {
            return Ok(());
        }
        let (store, queue, fence) = (self.store.clone(), self.queue, self.fence);
        let retries = self.options.flush_attempts.max(1) - 1;
        self.last_write = Some(Instant::now());
        (|| store.save(queue, token, fence))
            .retry(FLUSH_BACKOFF.schedule(retries))
            .when(|error| !matches!(error, CheckpointError::Fenced { .. }))
            .notify(|error, wait| tracing::warn!(%queue, %error, ?wait, "checkpoint flush failed; retrying"))
            .await?;
        self.saved(token);
        Ok(())
    }

    async fn write(&mut self, token: SequenceToken, now: Instant) -> Result<(), CheckpointError> {
        self.last_write = Some(now);
        self.store.save(self.queue, token, self.fence).await?;
        self.saved(token);
        Ok(())
    }

    fn saved(&mut self, token: SequenceToken) {
        self.persisted = Some(token);
        metrics::counter!(telemetry::CHECKPOINT_WRITES, "queue" => self.queue.to_string()).increment(1);
    }
}
