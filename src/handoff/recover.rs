//! Recovery after a writer crashed: inspect what it left (a stale lock,
//! `.open` files), move the files aside into `quarantine/`, free the prefix,
//! and (with `republish`) write their complete lines again into a sealed
//! file, event ids unchanged, so consumers can drop what they already had.
//!
//! Every step is safe to repeat and nothing is lost whatever step a crash
//! (or an operator) stops at:
//! 1. each `.open` file is moved to `quarantine/` as is (pending);
//! 2. the stale lock is removed;
//! 3. with `republish`, every pending file of the prefix (this run's and
//!    any an earlier run left without `republish`) is written again through
//!    a fresh writer and sealed, then renamed `….republished`.
//!
//! A crash between 3's seal and its rename republishes that file once more
//! on the next run: duplicates with the same event ids, never a loss.

use std::fmt;
use std::path::{Path, PathBuf};

use super::HandoffError;
use super::files::{list_prefix_files, lock_path, parse_name, sync_dir, validate_prefix};
use super::line::{DecodedLine, decode_line};
use super::lock::{Acquired, probe};
use super::writer::{LoggingConsumer, WriterOptions};

/// The quarantine folder inside a queue directory.
pub const QUARANTINE: &str = "quarantine";
/// Marks a quarantined file whose lines were written again.
const REPUBLISHED: &str = ".republished";
/// How deep [`recover_tree`] looks for queue directories below its root.
const TREE_DEPTH: usize = 2;

/// One `.open` file that was recovered.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecoveredFile {
    /// Where it was.
    pub original: PathBuf,
    /// Where it is now.
    pub quarantined: PathBuf,
    /// Lines ending with a newline.
    pub complete_lines: u64,
    /// Complete lines that parse as events.
    pub valid_lines: u64,
    /// Bytes after the last newline (a line cut by the crash).
    pub truncated_tail_bytes: u64,
    /// Events written again into a sealed file (with `--republish`).
    pub republished: u64,
}

/// What `recover` did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RecoveryReport {
    /// The directory.
    pub dir: PathBuf,
    /// The prefix.
    pub prefix: String,
    /// The stale lock removed, if there was one.
    pub stale_lock: Option<PathBuf>,
    /// The `.open` files moved aside now, and the quarantined files of an
    /// earlier run that were republished now.
    pub files: Vec<RecoveredFile>,
}

impl RecoveryReport {
    /// Whether there was nothing to recover.
    pub fn is_empty(&self) -> bool {
        self.stale_lock.is_none() && self.files.is_empty()
    }

    /// Events written again.
    pub fn republished(&self) -> u64 {
        self.files.iter().map(|f| f.republished).sum()
    }

    /// Bytes of torn tails left in quarantine.
    pub fn truncated_tail_bytes(&self) -> u64 {
        self.files.iter().map(|f| f.truncated_tail_bytes).sum()
    }

    /// Complete lines kept in quarantine only (not republished).
    pub fn pending_lines(&self) -> u64 {
        self.files.iter().filter(|f| f.republished == 0).map(|f| f.valid_lines).sum()
    }
}

impl fmt::Display for RecoveryReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "prefix `{}` in {}", self.prefix, self.dir.display())?;
        match &self.stale_lock {
            Some(lock) => writeln!(f, "  stale lock removed: {}", lock.display())?,
            None => writeln!(f, "  no stale lock")?,
        }
        if self.files.is_empty() {
            writeln!(f, "  no .open file")?;
        }
        for file in &self.files {
            let outcome = if file.republished > 0 {
                format!("; {} events republished", file.republished)
            } else if file.valid_lines > 0 && !file.quarantined.to_string_lossy().ends_with(REPUBLISHED) {
                "; not republished yet (run again with --republish)".into()
            } else {
                String::new()
            };
            writeln!(
                f,
                "  {}: {} complete lines ({} valid), truncated tail {} bytes -> {}{outcome}",
                file.original.display(),
                file.complete_lines,
                file.valid_lines,
                file.truncated_tail_bytes,
                file.quarantined.display(),
            )?;
        }
        Ok(())
    }
}

/// What a crashed file holds.
struct Inspected {
    complete_lines: u64,
    lines: Vec<DecodedLine>,
    truncated_tail_bytes: u64,
}

fn inspect(path: &Path) -> Result<Inspected, HandoffError> {
    let bytes = std::fs::read(path).map_err(HandoffError::io(format!("reading {}", path.display())))?;
    let body_end = bytes.iter().rposition(|b| *b == b'\n').map_or(0, |i| i + 1);
    let mut lines = Vec::new();
    let mut complete_lines = 0;
    for line in bytes[..body_end].split(|b| *b == b'\n').filter(|l| !l.is_empty()) {
        complete_lines += 1;
        if let Ok(decoded) = decode_line(line) {
            lines.push(decoded);
        }
    }
    Ok(Inspected { complete_lines, lines, truncated_tail_bytes: (bytes.len() - body_end) as u64 })
}

