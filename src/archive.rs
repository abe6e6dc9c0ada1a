//! The log path's durable side: run keys, the **run log store** and the
//! **archiver**, its one writer.
//!
//! A pipeline run's log is the stream (`logs`, `{fqn}/{runId}`): its
//! lines, and its status changes in order with them ([`status_event`]).
//! The archiver is the implicit subscriber of the `logs` namespace: it
//! appends each container's lines to the run log store, in order, exactly
//! once (a container whose token the run already holds is skipped, so
//! redeliveries are harmless; one whose event ids repeat one of the run's
//! last containers is a producer's retried POST, and is skipped too),
//! applies its status change after them, and answers its handshake with
//! the last token stored. So a status is stored only after every line
//! produced before it. The edge reads the store ([`RunLogReader`]) for
//! catch-up, the paginated endpoints and the download.
//!
//! Stores: [`FileRunLogStore`] (embedded, the default) and
//! [`RedisRunLogStore`] (every node of a cluster reads every run).
//!
//! Finished runs are removed by [`Retention`] once they are old or the
//! store is too big (`[archive.retention]`, see [`RetentionPolicy`]).

mod archiver;
mod audit;
mod file_names;
mod file_store;
#[cfg(feature = "redis")]
mod redis_store;
mod retention;
mod run_stream;
mod writes;

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

pub use archiver::{Archiver, RunLogReader};
pub use audit::{AuditError, AuditLine, AuditLog};
pub use file_store::FileRunLogStore;
#[cfg(feature = "redis")]
pub use redis_store::RedisRunLogStore;
pub use retention::{MAX_REPORTED_RUNS, MAX_RUNS_PER_PRUNE, PruneReport, Retention, RetentionPolicy, Verdict};
pub use run_stream::{Contents, RESERVED_ID_PREFIX, STATUS_ID_PREFIX, is_reserved, is_status, status_event};
#[cfg(feature = "edge")]
pub(crate) use run_stream::{batch_fingerprint, lines_of};
pub(crate) use writes::stored_within;
pub use writes::{Append, STORED_POLL};

/// A run's name and stream live with the data model; here is their path.
pub use crate::stream::{InvalidName, LOGS_NAMESPACE, MAX_NAME_BYTES, RunKey};

use crate::redis_conn::{RedisAccess, WaitReplicas};
use crate::stream::SequenceToken;

/// `[archive]`: where the archiver keeps run logs. `Debug` shows
/// `redis_url` without its password.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ArchiveOptions {
    /// `file` (embedded, the default) or `redis` (every node reads every run).
    pub store: String,
    /// The file store's root (`tailrace demo|serve --data-dir D` set `D/runs`).
    pub dir: std::path::PathBuf,
    /// Sync each append to disk before the archiver acknowledges it.
    pub fsync: bool,
    /// The Redis store's server (`rediss://`: TLS); the user, password and
    /// TLS files are `[adapters.redis]`'s.
    pub redis_url: String,
    /// Prefix of the Redis store's keys.
    pub redis_prefix: String,
    /// `[archive.retention]`: when finished runs are removed.
    pub retention: RetentionPolicy,
}

impl std::fmt::Debug for ArchiveOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ArchiveOptions")
            .field("store", &self.store)
            .field("dir", &self.dir)
            .field("fsync", &self.fsync)
            .field("redis_url", &crate::redis_conn::redact(&self.redis_url))
            .field("redis_prefix", &self.redis_prefix)
            .field("retention", &self.retention)
            .finish()
    }
}

impl Default for ArchiveOptions {
    fn default() -> Self {
        Self {
            store: "file".into(),
            dir: "data/runs".into(),
            fsync: true,
            redis_url: "redis://127.0.0.1:6379".into(),
            redis_prefix: "tailrace".into(),
            retention: RetentionPolicy::default(),
        }
    }
}

/// Opens the store `options.store` names. The Redis store reaches
/// `redis_url` with `access` (`[adapters.redis]`'s user, password, TLS
/// files and `cluster`: one set of secrets per process), and its appends
/// wait for `wait` replicas (`[adapters.redis] wait_replicas`).
pub async fn open_store(
    options: &ArchiveOptions,
    access: &RedisAccess,
    wait: Option<WaitReplicas>,
) -> Result<Arc<dyn RunLogStore>, StoreError> {
    match options.store.as_str() {
        "file" => Ok(Arc::new(FileRunLogStore::open(&options.dir, options.fsync)?)),
        #[cfg(feature = "redis")]
        "redis" => {
            let endpoint = crate::redis_conn::RedisEndpoint {
                url: options.redis_url.clone(),
                url_setting: "[archive] redis_url".into(),
                access: access.clone(),
            };
            Ok(Arc::new(RedisRunLogStore::connect_to(&endpoint, &options.redis_prefix).await?.with_wait_replicas(wait)))
        }
        #[cfg(not(feature = "redis"))]
        "redis" => {
            let _ = (access, wait);
            Err(StoreError::Backend("[archive] store = \"redis\" needs tailrace built with the `redis` feature".into()))
        }
        other => Err(StoreError::Backend(format!("unknown archive store `{other}` (built in: file, redis)"))),
    }
}

