//! The lock sidecar `.{prefix}.lock`: created exclusively, held with an OS
//! lock while the writer lives, checked before every accept, flush and the
//! final sync of `close`.

use std::fs::{File, OpenOptions, TryLockError};
use std::io::Write;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use super::HandoffError;
use super::files::sync_dir;

/// A held lock sidecar.
pub(crate) struct PrefixLock {
    path: PathBuf,
    file: File,
    identity: (u64, u64),
}

/// What is at the lock path when a writer wants it.
pub(crate) enum Acquired {
    /// Ours now.
    Held(PrefixLock),
    /// A live writer holds it.
    Busy,
    /// A sidecar nobody holds: a crash left it.
    Stale,
}

impl PrefixLock {
    /// Creates the sidecar exclusively and locks it.
    pub(crate) fn acquire(dir: &Path, path: PathBuf) -> Result<Acquired, HandoffError> {
        match OpenOptions::new().write(true).create_new(true).open(&path) {
            Ok(mut file) => {
                lock(&file, &path)?;
                let token = format!("pid {} token {:032x}\n", std::process::id(), rand::random::<u128>());
                file.write_all(token.as_bytes()).map_err(HandoffError::io(format!("writing {}", path.display())))?;
                file.sync_all().map_err(HandoffError::io(format!("syncing {}", path.display())))?;
                sync_dir(dir)?;
                let identity = identity(&file, &path)?;
                Ok(Acquired::Held(PrefixLock { path, file, identity }))
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(probe(&path)?),
            Err(e) => Err(HandoffError::io(format!("creating lock {}", path.display()))(e)),
        }
    }

    /// Fails if the sidecar was deleted or replaced since it was taken.
    pub(crate) fn verify(&self) -> Result<(), HandoffError> {
        match std::fs::metadata(&self.path) {
            Ok(meta) if (meta.dev(), meta.ino()) == self.identity => Ok(()),
            Ok(_) => Err(HandoffError::LockLost { lock: self.path.clone(), what: "replaced by another file" }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                Err(HandoffError::LockLost { lock: self.path.clone(), what: "deleted" })
            }
            Err(e) => Err(HandoffError::io(format!("checking lock {}", self.path.display()))(e)),
        }
    }

    /// Gives the prefix back (clean close): removes the sidecar.
    pub(crate) fn release(self, dir: &Path) -> Result<(), HandoffError> {
        std::fs::remove_file(&self.path).map_err(HandoffError::io(format!("removing lock {}", self.path.display())))?;
        sync_dir(dir)?;
        drop(self.file);
        Ok(())
    }
}

/// Is an existing sidecar held by a live writer?
pub(crate) fn probe(path: &Path) -> Result<Acquired, HandoffError> {
    let file = OpenOptions::new()
        .write(true)
        .open(path)
        .map_err(HandoffError::io(format!("opening lock {}", path.display())))?;
    match file.try_lock() {
        Ok(()) => {
            let _ = file.unlock();
            Ok(Acquired::Stale)
        }
        Err(TryLockError::WouldBlock) => Ok(Acquired::Busy),
        Err(TryLockError::Error(e)) => Err(HandoffError::io(format!("locking {}", path.display()))(e)),
    }
}

fn lock(file: &File, path: &Path) -> Result<(), HandoffError> {
    file.try_lock().map_err(|e| match e {
        TryLockError::WouldBlock => HandoffError::Failed(format!("{} was locked as it was created", path.display())),
        TryLockError::Error(e) => HandoffError::io(format!("locking {}", path.display()))(e),
    })
}

fn identity(file: &File, path: &Path) -> Result<(u64, u64), HandoffError> {
    let meta = file.metadata().map_err(HandoffError::io(format!("reading {}", path.display())))?;
    Ok((meta.dev(), meta.ino()))
}