/// Whether `name` (in `quarantine/`) is a file of `prefix` not republished
/// yet: `{prefix}-{n}.open` or `{prefix}-{n}.open.{k}`.
fn is_pending(prefix: &str, name: &str) -> bool {
    if name.ends_with(REPUBLISHED) {
        return false;
    }
    let base = match name.rsplit_once('.') {
        Some((base, k)) if !k.is_empty() && k.bytes().all(|b| b.is_ascii_digit()) => base,
        _ => name,
    };
    matches!(parse_name(prefix, base), Some((_, true)))
}

/// The pending files in `quarantine`, oldest file number first.
fn pending(quarantine: &Path, prefix: &str) -> Result<Vec<PathBuf>, HandoffError> {
    let entries = match std::fs::read_dir(quarantine) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(HandoffError::io(format!("listing {}", quarantine.display()))(e)),
    };
    let mut found = Vec::new();
    for entry in entries {
        let entry = entry.map_err(HandoffError::io(format!("listing {}", quarantine.display())))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if is_pending(prefix, &name) {
            let number = name.trim_start_matches(prefix).trim_start_matches('-');
            let n: u64 = number.split('.').next().and_then(|n| n.parse().ok()).unwrap_or(u64::MAX);
            found.push((n, name.clone(), entry.path()));
        }
    }
    found.sort();
    Ok(found.into_iter().map(|(_, _, path)| path).collect())
}

/// A free name for `name` in `quarantine`.
fn quarantine_target(quarantine: &Path, name: &str) -> PathBuf {
    let mut target = quarantine.join(name);
    let mut k = 1;
    while target.exists() || PathBuf::from(format!("{}{REPUBLISHED}", target.display())).exists() {
        target = quarantine.join(format!("{name}.{k}"));
        k += 1;
    }
    target
}

/// Recovers `prefix` in `dir`. Refuses while a live writer holds it.
pub fn recover(dir: &Path, prefix: &str, republish: bool) -> Result<RecoveryReport, HandoffError> {
    recover_from(dir, prefix, republish, 1)
}

/// Like [`recover`], republishing into files numbered from at least
/// `first_file` (a reader's checkpoint may know of numbers the directory
/// forgot).
pub fn recover_from(
    dir: &Path,
    prefix: &str,
    republish: bool,
    first_file: u64,
) -> Result<RecoveryReport, HandoffError> {
    validate_prefix(prefix)?;
    let lock = lock_path(dir, prefix);
    let stale_lock = if lock.exists() {
        match probe(&lock)? {
            Acquired::Busy => return Err(HandoffError::Locked { dir: dir.into(), prefix: prefix.into(), lock }),
            _ => Some(lock.clone()),
        }
    } else {
        None
    };
    let quarantine = dir.join(QUARANTINE);
    let mut report = RecoveryReport { dir: dir.into(), prefix: prefix.into(), stale_lock, files: Vec::new() };
    // 1. Every `.open` file aside, as is.
    for file in list_prefix_files(dir, prefix)?.into_iter().filter(|f| f.open) {
        let inspected = inspect(&file.path)?;
        std::fs::create_dir_all(&quarantine).map_err(HandoffError::io(format!("creating {}", quarantine.display())))?;
        let name = file.path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        let target = quarantine_target(&quarantine, &name);
        std::fs::rename(&file.path, &target).map_err(HandoffError::io(format!(
            "moving {} to {}",
            file.path.display(),
            target.display()
        )))?;
        sync_dir(&quarantine)?;
        sync_dir(dir)?;
        report.files.push(RecoveredFile {
            original: file.path,
            quarantined: target,
            complete_lines: inspected.complete_lines,
            valid_lines: inspected.lines.len() as u64,
            truncated_tail_bytes: inspected.truncated_tail_bytes,
            republished: 0,
        });
    }
    // 2. The prefix is free again.
    if report.stale_lock.is_some() {
        std::fs::remove_file(&lock).map_err(HandoffError::io(format!("removing stale lock {}", lock.display())))?;
        sync_dir(dir)?;
    }
    // 3. The complete lines of every pending file, written again.
    if republish {
        republish_pending(dir, prefix, &quarantine, first_file, &mut report)?;
    } else {
        // What an earlier run only quarantined is still waiting: say so.
        for path in pending(&quarantine, prefix)? {
            if report.files.iter().any(|f| f.quarantined == path) {
                continue;
            }
            let inspected = inspect(&path)?;
            report.files.push(RecoveredFile {
                original: path.clone(),
                quarantined: path,
                complete_lines: inspected.complete_lines,
                valid_lines: inspected.lines.len() as u64,
                truncated_tail_bytes: inspected.truncated_tail_bytes,
                republished: 0,
            });
        }
    }
    Ok(report)
}

