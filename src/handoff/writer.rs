//! `LoggingConsumer`: appends events as JSON Lines to a prefix's active
//! `.open` file, seals it into `.jsonl`, and keeps the prefix's byte budget.
//! Blocking I/O: call it from a thread or `spawn_blocking`.

mod options;

use std::fmt;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::HandoffError;
use super::files::{file_path, list_prefix_files, lock_path, sync_dir, validate_prefix};
use super::line::encode_batch;
use super::lock::{Acquired, PrefixLock};
use super::state::{RESERVE, read_next_file, write_next_file};
use crate::stream::{Event, StreamId};
pub use options::{FsyncPolicy, LinePosition, WriterOptions};

struct Active {
    n: u64,
    path: PathBuf,
    file: File,
    /// Bytes in the file plus those still buffered.
    bytes: u64,
    lines: u64,
    opened: Instant,
    /// Bytes and lines at the last successful flush: what was answered.
    kept_bytes: u64,
    kept_lines: u64,
}

/// Why the writer stopped taking appends.
struct Failure {
    reason: String,
    /// An I/O failure (a full disk, `EIO`): the next call cuts off what was
    /// not answered, seals what was and goes on once the disk takes writes
    /// again. A lost lock is for good.
    recoverable: bool,
}

/// Writes one prefix of one directory. See the module documentation.
pub struct LoggingConsumer {
    dir: PathBuf,
    prefix: String,
    options: WriterOptions,
    lock: PrefixLock,
    active: Option<Active>,
    buffer: Vec<u8>,
    next_n: u64,
    /// Numbers below this are recorded in the state file as possibly used.
    reserved: u64,
    sealed_bytes: u64,
    failed: Option<Failure>,
    last_sync: Instant,
    accepted: u64,
    /// `accepted` at the last successful flush.
    kept_accepted: u64,
    durable: u64,
    /// Events written to the OS (not only buffered).
    written: u64,
    /// Files sealed so far.
    sealed: u64,
}

impl LoggingConsumer {
    /// Takes `prefix` in `dir` (created if missing). Fails if another writer
    /// holds it, or if a crash left its lock or an `.open` file behind.
    ///
    /// Its first file is numbered past every number the directory holds or
    /// the prefix's state file says was ever used: numbers never go back.
    pub fn open(dir: impl Into<PathBuf>, prefix: &str, options: WriterOptions) -> Result<Self, HandoffError> {
        Self::open_from(dir, prefix, options, 1)
    }

