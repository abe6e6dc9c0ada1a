//! The file handoff: the `LoggingConsumer` writer of JSON Lines files and the
//! rules both sides follow (seed 003).
//!
//! A writer owns one *prefix* in one directory. It appends events, one JSON
//! object per line, to `{prefix}-{n}.open`; it seals a file (fsync, atomic
//! rename to `{prefix}-{n}.jsonl`, directory fsync) when the file reaches
//! `max_file_bytes`, when it is older than `max_file_age`, and on `close`.
//! Readers (the `file` queue adapter, an external agent) read sealed `.jsonl`
//! files only, so they never see a half-written line.
//!
//! - **One writer per prefix**: `.{prefix}.lock` is created exclusively and
//!   held (flock) before anything else; a second writer fails. If the
//!   sidecar is deleted or replaced, the writer fails for good instead of
//!   writing on.
//! - **A standalone writer never steals**: a leftover lock or `.open` makes
//!   opening the prefix fail with [`HandoffError::RecoveryRequired`] naming
//!   the files; [`recover`] inspects, quarantines and republishes
//!   (`tailrace handoff recover`). Only a process holding the data
//!   directory's OS lock ([`DataDirLock`]) recovers by itself: the kernel
//!   lock proves the leftovers are orphans.
//! - **File numbers never go back**: the prefix's state file records the
//!   numbers used, so a writer opened after readers deleted every file
//!   still numbers past them.
//! - **A byte budget per prefix** (`max_total_bytes`, `.open` and `.jsonl`
//!   counted): an event past it is refused with a typed error; nothing
//!   already accepted is lost.
//! - **Durability** follows the [`FsyncPolicy`]: never (sealed files only),
//!   on every flush, or grouped.

mod dir_lock;
mod files;
mod line;
mod lock;
mod recover;
mod state;
mod writer;

pub use dir_lock::{DATA_DIR_LOCK, DataDirLock};
pub use files::{PrefixFile, list_prefix_files};
pub(crate) use files::{file_path, sealed_path, validate_prefix};
pub(crate) use line::LineView;
pub use line::{DecodedLine, decode_line};
pub use recover::{QUARANTINE, RecoveredFile, RecoveryReport, recover, recover_from, recover_tree};
pub use writer::{FsyncPolicy, LinePosition, LoggingConsumer, WriterOptions};

use std::path::PathBuf;

/// What can go wrong with a handoff directory.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum HandoffError {
    /// The prefix is not `[A-Za-z0-9][A-Za-z0-9._-]*`.
    #[error("invalid prefix `{prefix}`: {reason} (allowed: a letter or digit, then letters, digits, `.`, `_`, `-`)")]
    InvalidPrefix {
        /// The prefix given.
        prefix: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// Another live writer holds the prefix.
    #[error("prefix `{prefix}` in {dir} is held by another writer (lock {lock})")]
    Locked {
        /// The directory.
        dir: PathBuf,
        /// The prefix.
        prefix: String,
        /// The lock sidecar.
        lock: PathBuf,
    },
    /// A crash left files behind; an operator must look at them first.
    #[error(
        "prefix `{prefix}` in {dir} needs recovery (RECOVERY_REQUIRED): leftover {}; a node recovers its own data directory at start; otherwise inspect and recover with `tailrace handoff recover --dir {} --prefix {prefix} --republish`",
        files.iter().map(|f| f.display().to_string()).collect::<Vec<_>>().join(", "),
        dir.display()
    )]
    RecoveryRequired {
        /// The directory.
        dir: PathBuf,
        /// The prefix.
        prefix: String,
        /// The leftover lock and `.open` files.
        files: Vec<PathBuf>,
    },
    /// Another live process holds the data directory.
    #[error(
        "data directory {dir} is in use by another tailrace process ({holder}); stop it first, or give this one its own --data-dir"
    )]
    DataDirBusy {
        /// The directory.
        dir: PathBuf,
        /// What the lock file says of its holder (`pid N`).
        holder: String,
    },
    /// Accepting the events would pass the prefix's byte budget.
    #[error(
        "budget of prefix `{prefix}` exceeded: {used} bytes used + {incoming} incoming > {max} (max_total_bytes); nothing was written"
    )]
    BudgetExceeded {
        /// The prefix.
        prefix: String,
        /// Bytes used by `.open` and `.jsonl` files.
        used: u64,
        /// Bytes refused.
        incoming: u64,
        /// The budget.
        max: u64,
    },
    /// The lock sidecar was deleted or replaced: the writer stopped for good.
    #[error("lock {lock} was {what}; the writer stopped and accepts nothing more")]
    LockLost {
        /// The sidecar.
        lock: PathBuf,
        /// Deleted or replaced.
        what: &'static str,
    },
    /// An empty batch was offered.
    #[error("refusing an empty batch for stream {0}")]
    EmptyBatch(crate::stream::StreamId),
    /// The writer failed earlier and accepts nothing more.
    #[error("the writer failed earlier and accepts nothing more: {0}")]
    Failed(String),
    /// A file-system error, with what was being done.
    #[error("{context}: {source}")]
    Io {
        /// What was being done (with the path).
        context: String,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
}

impl HandoffError {
    /// The same error again, for a second caller (an I/O error keeps its
    /// kind and OS code: a full disk stays a full disk).
    pub(crate) fn copy(&self) -> HandoffError {
        match self {
            HandoffError::Io { context, source } => {
                let source = match source.raw_os_error() {
                    Some(code) => std::io::Error::from_raw_os_error(code),
                    None => std::io::Error::new(source.kind(), source.to_string()),
                };
                HandoffError::Io { context: context.clone(), source }
            }
            other => HandoffError::Failed(other.to_string()),
        }
    }

    pub(crate) fn io(context: impl Into<String>) -> impl FnOnce(std::io::Error) -> HandoffError {
        let context = context.into();
        move |source| HandoffError::Io { context, source }
    }
}
