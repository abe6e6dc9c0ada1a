//! A run's foldable groups as the server sees them, by the viewer's own
//! rules (`page/lines.js`, `marker` and `buildGroups`): GitHub's
//! `::group::title` / `::endgroup::` and GitLab's `section_start:…` /
//! `section_end:…` open and close groups; an end closes the innermost open
//! group, whatever its name. A marker line belongs to the group it opens or
//! closes. [`Groups`] follows a run line by line and says, for each line,
//! the titles of the groups it is in (outermost first).

use std::sync::{Arc, OnceLock};

use regex::Regex;

use super::search::{GROUP_PATTERN, strip_escapes};

/// Groups open at once beyond which deeper ones are not tracked (their
/// lines count as in the deepest tracked group; the matching ends are
/// ignored as well).
pub(crate) const MAX_GROUP_DEPTH: usize = 32;
/// Longest group title kept, in bytes.
const MAX_TITLE_BYTES: usize = 256;

/// What a marker line does.
#[derive(Debug, PartialEq)]
enum Marker {
    Start(String),
    End,
}

fn group_regex() -> &'static Regex {
    static REGEX: OnceLock<Regex> = OnceLock::new();
    // A constant pattern, tested below.
    REGEX.get_or_init(|| Regex::new(GROUP_PATTERN).unwrap_or_else(|_| unreachable!("GROUP_PATTERN compiles")))
}

fn gitlab_regex() -> &'static Regex {
    static REGEX: OnceLock<Regex> = OnceLock::new();
    REGEX.get_or_init(|| {
        Regex::new(r"^section_(start|end):[0-9]+:([^\r\[]*)[^\r]*(?:\r(.*))?$")
            .unwrap_or_else(|_| unreachable!("a constant pattern"))
    })
}

fn marker(line: &str) -> Option<Marker> {
    if !line.contains("::") && !line.contains("section_") {
        return None;
    }
    let plain = strip_escapes(line);
    if !group_regex().is_match(&plain) {
        return None;
    }
    if let Some(title) = plain.strip_prefix("::group::") {
        return Some(Marker::Start(if title.is_empty() { "group".into() } else { title.into() }));
    }
    if plain.starts_with("::endgroup::") {
        return Some(Marker::End);
    }
    let parts = gitlab_regex().captures(&plain)?;
    if &parts[1] == "end" {
        return Some(Marker::End);
    }
    let title = parts.get(3).map(|m| m.as_str()).filter(|t| !t.is_empty()).unwrap_or(&parts[2]).trim();
    Some(Marker::Start(if title.is_empty() { "section".into() } else { title.into() }))
}

fn cut_title(mut title: String) -> String {
    if title.len() > MAX_TITLE_BYTES {
        let mut end = MAX_TITLE_BYTES;
        while !title.is_char_boundary(end) {
            end -= 1;
        }
        title.truncate(end);
    }
    title
}

/// A group a line is in: its title and the 1-based line that opened it.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Open {
    pub(crate) title: Arc<str>,
    pub(crate) line: u64,
}

/// The groups open at the current line of a run read in order.
#[derive(Default)]
pub(crate) struct Groups {
    open: Vec<Open>,
    /// Starts past [`MAX_GROUP_DEPTH`] not yet closed.
    untracked: usize,
    /// The group that a marker line just closed (it still counts as in it).
    closing: Option<Open>,
}

/// What a line did to the groups.
#[derive(Debug, PartialEq)]
pub(crate) enum Change {
    None,
    Opened,
    /// The line closed this group (and is its last line).
    Closed(Open),
}

impl Groups {
    /// Takes line `number` (1-based) into account.
    pub(crate) fn observe(&mut self, number: u64, line: &str) -> Change {
        self.closing = None;
        match marker(line) {
            None => Change::None,
            Some(Marker::Start(title)) => {
                if self.open.len() >= MAX_GROUP_DEPTH {
                    self.untracked += 1;
                    return Change::None;
                }
                self.open.push(Open { title: cut_title(title).into(), line: number });
                Change::Opened
            }
            Some(Marker::End) if self.untracked > 0 => {
                self.untracked -= 1;
                Change::None
            }
            Some(Marker::End) => match self.open.pop() {
                Some(closed) => {
                    self.closing = Some(closed.clone());
                    Change::Closed(closed)
                }
                None => Change::None,
            },
        }
    }

    /// The groups the last observed line is in, outermost first.
    pub(crate) fn path(&self) -> Vec<Arc<str>> {
        self.open.iter().chain(self.closing.iter()).map(|g| g.title.clone()).collect()
    }

    /// The innermost group the last observed line is in.
    pub(crate) fn innermost(&self) -> Option<&Open> {
        self.closing.as_ref().or(self.open.last())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn paths(lines: &[&str]) -> Vec<Vec<String>> {
        let mut groups = Groups::default();
        lines
            .iter()
            .enumerate()
            .map(|(i, line)| {
                groups.observe(i as u64 + 1, line);
                groups.path().iter().map(|t| t.to_string()).collect()
            })
            .collect()
    }

    #[test]
    fn lines_are_in_the_groups_the_viewer_folds() {
        let got = paths(&[
            "setup",
            "::group::Build",
            "compiling",
            "\x1b[36m::group::Test\x1b[0m",
            "test a ... ok",
            "::endgroup::",
            "::endgroup::",
            "after",
            "section_start:1700000000:lint[collapsed=true]\r\x1b[0KRun lint",
            "lint ok",
            "section_end:1700000001:lint\r\x1b[0K",
            "section_start:1700000002:pack",
            "::group::",
        ]);
        let want: Vec<Vec<&str>> = vec![
            vec![],
            vec!["Build"],
            vec!["Build"],
            vec!["Build", "Test"],
            vec!["Build", "Test"],
            vec!["Build", "Test"],
            vec!["Build"],
            vec![],
            vec!["Run lint"],
            vec!["Run lint"],
            vec!["Run lint"],
            vec!["pack"],
            vec!["pack", "group"],
        ];
        assert_eq!(got, want);
    }

    #[test]
    fn a_marker_quoted_in_a_line_is_not_a_marker() {
        assert_eq!(paths(&["echo ::group::x", "in"]), vec![Vec::<String>::new(), vec![]]);
        assert_eq!(paths(&["::endgroup::", "x"]), vec![Vec::<String>::new(), vec![]]);
    }

    #[test]
    fn depth_is_bounded_and_ends_match_their_starts() {
        let mut lines = vec!["::group::g".to_string(); MAX_GROUP_DEPTH + 3];
        lines.extend(vec!["::endgroup::".to_string(); 3]);
        lines.push("inside".into());
        let lines: Vec<&str> = lines.iter().map(String::as_str).collect();
        let got = paths(&lines);
        assert_eq!(got.last().map(Vec::len), Some(MAX_GROUP_DEPTH));
    }

    #[test]
    fn a_long_title_is_cut_on_a_character_boundary() {
        let line = format!("::group::{}", "é".repeat(MAX_TITLE_BYTES));
        let got = paths(&[&line]);
        assert!(got[0][0].len() <= MAX_TITLE_BYTES);
    }
}
