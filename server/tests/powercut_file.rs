//! A node's whole life with power cuts, not only `kill -9`: `tailrace
//! serve` on the embedded file adapter and file run log store, its data
//! directory on the power-cut file system (testkit/src/powercut.rs), so
//! a cut loses every write that was not synced, as a machine losing power
//! does (a `kill -9` leaves them in the page cache). On defaults (`fsync =
//! "every-flush"`, `[archive] fsync = true`), after every cut and restart
//! each run's log holds every acknowledged line exactly once, in order.
//!
//! `cargo test` runs a few cases; `TAILRACE_POWERCUT_CASES=30 cargo test
//! --test powercut_file` runs more. Skips, saying why, where FUSE cannot
//! be mounted.

use tailrace_testkit as common;

use common::life::{Op, ServeNode, node_ops, run_life_on};
use common::powercut::{Cut, PowerCutFs};
use proptest::prelude::*;

/// Small files (many rotations and seals), the given checkpoint interval,
/// and downloads in pages of 700 lines, so reading a log back crosses the
/// run log's index (an entry every 1 024 lines) at every page.
fn config(max_file_bytes: u64, persist_ms: u64) -> String {
    format!(
        "[adapters.file.writer]\nmax_file_bytes = {max_file_bytes}\n\n[checkpoint]\npersist_interval = \"{persist_ms}ms\"\n\n[edge]\nmax_page_lines = 700\n"
    )
}

fn live(mut ops: Vec<Op>, config: &str) -> Result<(), TestCaseError> {
    let dir = tempfile::tempdir().unwrap();
    let mnt = dir.path().join("mnt");
    std::fs::create_dir(&mnt).unwrap();
    let Some(mut power) = PowerCutFs::mount_or_skip(&mnt) else { return Ok(()) };
    ops.insert(0, Op::Produce { run: 0, batches: 3, lines: 5 });
    let mut node = ServeNode::with_data_dir(config, mnt.join("data"));
    let outcome = run_life_on(&mut node, ops, None, Some(&mut power));
    prop_assert!(outcome.is_ok(), "{}", outcome.unwrap_err());
    let cuts = power.counts().cuts.load(std::sync::atomic::Ordering::Relaxed);
    let syncs = power.counts().file_syncs.load(std::sync::atomic::Ordering::Relaxed);
    prop_assert!(syncs > 0, "the node never synced a file: the cuts tested nothing");
    eprintln!("{cuts} power cuts, {syncs} file syncs");
    Ok(())
}

fn power_ops() -> impl Strategy<Value = Op> {
    let torn = prop_oneof![Just(None), any::<u64>().prop_map(Some)];
    prop_oneof![
        3 => node_ops(),
        1 => torn.clone().prop_map(|torn| Op::PowerCut { torn }),
        2 => (0u32..3, 5u32..40, 1u32..80, 0u64..400, torn).prop_map(|(run, batches, lines, after_ms, torn)| {
            Op::PowerCutWhileProducing { run, batches, lines, after_ms, torn }
        }),
    ]
}

fn cases() -> u32 {
    std::env::var("TAILRACE_POWERCUT_CASES").ok().and_then(|n| n.parse().ok()).unwrap_or(2)
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: cases(),
        max_shrink_iters: 8,
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    #[test]
    fn every_acknowledged_line_survives_power_cuts(
        ops in proptest::collection::vec(power_ops(), 4..9),
        max_file_bytes in prop_oneof![Just(4_096u64), Just(65_536), Just(8 * 1024 * 1024)],
        persist_ms in prop_oneof![Just(0u64), Just(300), Just(5_000)],
    ) {
        live(ops, &config(max_file_bytes, persist_ms))?;
    }
}

/// A run longer than a page of the run log's index (1 024 lines), cut
/// while producers post, then cut again idle and torn: every line of
/// every page is the right one, once (the index of a run must survive a
/// cut as its lines do).
#[test]
fn a_long_run_reads_back_exactly_after_power_cuts() {
    let ops = vec![
        Op::Produce { run: 0, batches: 30, lines: 100 },
        Op::PowerCut { torn: None },
        Op::Produce { run: 0, batches: 30, lines: 100 },
        Op::PowerCutWhileProducing { run: 1, batches: 60, lines: 70, after_ms: 300, torn: None },
        Op::Produce { run: 1, batches: 20, lines: 100 },
        Op::PowerCut { torn: Some(7) },
        Op::PowerCutWhileProducing { run: 0, batches: 40, lines: 60, after_ms: 200, torn: Some(11) },
        Op::Drain,
        Op::Produce { run: 2, batches: 5, lines: 10 },
    ];
    live(ops, &config(16_384, 300)).unwrap();
}

/// Under `fsync = "never"` an acknowledged line is in the page cache, not
/// on disk, until its queue file is sealed (fsync, rename, directory
/// fsync: at most `max_file_age` after the file's first line, or when it
/// fills); under `"group:10ms"` until the next group sync. A power cut
/// loses what was acknowledged in that window and nothing before it: the
/// lost batches are a tail of what was posted, and what survives is whole,
/// in order, once. The tests print the window they measured (the docs
/// quote it).
#[test]
fn under_fsync_never_a_power_cut_loses_only_a_tail() {
    loses_only_a_tail("never");
}

#[test]
fn under_group_fsync_a_power_cut_loses_only_a_tail() {
    loses_only_a_tail("group:10ms");
}

