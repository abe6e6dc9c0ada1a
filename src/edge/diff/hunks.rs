//! The hunks of a run diff, from the edit script of the two runs' line
//! hashes: rows of equal, removed and added lines, gathered with `context`
//! equal lines around each change (changes closer than twice that share a
//! hunk, as in a unified diff), and cut so that no hunk holds more than a
//! given number of rows (a diff of two unrelated runs of a million lines is
//! many bounded hunks, never one huge one). Only positions here: the text is
//! read for the hunks an answer holds.

use similar::DiffOp;

/// What a row of a hunk is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    /// The same line in both runs (context).
    Same,
    /// A line of the old run only.
    Removed,
    /// A line of the new run only.
    Added,
}

/// `len` rows of one kind, by zero-based line offsets: `Same` rows are old
/// lines `old..` and new lines `new..`; `Removed` rows are old lines
/// `old..`, where the new run is at `new`; `Added` rows are new lines
/// `new..`, where the old run is at `old`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Span {
    pub(crate) kind: Kind,
    pub(crate) old: usize,
    pub(crate) new: usize,
    pub(crate) len: usize,
}

impl Span {
    /// The span without its first `rows` rows.
    fn skip(self, rows: usize) -> Self {
        let old = if self.kind == Kind::Added { self.old } else { self.old + rows };
        let new = if self.kind == Kind::Removed { self.new } else { self.new + rows };
        Self { old, new, len: self.len - rows, ..self }
    }

    /// The span's first `rows` rows.
    fn take(self, rows: usize) -> Self {
        Self { len: rows, ..self }
    }
}

/// Rows in order, at most the limit given to [`hunks`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Hunk {
    pub(crate) spans: Vec<Span>,
}

impl Hunk {
    /// Rows in the hunk.
    pub(crate) fn rows(&self) -> usize {
        self.spans.iter().map(|s| s.len).sum()
    }

    /// `(start, count)` of the old run's lines in the hunk, as a unified
    /// diff writes them: `start` 1-based, or with no line the one after
    /// which the hunk is.
    pub(crate) fn old_range(&self) -> (usize, usize) {
        let count = self.spans.iter().filter(|s| s.kind != Kind::Added).map(|s| s.len).sum();
        let start = self.spans.first().map_or(0, |s| s.old);
        (if count > 0 { start + 1 } else { start }, count)
    }

    /// The same for the new run's lines.
    pub(crate) fn new_range(&self) -> (usize, usize) {
        let count = self.spans.iter().filter(|s| s.kind != Kind::Removed).map(|s| s.len).sum();
        let start = self.spans.first().map_or(0, |s| s.new);
        (if count > 0 { start + 1 } else { start }, count)
    }

    /// Zero-based `[from, to)` of the removed old lines (what the answer
    /// reads of the old run), if any.
    pub(crate) fn removed(&self) -> Option<(usize, usize)> {
        let mut removed = self.spans.iter().filter(|s| s.kind == Kind::Removed);
        let first = removed.next()?;
        let last = removed.next_back().unwrap_or(first);
        Some((first.old, last.old + last.len))
    }

    /// Zero-based `[from, to)` of the new lines in the hunk (context and
    /// added), if any.
    pub(crate) fn shown_new(&self) -> Option<(usize, usize)> {
        let (start, count) = self.new_range();
        (count > 0).then(|| (start - 1, start - 1 + count))
    }
}

/// The spans of an edit script: a replacement is its removed rows, then
/// its added ones; empty operations are dropped.
pub(crate) fn spans(ops: &[DiffOp]) -> Vec<Span> {
    let mut out = Vec::with_capacity(ops.len());
    let mut push = |kind, old, new, len| {
        if len > 0 {
            out.push(Span { kind, old, new, len });
        }
    };
    for op in ops {
        match *op {
            DiffOp::Equal { old_index, new_index, len } => push(Kind::Same, old_index, new_index, len),
            DiffOp::Delete { old_index, old_len, new_index } => push(Kind::Removed, old_index, new_index, old_len),
            DiffOp::Insert { old_index, new_index, new_len } => push(Kind::Added, old_index, new_index, new_len),
            DiffOp::Replace { old_index, old_len, new_index, new_len } => {
                push(Kind::Removed, old_index, new_index, old_len);
                push(Kind::Added, old_index + old_len, new_index, new_len);
            }
        }
    }
    out
}

