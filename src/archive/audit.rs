//! The audit log: an implicit subscriber that writes one JSON line per
//! delivered event to a file, so a test or an operator can check from
//! outside which node delivered which event, under which lease, and
//! whether anything was lost or delivered twice.
//!
//! Turned on by `[diagnostics] audit_namespace` and `audit_path`. A line:
//!
//! ```text
//! {"node":"n1","stream":"audit/s3","token":"1764470000000-0","event":"e-42","fence":7,"at_us":1764470000000123}
//! ```
//!
//! (`stream` is the stream's key, `token` its container's sequence token,
//! `fence` the fencing token of the lease the delivering agent held, or
//! `null` when its writes are not fenced; `at_us` when the line was
//! written, in microseconds since the Unix epoch.)
//!
//! **Durability.** A delivery's lines are written to the file with one
//! `write` call before [`StreamConsumer::deliver`] returns, so an event is
//! acknowledged only once its line is in the file: a process killed with
//! `kill -9` loses no line of an acknowledged event (the kernel has it),
//! and an event delivered again after a crash is written again (at least
//! once). The file is not synced to disk: a power cut may lose lines.
//!
//! **Several processes, one file.** The file is opened in append mode and
//! every delivery is one `write`, so the nodes of a cluster on one machine
//! may share a path (each write lands whole, after the others); nodes on
//! different machines give each their own path. One writer per process
//! serves every stream through a bounded channel (a stalled disk
//! back-pressures the agents instead of growing memory).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use tokio::sync::{mpsc, oneshot};

use crate::pubsub::{ConsumerError, ConsumerFactory, Delivery, DeliveryOutcome, StreamConsumer};
use crate::stream::StreamId;

/// Deliveries waiting for the writer at most.
const QUEUED_WRITES: usize = 64;

/// One line of the audit log.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuditLine {
    /// The node that delivered the event.
    pub node: String,
    /// The stream's key (its namespace is the audited one).
    pub stream: String,
    /// The sequence token of the event's container, `major-minor`.
    pub token: String,
    /// The event's id.
    pub event: String,
    /// The fencing token the delivering agent ran under, if fenced.
    pub fence: Option<u64>,
    /// When the line was written, in microseconds since the Unix epoch
    /// (0 in lines of older builds): what a latency measurement needs.
    #[serde(default)]
    pub at_us: u64,
}

impl AuditLine {
    /// Parses one line of an audit log.
    pub fn parse(line: &str) -> Result<Self, serde_json::Error> {
        serde_json::from_str(line)
    }
}

/// Microseconds since the Unix epoch, by the system clock.
pub(crate) fn now_us() -> u64 {
    let since = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    u64::try_from(since.as_micros()).unwrap_or(u64::MAX)
}

/// Why the audit log cannot be written.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AuditError {
    /// The file could not be opened for appending.
    #[error("cannot open the audit log {path}: {source}")]
    Open {
        /// The file.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// A write failed.
    #[error("cannot append to the audit log {path}: {source}")]
    Write {
        /// The file.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The writer is gone (its runtime is shutting down).
    #[error("the audit log writer of {path} stopped")]
    Stopped {
        /// The file.
        path: PathBuf,
    },
}

struct PendingWrite {
    bytes: Vec<u8>,
    done: oneshot::Sender<Result<(), AuditError>>,
}

/// The audit log of one process: bind it with
/// `ImplicitSubscriptions::new().bind(namespace, audit)`.
pub struct AuditLog {
    shared: Arc<Shared>,
}

/// What the log and its consumers share.
struct Shared {
    node: String,
    path: PathBuf,
    writes: mpsc::Sender<PendingWrite>,
}

impl AuditLog {
    /// Opens `path` for appending (creating it and its directory) and
    /// starts its writer thread; lines name `node`.
    pub fn open(path: &Path, node: &str) -> Result<Arc<Self>, AuditError> {
        let open = |source| AuditError::Open { path: path.to_path_buf(), source };
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(open)?;
        }
        let file = std::fs::OpenOptions::new().create(true).append(true).open(path).map_err(open)?;
        let (writes, rx) = mpsc::channel(QUEUED_WRITES);
        let owned = path.to_path_buf();
        // A thread, not a runtime task: it never holds a runtime's shutdown
        // up, and it ends once the last consumer is gone.
        std::thread::Builder::new().name("audit-log".into()).spawn(move || write_all(file, owned, rx)).map_err(open)?;
        Ok(Arc::new(Self { shared: Arc::new(Shared { node: node.to_string(), path: path.to_path_buf(), writes }) }))
    }

    /// The file written.
    pub fn path(&self) -> &Path {
        &self.shared.path
    }

    /// Appends the lines of `delivery`; returns once they are written.
    pub async fn append(&self, delivery: &Delivery) -> Result<(), AuditError> {
        self.shared.append(delivery).await
    }
}

impl Shared {
    async fn append(&self, delivery: &Delivery) -> Result<(), AuditError> {
        let mut bytes = Vec::with_capacity(128 * delivery.event_count());
        for (event, token) in delivery.events() {
            let line = AuditLine {
                node: self.node.clone(),
                stream: delivery.stream.key().to_string(),
                token: token.to_string(),
                event: event.id.to_string(),
                fence: delivery.fence.token(),
                at_us: now_us(),
            };
            // A struct of strings and numbers always serializes.
            if serde_json::to_writer(&mut bytes, &line).is_ok() {
                bytes.push(b'\n');
            }
        }
        if bytes.is_empty() {
            return Ok(());
        }
        let stopped = || AuditError::Stopped { path: self.path.clone() };
        let (done, written) = oneshot::channel();
        self.writes.send(PendingWrite { bytes, done }).await.map_err(|_| stopped())?;
        written.await.map_err(|_| stopped())?
    }
}

/// The writer: one `write` per delivery, answered once it returned.
fn write_all(mut file: std::fs::File, path: PathBuf, mut rx: mpsc::Receiver<PendingWrite>) {
    while let Some(write) = rx.blocking_recv() {
        let result = file.write_all(&write.bytes).map_err(|source| AuditError::Write { path: path.clone(), source });
        let _ = write.done.send(result);
    }
}

impl ConsumerFactory for AuditLog {
    fn name(&self) -> &str {
        "audit"
    }

    fn create(&self, _: &StreamId) -> Arc<dyn StreamConsumer> {
        Arc::new(AuditConsumer { shared: self.shared.clone() })
    }
}

struct AuditConsumer {
    shared: Arc<Shared>,
}

#[async_trait]
impl StreamConsumer for AuditConsumer {
    async fn deliver(&self, delivery: &Delivery) -> Result<DeliveryOutcome, ConsumerError> {
        self.shared.append(delivery).await.map_err(ConsumerError::failed)?;
        Ok(DeliveryOutcome::Continue)
    }
}
