//! Run logs in a directory (embedded mode):
//!
//! ```text
//! {root}/{fqn}/{runId}/log.txt     the lines, each ending in \n
//! {root}/{fqn}/{runId}/log.idx     byte offset of every 1024th line (u64 LE)
//! {root}/{fqn}/{runId}/meta.json   lines, bytes, last token, status, full names (atomic replace)
//! ```
//!
//! Names are percent-encoded (anything but `A-Za-z0-9._-`, and a leading
//! `.`), so no name can leave the root; a name whose encoding would pass
//! 255 bytes gets a readable prefix and a hash instead, and its full name
//! is read from the meta (see `file_names`). `meta.json` is the truth: an append
//! writes the lines, then replaces the meta; bytes past the meta's length
//! (a crash between the two) are cut off by the next append and never read.
//! The index is rebuilt from the log whenever it is shorter than the meta
//! says. Writes to one run are serialised by a striped lock held on the
//! blocking pool, never across an `.await`.
//!
//! Retention removes a run under its lock, and only if its meta is still
//! the one it was chosen by: the run's directory is renamed to
//! `{root}/.trash-*` (one rename: the run is there whole or gone), then
//! deleted; an emptied pipeline directory goes too. Trash a crash left
//! behind is deleted by the next prune; names starting with `.` are never
//! pipelines (encoded names never start with one).

use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use async_trait::async_trait;
use parking_lot::{Mutex, MutexGuard};
use serde::{Deserialize, Serialize};
use tokio::sync::Notify;

mod index;
mod prune;
mod times;

use super::file_names::{decode, folder, is_hashed};
#[cfg(test)]
use super::retention::Planner;
use super::{
    Append, Clock, PruneReport, RetentionPolicy, RunInfo, RunKey, RunLogStore, RunState, RunSummary, StoreError,
};
use crate::atomic_file::{self, Durability};
use crate::stream::SequenceToken;

/// Lines between two index entries.
const INDEX_EVERY: u64 = 1024;
/// Lock stripes (runs hash onto them).
const STRIPES: usize = 64;
/// Where a removed run's directory goes before it is deleted.
const TRASH: &str = ".trash-";

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
struct Meta {
    fqn: String,
    run: String,
    #[serde(flatten)]
    info: RunInfo,
    /// Fingerprints of the run's last containers, newest last (at most
    /// `RECENT_BATCHES`): a retried batch is dropped.
    #[serde(default, skip_serializing_if = "std::collections::VecDeque::is_empty")]
    recent: std::collections::VecDeque<u64>,
    /// Records of `times.bin` that are the run's.
    #[serde(default, skip_serializing_if = "is_zero")]
    times: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// See the module documentation.
pub struct FileRunLogStore {
    inner: Arc<Inner>,
    /// Woken (`notify_waiters`) after each write: the waits of
    /// [`RunLogStore::wait_stored`] look again.
    written: Arc<Notify>,
}

struct Inner {
    root: PathBuf,
    fsync: bool,
    stripes: Vec<Mutex<()>>,
    clock: Clock,
    trash_seq: AtomicU64,
}

fn durability(fsync: bool) -> Durability {
    if fsync { Durability::Synced } else { Durability::Unsynced }
}

fn io(context: impl Into<String>) -> impl FnOnce(std::io::Error) -> StoreError {
    let context = context.into();
    move |source| StoreError::Io { context, source }
}

impl FileRunLogStore {
    /// A store under `root` (created if missing). With `fsync`, an append
    /// is on disk before it returns (the archiver acks only then).
    pub fn open(root: impl Into<PathBuf>, fsync: bool) -> Result<Self, StoreError> {
        Self::open_with_clock(root, fsync, super::system_clock())
    }

    /// As [`FileRunLogStore::open`], stamping runs with `clock`'s time.
    pub fn open_with_clock(root: impl Into<PathBuf>, fsync: bool, clock: Clock) -> Result<Self, StoreError> {
        let root = root.into();
        atomic_file::create_dir_all(&root, durability(fsync)).map_err(io(format!("creating {}", root.display())))?;
        let stripes = (0..STRIPES).map(|_| Mutex::new(())).collect();
        let inner = Arc::new(Inner { root, fsync, stripes, clock, trash_seq: AtomicU64::new(0) });
        Ok(Self { inner, written: Arc::new(Notify::new()) })
    }

    async fn blocking<T: Send + 'static>(
        &self,
        work: impl FnOnce(&Inner) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, StoreError> {
        let inner = self.inner.clone();
        tokio::task::spawn_blocking(move || work(&inner)).await.map_err(StoreError::Task)?
    }
}

impl Inner {
    fn dir(&self, run: &RunKey) -> PathBuf {
        self.root.join(folder(run.fqn())).join(folder(run.run()))
    }