    /// Like [`open`](Self::open), numbering files from at least `first_file`
    /// (a reader's checkpoint may know of numbers the directory forgot).
    pub fn open_from(
        dir: impl Into<PathBuf>,
        prefix: &str,
        options: WriterOptions,
        first_file: u64,
    ) -> Result<Self, HandoffError> {
        validate_prefix(prefix)?;
        let dir = dir.into();
        crate::atomic_file::create_dir_all(&dir, crate::atomic_file::Durability::Synced)
            .map_err(HandoffError::io(format!("creating {}", dir.display())))?;
        let lock_file = lock_path(&dir, prefix);
        let lock = match PrefixLock::acquire(&dir, lock_file.clone())? {
            Acquired::Held(lock) => lock,
            Acquired::Busy => return Err(HandoffError::Locked { dir, prefix: prefix.into(), lock: lock_file }),
            Acquired::Stale => {
                let mut files = vec![lock_file];
                files.extend(list_prefix_files(&dir, prefix)?.into_iter().filter(|f| f.open).map(|f| f.path));
                return Err(HandoffError::RecoveryRequired { dir, prefix: prefix.into(), files });
            }
        };
        let existing = list_prefix_files(&dir, prefix)?;
        let leftovers: Vec<PathBuf> = existing.iter().filter(|f| f.open).map(|f| f.path.clone()).collect();
        if !leftovers.is_empty() {
            lock.release(&dir)?;
            return Err(HandoffError::RecoveryRequired { dir, prefix: prefix.into(), files: leftovers });
        }
        let recorded = match read_next_file(&dir, prefix) {
            Ok(recorded) => recorded,
            Err(error) => {
                lock.release(&dir)?;
                return Err(error);
            }
        };
        let next_n = existing.iter().map(|f| f.n + 1).chain(recorded).chain([first_file, 1]).max().unwrap_or(1);
        Ok(Self {
            next_n,
            reserved: next_n,
            sealed_bytes: existing.iter().map(|f| f.bytes).sum(),
            dir,
            prefix: prefix.into(),
            options,
            lock,
            active: None,
            buffer: Vec::new(),
            failed: None,
            last_sync: Instant::now(),
            accepted: 0,
            kept_accepted: 0,
            durable: 0,
            written: 0,
            sealed: 0,
        })
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The prefix.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// Events accepted so far.
    pub fn accepted(&self) -> u64 {
        self.accepted
    }

    /// Events known to be on disk (fsynced or sealed).
    pub fn durable(&self) -> u64 {
        self.durable
    }

    /// Why the writer stopped taking appends, if it did (an I/O failure
    /// lasts until a call finds the disk taking writes again).
    pub fn failure(&self) -> Option<&str> {
        self.failed.as_ref().map(|f| f.reason.as_str())
    }

    /// Files sealed by this writer so far.
    pub fn sealed_files(&self) -> u64 {
        self.sealed
    }

    /// Bytes the prefix uses now, as counted against the budget.
    pub fn used_bytes(&self) -> u64 {
        self.sealed_bytes + self.active.as_ref().map_or(0, |a| a.bytes)
    }

    /// Appends one event.
    pub fn append(&mut self, stream: &StreamId, event: &Event) -> Result<LinePosition, HandoffError> {
        self.append_batch(stream, std::slice::from_ref(event))
    }

    /// Appends events of one stream as one batch, all or none: a batch past
    /// the budget is refused whole and nothing accepted before it is
    /// touched. A batch never spans two files. Returns where its first line
    /// is (file number, 1-based line).
    pub fn append_batch(&mut self, stream: &StreamId, events: &[Event]) -> Result<LinePosition, HandoffError> {
        self.usable()?;
        if events.is_empty() {
            return Err(HandoffError::EmptyBatch(stream.clone()));
        }
        // The lines are made at the end of the buffer, where they stay if
        // the batch is accepted (no second copy); a refusal cuts them off.
        let start = self.buffer.len();
        encode_batch(stream, events, &mut self.buffer);
        let incoming = (self.buffer.len() - start) as u64;
        if self.used_bytes() + incoming > self.options.max_total_bytes {
            // Readers delete sealed files: count again before refusing.
            let files = match list_prefix_files(&self.dir, &self.prefix) {
                Ok(files) => files,
                Err(error) => {
                    self.buffer.truncate(start);
                    return Err(error);
                }
            };
            self.sealed_bytes = files.iter().filter(|f| !f.open).map(|f| f.bytes).sum();
            if self.used_bytes() + incoming > self.options.max_total_bytes {
                self.buffer.truncate(start);
                return Err(HandoffError::BudgetExceeded {
                    prefix: self.prefix.clone(),
                    used: self.used_bytes(),
                    incoming,
                    max: self.options.max_total_bytes,
                });
            }
        }
        let full =
            self.active.as_ref().is_some_and(|a| a.lines > 0 && a.bytes + incoming > self.options.max_file_bytes);
        if full {
            // The lines before this batch go to the file being sealed; the
            // batch opens the next one.
            let batch = self.buffer.split_off(start);
            let sealed = self.seal_active();
            self.buffer.extend_from_slice(&batch);
            if let Err(error) = sealed {
                self.buffer.truncate(self.buffer.len() - batch.len());
                return Err(error);
            }
        }
        if let Err(error) = self.ensure_active() {
            self.buffer.truncate(self.buffer.len() - incoming as usize);
            return Err(error);
        }
        let Some(active) = self.active.as_mut() else {
            return Err(HandoffError::Failed("no active file after creating one".into()));
        };
        let position = LinePosition { file: active.n, line: active.lines + 1 };
        active.bytes += incoming;
        active.lines += events.len() as u64;
        self.accepted += events.len() as u64;
        if self.buffer.len() >= self.options.buffer_bytes {
            self.write_buffer()?;
        }
        Ok(position)
    }

    /// Writes buffered lines and syncs as the policy says. Never seals.
    pub fn flush(&mut self) -> Result<(), HandoffError> {
        self.usable()?;
        self.write_buffer()?;
        let sync = match self.options.fsync {
            FsyncPolicy::Never => false,
            FsyncPolicy::EveryFlush => true,
            FsyncPolicy::Group(every) => self.last_sync.elapsed() >= every,
        };
        if sync {
            self.sync_active()?;
        }
        // Everything appended so far is answered now.
        if let Some(active) = self.active.as_mut() {
            (active.kept_bytes, active.kept_lines) = (active.bytes, active.lines);
        }
        self.kept_accepted = self.accepted;
        Ok(())
    }

    /// With a group policy: how long until a sync is due for what was
    /// written (`None` if nothing waits for one).
    pub fn sync_due_in(&self) -> Option<Duration> {
        match self.options.fsync {
            FsyncPolicy::Group(every) if self.written > self.durable => {
                Some(every.saturating_sub(self.last_sync.elapsed()))
            }
            _ => None,
        }
    }

    /// Seals the active file if it is older than `max_file_age`. Returns
    /// whether it did.
    pub fn seal_if_due(&mut self) -> Result<bool, HandoffError> {
        let due = match (&self.active, self.options.max_file_age) {
            (Some(active), Some(age)) => active.lines > 0 && active.opened.elapsed() >= age,
            _ => false,
        };
        if due {
            self.usable()?;
            self.seal_active()?;
        }
        Ok(due)
    }

    /// How long until the active file is due for sealing by age.
    pub fn seal_due_in(&self) -> Option<Duration> {
        match (&self.active, self.options.max_file_age) {
            (Some(active), Some(age)) if active.lines > 0 => Some(age.saturating_sub(active.opened.elapsed())),
            _ => None,
        }
    }

    /// Seals the active file now (if it has lines).
    pub fn rotate(&mut self) -> Result<(), HandoffError> {
        self.usable()?;
        if self.active.as_ref().is_some_and(|a| a.lines > 0) {
            self.seal_active()?;
        }
        Ok(())
    }

    /// Seals what is written and releases the prefix (the clean way out).
    pub fn close(mut self) -> Result<(), HandoffError> {
        self.usable()?;
        self.write_buffer()?;
        // The final sync happens only while the lock is still ours.
        self.lock.verify().inspect_err(|_| {
            self.failed = Some(Failure { reason: "lock lost before close".into(), recoverable: false })
        })?;
        match self.active.as_ref().map(|a| a.lines) {
            Some(0) => {
                if let Some(active) = self.active.take() {
                    std::fs::remove_file(&active.path)
                        .map_err(HandoffError::io(format!("removing {}", active.path.display())))?;
                }
            }
            Some(_) => self.seal_active()?,
            None => {}
        }
        self.lock.release(&self.dir)
    }

    fn usable(&mut self) -> Result<(), HandoffError> {
        match &self.failed {
            Some(Failure { reason, recoverable: false }) => return Err(HandoffError::Failed(reason.clone())),
            Some(_) => self.recover()?,
            None => {}
        }
        self.lock.verify().inspect_err(|e| self.failed = Some(Failure { reason: e.to_string(), recoverable: false }))
    }

    /// After a failed write, sync or seal. What was not answered yet (the
    /// buffer, and the active file past its last successful flush) is cut
    /// off: after a failed `fsync` the page cache may have dropped it, and
    /// a later `fsync` that succeeds would not bring it back, so that file
    /// takes no more writes. What was answered is sealed (synced again,
    /// renamed, the directory synced), and the next append opens a new
    /// file. While the disk still fails this fails, and the next call tries
    /// again.
    fn recover(&mut self) -> Result<(), HandoffError> {
        self.buffer.clear();
        self.accepted = self.kept_accepted;
        self.written = self.written.min(self.kept_accepted);
        self.durable = self.durable.min(self.kept_accepted);
        if let Some(active) = self.active.as_mut() {
            if let Err(e) = active.file.set_len(active.kept_bytes) {
                let context = format!("cutting {} back to what was acknowledged", active.path.display());
                return Err(self.fail(context, e));
            }
            (active.bytes, active.lines) = (active.kept_bytes, active.kept_lines);
        }
        match self.active.as_ref().map(|a| a.lines) {
            Some(0) => {
                if let Some(active) = self.active.take()
                    && let Err(e) = std::fs::remove_file(&active.path)
                {
                    let context = format!("removing {}", active.path.display());
                    self.active = Some(active);
                    return Err(self.fail(context, e));
                }
                self.sync_dir_or_fail()?;
            }
            Some(_) => self.seal_active()?,
            None => self.sync_dir_or_fail()?,
        }
        if let Some(failure) = self.failed.take() {
            tracing::warn!(dir = %self.dir.display(), prefix = %self.prefix, was = %failure.reason,
                "the writer takes appends again: what was not acknowledged was cut off, the rest sealed");
        }
        Ok(())
    }

    fn sync_dir_or_fail(&mut self) -> Result<(), HandoffError> {
        sync_dir(&self.dir).inspect_err(|e| self.failed = Some(Failure { reason: e.to_string(), recoverable: true }))
    }

    fn ensure_active(&mut self) -> Result<(), HandoffError> {
        if self.active.is_some() {
            return Ok(());
        }
        let n = self.next_n;
        if n >= self.reserved {
            // Record the numbers before using them, so a later writer never
            // reuses one after readers deleted the files.
            write_next_file(&self.dir, &self.prefix, n + RESERVE)
                .inspect_err(|e| self.failed = Some(Failure { reason: e.to_string(), recoverable: true }))?;
            self.reserved = n + RESERVE;
        }
        let path = file_path(&self.dir, &self.prefix, n, true);
        let file = OpenOptions::new()
            .append(true)
            .create_new(true)
            .open(&path)
            .map_err(|e| self.fail(format!("creating {}", path.display()), e))?;
        self.next_n += 1;
        let active = Active { n, path, file, bytes: 0, lines: 0, opened: Instant::now(), kept_bytes: 0, kept_lines: 0 };
        self.active = Some(active);
        self.sync_dir_or_fail()?;
        Ok(())
    }

    fn write_buffer(&mut self) -> Result<(), HandoffError> {
        if self.buffer.is_empty() {
            return Ok(());
        }
        let Some(active) = self.active.as_mut() else {
            return Err(HandoffError::Failed("buffered lines without an active file".into()));
        };
        if let Err(e) = active.file.write_all(&self.buffer) {
            let context = format!("writing {}", active.path.display());
            return Err(self.fail(context, e));
        }
        self.buffer.clear();
        self.written = self.accepted;
        Ok(())
    }

    fn sync_active(&mut self) -> Result<(), HandoffError> {
        if let Some(active) = self.active.as_mut()
            && let Err(e) = active.file.sync_data()
        {
            let context = format!("syncing {}", active.path.display());
            return Err(self.fail(context, e));
        }
        self.last_sync = Instant::now();
        self.durable = self.written;
        Ok(())
    }

    /// fsync, rename `.open` to `.jsonl`, fsync the directory. The file
    /// stays the active one until it is renamed: a failed sync or rename
    /// leaves it for [`LoggingConsumer::recover`] to seal again, never
    /// behind as an `.open` file nobody reads.
    fn seal_active(&mut self) -> Result<(), HandoffError> {
        self.write_buffer()?;
        let Some(active) = self.active.as_ref() else { return Ok(()) };
        let sealed = file_path(&self.dir, &self.prefix, active.n, false);
        if let Err(e) = active.file.sync_all() {
            let context = format!("syncing {}", active.path.display());
            return Err(self.fail(context, e));
        }
        if let Err(e) = std::fs::rename(&active.path, &sealed) {
            let context = format!("sealing {} as {}", active.path.display(), sealed.display());
            return Err(self.fail(context, e));
        }
        let Some(active) = self.active.take() else { return Ok(()) };
        drop(active.file);
        self.sealed_bytes += active.bytes;
        self.sealed += 1;
        self.last_sync = Instant::now();
        self.durable = self.accepted;
        self.written = self.accepted;
        self.kept_accepted = self.accepted;
        self.sync_dir_or_fail()
    }

    /// An I/O failure mid-write leaves a file we cannot trust: no append is
    /// taken until [`LoggingConsumer::recover`] dealt with it.
    fn fail(&mut self, context: String, source: std::io::Error) -> HandoffError {
        self.failed = Some(Failure { reason: format!("{context}: {source}"), recoverable: true });
        HandoffError::Io { context, source }
    }
}

impl fmt::Debug for LoggingConsumer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LoggingConsumer")
            .field("dir", &self.dir)
            .field("prefix", &self.prefix)
            .field("active", &self.active.as_ref().map(|a| a.n))
            .field("accepted", &self.accepted)
            .field("durable", &self.durable)
            .field("failed", &self.failure())
            .finish()
    }
}