/// How many of a run's latest containers a store remembers the
/// fingerprints of, to drop a producer's retried batch.
pub const RECENT_BATCHES: usize = 128;

/// A run's status, as OpenMetadata's pipeline states.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum RunState {
    /// Waiting to start.
    Queued,
    /// Going.
    Running,
    /// Finished well.
    Success,
    /// Finished badly.
    Failed,
    /// Finished with some failures.
    PartialSuccess,
    /// Stopped by someone.
    Stopped,
}

impl RunState {
    /// Every state, in its wire spelling.
    pub const ALL: [RunState; 6] = [
        RunState::Queued,
        RunState::Running,
        RunState::Success,
        RunState::Failed,
        RunState::PartialSuccess,
        RunState::Stopped,
    ];

    /// Whether the run is over (success, failed, partial success, stopped).
    pub fn is_finished(self) -> bool {
        matches!(self, RunState::Success | RunState::Failed | RunState::PartialSuccess | RunState::Stopped)
    }

    /// The wire spelling (`partialSuccess`).
    pub fn as_str(self) -> &'static str {
        match self {
            RunState::Queued => "queued",
            RunState::Running => "running",
            RunState::Success => "success",
            RunState::Failed => "failed",
            RunState::PartialSuccess => "partialSuccess",
            RunState::Stopped => "stopped",
        }
    }

    /// Parses a state, ignoring case (`SUCCESS`, `partialsuccess`, and
    /// `partial_success` too).
    pub fn parse(text: &str) -> Option<Self> {
        let folded: String = text.chars().filter(|c| *c != '_').flat_map(char::to_lowercase).collect();
        RunState::ALL.into_iter().find(|s| s.as_str().to_lowercase() == folded)
    }
}

impl fmt::Display for RunState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What the store knows of a run.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunInfo {
    /// Lines stored.
    pub lines: u64,
    /// Bytes of those lines (newlines included).
    pub bytes: u64,
    /// The last status reported, if any.
    pub state: Option<RunState>,
    /// The token of the last container stored.
    pub last_token: Option<SequenceToken>,
    /// When the run was first seen (ms since the Unix epoch).
    pub created_ms: u64,
    /// When a line was last appended or the status last changed (ms since
    /// the Unix epoch; 0 in runs stored before it was recorded).
    #[serde(default)]
    pub updated_ms: u64,
}

impl RunInfo {
    /// When the run was last active: its last append or status change, or
    /// its creation when nothing was recorded since. Retention ages a run
    /// from here.
    pub fn last_activity_ms(&self) -> u64 {
        self.updated_ms.max(self.created_ms)
    }
}

/// Where a store reads the time (ms since the Unix epoch): the system clock
/// unless a test or a simulation gives its own.
pub type Clock = Arc<dyn Fn() -> u64 + Send + Sync>;

fn system_clock() -> Clock {
    Arc::new(crate::stream::now_ms)
}

/// A run in a listing.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct RunSummary {
    /// The run id.
    pub run: String,
    /// What the store knows of it.
    pub info: RunInfo,
}

