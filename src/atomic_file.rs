//! The one way tailrace changes the file system durably: replacing a
//! small file whole (a checkpoint, a run's `meta.json`, a handoff state
//! file: readers see the old contents or the new, never a torn mix,
//! whatever crashes in between), creating directories and syncing a
//! directory's entries. A file's data survives a power loss once the file
//! is synced, but its name only once its directory is: each creation,
//! rename or removal that must survive one syncs the directory holding it.

use std::io::Write;
use std::path::Path;

/// How far a replacement must reach before it returns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Durability {
    /// On disk: the new contents are synced, renamed into place and the
    /// directory is synced, so the replacement survives a power loss.
    Synced,
    /// Atomic for other processes and across a crash of this one, but left
    /// to the OS to write back (a power loss may keep the old contents).
    Unsynced,
}

/// Replaces `path` with `bytes` atomically.
pub(crate) fn replace(path: &Path, bytes: &[u8], durability: Durability) -> std::io::Result<()> {
    match durability {
        Durability::Synced => {
            let mut file = atomic_write_file::AtomicWriteFile::open(path)?;
            file.write_all(bytes)?;
            // `commit` syncs the file, renames it into place and syncs the
            // directory.
            file.commit()
        }
        Durability::Unsynced => {
            let mut temp = path.as_os_str().to_owned();
            temp.push(".tmp");
            std::fs::write(&temp, bytes)?;
            std::fs::rename(&temp, path)
        }
    }
}

/// Syncs the directory `dir`: the creations, renames and removals of
/// names in it survive a power loss.
pub(crate) fn sync_dir(dir: &Path) -> std::io::Result<()> {
    std::fs::File::open(dir)?.sync_all()
}

/// Creates `dir` and its missing parents. With [`Durability::Synced`], the
/// parent of each directory created, and `dir`'s own parent, are synced
/// after, so `dir` is still there after a power loss.
pub(crate) fn create_dir_all(dir: &Path, durability: Durability) -> std::io::Result<()> {
    create_dirs(dir, None, durability)
}

/// As [`create_dir_all`], for a `dir` inside `base`, a directory known to
/// be durable: every directory between them is synced into its parent,
/// whoever made it (another thread may have made one and not synced it
/// yet when this call finds it).
pub(crate) fn create_dir_all_under(base: &Path, dir: &Path, durability: Durability) -> std::io::Result<()> {
    create_dirs(dir, Some(base), durability)
}

fn create_dirs(dir: &Path, base: Option<&Path>, durability: Durability) -> std::io::Result<()> {
    if durability == Durability::Unsynced {
        return std::fs::create_dir_all(dir);
    }
    // A relative path's last parent is "": the current directory.
    fn parent(path: &Path) -> Option<&Path> {
        path.parent().map(|p| if p.as_os_str().is_empty() { Path::new(".") } else { p })
    }
    let mut missing = Vec::new();
    let mut at = Some(dir);
    while let Some(path) = at.filter(|p| p.as_os_str() != "." && !p.as_os_str().is_empty()) {
        let inside_base = base.is_some_and(|base| path != base && path.starts_with(base));
        if !inside_base && path.exists() {
            break;
        }
        missing.push(path);
        at = parent(path);
    }
    std::fs::create_dir_all(dir)?;
    // Deepest first: each name is synced into its parent; `dir`'s parent
    // even when `dir` existed (a crash may have come between its creation
    // and that sync).
    let mut parents: Vec<&Path> = missing.iter().filter_map(|p| parent(p)).collect();
    if missing.is_empty()
        && let Some(dir_parent) = parent(dir)
    {
        parents.push(dir_parent);
    }
    for parent in parents {
        sync_dir(parent)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_ways_replace_the_whole_file_and_leave_no_temp_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("meta.json");
        for durability in [Durability::Synced, Durability::Unsynced] {
            replace(&path, b"a longer first version", durability).unwrap();
            replace(&path, b"second", durability).unwrap();
            assert_eq!(std::fs::read(&path).unwrap(), b"second");
            let names: Vec<_> = std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
            assert_eq!(names, ["meta.json"], "{durability:?}");
        }
    }
}
