//! When lines arrived (`times.bin`): one 16-byte record per container with
//! lines and an arrival time, `(first line offset, ms)` little-endian, in
//! offset order. The meta's `times` says how many records are the run's:
//! records past it (a crashed append's) are cut off by the next append and
//! never read. Times are not synced: a power cut may lose the last records
//! (their lines then read with the time before), never a line.

use std::fs::{File, OpenOptions};
use std::io::{Seek, SeekFrom, Write};
use std::os::unix::fs::FileExt;
use std::path::Path;

use super::{Inner, Meta, io};
use crate::archive::StoreError;

const RECORD: u64 = 16;

fn record(file: &File, index: u64) -> std::io::Result<(u64, u64)> {
    let mut bytes = [0u8; RECORD as usize];
    file.read_exact_at(&mut bytes, index * RECORD)?;
    let (offset, ms) = bytes.split_at(8);
    let word = |b: &[u8]| u64::from_le_bytes(b.try_into().unwrap_or_default());
    Ok((word(offset), word(ms)))
}

impl Inner {
    /// Records that the lines from `offset` arrived at `ms`, as the
    /// `meta.times`th record (the meta is written after, by the caller).
    pub(super) fn append_time(&self, dir: &Path, meta: &mut Meta, offset: u64, ms: u64) -> Result<(), StoreError> {
        let path = dir.join("times.bin");
        let context = || format!("appending to {}", path.display());
        let mut file =
            OpenOptions::new().create(true).write(true).truncate(false).open(&path).map_err(io(context()))?;
        let len = file.metadata().map_err(io(context()))?.len();
        // Shorter than the meta says (a power cut): keep what is there.
        meta.times = meta.times.min(len / RECORD);
        file.set_len(meta.times * RECORD).map_err(io(context()))?;
        file.seek(SeekFrom::End(0)).map_err(io(context()))?;
        let mut bytes = offset.to_le_bytes().to_vec();
        bytes.extend_from_slice(&ms.to_le_bytes());
        file.write_all(&bytes).map_err(io(context()))?;
        meta.times += 1;
        Ok(())
    }

    /// The marks of lines `[from, to)`: the last record at or before
    /// `from`, then every record before `to` (found by bisection).
    pub(super) fn read_times(
        &self,
        dir: &Path,
        meta: &Meta,
        from: u64,
        to: u64,
    ) -> Result<Vec<(u64, u64)>, StoreError> {
        if from >= to.min(meta.info.lines) {
            return Ok(Vec::new());
        }
        let path = dir.join("times.bin");
        let file = match File::open(&path) {
            Ok(file) => file,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(io(format!("opening {}", path.display()))(e)),
        };
        let context = || format!("reading {}", path.display());
        let len = file.metadata().map_err(io(context()))?.len();
        let count = meta.times.min(len / RECORD);
        // The first record whose offset is past `from`.
        let (mut lo, mut hi) = (0u64, count);
        while lo < hi {
            let mid = (lo + hi) / 2;
            if record(&file, mid).map_err(io(context()))?.0 <= from { lo = mid + 1 } else { hi = mid }
        }
        let mut marks = Vec::new();
        for index in lo.saturating_sub(1)..count {
            let (offset, ms) = record(&file, index).map_err(io(context()))?;
            if offset >= to.min(meta.info.lines) {
                break;
            }
            marks.push((offset, ms));
        }
        Ok(marks)
    }
}
