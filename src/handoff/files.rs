//! Naming: prefixes, `{prefix}-{n}.open|jsonl` files, whole-name matching.

use std::path::{Path, PathBuf};

use super::HandoffError;

/// Checks a prefix: `[A-Za-z0-9][A-Za-z0-9._-]*`.
pub(crate) fn validate_prefix(prefix: &str) -> Result<(), HandoffError> {
    let invalid = |reason| HandoffError::InvalidPrefix { prefix: prefix.chars().take(80).collect(), reason };
    let mut chars = prefix.chars();
    match chars.next() {
        None => return Err(invalid("it is empty")),
        Some(c) if !c.is_ascii_alphanumeric() => return Err(invalid("it must start with a letter or a digit")),
        Some(_) => {}
    }
    if chars.any(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))) {
        return Err(invalid("it has a character outside letters, digits, `.`, `_`, `-`"));
    }
    Ok(())
}

/// One file of a prefix.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct PrefixFile {
    /// Its number (`{prefix}-{n}`).
    pub n: u64,
    /// Still being written (`.open`) or sealed (`.jsonl`).
    pub open: bool,
    /// Its path.
    pub path: PathBuf,
    /// Its size in bytes.
    pub bytes: u64,
}

/// Parses `name` as a file of `prefix`: `{prefix}-{digits}.open|jsonl`,
/// matched on the whole name (`events` never claims `events-worker-1-3.jsonl`).
pub(crate) fn parse_name(prefix: &str, name: &str) -> Option<(u64, bool)> {
    let rest = name.strip_prefix(prefix)?.strip_prefix('-')?;
    let (number, open) =
        if let Some(n) = rest.strip_suffix(".open") { (n, true) } else { (rest.strip_suffix(".jsonl")?, false) };
    if number.is_empty() || !number.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some((number.parse().ok()?, open))
}

/// The `.open` and `.jsonl` files of `prefix` in `dir`, by number.
pub fn list_prefix_files(dir: &Path, prefix: &str) -> Result<Vec<PrefixFile>, HandoffError> {
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(HandoffError::io(format!("listing {}", dir.display()))(e)),
    };
    let mut files = Vec::new();
    for entry in entries {
        let entry = entry.map_err(HandoffError::io(format!("listing {}", dir.display())))?;
        let name = entry.file_name();
        let Some((n, open)) = name.to_str().and_then(|name| parse_name(prefix, name)) else { continue };
        let path = entry.path();
        // A file may vanish while listing (a reader deleted it): skip it.
        let Ok(meta) = entry.metadata() else { continue };
        files.push(PrefixFile { n, open, path, bytes: meta.len() });
    }
    files.sort();
    Ok(files)
}

/// The path of sealed file `n` of `prefix`.
pub(crate) fn sealed_path(dir: &Path, prefix: &str, n: u64) -> PathBuf {
    file_path(dir, prefix, n, false)
}

/// The path of file `n` of `prefix`.
pub(crate) fn file_path(dir: &Path, prefix: &str, n: u64, open: bool) -> PathBuf {
    dir.join(format!("{prefix}-{n}.{}", if open { "open" } else { "jsonl" }))
}

/// The lock sidecar of `prefix`.
pub(crate) fn lock_path(dir: &Path, prefix: &str) -> PathBuf {
    dir.join(format!(".{prefix}.lock"))
}

/// fsyncs a directory (so a rename or create in it is durable).
pub(crate) fn sync_dir(dir: &Path) -> Result<(), HandoffError> {
    crate::atomic_file::sync_dir(dir).map_err(HandoffError::io(format!("syncing directory {}", dir.display())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefixes_follow_the_rule() {
        for good in ["events", "events-worker-1", "a", "0", "q1.node_2"] {
            assert!(validate_prefix(good).is_ok(), "{good}");
        }
        for (bad, why) in [
            ("", "empty"),
            ("../x", "start"),
            (".hidden", "start"),
            ("a/b", "character"),
            ("a b", "character"),
            ("é", "start"),
        ] {
            let err = validate_prefix(bad).unwrap_err().to_string();
            assert!(err.contains(why), "{bad}: {err}");
        }
    }

    #[test]
    fn names_match_on_whole_boundaries() {
        assert_eq!(parse_name("events", "events-3.jsonl"), Some((3, false)));
        assert_eq!(parse_name("events", "events-12.open"), Some((12, true)));
        assert_eq!(parse_name("events", "events-worker-1-3.jsonl"), None);
        assert_eq!(parse_name("events", "events-3.jsonl.tmp"), None);
        assert_eq!(parse_name("events", "events-.jsonl"), None);
        assert_eq!(parse_name("events", "eventsx-3.jsonl"), None);
        assert_eq!(parse_name("events-worker-1", "events-worker-1-3.jsonl"), Some((3, false)));
    }
}
