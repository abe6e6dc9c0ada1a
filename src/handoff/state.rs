//! The prefix's state file `.{prefix}.state`: the file numbers a writer may
//! have used, so numbers never go back, whatever readers deleted.
//!
//! A writer reserves numbers in blocks: before it creates file `n` at or
//! past the reserved mark, it durably records `n + RESERVE` (atomic replace:
//! temp file, fsync, rename, directory fsync). A writer that opens the
//! prefix later starts at the recorded mark, past every number used before,
//! even when every file was consumed and deleted. One write per `RESERVE`
//! files keeps it off the hot path.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::HandoffError;
use crate::atomic_file::{self, Durability};

/// File numbers reserved by one write of the state file.
pub(crate) const RESERVE: u64 = 1024;

/// The on-disk form; versioned.
#[derive(Serialize, Deserialize)]
#[serde(tag = "version")]
enum StateFile {
    #[serde(rename = "1")]
    V1 {
        /// Every file number below this may have been used.
        next_file: u64,
    },
}

/// The state file of `prefix` in `dir`.
pub(crate) fn state_path(dir: &Path, prefix: &str) -> PathBuf {
    dir.join(format!(".{prefix}.state"))
}

/// The first file number never used, as recorded (`None` without a state
/// file). A damaged state file is an error naming it: guessing could reuse
/// a number.
pub(crate) fn read_next_file(dir: &Path, prefix: &str) -> Result<Option<u64>, HandoffError> {
    let path = state_path(dir, prefix);
    let bytes = match std::fs::read(&path) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(HandoffError::io(format!("reading {}", path.display()))(e)),
    };
    match serde_json::from_slice::<StateFile>(&bytes) {
        Ok(StateFile::V1 { next_file }) => Ok(Some(next_file)),
        Err(e) => Err(HandoffError::Failed(format!("state file {} is damaged: {e}", path.display()))),
    }
}

/// Records durably that every number below `next_file` may have been used.
pub(crate) fn write_next_file(dir: &Path, prefix: &str, next_file: u64) -> Result<(), HandoffError> {
    let path = state_path(dir, prefix);
    let body = serde_json::to_vec(&StateFile::V1 { next_file })
        .map_err(|e| HandoffError::Failed(format!("encoding {}: {e}", path.display())))?;
    atomic_file::replace(&path, &body, Durability::Synced)
        .map_err(HandoffError::io(format!("writing {}", path.display())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_mark_round_trips_and_a_damaged_file_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(read_next_file(dir.path(), "events").unwrap(), None);
        write_next_file(dir.path(), "events", 2049).unwrap();
        assert_eq!(read_next_file(dir.path(), "events").unwrap(), Some(2049));
        std::fs::write(state_path(dir.path(), "events"), b"{\"version\":\"1\"").unwrap();
        let err = read_next_file(dir.path(), "events").unwrap_err().to_string();
        assert!(err.contains(".events.state") && err.contains("damaged"), "{err}");
    }
}