    /// The meta of `run` in its folder `dir`. A meta of another run there
    /// (two long names with the same hash) is refused, never mixed in.
    fn run_meta(&self, run: &RunKey, dir: &Path) -> Result<Option<Meta>, StoreError> {
        let meta = self.read_meta(dir)?;
        if let Some(meta) = &meta
            && (meta.fqn != run.fqn() || meta.run != run.run())
        {
            return Err(StoreError::Corrupt(format!(
                "{} (it holds run {}/{}, not {run})",
                dir.display(),
                meta.fqn,
                meta.run
            )));
        }
        Ok(meta)
    }

    fn lock(&self, run: &RunKey) -> MutexGuard<'_, ()> {
        let stripe = (run.stream().stable_hash() % STRIPES as u64) as usize;
        self.stripes[stripe].lock()
    }

    fn read_meta(&self, dir: &Path) -> Result<Option<Meta>, StoreError> {
        let path = dir.join("meta.json");
        match std::fs::read(&path) {
            Ok(bytes) => serde_json::from_slice(&bytes)
                .map(Some)
                .map_err(|e| StoreError::Corrupt(format!("{} ({e})", path.display()))),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(io(format!("reading {}", path.display()))(e)),
        }
    }

    fn write_meta(&self, dir: &Path, meta: &Meta) -> Result<(), StoreError> {
        let path = dir.join("meta.json");
        let json = serde_json::to_vec(meta).map_err(StoreError::Encode)?;
        atomic_file::replace(&path, &json, durability(self.fsync)).map_err(io(format!("writing {}", path.display())))
    }

    /// The run's meta, creating the run if it is new.
    fn meta_or_new(&self, run: &RunKey, dir: &Path) -> Result<Meta, StoreError> {
        if let Some(meta) = self.run_meta(run, dir)? {
            return Ok(meta);
        }
        // A prune may remove the pipeline's directory, emptied of its last
        // run, between the two levels create_dir_all makes: try again.
        let mut attempts = 0;
        while let Err(e) = atomic_file::create_dir_all_under(&self.root, dir, durability(self.fsync)) {
            attempts += 1;
            if e.kind() != std::io::ErrorKind::NotFound || attempts == 3 {
                return Err(io(format!("creating {}", dir.display()))(e));
            }
        }
        let now = (self.clock)();
        let meta = Meta {
            fqn: run.fqn().to_string(),
            run: run.run().to_string(),
            info: RunInfo { created_ms: now, updated_ms: now, ..RunInfo::default() },
            recent: Default::default(),
            times: 0,
        };
        self.write_meta(dir, &meta)?;
        Ok(meta)
    }

    fn append(&self, run: &RunKey, token: SequenceToken, how: Append, lines: &[String]) -> Result<bool, StoreError> {
        let fingerprint = how.fingerprint;
        let _guard = self.lock(run);
        let dir = self.dir(run);
        let mut meta = self.meta_or_new(run, &dir)?;
        if meta.info.last_token.is_some_and(|last| last >= token) {
            return Ok(false);
        }
        if let Some(fingerprint) = fingerprint {
            if meta.recent.contains(&fingerprint) {
                // A producer's retried batch: the token moves, nothing else.
                meta.info.last_token = Some(token);
                self.write_meta(&dir, &meta)?;
                return Ok(false);
            }
            if meta.recent.len() >= super::RECENT_BATCHES {
                meta.recent.pop_front();
            }
            meta.recent.push_back(fingerprint);
        }
        let log_path = dir.join("log.txt");
        let mut log = OpenOptions::new()
            .create(true)
            .write(true)
            .truncate(false)
            .open(&log_path)
            .map_err(io(format!("opening {}", log_path.display())))?;
        // Bytes past the meta are a crashed append's: cut them off.
        log.set_len(meta.info.bytes).map_err(io(format!("truncating {}", log_path.display())))?;
        log.seek(SeekFrom::Start(meta.info.bytes)).map_err(io(format!("seeking {}", log_path.display())))?;
        let mut buffer = Vec::with_capacity(lines.iter().map(|l| l.len() + 1).sum());
        let mut index = Vec::new();
        for (i, line) in lines.iter().enumerate() {
            if (meta.info.lines + i as u64).is_multiple_of(INDEX_EVERY) {
                index.extend_from_slice(&(meta.info.bytes + buffer.len() as u64).to_le_bytes());
            }
            buffer.extend_from_slice(line.as_bytes());
            buffer.push(b'\n');
        }
        log.write_all(&buffer).map_err(io(format!("appending to {}", log_path.display())))?;
        if self.fsync {
            log.sync_data().map_err(io(format!("syncing {}", log_path.display())))?;
        }
        if !index.is_empty() {
            self.append_index(&dir, &meta, &index)?;
        }
        if let Some(ms) = how.arrived_ms.filter(|_| !lines.is_empty()) {
            let first = meta.info.lines;
            self.append_time(&dir, &mut meta, first, ms)?;
        }
        meta.info.lines += lines.len() as u64;
        meta.info.bytes += buffer.len() as u64;
        meta.info.last_token = Some(token);
        meta.info.updated_ms = (self.clock)();
        self.write_meta(&dir, &meta)?;
        Ok(true)
    }