/// The hunks of `spans`, with `context` equal rows around each change,
/// each of at most `max_rows` rows (at least 1).
pub(crate) fn hunks(spans: &[Span], context: usize, max_rows: usize) -> Vec<Hunk> {
    let mut out = Vec::new();
    let mut current: Vec<Span> = Vec::new();
    for (i, span) in spans.iter().enumerate() {
        if span.kind != Kind::Same {
            if current.is_empty()
                && let Some(before) = i.checked_sub(1).map(|p| spans[p]).filter(|p| p.kind == Kind::Same)
            {
                let n = before.len.min(context);
                if n > 0 {
                    current.push(before.skip(before.len - n));
                }
            }
            current.push(*span);
            continue;
        }
        if current.is_empty() {
            continue;
        }
        if span.len > 2 * context || i + 1 == spans.len() {
            let n = span.len.min(context);
            if n > 0 {
                current.push(span.take(n));
            }
            cut(std::mem::take(&mut current), max_rows.max(1), &mut out);
        } else {
            current.push(*span);
        }
    }
    if !current.is_empty() {
        cut(current, max_rows.max(1), &mut out);
    }
    out
}

/// `spans` as hunks of at most `max_rows` rows, in order, onto `out`.
fn cut(spans: Vec<Span>, max_rows: usize, out: &mut Vec<Hunk>) {
    let mut piece: Vec<Span> = Vec::new();
    let mut rows = 0;
    for mut span in spans {
        while rows + span.len > max_rows {
            let fits = max_rows - rows;
            if fits > 0 {
                piece.push(span.take(fits));
                span = span.skip(fits);
            }
            out.push(Hunk { spans: std::mem::take(&mut piece) });
            rows = 0;
        }
        if span.len > 0 {
            rows += span.len;
            piece.push(span);
        }
    }
    if !piece.is_empty() {
        out.push(Hunk { spans: piece });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn diff(old: &[u64], new: &[u64]) -> Vec<Span> {
        spans(&similar::capture_diff_slices(similar::Algorithm::Myers, old, new))
    }

    #[test]
    fn changes_get_context_and_near_ones_share_a_hunk() {
        let old: Vec<u64> = (0..30).collect();
        let mut new = old.clone();
        new[5] = 100; // replaced
        new[9] = 101; // 3 equal lines apart: same hunk with context 2
        new.remove(25); // far: its own hunk
        let hunks = hunks(&diff(&old, &new), 2, 1_000);
        assert_eq!(hunks.len(), 2, "{hunks:?}");
        assert_eq!((hunks[0].old_range(), hunks[0].new_range()), ((4, 9), (4, 9)));
        assert_eq!(hunks[0].removed(), Some((5, 10)));
        assert_eq!((hunks[1].old_range(), hunks[1].new_range()), ((24, 5), (24, 4)));
        assert_eq!(hunks[1].removed(), Some((25, 26)));
    }

    #[test]
    fn an_insertion_with_no_context_starts_after_its_line() {
        let hunks = hunks(&diff(&[1, 2, 3], &[1, 2, 9, 3]), 0, 10);
        assert_eq!((hunks[0].old_range(), hunks[0].new_range()), ((2, 0), (3, 1)));
        assert_eq!((hunks[0].removed(), hunks[0].shown_new()), (None, Some((2, 3))));
    }

    #[test]
    fn equal_runs_have_no_hunk() {
        assert!(hunks(&diff(&[1, 2, 3], &[1, 2, 3]), 3, 10).is_empty());
        assert!(hunks(&diff(&[], &[]), 3, 10).is_empty());
    }

    #[test]
    fn a_huge_change_is_cut_into_bounded_hunks_that_keep_every_row() {
        let old: Vec<u64> = (0..1_000).collect();
        let new: Vec<u64> = (5_000..5_700).collect();
        let hunks = hunks(&diff(&old, &new), 3, 300);
        assert!(hunks.iter().all(|h| h.rows() <= 300));
        assert_eq!(hunks.iter().map(Hunk::rows).sum::<usize>(), 1_700);
        let (removed, added): (usize, usize) = hunks.iter().fold((0, 0), |(r, a), h| {
            let (_, old) = h.old_range();
            let (_, new) = h.new_range();
            (r + old, a + new)
        });
        assert_eq!((removed, added), (1_000, 700));
        // Consecutive pieces continue where the last one stopped.
        assert_eq!(hunks[3].spans[0], Span { kind: Kind::Removed, old: 900, new: 0, len: 100 });
        assert_eq!(hunks[3].spans[1], Span { kind: Kind::Added, old: 1_000, new: 0, len: 200 });
    }
}
