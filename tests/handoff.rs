//! The file handoff writer (seed 003): sealing, rotation, budget, the lock,
//! crash leftovers and recovery, and a property test against a model.

use std::collections::BTreeSet;
use std::path::Path;

use proptest::prelude::*;
use tailrace::handoff::*;
use tailrace::{Event, EventId, StreamId};

fn stream() -> StreamId {
    StreamId::new("logs", "etl/run-1")
}

fn event(i: u64) -> Event {
    Event::new(EventId::new(format!("e{i}")), format!("line {i} of the log"))
}

/// The directory's entries, but the prefixes' state files (their tests
/// look at them on purpose).
fn names(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|name| !name.ends_with(".state"))
        .collect();
    names.sort();
    names
}

/// Every event id in the sealed files of `prefix`, in file and line order.
fn sealed_ids(dir: &Path, prefix: &str) -> Vec<String> {
    let mut ids = Vec::new();
    for file in list_prefix_files(dir, prefix).unwrap().into_iter().filter(|f| !f.open) {
        for line in std::fs::read(&file.path).unwrap().split(|b| *b == b'\n').filter(|l| !l.is_empty()) {
            ids.push(decode_line(line).unwrap().event.id.to_string());
        }
    }
    ids
}

fn options() -> WriterOptions {
    WriterOptions { max_file_bytes: 1_000, max_total_bytes: 100_000, ..WriterOptions::default() }
}

#[test]
fn flush_syncs_but_never_seals_and_close_seals() {
    let dir = tempfile::tempdir().unwrap();
    let mut writer = LoggingConsumer::open(dir.path(), "events", options()).unwrap();
    writer.append_batch(&stream(), &[event(0), event(1)]).unwrap();
    writer.flush().unwrap();
    assert_eq!(names(dir.path()), [".events.lock", "events-1.open"]);
    assert_eq!(writer.durable(), 2);
    writer.close().unwrap();
    assert_eq!(names(dir.path()), ["events-1.jsonl"]);
    assert_eq!(sealed_ids(dir.path(), "events"), ["e0", "e1"]);
}

#[test]
fn files_rotate_at_max_file_bytes_with_every_line_kept_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let mut writer = LoggingConsumer::open(dir.path(), "events", options()).unwrap();
    for i in 0..100 {
        writer.append(&stream(), &event(i)).unwrap();
    }
    writer.close().unwrap();
    let files = list_prefix_files(dir.path(), "events").unwrap();
    assert!(files.len() > 5, "{files:?}");
    assert!(files.iter().all(|f| !f.open && f.bytes <= 1_000));
    let want: Vec<String> = (0..100).map(|i| format!("e{i}")).collect();
    assert_eq!(sealed_ids(dir.path(), "events"), want);
}

#[test]
fn an_old_active_file_is_sealed_by_age() {
    let dir = tempfile::tempdir().unwrap();
    let mut writer = LoggingConsumer::open(
        dir.path(),
        "events",
        WriterOptions { max_file_age: Some(std::time::Duration::ZERO), ..options() },
    )
    .unwrap();
    assert!(!writer.seal_if_due().unwrap(), "nothing to seal yet");
    writer.append(&stream(), &event(0)).unwrap();
    assert!(writer.seal_if_due().unwrap());
    assert_eq!(names(dir.path()), [".events.lock", "events-1.jsonl"]);
    writer.append(&stream(), &event(1)).unwrap();
    writer.close().unwrap();
    assert_eq!(sealed_ids(dir.path(), "events"), ["e0", "e1"]);
}

