//! `tailrace handoff recover`: after a crash, inspect what the writer left
//! (a stale lock, `.open` files), report complete lines and a truncated
//! tail, move the files aside into `quarantine/`, and free the prefix. It
//! republishes the complete lines only when asked (`--republish`), through a
//! fresh writer, event ids unchanged (so consumers can drop duplicates).

use std::fmt;
use std::path::{Path, PathBuf};

use super::HandoffError;
use super::files::{list_prefix_files, lock_path, sync_dir, validate_prefix};
use super::line::{DecodedLine, decode_line};
use super::lock::{Acquired, probe};
use super::writer::{LoggingConsumer, WriterOptions};

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
    /// The `.open` files moved aside.
    pub files: Vec<RecoveredFile>,
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
            writeln!(
                f,
                "  {}: {} complete lines ({} valid), truncated tail {} bytes -> {}{}",
                file.original.display(),
                file.complete_lines,
                file.valid_lines,
                file.truncated_tail_bytes,
                file.quarantined.display(),
                if file.republished > 0 { format!("; {} events republished", file.republished) } else { String::new() }
            )?;
        }
        Ok(())
    }
}

/// Recovers `prefix` in `dir`. Refuses while a live writer holds it.
pub fn recover(dir: &Path, prefix: &str, republish: bool) -> Result<RecoveryReport, HandoffError> {
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
    let quarantine = dir.join("quarantine");
    let mut report = RecoveryReport { dir: dir.into(), prefix: prefix.into(), stale_lock, files: Vec::new() };
    let mut to_republish: Vec<(usize, Vec<DecodedLine>)> = Vec::new();
    for file in list_prefix_files(dir, prefix)?.into_iter().filter(|f| f.open) {
        let bytes = std::fs::read(&file.path).map_err(HandoffError::io(format!("reading {}", file.path.display())))?;
        let body_end = bytes.iter().rposition(|b| *b == b'\n').map_or(0, |i| i + 1);
        let mut decoded = Vec::new();
        let mut complete = 0;
        for line in bytes[..body_end].split(|b| *b == b'\n').filter(|l| !l.is_empty()) {
            complete += 1;
            if let Ok(event) = decode_line(line) {
                decoded.push(event);
            }
        }
        std::fs::create_dir_all(&quarantine).map_err(HandoffError::io(format!("creating {}", quarantine.display())))?;
        let name = file.path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        let mut target = quarantine.join(&name);
        let mut k = 1;
        while target.exists() {
            target = quarantine.join(format!("{name}.{k}"));
            k += 1;
        }
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
            complete_lines: complete,
            valid_lines: decoded.len() as u64,
            truncated_tail_bytes: (bytes.len() - body_end) as u64,
            republished: 0,
        });
        if republish && !decoded.is_empty() {
            to_republish.push((report.files.len() - 1, decoded));
        }
    }
    if report.stale_lock.is_some() {
        std::fs::remove_file(&lock).map_err(HandoffError::io(format!("removing stale lock {}", lock.display())))?;
        sync_dir(dir)?;
    }
    if !to_republish.is_empty() {
        let mut writer =
            LoggingConsumer::open(dir, prefix, WriterOptions { max_file_age: None, ..WriterOptions::default() })?;
        for (index, lines) in to_republish {
            for line in &lines {
                writer.append(&line.stream, &line.event)?;
            }
            writer.flush()?;
            let entry = &mut report.files[index];
            entry.republished = lines.len() as u64;
            let marked = PathBuf::from(format!("{}.republished", entry.quarantined.display()));
            std::fs::rename(&entry.quarantined, &marked)
                .map_err(HandoffError::io(format!("marking {}", marked.display())))?;
            entry.quarantined = marked;
        }
        writer.close()?;
        sync_dir(&quarantine)?;
    }
    Ok(report)
}