    fn read(&self, run: &RunKey, from: u64, max_lines: usize, max_bytes: usize) -> Result<Vec<String>, StoreError> {
        let dir = self.dir(run);
        let Some(meta) = self.run_meta(run, &dir)? else { return Ok(Vec::new()) };
        if from >= meta.info.lines || max_lines == 0 {
            return Ok(Vec::new());
        }
        let log_path = dir.join("log.txt");
        let mut file = File::open(&log_path).map_err(io(format!("opening {}", log_path.display())))?;
        let start = self.index_entry(run, &dir, &meta, &file, from / INDEX_EVERY)?;
        file.seek(SeekFrom::Start(start)).map_err(io(format!("seeking {}", log_path.display())))?;
        let mut reader = BufReader::new(file.take(meta.info.bytes.saturating_sub(start)));
        let (mut line, mut taken, mut out, mut buf) =
            ((from / INDEX_EVERY) * INDEX_EVERY, 0usize, Vec::new(), Vec::new());
        while line < meta.info.lines && out.len() < max_lines {
            buf.clear();
            let n = reader.read_until(b'\n', &mut buf).map_err(io(format!("reading {}", log_path.display())))?;
            if n == 0 {
                break;
            }
            if line >= from {
                if !out.is_empty() && taken + n > max_bytes {
                    break;
                }
                taken += n;
                let text = buf.strip_suffix(b"\n").unwrap_or(&buf);
                out.push(String::from_utf8_lossy(text).into_owned());
            }
            line += 1;
        }
        Ok(out)
    }

    fn set_state(&self, run: &RunKey, state: RunState) -> Result<(), StoreError> {
        let _guard = self.lock(run);
        let dir = self.dir(run);
        let mut meta = self.meta_or_new(run, &dir)?;
        if meta.info.state != Some(state) {
            meta.info.state = Some(state);
            meta.info.updated_ms = (self.clock)();
            self.write_meta(&dir, &meta)?;
        }
        Ok(())
    }

    fn runs(&self, fqn: &str, limit: usize) -> Result<Vec<RunSummary>, StoreError> {
        let dir = self.root.join(folder(fqn));
        let entries = match std::fs::read_dir(&dir) {
            Ok(entries) => entries,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(io(format!("listing {}", dir.display()))(e)),
        };
        let mut runs = Vec::new();
        for entry in entries.flatten() {
            if let Some(meta) = self.read_meta(&entry.path())?
                && meta.fqn == fqn
            {
                runs.push(RunSummary { run: meta.run, info: meta.info });
            }
        }
        runs.sort_by(|a, b| b.info.created_ms.cmp(&a.info.created_ms).then_with(|| b.run.cmp(&a.run)));
        runs.truncate(limit);
        Ok(runs)
    }

    fn pipelines(&self, limit: usize) -> Result<Vec<String>, StoreError> {
        let entries = std::fs::read_dir(&self.root).map_err(io(format!("listing {}", self.root.display())))?;
        let mut names = Vec::new();
        for entry in entries.flatten() {
            let name = entry.file_name();
            let Some(name) = name.to_str().filter(|n| !n.starts_with('.')) else { continue };
            if is_hashed(name) {
                names.extend(self.hashed_pipeline(&entry.path(), name)?);
            } else {
                names.extend(decode(name));
            }
        }
        names.sort();
        names.truncate(limit);
        Ok(names)
    }

    /// The full name of the pipeline in the hashed folder `dir` (`name`):
    /// the one its runs' metas hold. `None` while it holds no run.
    fn hashed_pipeline(&self, dir: &Path, name: &str) -> Result<Option<String>, StoreError> {
        let runs = match std::fs::read_dir(dir) {
            Ok(runs) => runs,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(io(format!("listing {}", dir.display()))(e)),
        };
        for run in runs.flatten() {
            if let Some(meta) = self.read_meta(&run.path())?
                && folder(&meta.fqn) == name
            {
                return Ok(Some(meta.fqn));
            }
        }
        Ok(None)
    }
}