#[test]
fn the_budget_refuses_whole_batches_and_keeps_what_was_accepted() {
    let dir = tempfile::tempdir().unwrap();
    let mut writer =
        LoggingConsumer::open(dir.path(), "events", WriterOptions { max_total_bytes: 600, ..options() }).unwrap();
    let mut accepted = 0;
    let err = loop {
        match writer.append_batch(&stream(), &[event(accepted), event(accepted + 1)]) {
            Ok(_) => accepted += 2,
            Err(e) => break e,
        }
    };
    assert!(matches!(err, HandoffError::BudgetExceeded { max: 600, .. }), "{err}");
    assert!(err.to_string().contains("nothing was written"));
    assert!(writer.used_bytes() <= 600);
    writer.close().unwrap();
    let want: Vec<String> = (0..accepted).map(|i| format!("e{i}")).collect();
    assert_eq!(sealed_ids(dir.path(), "events"), want);
}

#[test]
fn budget_frees_up_when_a_reader_deletes_sealed_files() {
    let dir = tempfile::tempdir().unwrap();
    let mut writer =
        LoggingConsumer::open(dir.path(), "events", WriterOptions { max_total_bytes: 400, ..options() }).unwrap();
    let mut i = 0;
    while writer.append(&stream(), &event(i)).is_ok() {
        i += 1;
    }
    writer.rotate().unwrap();
    for file in list_prefix_files(dir.path(), "events").unwrap() {
        std::fs::remove_file(file.path).unwrap();
    }
    writer.append(&stream(), &event(i)).unwrap();
    writer.close().unwrap();
}

#[test]
fn a_second_writer_on_the_same_prefix_fails() {
    let dir = tempfile::tempdir().unwrap();
    let first = LoggingConsumer::open(dir.path(), "events", options()).unwrap();
    let err = LoggingConsumer::open(dir.path(), "events", options()).unwrap_err();
    assert!(matches!(err, HandoffError::Locked { .. }), "{err}");
    assert!(err.to_string().contains("held by another writer"));
    first.close().unwrap();
    LoggingConsumer::open(dir.path(), "events", options()).unwrap().close().unwrap();
}

#[test]
fn prefixes_are_matched_on_whole_names_and_budgeted_apart() {
    let dir = tempfile::tempdir().unwrap();
    let mut a = LoggingConsumer::open(dir.path(), "events", options()).unwrap();
    let mut b = LoggingConsumer::open(dir.path(), "events-worker-1", options()).unwrap();
    a.append(&stream(), &event(1)).unwrap();
    b.append(&stream(), &event(2)).unwrap();
    b.append(&stream(), &event(3)).unwrap();
    a.close().unwrap();
    b.close().unwrap();
    assert_eq!(sealed_ids(dir.path(), "events"), ["e1"]);
    assert_eq!(sealed_ids(dir.path(), "events-worker-1"), ["e2", "e3"]);
}

#[test]
fn bad_prefixes_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    for bad in ["../x", ".hidden", "", "a/b"] {
        let err = LoggingConsumer::open(dir.path(), bad, options()).unwrap_err();
        assert!(matches!(err, HandoffError::InvalidPrefix { .. }), "{bad}: {err}");
    }
    assert!(names(dir.path()).is_empty(), "nothing was created");
}

#[test]
fn a_deleted_or_replaced_lock_stops_the_writer_for_good() {
    for replace in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let mut writer = LoggingConsumer::open(dir.path(), "events", options()).unwrap();
        writer.append(&stream(), &event(0)).unwrap();
        let lock = dir.path().join(".events.lock");
        std::fs::remove_file(&lock).unwrap();
        if replace {
            std::fs::write(&lock, "someone else").unwrap();
        }
        let err = writer.append(&stream(), &event(1)).unwrap_err();
        assert!(matches!(err, HandoffError::LockLost { .. }), "{err}");
        let err = writer.flush().unwrap_err();
        assert!(err.to_string().contains("accepts nothing more"), "{err}");
        assert!(writer.close().is_err());
    }
}

