//! What an adapter factory hands the runtime besides its queues: where
//! checkpoints are stored ([`Checkpointer`], with its error) and the shape
//! of each queue's cache ([`CacheOptions`]). They are part of the plug-in
//! surface, so they live here, below the runtime that uses them;
//! `checkpoint` and `cache` re-export them.

use std::path::PathBuf;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use super::Fence;
use crate::stream::{QueueId, SequenceToken};

/// A checkpoint could not be read or written.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CheckpointError {
    /// File-system failure, with the path.
    #[error("checkpoint {path}: {source}")]
    Io {
        /// The file or directory involved.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// A checkpoint file that is not ours or is damaged.
    #[error("checkpoint {path} is corrupt: {reason}")]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// The backing store failed.
    #[error("checkpoint store: {0}")]
    Backend(String),
    /// A checkpoint could not be encoded.
    #[error("checkpoint could not be encoded: {0}")]
    Encode(#[source] serde_json::Error),
    /// A newer lease of the queue was granted: the write of the old
    /// owner was refused.
    #[error("checkpoint of queue {queue} refused: a lease newer than token {token} was granted")]
    Fenced {
        /// The queue.
        queue: QueueId,
        /// The refused writer's fencing token.
        token: u64,
    },
    /// The blocking task doing the file work failed (panicked).
    #[error("checkpoint {0} task failed: {1}")]
    Task(&'static str, #[source] tokio::task::JoinError),
}

/// Stores one checkpoint per queue.
#[async_trait]
pub trait Checkpointer: Send + Sync + 'static {
    /// The stored checkpoint of `queue`, if any.
    async fn load(&self, queue: QueueId) -> Result<Option<SequenceToken>, CheckpointError>;

    /// Stores `token` as `queue`'s checkpoint, written under `fence`;
    /// durable when this returns. A store that can fence refuses it with
    /// [`CheckpointError::Fenced`] once a newer lease of the queue was
    /// granted; one that cannot ignores the fence.
    async fn save(&self, queue: QueueId, token: SequenceToken, fence: Fence) -> Result<(), CheckpointError>;
}

/// Size and shape of one queue's cache.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CacheOptions {
    /// Most containers held at once (Orleans `CacheSize`, 4096).
    pub cache_size: usize,
    /// Pressure buckets (Orleans uses 10).
    pub buckets: usize,
}

impl Default for CacheOptions {
    fn default() -> Self {
        Self { cache_size: 4096, buckets: 10 }
    }
}
