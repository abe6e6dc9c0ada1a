//! What a file queue's reader knows about its files (blocking work): the
//! next sealed file, the file being read and the containers in it, the
//! files read to their end (for deletion) and rewinds over the files still
//! on disk.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use bytes::Bytes;

use super::super::NAME;
use crate::handoff::{LineView, PrefixFile, list_prefix_files};
use crate::queue::QueueError;
use crate::stream::{BatchContainer, QueueId, SequenceToken, StreamIdCache};

/// A line that could not be read as an event.
pub(super) struct BadLine {
    pub(super) token: SequenceToken,
    pub(super) bytes: Bytes,
    pub(super) error: String,
}

/// A file's bytes as text (when the whole file is UTF-8), shared by the
/// payloads cut from it.
#[derive(Clone)]
struct Text(Arc<String>);

impl AsRef<[u8]> for Text {
    fn as_ref(&self) -> &[u8] {
        self.0.as_bytes()
    }
}

/// A file loaded for reading.
struct Loaded {
    n: u64,
    data: Bytes,
    /// The same bytes as text, when they are UTF-8 (they are unless the
    /// file is corrupt): lines are then read without a search for their end.
    text: Option<Text>,
    offset: usize,
    /// The 1-based number of the line at `offset`.
    line: u64,
    /// The token of the last container read from it.
    last: Option<SequenceToken>,
}

/// What a reader knows about its queue's files (blocking).
pub(super) struct Files {
    pub(super) dir: PathBuf,
    pub(super) prefix: String,
    next_file: u64,
    current: Option<Loaded>,
    /// Files read to the end: the token of their last container.
    pub(super) finished: BTreeMap<u64, Option<SequenceToken>>,
    /// The streams met lately (containers of a stream share its id).
    streams: StreamIdCache,
}

impl Files {
    /// Nothing read yet of the files of `prefix` in `dir`.
    pub(super) fn new(dir: PathBuf, prefix: String) -> Self {
        Self { dir, prefix, next_file: 0, current: None, finished: BTreeMap::new(), streams: StreamIdCache::default() }
    }

    fn io(context: String) -> impl FnOnce(std::io::Error) -> QueueError {
        move |source| QueueError::Io { context, source }
    }

    /// The first sealed file numbered `from` or later. The writer seals
    /// in order, so file `from` itself, sealed, is the answer, and file
    /// `from` still open means there is none yet: two probes, not a listing
    /// of a directory that may hold many files (history kept); the listing
    /// is for gaps in the numbers (after a restart).
    fn sealed(&self, from: u64) -> Result<Option<(u64, PathBuf)>, QueueError> {
        let path = crate::handoff::sealed_path(&self.dir, &self.prefix, from);
        if path.exists() {
            return Ok(Some((from, path)));
        }
        if crate::handoff::file_path(&self.dir, &self.prefix, from, true).exists() {
            return Ok(None);
        }
        first_sealed(from, || self.list())
    }

    /// The prefix's files, in number order.
    fn list(&self) -> Result<Vec<PrefixFile>, QueueError> {
        list_prefix_files(&self.dir, &self.prefix).map_err(|e| QueueError::Backend {
            adapter: NAME.into(),
            message: e.to_string(),
            transient: true,
        })
    }

    fn load(&self, n: u64, path: &Path) -> Result<Loaded, QueueError> {
        let data = std::fs::read(path).map_err(Self::io(format!("reading {}", path.display())))?;
        let (data, text) = match String::from_utf8(data) {
            Ok(text) => {
                let text = Text(Arc::new(text));
                (Bytes::from_owner(text.clone()), Some(text))
            }
            Err(not_text) => (Bytes::from(not_text.into_bytes()), None),
        };
        Ok(Loaded { n, data, text, offset: 0, line: 1, last: None })
    }