/// The store failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// A file could not be read or written.
    #[error("run log store: {context}: {source}")]
    Io {
        /// What was being done, with the path.
        context: String,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// Stored data could not be read back.
    #[error("run log store: {0} is corrupt")]
    Corrupt(String),
    /// The backend (Redis) failed.
    #[error("run log store: {0}")]
    Backend(String),
    /// A run's metadata could not be encoded.
    #[error("run log store: cannot encode a run's metadata: {0}")]
    Encode(#[source] serde_json::Error),
    /// The blocking task doing the file work failed (panicked).
    #[error("run log store: a store task failed: {0}")]
    Task(#[source] tokio::task::JoinError),
    /// A fenced append was refused: a writer under a newer lease of the
    /// run's queue already appended to the run.
    #[error("run log store: append to run {run} refused: a lease newer than token {token} wrote to it")]
    Fenced {
        /// The run.
        run: String,
        /// The refused writer's fencing token.
        token: u64,
    },
}

/// Where run logs and statuses are kept. Lines are addressed by their
/// zero-based offset in the run's log.
#[async_trait]
pub trait RunLogStore: Send + Sync + 'static {
    /// Appends `lines` as the container `token` unless the run already
    /// holds it or a later one (then nothing changes), creating the run
    /// (and its pipeline) at its first container, even one with no lines
    /// (a status change). Returns whether lines were appended. Atomic: after a crash either all the lines and
    /// the token are stored or none. `how` says under which fence (a store
    /// that can fence refuses it with [`StoreError::Fenced`] once a writer
    /// with a newer token appended to the run) and, for a producer's batch,
    /// its fingerprint (if one of the run's last [`RECENT_BATCHES`]
    /// containers had the same, this is a retried batch: only the token
    /// moves, nothing is appended, and it returns false). A store may
    /// ignore either.
    async fn append(&self, run: &RunKey, token: SequenceToken, lines: &[&str], how: Append)
    -> Result<bool, StoreError>;

    /// Sets the run's status (creating the run if needed).
    async fn set_state(&self, run: &RunKey, state: RunState) -> Result<(), StoreError>;

    /// What the store knows of `run`; `None` if it was never seen.
    async fn info(&self, run: &RunKey) -> Result<Option<RunInfo>, StoreError>;

    /// [`info`](Self::info) and the fingerprints of the run's last
    /// [`RECENT_BATCHES`] containers (oldest first), read at one moment, so
    /// that a follower of the run (the SSE tailer) drops a producer's
    /// retried batch as [`append`](Self::append) does. A store that keeps
    /// no fingerprints answers none (the default).
    async fn info_and_recent(&self, run: &RunKey) -> Result<Option<(RunInfo, Vec<u64>)>, StoreError> {
        Ok(self.info(run).await?.map(|info| (info, Vec::new())))
    }

    /// When lines `[from, to)` arrived: the marks `(first line offset, ms)`
    /// of the containers that hold them (each mark holds until the next),
    /// from the one `from` is in, in offset order; none past the run's end.
    /// A store that keeps no
    /// times answers none (the default); so do lines appended without
    /// [`Append::arrived`].
    async fn times(&self, run: &RunKey, from: u64, to: u64) -> Result<Vec<(u64, u64)>, StoreError> {
        let _ = (run, from, to);
        Ok(Vec::new())
    }

    /// Waits until `run` holds the container `token` (or a later one), for
    /// at most `within`; whether it does (a store that cannot answer counts
    /// as not yet). The default looks at [`info`](Self::info) every
    /// [`STORED_POLL`]; the stores of this crate are told of writes (the
    /// file store of its own, the Redis store of any node's, by client-side
    /// tracking of the run's key) and answer as the container lands.
    async fn wait_stored(&self, run: &RunKey, token: SequenceToken, within: Duration) -> bool {
        stored_within(self, run, token, within, || None::<std::future::Pending<()>>).await
    }

    /// Lines `[from, from + n)` with `n ≤ max_lines`, stopping early once
    /// `max_bytes` were taken (always at least one line when there is one).
    async fn read(
        &self,
        run: &RunKey,
        from: u64,
        max_lines: usize,
        max_bytes: usize,
    ) -> Result<Vec<String>, StoreError>;

    /// Whether any run of the pipeline `fqn` was ever seen.
    async fn pipeline_exists(&self, fqn: &str) -> Result<bool, StoreError>;

    /// Up to `limit` pipelines, sorted by name.
    async fn pipelines(&self, limit: usize) -> Result<Vec<String>, StoreError>;

    /// Up to `limit` runs of `fqn`, newest first.
    async fn runs(&self, fqn: &str, limit: usize) -> Result<Vec<RunSummary>, StoreError>;

    /// Removes the runs `policy` lets go at `now_ms` (ms since the Unix
    /// epoch), oldest first, at most [`MAX_RUNS_PER_PRUNE`] per call. A run
    /// is removed whole or not at all, and only if nothing was appended to
    /// it and its status did not change since it was chosen; a removed run
    /// reads as never seen, and a pipeline whose last run went is unknown.
    async fn prune(&self, policy: &RetentionPolicy, now_ms: u64) -> Result<PruneReport, StoreError>;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn states_parse_in_any_case() {
        assert_eq!(RunState::parse("SUCCESS"), Some(RunState::Success));
        assert_eq!(RunState::parse("partialSuccess"), Some(RunState::PartialSuccess));
        assert_eq!(RunState::parse("PARTIAL_SUCCESS"), Some(RunState::PartialSuccess));
        assert_eq!(RunState::parse("Queued"), Some(RunState::Queued));
        assert_eq!(RunState::parse("done"), None);
        assert!(RunState::Stopped.is_finished() && !RunState::Queued.is_finished());
    }
}