#[async_trait]
impl RunLogStore for FileRunLogStore {
    async fn append(
        &self,
        run: &RunKey,
        token: SequenceToken,
        lines: &[&str],
        how: Append,
    ) -> Result<bool, StoreError> {
        let (run, lines) = (run.clone(), lines.iter().map(|l| l.to_string()).collect::<Vec<_>>());
        let appended = self.blocking(move |inner| inner.append(&run, token, how, &lines)).await;
        self.written.notify_waiters();
        appended
    }

    async fn set_state(&self, run: &RunKey, state: RunState) -> Result<(), StoreError> {
        let run = run.clone();
        let set = self.blocking(move |inner| inner.set_state(&run, state)).await;
        self.written.notify_waiters();
        set
    }

    async fn info(&self, run: &RunKey) -> Result<Option<RunInfo>, StoreError> {
        let run = run.clone();
        self.blocking(move |inner| Ok(inner.run_meta(&run, &inner.dir(&run))?.map(|m| m.info))).await
    }

    async fn info_and_recent(&self, run: &RunKey) -> Result<Option<(RunInfo, Vec<u64>)>, StoreError> {
        let run = run.clone();
        self.blocking(move |inner| {
            Ok(inner.run_meta(&run, &inner.dir(&run))?.map(|m| (m.info, m.recent.into_iter().collect())))
        })
        .await
    }

    async fn times(&self, run: &RunKey, from: u64, to: u64) -> Result<Vec<(u64, u64)>, StoreError> {
        let run = run.clone();
        self.blocking(move |inner| {
            let dir = inner.dir(&run);
            match inner.run_meta(&run, &dir)? {
                Some(meta) => inner.read_times(&dir, &meta, from, to),
                None => Ok(Vec::new()),
            }
        })
        .await
    }

    async fn wait_stored(&self, run: &RunKey, token: SequenceToken, within: Duration) -> bool {
        // A `Notified` sees every `notify_waiters` after it was made.
        super::stored_within(self, run, token, within, || Some(self.written.notified())).await
    }

    async fn read(
        &self,
        run: &RunKey,
        from: u64,
        max_lines: usize,
        max_bytes: usize,
    ) -> Result<Vec<String>, StoreError> {
        let run = run.clone();
        self.blocking(move |inner| inner.read(&run, from, max_lines, max_bytes)).await
    }

    async fn pipeline_exists(&self, fqn: &str) -> Result<bool, StoreError> {
        let dir = self.inner.root.join(folder(fqn));
        self.blocking(move |_| Ok(dir.is_dir())).await
    }

    async fn pipelines(&self, limit: usize) -> Result<Vec<String>, StoreError> {
        self.blocking(move |inner| inner.pipelines(limit)).await
    }

    async fn runs(&self, fqn: &str, limit: usize) -> Result<Vec<RunSummary>, StoreError> {
        let fqn = fqn.to_string();
        self.blocking(move |inner| inner.runs(&fqn, limit)).await
    }

    async fn prune(&self, policy: &RetentionPolicy, now_ms: u64) -> Result<PruneReport, StoreError> {
        let policy = policy.clone();
        self.blocking(move |inner| inner.prune(&policy, now_ms)).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A run chosen for removal that receives a line (or a status) before
    /// its lock is taken is kept whole, and judged again next time.
    #[tokio::test]
    async fn a_run_that_changed_after_it_was_chosen_is_kept() {
        let dir = tempfile::tempdir().unwrap();
        let store = FileRunLogStore::open(dir.path(), false).unwrap();
        let run = RunKey::new("svc.etl", "r-1").unwrap();
        store.append(&run, SequenceToken::new(1, 0), &["a"], Append::new()).await.unwrap();
        store.set_state(&run, RunState::Success).await.unwrap();
        let policy = RetentionPolicy { max_total_bytes: 1, min_age: std::time::Duration::ZERO, ..Default::default() };
        let chosen = |info: &RunInfo| {
            let mut planner = Planner::new(&policy, u64::MAX);
            planner.offer(&run, info);
            planner.finish().0.remove(0)
        };
        let candidate = chosen(&store.info(&run).await.unwrap().unwrap());
        store.append(&run, SequenceToken::new(2, 0), &["late"], Append::new()).await.unwrap();
        assert!(!store.inner.remove_if_unchanged(&candidate).unwrap());
        assert_eq!(store.read(&run, 0, 10, usize::MAX).await.unwrap(), ["a", "late"]);
        let candidate = chosen(&store.info(&run).await.unwrap().unwrap());
        store.set_state(&run, RunState::Failed).await.unwrap();
        assert!(!store.inner.remove_if_unchanged(&candidate).unwrap(), "a status change counts too");
        let candidate = chosen(&store.info(&run).await.unwrap().unwrap());
        assert!(store.inner.remove_if_unchanged(&candidate).unwrap());
        assert_eq!(store.info(&run).await.unwrap(), None);
    }
}