fn republish_pending(
    dir: &Path,
    prefix: &str,
    quarantine: &Path,
    first_file: u64,
    report: &mut RecoveryReport,
) -> Result<(), HandoffError> {
    let files = pending(quarantine, prefix)?;
    if files.is_empty() {
        return Ok(());
    }
    let options = WriterOptions { max_file_age: None, ..WriterOptions::default() };
    let mut writer = LoggingConsumer::open_from(dir, prefix, options, first_file)?;
    for path in files {
        let inspected = inspect(&path)?;
        let republished = append_batches(&mut writer, &inspected.lines)?;
        // Sealed before the file is marked: a crash in between republishes
        // it again (same ids), never loses it.
        writer.rotate()?;
        let marked = PathBuf::from(format!("{}{REPUBLISHED}", path.display()));
        std::fs::rename(&path, &marked).map_err(HandoffError::io(format!("marking {}", marked.display())))?;
        match report.files.iter_mut().find(|f| f.quarantined == path) {
            Some(entry) => {
                entry.republished = republished;
                entry.quarantined = marked;
            }
            None => report.files.push(RecoveredFile {
                original: path,
                quarantined: marked,
                complete_lines: inspected.complete_lines,
                valid_lines: inspected.lines.len() as u64,
                truncated_tail_bytes: inspected.truncated_tail_bytes,
                republished,
            }),
        }
    }
    writer.close()?;
    sync_dir(quarantine)
}

/// Appends lines as the batches they were written in (a batch's first line
/// says how many lines it has). A batch the crash cut short was never
/// acknowledged (an append is answered after its whole batch is written):
/// it stays in quarantine only, so batches stay all or nothing. Returns
/// the events appended.
fn append_batches(writer: &mut LoggingConsumer, lines: &[DecodedLine]) -> Result<u64, HandoffError> {
    let mut appended = 0;
    let mut i = 0;
    while i < lines.len() {
        let first = &lines[i];
        let mut events = vec![first.event.clone()];
        let mut j = i + 1;
        while j < lines.len() && events.len() < first.batch as usize {
            let next = &lines[j];
            if next.stream != first.stream || next.batch != 1 {
                break;
            }
            events.push(next.event.clone());
            j += 1;
        }
        if events.len() == first.batch as usize {
            writer.append_batch(&first.stream, &events)?;
            appended += events.len() as u64;
        }
        i = j;
    }
    Ok(appended)
}

/// Whether `dir` holds anything of `prefix` to recover.
fn needs_recovery(dir: &Path, prefix: &str) -> Result<bool, HandoffError> {
    Ok(lock_path(dir, prefix).exists()
        || list_prefix_files(dir, prefix)?.iter().any(|f| f.open)
        || !pending(&dir.join(QUARANTINE), prefix)?.is_empty())
}

/// Recovers `prefix` in `root` and in every directory below it (a few
/// levels deep, quarantine folders skipped) that needs it: a data
/// directory's queues in one run. Reports only what was recovered.
pub fn recover_tree(root: &Path, prefix: &str, republish: bool) -> Result<Vec<RecoveryReport>, HandoffError> {
    validate_prefix(prefix)?;
    let mut reports = Vec::new();
    let mut dirs = vec![(root.to_path_buf(), 0)];
    while let Some((dir, depth)) = dirs.pop() {
        if needs_recovery(&dir, prefix)? {
            reports.push(recover(&dir, prefix, republish)?);
        }
        if depth >= TREE_DEPTH {
            continue;
        }
        let entries = match std::fs::read_dir(&dir) {
            Ok(entries) => entries,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(HandoffError::io(format!("listing {}", dir.display()))(e)),
        };
        let mut children = Vec::new();
        for entry in entries {
            let entry = entry.map_err(HandoffError::io(format!("listing {}", dir.display())))?;
            let name = entry.file_name().to_string_lossy().into_owned();
            if name == QUARANTINE || name.starts_with('.') || !entry.file_type().is_ok_and(|t| t.is_dir()) {
                continue;
            }
            children.push(entry.path());
        }
        children.sort();
        dirs.extend(children.into_iter().rev().map(|child| (child, depth + 1)));
    }
    Ok(reports)
}