#[test]
fn a_crash_leaves_files_that_need_recovery_and_nothing_is_taken_over() {
    let dir = tempfile::tempdir().unwrap();
    let mut writer = LoggingConsumer::open(dir.path(), "events", options()).unwrap();
    writer.append_batch(&stream(), &[event(0), event(1), event(2)]).unwrap();
    writer.flush().unwrap();
    drop(writer); // no close: as after kill -9
    let err = LoggingConsumer::open(dir.path(), "events", options()).unwrap_err();
    let text = err.to_string();
    assert!(matches!(err, HandoffError::RecoveryRequired { .. }), "{text}");
    assert!(
        text.contains(".events.lock") && text.contains("events-1.open") && text.contains("tailrace handoff recover"),
        "{text}"
    );
    assert_eq!(names(dir.path()), [".events.lock", "events-1.open"], "nothing renamed or stolen");
}

#[test]
fn a_leftover_open_file_alone_also_needs_recovery() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("events-4.open"), "{}\n").unwrap();
    let err = LoggingConsumer::open(dir.path(), "events", options()).unwrap_err();
    assert!(matches!(err, HandoffError::RecoveryRequired { ref files, .. } if files.len() == 1), "{err}");
    assert_eq!(names(dir.path()), ["events-4.open"], "our own lock was given back");
}

#[test]
fn recover_reports_quarantines_and_republishes_only_when_asked() {
    let dir = tempfile::tempdir().unwrap();
    let mut writer = LoggingConsumer::open(dir.path(), "events", options()).unwrap();
    writer.append_batch(&stream(), &[event(0), event(1)]).unwrap();
    writer.flush().unwrap();
    drop(writer);
    // The crash cut a line in half.
    let open = dir.path().join("events-1.open");
    let mut bytes = std::fs::read(&open).unwrap();
    bytes.extend_from_slice(b"{\"id\":\"e2\",\"str");
    std::fs::write(&open, bytes).unwrap();

    let report = recover(dir.path(), "events", false).unwrap();
    assert!(report.stale_lock.is_some());
    assert_eq!(report.files.len(), 1);
    let file = &report.files[0];
    assert_eq!((file.complete_lines, file.valid_lines, file.truncated_tail_bytes, file.republished), (2, 2, 15, 0));
    assert!(report.to_string().contains("2 complete lines (2 valid), truncated tail 15 bytes"), "{report}");
    assert_eq!(names(dir.path()), ["quarantine"]);
    assert!(sealed_ids(dir.path(), "events").is_empty(), "never republished by itself");

    // A clean writer can take the prefix again.
    LoggingConsumer::open(dir.path(), "events", options()).unwrap().close().unwrap();
}

#[test]
fn recover_with_republish_writes_the_complete_lines_again_with_their_ids() {
    let dir = tempfile::tempdir().unwrap();
    let mut writer = LoggingConsumer::open(dir.path(), "events", options()).unwrap();
    writer.append_batch(&stream(), &[event(0), event(1)]).unwrap();
    writer.rotate().unwrap();
    writer.append_batch(&stream(), &[event(2), event(3)]).unwrap();
    writer.flush().unwrap();
    drop(writer);
    let report = recover(dir.path(), "events", true).unwrap();
    assert_eq!(report.files[0].republished, 2);
    assert!(report.files[0].quarantined.to_string_lossy().ends_with(".republished"));
    assert_eq!(sealed_ids(dir.path(), "events"), ["e0", "e1", "e2", "e3"]);
}

#[test]
fn recover_refuses_while_a_writer_is_alive() {
    let dir = tempfile::tempdir().unwrap();
    let writer = LoggingConsumer::open(dir.path(), "events", options()).unwrap();
    let err = recover(dir.path(), "events", true).unwrap_err();
    assert!(matches!(err, HandoffError::Locked { .. }), "{err}");
    writer.close().unwrap();
}

#[test]
fn fsync_policies_parse_and_print() {
    for (text, policy) in [
        ("never", FsyncPolicy::Never),
        ("every-flush", FsyncPolicy::EveryFlush),
        ("group:10ms", FsyncPolicy::Group(std::time::Duration::from_millis(10))),
    ] {
        assert_eq!(text.parse::<FsyncPolicy>().unwrap(), policy);
        assert_eq!(policy.to_string(), text);
    }
    assert!("sometimes".parse::<FsyncPolicy>().unwrap_err().contains("not an fsync policy"));
}