    /// Positions the reader just after the container at `after`.
    pub(super) fn position_after(&mut self, after: Option<SequenceToken>) -> Result<(), QueueError> {
        self.current = None;
        let Some(after) = after else {
            self.next_file = 0;
            return Ok(());
        };
        self.next_file = after.major;
        // Files wholly before the position were consumed: a crash may have
        // come between the checkpoint and their deletion. They are deleted
        // once the stored checkpoint passes them (a line past any real one
        // stands for their end).
        for file in self.list()?.iter().filter(|f| !f.open && f.n < after.major) {
            self.finished.insert(file.n, Some(SequenceToken::new(file.n, u64::MAX)));
        }
        let Some((n, path)) = self.sealed(after.major)? else { return Ok(()) };
        if n != after.major {
            // The file was consumed and deleted: start at the next one.
            return Ok(());
        }
        let mut loaded = self.load(n, &path)?;
        let mut bad = Vec::new();
        while loaded.line <= after.minor {
            if next_container(&mut loaded, &mut bad, &mut self.streams).is_none() {
                break;
            }
        }
        self.next_file = n + 1;
        self.current = Some(loaded);
        Ok(())
    }

    /// Reads up to `max` containers.
    pub(super) fn read(&mut self, max: usize, bad: &mut Vec<BadLine>) -> Result<Vec<Arc<BatchContainer>>, QueueError> {
        let mut out = Vec::new();
        while out.len() < max {
            if self.current.as_ref().is_none_or(|c| c.offset >= c.data.len()) {
                if let Some(done) = self.current.take() {
                    self.finished.insert(done.n, done.last);
                }
                let Some((n, path)) = self.sealed(self.next_file)? else { break };
                self.current = Some(self.load(n, &path)?);
                self.next_file = n + 1;
            }
            let Some(current) = self.current.as_mut() else { break };
            if let Some(container) = next_container(current, bad, &mut self.streams) {
                current.last = Some(container.token);
                out.push(Arc::new(container));
            }
        }
        Ok(out)
    }

    /// Containers at or after `from` in the files still on disk.
    pub(super) fn rewind(
        &self,
        queue: QueueId,
        from: SequenceToken,
        max: usize,
    ) -> Result<Vec<Arc<BatchContainer>>, QueueError> {
        let first = self.sealed(from.major)?;
        if first.as_ref().is_none_or(|(n, _)| *n > from.major) && from.major < self.next_file {
            // The oldest file still there past the one asked for, sealed or
            // not: its first line is where a reader can start instead.
            let listed = self.list()?;
            let oldest = listed.iter().map(|f| f.n).filter(|n| *n > from.major).min().map(|n| SequenceToken::new(n, 0));
            return Err(QueueError::CannotRewind {
                adapter: NAME.into(),
                queue,
                requested: from,
                reason: format!("file {}-{}.jsonl was consumed and deleted", self.prefix, from.major),
                oldest,
            });
        }
        let mut out = Vec::new();
        let mut ignored = Vec::new();
        let mut streams = StreamIdCache::default();
        let mut file = first;
        while let Some((n, path)) = file {
            let mut loaded = self.load(n, &path)?;
            while out.len() < max {
                let Some(container) = next_container(&mut loaded, &mut ignored, &mut streams) else { break };
                if container.token >= from {
                    out.push(Arc::new(container));
                }
            }
            if out.len() >= max {
                break;
            }
            file = self.sealed(n + 1)?;
        }
        Ok(out)
    }
}

/// The first sealed file numbered `from` or later in `list()`'s listing.
///
/// A listing made while the writer seals files is not a snapshot: POSIX
/// leaves unspecified whether a readdir returns names added or renamed
/// during it, so one can show file `k` as `.open` (renamed before it is
/// looked at, so left out) and file `k + 1` already sealed. Taken as is,
/// that skips file `k` for good. The writer seals files in order, so when
/// a sealed file past `from` is found, every file before it was sealed
/// earlier and is stable: a gap is believed only when a second listing
/// shows it too (a gap is rare: a restart's jump in numbers).
fn first_sealed(
    from: u64,
    mut list: impl FnMut() -> Result<Vec<PrefixFile>, QueueError>,
) -> Result<Option<(u64, PathBuf)>, QueueError> {
    let first = |files: Vec<PrefixFile>| files.into_iter().find(|f| !f.open && f.n >= from).map(|f| (f.n, f.path));
    match first(list()?) {
        Some((n, _)) if n > from => Ok(first(list()?)),
        found => Ok(found),
    }
}