fn loses_only_a_tail(policy: &str) {
    use common::life::{Client, Model, Outcome, kill_while_producing, line};
    use std::time::{Duration, Instant};

    let dir = tempfile::tempdir().unwrap();
    let mnt = dir.path().join("mnt");
    std::fs::create_dir(&mnt).unwrap();
    let Some(mut power) = PowerCutFs::mount_or_skip(&mnt) else { return };
    let config = format!("[adapters.file.writer]\nfsync = \"{policy}\"\n");
    let mut node = ServeNode::with_data_dir(&config, mnt.join("data"));
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    node.start();
    let client = Client::new(&node);
    let mut model = Model::default();
    let (mut lost_lines, mut window) = (0u64, Duration::ZERO);
    for round in 0..3u64 {
        // Batch numbers posted before this round: the round's acks are
        // timed from here.
        let first = model.runs.get(&0).map_or(0, Vec::len);
        let started = Instant::now();
        runtime.block_on(kill_while_producing(&client, &mut model, &mut node, 0, 200, 20, 200 + 100 * round));
        let cut_at = Instant::now();
        power.cut(Cut::Clean).unwrap();
        node.start();
        // A marker batch after the restart: once it is in the log, every
        // batch before it that survived is too (one run, one queue).
        let (marker, body) = model.next(0, 1);
        assert!(matches!(runtime.block_on(client.post(0, body)), common::life::Posted::Acked));
        model.record(0, 1, Outcome::Acked);
        let deadline = Instant::now() + common::life::DRAIN_WITHIN;
        let log = loop {
            let log = runtime.block_on(client.log(0));
            if log.last().is_some_and(|l| *l == line(0, marker, 0, 1)) || Instant::now() > deadline {
                break log;
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        // Which batches the log holds: whole, in order, once.
        let batches = &model.runs[&0];
        let mut present = Vec::new();
        let mut at = 0;
        while at < log.len() {
            let b = (present.last().map_or(0, |p| p + 1)..batches.len())
                .find(|&b| log[at] == line(0, b, 0, batches[b].lines))
                .unwrap_or_else(|| panic!("line {at} `{}` starts no later batch", log[at]));
            for i in 0..batches[b].lines {
                assert_eq!(log.get(at + i as usize), Some(&line(0, b, i, batches[b].lines)), "batch {b} torn");
            }
            at += batches[b].lines as usize;
            present.push(b);
        }
        assert_eq!(present.last(), Some(&marker), "the marker batch ends the log");
        // Acknowledged and lost: only in this round, and only a tail of it.
        let lost: Vec<usize> =
            (0..marker).filter(|b| batches[*b].outcome == Outcome::Acked && !present.contains(b)).collect();
        assert!(lost.iter().all(|&b| b >= first), "a batch acknowledged in an earlier round was lost: {lost:?}");
        if let Some(&oldest) = lost.first() {
            assert!(present.iter().all(|&p| p < oldest || p == marker), "a hole: {lost:?} lost, {present:?} kept");
            lost_lines += lost.iter().map(|&b| u64::from(batches[b].lines)).sum::<u64>();
            // Batches are acknowledged one after another: the round's
            // share of acks before the oldest lost one, in time.
            let acked = (first..marker).filter(|b| batches[*b].outcome == Outcome::Acked).count().max(1);
            let lost_share = lost.len() as f64 / acked as f64;
            window = window.max((cut_at - started).mul_f64(lost_share));
        }
        // Tell the model which batches are gone, so later rounds check the rest.
        for b in lost {
            model.runs.get_mut(&0).unwrap()[b].outcome = Outcome::Maybe;
        }
    }
    node.stop();
    eprintln!(
        "fsync = {policy}: {lost_lines} of {} acknowledged lines lost over 3 power cuts; about {} ms of acknowledgements at most",
        model.acked_lines() + lost_lines,
        window.as_millis()
    );
}

/// A disk that fails `fsync` (`EIO`): no batch is acknowledged that was
/// not synced (the node refuses: it cannot trust what the kernel kept),
/// and after a restart on a healthy disk every batch it did
/// acknowledge is in the log, once, in order.
#[test]
fn a_failing_fsync_is_never_acknowledged() {
    use common::life::{Client, Model, Outcome, Posted};

    let dir = tempfile::tempdir().unwrap();
    let mnt = dir.path().join("mnt");
    std::fs::create_dir(&mnt).unwrap();
    let Some(mut power) = PowerCutFs::mount_or_skip(&mnt) else { return };
    let mut node = ServeNode::with_data_dir(&config(65_536, 300), mnt.join("data"));
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    node.start();
    let client = Client::new(&node);
    let mut model = Model::default();
    let post = |model: &mut Model| {
        let (_, body) = model.next(0, 10);
        let posted = runtime.block_on(client.post(0, body));
        let outcome = if matches!(posted, Posted::Acked) { Outcome::Acked } else { Outcome::Maybe };
        model.record(0, 10, outcome);
        outcome
    };
    for _ in 0..5 {
        assert_eq!(post(&mut model), Outcome::Acked, "a healthy disk takes every batch");
    }
    power.fail_fsync(true);
    let refused = (0..5).map(|_| post(&mut model)).filter(|o| *o == Outcome::Maybe).count();
    assert_eq!(refused, 5, "a batch was acknowledged while every fsync failed");
    // The cut drops whatever the failed syncs left unsynced.
    node.kill9();
    power.fail_fsync(false);
    power.cut(Cut::Clean).unwrap();
    node.start();
    let client = Client::new(&node);
    for _ in 0..3 {
        let (_, body) = model.next(0, 10);
        assert!(matches!(runtime.block_on(client.post(0, body)), Posted::Acked));
        model.record(0, 10, Outcome::Acked);
    }
    runtime.block_on(client.drained(&model)).unwrap_or_else(|e| panic!("{e}\n{}", node.log_tail()));
    node.stop();
}