#[derive(Clone, Debug)]
enum Op {
    Append(u8),
    Flush,
    Rotate,
    Close,
    Crash,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (1u8..6).prop_map(Op::Append),
        3 => Just(Op::Flush),
        1 => Just(Op::Rotate),
        1 => Just(Op::Close),
        1 => Just(Op::Crash),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// Random appends, flushes, rotations, closes and crashes (each crash
    /// followed by `recover --republish`, as an operator would): every
    /// acknowledged event ends up in a sealed file, no event appears that
    /// was never accepted, and the budget is never exceeded.
    #[test]
    fn the_writer_never_loses_an_acknowledged_event(ops in proptest::collection::vec(op(), 1..60), policy in prop_oneof![Just(FsyncPolicy::EveryFlush), Just(FsyncPolicy::Never)]) {
        let dir = tempfile::tempdir().unwrap();
        let options = WriterOptions { max_file_bytes: 700, max_total_bytes: 20_000, fsync: policy, buffer_bytes: 256, ..WriterOptions::default() };
        let mut writer = Some(LoggingConsumer::open(dir.path(), "p", options.clone()).unwrap());
        let mut next = 0u64;
        let mut accepted: BTreeSet<String> = BTreeSet::new();
        let mut acknowledged: BTreeSet<String> = BTreeSet::new();
        let mut pending: Vec<String> = Vec::new();
        for op in ops {
            let w = match writer.as_mut() {
                Some(w) => w,
                None => writer.insert(LoggingConsumer::open(dir.path(), "p", options.clone()).unwrap()),
            };
            match op {
                Op::Append(n) => {
                    let batch: Vec<Event> = (0..n as u64).map(|i| event(next + i)).collect();
                    match w.append_batch(&stream(), &batch) {
                        Ok(_) => {
                            for e in &batch {
                                accepted.insert(e.id.to_string());
                                pending.push(e.id.to_string());
                            }
                            next += n as u64;
                        }
                        Err(HandoffError::BudgetExceeded { .. }) => {}
                        Err(e) => panic!("{e}"),
                    }
                    prop_assert!(w.used_bytes() <= options.max_total_bytes);
                }
                Op::Flush => {
                    w.flush().unwrap();
                    if policy == FsyncPolicy::EveryFlush {
                        acknowledged.extend(pending.drain(..));
                    }
                }
                Op::Rotate => {
                    w.rotate().unwrap();
                    acknowledged.extend(pending.drain(..));
                }
                Op::Close => {
                    writer.take().unwrap().close().unwrap();
                    acknowledged.extend(pending.drain(..));
                }
                Op::Crash => {
                    drop(writer.take());
                    recover(dir.path(), "p", true).unwrap();
                    // Republished lines are acknowledged again only if complete.
                    pending.clear();
                }
            }
            // Sealed files never hold an event that was not accepted.
            if accepted.len().is_multiple_of(40) {
                let ids: BTreeSet<String> = sealed_ids(dir.path(), "p").into_iter().collect();
                prop_assert!(ids.is_subset(&accepted));
            }
        }
        if let Some(w) = writer.take() {
            w.close().unwrap();
            acknowledged.extend(pending.drain(..));
        }
        let sealed: BTreeSet<String> = sealed_ids(dir.path(), "p").into_iter().collect();
        let lost: Vec<_> = acknowledged.difference(&sealed).collect();
        prop_assert!(lost.is_empty(), "acknowledged but lost: {:?}", lost);
        prop_assert!(sealed.is_subset(&accepted), "never accepted: {:?}", sealed.difference(&accepted).collect::<Vec<_>>());
    }
}