/// Parses the next container (one batch) of `file`; bad lines are set
/// aside. `None` at the end of the file.
fn next_container(file: &mut Loaded, bad: &mut Vec<BadLine>, streams: &mut StreamIdCache) -> Option<BatchContainer> {
    // Lines are parsed in place; an event's payload shares the file's buffer.
    let (data, text) = (file.data.clone(), file.text.clone());
    let text = text.as_ref().map(|t| t.0.as_str());
    loop {
        let (first, range, token) = next_line(file, &data, text)?;
        let (view, stream, event) =
            match first.and_then(|view| Ok((view.stream_from(streams), view.event(&data)?, view))) {
                Ok((stream, event, view)) => (view, stream, event),
                Err(error) => {
                    bad.push(BadLine { token, bytes: data.slice(range), error });
                    continue;
                }
            };
        let batch = view.batch();
        let mut events = Vec::with_capacity(batch as usize);
        events.push(event);
        for _ in 1..batch {
            // The writer's own lines of the same stream: compared with the
            // first line's stream bytes, not parsed again.
            if let Some((event, length)) =
                text.and_then(|t| t.get(file.offset..)).and_then(|rest| view.next_in_batch(rest, &data))
            {
                advance(file, length);
                events.push(event);
                continue;
            }
            let saved = (file.offset, file.line);
            let Some((view, range, at)) = next_line(file, &data, text) else { break };
            let next =
                view.and_then(|view| (view.is_of(&stream) && view.batch() == 1).then(|| view.event(&data)).transpose());
            match next {
                Ok(Some(event)) => events.push(event),
                Ok(None) => {
                    // Not part of this batch after all: read it on its own.
                    (file.offset, file.line) = saved;
                    break;
                }
                Err(error) => bad.push(BadLine { token: at, bytes: data.slice(range), error }),
            }
        }
        return Some(BatchContainer { stream, token, events });
    }
}

type NextLine<'d> = (Result<LineView<'d>, String>, std::ops::Range<usize>, SequenceToken);

/// Parses the next line of `file`; `data` and `text` are its bytes.
fn next_line<'d>(file: &mut Loaded, data: &'d Bytes, text: Option<&'d str>) -> Option<NextLine<'d>> {
    let rest = text.and_then(|t| t.get(file.offset..));
    if let Some((view, length)) = rest.and_then(LineView::parse_prefix) {
        let (range, token) = advance(file, length);
        return Some((Ok(view), range, token));
    }
    let (range, token) = take_line(file)?;
    Some((LineView::parse(&data[range.clone()]), range, token))
}

/// Where the next line of `file` is (without its newline), and its token.
fn take_line(file: &mut Loaded) -> Option<(std::ops::Range<usize>, SequenceToken)> {
    let rest = file.data.get(file.offset..).filter(|r| !r.is_empty())?;
    let length = memchr::memchr(b'\n', rest).unwrap_or(rest.len());
    Some(advance(file, length))
}

/// Moves past the line of `length` bytes at the offset (and its newline).
fn advance(file: &mut Loaded, length: usize) -> (std::ops::Range<usize>, SequenceToken) {
    let range = file.offset..file.offset + length;
    let token = SequenceToken::new(file.n, file.line);
    file.offset = (range.end + 1).min(file.data.len());
    file.line += 1;
    (range, token)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(n: u64, open: bool) -> PrefixFile {
        PrefixFile {
            n,
            open,
            path: PathBuf::from(format!("events-{n}.{}", if open { "open" } else { "jsonl" })),
            bytes: 1,
        }
    }

    /// A listing that missed file 4 (seen open, renamed before its stat)
    /// and saw file 5 sealed after it does not skip file 4.
    #[test]
    fn a_gap_in_one_listing_is_looked_at_again() {
        let mut listings =
            vec![vec![file(3, false), file(5, false)], vec![file(3, false), file(4, false), file(5, false)]]
                .into_iter();
        let found = first_sealed(4, || Ok(listings.next().unwrap_or_default())).unwrap();
        assert_eq!(found.map(|(n, _)| n), Some(4));
        // A real gap (a restart's jump in numbers) shows in both listings.
        let found = first_sealed(4, || Ok(vec![file(3, false), file(1025, false)])).unwrap();
        assert_eq!(found.map(|(n, _)| n), Some(1025));
        // No gap: one listing.
        let mut calls = 0;
        let found = first_sealed(4, || {
            calls += 1;
            Ok(vec![file(4, false), file(5, true)])
        });
        assert_eq!((found.unwrap().map(|(n, _)| n), calls), (Some(4), 1));
    }
}
