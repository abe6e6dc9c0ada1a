//! The power-cut file system itself (testkit/src/powercut.rs): what a cut
//! keeps is exactly what was synced, file data and directory entries
//! alike, so the life tests built on it can trust what it drops. Skips,
//! saying why, where FUSE cannot be mounted.

use tailrace_testkit as common;

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::Path;

use common::powercut::{Cut, PowerCutFs};

fn mounted() -> Option<(tempfile::TempDir, PowerCutFs)> {
    let dir = tempfile::tempdir().unwrap();
    let mnt = dir.path().join("mnt");
    std::fs::create_dir(&mnt).unwrap();
    PowerCutFs::mount_or_skip(&mnt).map(|fs| (dir, fs))
}

fn sync_dir(dir: &Path) {
    File::open(dir).unwrap().sync_all().unwrap();
}

fn read(path: &Path) -> Option<String> {
    std::fs::read_to_string(path).ok()
}

#[test]
fn a_cut_keeps_synced_data_and_entries_and_drops_the_rest() {
    let Some((_dir, mut fs)) = mounted() else { return };
    let root = fs.path().to_path_buf();
    // Synced data in a synced directory entry: kept.
    let mut kept = File::create(root.join("kept")).unwrap();
    kept.write_all(b"one\n").unwrap();
    kept.sync_data().unwrap();
    sync_dir(&root);
    // An append after the sync: dropped.
    kept.write_all(b"two\n").unwrap();
    drop(kept);
    // A directory made and synced in its parent; in it, a file with
    // synced data whose directory never synced: the name is gone.
    std::fs::create_dir(root.join("sub")).unwrap();
    sync_dir(&root);
    let mut orphan = File::create(root.join("sub/orphan")).unwrap();
    orphan.write_all(b"lost").unwrap();
    orphan.sync_all().unwrap();
    drop(orphan);
    // A rename not synced: the old name stays.
    std::fs::write(root.join("a.tmp"), b"new").unwrap();
    File::open(root.join("a.tmp")).unwrap().sync_all().unwrap();
    sync_dir(&root);
    std::fs::rename(root.join("a.tmp"), root.join("a")).unwrap();
    // Before the cut, everything is visible.
    assert_eq!(read(&root.join("kept")).as_deref(), Some("one\ntwo\n"));
    assert_eq!(read(&root.join("a")).as_deref(), Some("new"));

    fs.cut(Cut::Clean).unwrap();

    assert_eq!(read(&root.join("kept")).as_deref(), Some("one\n"));
    assert!(root.join("sub").is_dir());
    assert_eq!(read(&root.join("sub/orphan")), None);
    assert_eq!(read(&root.join("a.tmp")).as_deref(), Some("new"));
    assert_eq!(read(&root.join("a")), None);

    // A synced rename and a synced truncation survive the next cut.
    std::fs::rename(root.join("a.tmp"), root.join("a")).unwrap();
    sync_dir(&root);
    let shrunk = OpenOptions::new().write(true).open(root.join("kept")).unwrap();
    shrunk.set_len(2).unwrap();
    shrunk.sync_all().unwrap();
    drop(shrunk);
    fs.cut(Cut::Clean).unwrap();
    assert_eq!(read(&root.join("a")).as_deref(), Some("new"));
    assert_eq!(read(&root.join("a.tmp")), None);
    assert_eq!(read(&root.join("kept")).as_deref(), Some("on"));
}

#[test]
fn a_torn_cut_keeps_a_prefix_of_unsynced_appends_and_a_failing_sync_says_eio() {
    let Some((_dir, mut fs)) = mounted() else { return };
    let root = fs.path().to_path_buf();
    let mut log = File::create(root.join("log")).unwrap();
    log.write_all(b"synced|").unwrap();
    log.sync_data().unwrap();
    sync_dir(&root);
    log.write_all(b"0123456789").unwrap();
    drop(log);
    let mut lengths = std::collections::BTreeSet::new();
    for seed in 0..16 {
        fs.cut(Cut::Torn(seed)).unwrap();
        let text = read(&root.join("log")).unwrap();
        assert!("synced|0123456789".starts_with(&text) && text.starts_with("synced|"), "{text:?}");
        lengths.insert(text.len());
        // Put the unsynced tail back for the next cut.
        let mut log = OpenOptions::new().write(true).open(root.join("log")).unwrap();
        log.set_len(7).unwrap();
        log.sync_data().unwrap();
        std::io::Seek::seek(&mut log, std::io::SeekFrom::Start(7)).unwrap();
        log.write_all(b"0123456789").unwrap();
    }
    assert!(lengths.len() > 1, "torn cuts always kept the same length: {lengths:?}");

    fs.fail_fsync(true);
    let file = File::create(root.join("eio")).unwrap();
    let error = file.sync_all().unwrap_err();
    assert_eq!(error.raw_os_error(), Some(libc::EIO));
}