#[test]
fn a_batch_is_one_unit_on_disk_and_never_spans_two_files() {
    let dir = tempfile::tempdir().unwrap();
    let mut writer = LoggingConsumer::open(dir.path(), "events", options()).unwrap();
    let first = writer.append_batch(&stream(), &[event(0), event(1), event(2)]).unwrap();
    assert_eq!(first, LinePosition { file: 1, line: 1 });
    let second = writer.append(&stream(), &event(3)).unwrap();
    assert_eq!(second, LinePosition { file: 1, line: 4 });
    // A batch that does not fit the rest of the file starts a new one.
    let big: Vec<Event> = (10..20).map(event).collect();
    let third = writer.append_batch(&stream(), &big).unwrap();
    assert_eq!(third, LinePosition { file: 2, line: 1 });
    assert!(matches!(writer.append_batch(&stream(), &[]), Err(HandoffError::EmptyBatch(_))));
    writer.close().unwrap();
    let file = list_prefix_files(dir.path(), "events").unwrap().remove(0);
    let lines: Vec<DecodedLine> = std::fs::read(file.path)
        .unwrap()
        .split(|b| *b == b'\n')
        .filter(|l| !l.is_empty())
        .map(|l| decode_line(l).unwrap())
        .collect();
    assert_eq!(
        lines.iter().map(|l| l.batch).collect::<Vec<_>>(),
        [3, 1, 1, 1],
        "the first line carries the batch size"
    );
}

/// Writes `n` events to a fresh writer of `prefix`, closes it, and returns
/// the file numbers it used.
fn write_and_close(dir: &Path, prefix: &str, n: u64) -> Vec<u64> {
    let mut writer = LoggingConsumer::open(dir, prefix, options()).unwrap();
    for i in 0..n {
        writer.append(&stream(), &event(i)).unwrap();
        writer.rotate().unwrap();
    }
    writer.close().unwrap();
    list_prefix_files(dir, prefix).unwrap().iter().map(|f| f.n).collect()
}

#[test]
fn file_numbers_never_go_back_even_when_every_file_was_deleted() {
    let dir = tempfile::tempdir().unwrap();
    let mut highest = 0;
    for life in 0..4 {
        let used = write_and_close(dir.path(), "events", 3);
        assert_eq!(used.len(), 3, "life {life}: {used:?}");
        assert!(used.iter().all(|n| *n > highest), "life {life}: {used:?} after {highest}");
        highest = *used.iter().max().unwrap();
        // A reader consumed everything and deleted it.
        for file in list_prefix_files(dir.path(), "events").unwrap() {
            std::fs::remove_file(file.path).unwrap();
        }
    }
}

#[test]
fn a_writer_numbers_past_the_floor_it_is_given() {
    let dir = tempfile::tempdir().unwrap();
    let mut writer = LoggingConsumer::open_from(dir.path(), "events", options(), 5000).unwrap();
    assert_eq!(writer.append(&stream(), &event(0)).unwrap().file, 5000);
    writer.close().unwrap();
    std::fs::remove_file(dir.path().join(".events.state")).unwrap();
    // Without its state file, the directory's files still count.
    let mut writer = LoggingConsumer::open(dir.path(), "events", options()).unwrap();
    assert_eq!(writer.append(&stream(), &event(1)).unwrap().file, 5001);
    writer.close().unwrap();
}

/// A writer that dies with two complete lines and a torn third in its
/// `.open` file.
fn crash_with_a_torn_tail(dir: &Path) {
    let mut writer = LoggingConsumer::open(dir, "events", options()).unwrap();
    writer.append_batch(&stream(), &[event(0), event(1)]).unwrap();
    writer.flush().unwrap();
    drop(writer);
    let open = dir.join("events-1.open");
    let mut bytes = std::fs::read(&open).unwrap();
    bytes.extend_from_slice(b"{\"id\":\"e2\",\"str");
    std::fs::write(&open, bytes).unwrap();
}

