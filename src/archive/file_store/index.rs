//! The run log's index (`log.idx`): the byte offset of every
//! `INDEX_EVERY`th line, appended with the lines and synced with them. It
//! is derived data: an index shorter than the meta says, or whose entry
//! does not start a line (what a crash or a power cut can leave), is
//! rebuilt from the log, never trusted and never padded.

use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Read, Seek, SeekFrom, Write};
use std::path::Path;

use super::{INDEX_EVERY, Inner, Meta, io};
use crate::archive::{RunKey, StoreError};

impl Inner {
    /// Appends `entries` (of the lines after `meta`'s) to the index. An
    /// index shorter than `meta` says (a power cut lost its tail) is
    /// rebuilt first, never padded; entries past it (a crashed append's)
    /// are cut off.
    pub(super) fn append_index(&self, dir: &Path, meta: &Meta, entries: &[u8]) -> Result<(), StoreError> {
        let idx_path = dir.join("log.idx");
        let open = || {
            OpenOptions::new()
                .create(true)
                .write(true)
                .truncate(false)
                .open(&idx_path)
                .map_err(io(format!("opening {}", idx_path.display())))
        };
        let mut idx = open()?;
        let kept = meta.info.lines.div_ceil(INDEX_EVERY) * 8;
        let len = idx.metadata().map_err(io(format!("reading {}", idx_path.display())))?.len();
        if len < kept {
            drop(idx);
            self.rebuild_index(dir, meta)?;
            idx = open()?;
        }
        idx.set_len(kept).map_err(io(format!("truncating {}", idx_path.display())))?;
        idx.seek(SeekFrom::End(0))
            .and_then(|_| idx.write_all(entries))
            .map_err(io(format!("appending to {}", idx_path.display())))?;
        if self.fsync {
            idx.sync_data().map_err(io(format!("syncing {}", idx_path.display())))?;
        }
        Ok(())
    }

    /// The byte offset of line `entry * INDEX_EVERY`, rebuilding the index
    /// when it is short or the entry does not start a line of `log` (a
    /// crash or a power cut before the index was written or synced).
    pub(super) fn index_entry(
        &self,
        run: &RunKey,
        dir: &Path,
        meta: &Meta,
        log: &File,
        entry: u64,
    ) -> Result<u64, StoreError> {
        let idx_path = dir.join("log.idx");
        let needed = meta.info.lines.div_ceil(INDEX_EVERY);
        let bytes = std::fs::read(&idx_path).unwrap_or_default();
        let at = (entry * 8) as usize;
        let offset = (bytes.len() as u64 >= needed * 8)
            .then(|| bytes.get(at..at + 8).and_then(|b| b.try_into().ok()).map(u64::from_le_bytes))
            .flatten()
            .filter(|&offset| starts_line(log, entry, offset, meta.info.bytes));
        if let Some(offset) = offset {
            return Ok(offset);
        }
        let _guard = self.lock(run);
        let bytes = self.rebuild_index(dir, meta)?;
        let raw: [u8; 8] = bytes
            .get(at..at + 8)
            .and_then(|b| b.try_into().ok())
            .ok_or_else(|| StoreError::Corrupt(idx_path.display().to_string()))?;
        Ok(u64::from_le_bytes(raw))
    }

    pub(super) fn rebuild_index(&self, dir: &Path, meta: &Meta) -> Result<Vec<u8>, StoreError> {
        let log_path = dir.join("log.txt");
        let file = File::open(&log_path).map_err(io(format!("opening {}", log_path.display())))?;
        let mut reader = BufReader::new(file.take(meta.info.bytes));
        let (mut index, mut offset, mut line, mut buf) = (Vec::new(), 0u64, 0u64, Vec::new());
        while line < meta.info.lines {
            if line.is_multiple_of(INDEX_EVERY) {
                index.extend_from_slice(&offset.to_le_bytes());
            }
            buf.clear();
            let n = reader.read_until(b'\n', &mut buf).map_err(io(format!("reading {}", log_path.display())))?;
            if n == 0 {
                return Err(StoreError::Corrupt(format!("{} is shorter than its meta", log_path.display())));
            }
            offset += n as u64;
            line += 1;
        }
        let idx_path = dir.join("log.idx");
        std::fs::write(&idx_path, &index).map_err(io(format!("writing {}", idx_path.display())))?;
        Ok(index)
    }
}

/// Whether `offset`, the index's entry `entry`, can start a line of `log`
/// (whose first `len` bytes are the run's): the first entry is 0, any
/// other follows a newline. Zeros or garbage from a lost write are not.
fn starts_line(log: &File, entry: u64, offset: u64, len: u64) -> bool {
    use std::os::unix::fs::FileExt;
    if entry == 0 || offset == 0 {
        return entry == 0 && offset == 0;
    }
    let mut byte = [0u8];
    offset < len && log.read_exact_at(&mut byte, offset - 1).is_ok() && byte[0] == b'\n'
}
