//! A node's hold on its data directory: an OS lock (`flock`) on
//! `{dir}/.tailrace.lock`, held for the node's whole life and dropped by the
//! kernel when the process ends, however it ends.
//!
//! Holding it proves that no other live process of ours writes under the
//! directory, so what a writer left there (prefix locks, `.open` files) is
//! an orphan that the holder may recover itself ([`DataDirLock::recover`]).
//! A standalone `LoggingConsumer` never does this: it refuses and never
//! steals (seed 003); only a lock holder may.

use std::fs::{File, OpenOptions, TryLockError};
use std::io::{Read, Seek, Write};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use super::HandoffError;
use super::recover::{RecoveryReport, recover_from};

/// The lock file's name in a data directory.
pub const DATA_DIR_LOCK: &str = ".tailrace.lock";

/// An exclusive hold on a data directory. Released when dropped.
#[derive(Debug)]
pub struct DataDirLock {
    dir: PathBuf,
    _file: File,
}

impl DataDirLock {
    /// Takes `dir` (created if missing) for this process, or fails with
    /// [`HandoffError::DataDirBusy`] naming the process that holds it.
    pub fn acquire(dir: impl Into<PathBuf>) -> Result<Self, HandoffError> {
        let dir = dir.into();
        crate::atomic_file::create_dir_all(&dir, crate::atomic_file::Durability::Synced)
            .map_err(HandoffError::io(format!("creating {}", dir.display())))?;
        let path = dir.join(DATA_DIR_LOCK);
        let io = |what: &str| HandoffError::io(format!("{what} {}", path.display()));
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(io("opening"))?;
        match file.try_lock() {
            Ok(()) => {}
            Err(TryLockError::WouldBlock) => {
                let mut holder = String::new();
                let _ = file.read_to_string(&mut holder);
                return Err(HandoffError::DataDirBusy { dir, holder: holder.trim().chars().take(200).collect() });
            }
            Err(TryLockError::Error(e)) => return Err(io("locking")(e)),
        }
        // The lock file is never deleted, so the inode we locked is the
        // one every later process opens; check it all the same.
        let (ours, named) = (file.metadata().map_err(io("reading"))?, std::fs::metadata(&path).map_err(io("reading"))?);
        if (ours.dev(), ours.ino()) != (named.dev(), named.ino()) {
            return Err(HandoffError::Failed(format!("{} was replaced while it was being locked", path.display())));
        }
        let holder = format!("pid {}\n", std::process::id());
        file.set_len(0).map_err(io("writing"))?;
        file.rewind().map_err(io("writing"))?;
        file.write_all(holder.as_bytes()).map_err(io("writing"))?;
        Ok(Self { dir, _file: file })
    }

    /// The directory held.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Recovers `prefix` in the queue directory `dir` (inside the held
    /// directory): a stale prefix lock removed, the complete lines of
    /// `.open` files republished with their event ids into files numbered
    /// from at least `first_file`, the files (and any torn tail) moved to
    /// the queue's `quarantine/`.
    pub fn recover(&self, dir: &Path, prefix: &str, first_file: u64) -> Result<RecoveryReport, HandoffError> {
        if !dir.starts_with(&self.dir) {
            return Err(HandoffError::Failed(format!(
                "{} is outside the locked data directory {}",
                dir.display(),
                self.dir.display()
            )));
        }
        recover_from(dir, prefix, true, first_file)
    }
}
