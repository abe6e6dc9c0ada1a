//! A node's whole life with power cuts, not only `kill -9`: `tailrace
//! serve` on the embedded file adapter and file run log store, its data
//! directory on the power-cut file system (tests/common/powercut.rs), so
//! a cut loses every write that was not synced, as a machine losing power
//! does (a `kill -9` leaves them in the page cache). On defaults (`fsync =
//! "every-flush"`, `[archive] fsync = true`), after every cut and restart
//! each run's log holds every acknowledged line exactly once, in order.
//!
//! `cargo test` runs a few cases; `TAILRACE_POWERCUT_CASES=30 cargo test
//! --test powercut_file` runs more. Skips, saying why, where FUSE cannot
//! be mounted.

mod common;

use common::life::{Op, ServeNode, node_ops, run_life_on};
use common::powercut::PowerCutFs;
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
    let mut power = match PowerCutFs::mount(&mnt) {
        Ok(power) => power,
        Err(why) => {
            eprintln!("skipped: {why}");
            return Ok(());
        }
    };
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