#[test]
fn recover_then_recover_with_republish_loses_nothing_and_a_third_run_is_harmless() {
    let dir = tempfile::tempdir().unwrap();
    crash_with_a_torn_tail(dir.path());
    // The documented two steps: look first, then hand the lines over.
    let first = recover(dir.path(), "events", false).unwrap();
    assert_eq!(first.pending_lines(), 2);
    assert!(first.to_string().contains("not republished yet"), "{first}");
    assert!(sealed_ids(dir.path(), "events").is_empty());
    let second = recover(dir.path(), "events", true).unwrap();
    assert_eq!(second.republished(), 2, "{second}");
    assert_eq!(sealed_ids(dir.path(), "events"), ["e0", "e1"]);
    let third = recover(dir.path(), "events", true).unwrap();
    assert!(third.is_empty(), "{third}");
    assert_eq!(sealed_ids(dir.path(), "events"), ["e0", "e1"], "nothing republished twice");
    let quarantined: Vec<String> = names(&dir.path().join(QUARANTINE));
    assert_eq!(quarantined, ["events-1.open.republished"], "the torn tail is kept for a look");
}

#[test]
fn recover_tree_recovers_every_queue_of_a_data_directory() {
    let root = tempfile::tempdir().unwrap();
    for queue in ["q0", "q3"] {
        crash_with_a_torn_tail(&root.path().join(queue));
    }
    write_and_close(&root.path().join("q5"), "events", 1);
    let reports = recover_tree(root.path(), "events", true).unwrap();
    let dirs: Vec<String> = reports.iter().map(|r| r.dir.file_name().unwrap().to_string_lossy().into_owned()).collect();
    assert_eq!(dirs, ["q0", "q3"], "a clean queue needs nothing");
    for queue in ["q0", "q3"] {
        assert_eq!(sealed_ids(&root.path().join(queue), "events"), ["e0", "e1"]);
        LoggingConsumer::open(root.path().join(queue), "events", options()).unwrap().close().unwrap();
    }
    assert!(recover_tree(root.path(), "events", true).unwrap().is_empty(), "a second run finds nothing");
}

#[test]
fn a_data_directory_is_held_by_one_process_and_lets_its_holder_recover() {
    let root = tempfile::tempdir().unwrap();
    let held = DataDirLock::acquire(root.path()).unwrap();
    let err = DataDirLock::acquire(root.path()).unwrap_err();
    let text = err.to_string();
    assert!(matches!(err, HandoffError::DataDirBusy { .. }), "{text}");
    assert!(text.contains(&format!("pid {}", std::process::id())) && text.contains("--data-dir"), "{text}");
    let queue = root.path().join("queues").join("q1");
    crash_with_a_torn_tail(&queue);
    // An old directory without a state file: the floor is what counts.
    std::fs::remove_file(queue.join(".events.state")).unwrap();
    let report = held.recover(&queue, "events", 900).unwrap();
    assert_eq!(report.republished(), 2);
    let numbers: Vec<u64> = list_prefix_files(&queue, "events").unwrap().iter().map(|f| f.n).collect();
    assert_eq!(numbers, [900], "republished past the floor it was given");
    assert!(held.recover(Path::new("/elsewhere"), "events", 1).is_err(), "only inside the held directory");
    drop(held);
    DataDirLock::acquire(root.path()).unwrap();
}

#[test]
fn a_batch_the_crash_cut_short_is_not_republished_so_batches_stay_whole() {
    let dir = tempfile::tempdir().unwrap();
    let mut writer = LoggingConsumer::open(dir.path(), "events", options()).unwrap();
    writer.append_batch(&stream(), &[event(0), event(1)]).unwrap();
    writer.append_batch(&stream(), &[event(2), event(3), event(4)]).unwrap();
    writer.flush().unwrap();
    drop(writer);
    // The crash came after two of the second batch's three lines.
    let open = dir.path().join("events-1.open");
    let text = std::fs::read_to_string(&open).unwrap();
    let kept: String = text.lines().take(4).map(|l| format!("{l}\n")).collect();
    std::fs::write(&open, kept).unwrap();
    let report = recover(dir.path(), "events", true).unwrap();
    assert_eq!(report.republished(), 2, "{report}");
    assert_eq!(sealed_ids(dir.path(), "events"), ["e0", "e1"]);
}
