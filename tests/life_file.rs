//! A node's whole life on one data directory, as a user lives it: `tailrace
//! serve` on the embedded file adapter and file run log store, through
//! random sequences of producing, draining, Ctrl-C, `kill -9` (also while
//! producers post) and restarts, with small files (many rotations) and
//! throttled checkpoints. After every restart and at the end, each run's
//! log holds every acknowledged line exactly once, in order; a batch that
//! got no answer appears whole or not at all. No start needs an operator.
//!
//! `cargo test` runs a few cases; `TAILRACE_LIFE_CASES=50 cargo test --test
//! life_file` runs more.

mod common;

use std::time::Duration;

use common::life::{Client, Model, Outcome, Posted, ServeNode};
use proptest::prelude::*;

#[derive(Clone, Debug)]
enum Op {
    /// Posts `batches` batches of `lines` lines to run `run`, one after another.
    Produce { run: u32, batches: u32, lines: u32 },
    /// The same, and a `kill -9` after `after_ms`, then a restart.
    KillWhileProducing { run: u32, batches: u32, lines: u32, after_ms: u64 },
    /// Waits until every acknowledged line is in its run's log and every
    /// queue file was consumed and deleted (the queues drained to empty).
    Drain,
    /// Ctrl-C, then a restart.
    Stop,
    /// `kill -9` while idle, then a restart.
    Kill,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0u32..3, 1u32..12, 1u32..60).prop_map(|(run, batches, lines)| Op::Produce { run, batches, lines }),
        2 => (0u32..3, 5u32..40, 1u32..60, 0u64..400)
            .prop_map(|(run, batches, lines, after_ms)| Op::KillWhileProducing { run, batches, lines, after_ms }),
        2 => Just(Op::Drain),
        1 => Just(Op::Stop),
        1 => Just(Op::Kill),
    ]
}

/// A config with small files and the given checkpoint interval.
fn config(max_file_bytes: u64, persist_ms: u64) -> String {
    format!(
        "[adapters.file.writer]\nmax_file_bytes = {max_file_bytes}\n\n[checkpoint]\npersist_interval = \"{persist_ms}ms\"\n"
    )
}

async fn produce(client: &Client, model: &mut Model, run: u32, batches: u32, lines: u32) {
    for _ in 0..batches {
        let (_, body) = model.next(run, lines);
        match client.post(run, body).await {
            Posted::Acked => model.record(run, lines, Outcome::Acked),
            Posted::Maybe(why) => panic!("a live node refused a batch: {why}"),
            Posted::NotSent => panic!("a live node refused the connection"),
        }
    }
}

/// Posts while the node is killed: a batch counts as acknowledged only on
/// a 202; one in flight at the kill may or may not be in the log.
async fn produce_until_killed(client: &Client, model: &mut Model, run: u32, batches: u32, lines: u32) {
    for _ in 0..batches {
        let (_, body) = model.next(run, lines);
        match client.post(run, body).await {
            Posted::Acked => model.record(run, lines, Outcome::Acked),
            Posted::Maybe(_) => model.record(run, lines, Outcome::Maybe),
            Posted::NotSent => return,
        }
    }
}

fn live(ops: Vec<Op>, max_file_bytes: u64, persist_ms: u64) -> Result<(), TestCaseError> {
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let mut node = ServeNode::new(&config(max_file_bytes, persist_ms));
    node.start();
    let client = Client::new(&node);
    let mut model = Model::default();
    let check = |node: &ServeNode, model: &Model, when: &str| -> Result<(), TestCaseError> {
        let drained = runtime.block_on(client.drained(model));
        prop_assert!(drained.is_ok(), "{when}: {}\nnode log:\n{}", drained.unwrap_err(), node.log_tail());
        Ok(())
    };
    for (step, op) in ops.into_iter().enumerate() {
        match op {
            Op::Produce { run, batches, lines } => runtime.block_on(produce(&client, &mut model, run, batches, lines)),
            Op::KillWhileProducing { run, batches, lines, after_ms } => {
                runtime.block_on(async {
                    let producing = produce_until_killed(&client, &mut model, run, batches, lines);
                    let killing = async {
                        tokio::time::sleep(Duration::from_millis(after_ms)).await;
                        tokio::task::block_in_place(|| node.kill9());
                    };
                    tokio::join!(producing, killing);
                });
                node.start();
                check(&node, &model, &format!("step {step}: after a kill -9 while producing"))?;
            }
            Op::Drain => {
                check(&node, &model, &format!("step {step}: drain"))?;
                let empty = node.wait_queues_empty();
                prop_assert!(empty.is_ok(), "step {step}: {}\nnode log:\n{}", empty.unwrap_err(), node.log_tail());
            }
            Op::Stop => {
                node.stop();
                node.start();
                check(&node, &model, &format!("step {step}: after Ctrl-C and a restart"))?;
            }
            Op::Kill => {
                node.kill9();
                node.start();
                check(&node, &model, &format!("step {step}: after a kill -9 and a restart"))?;
            }
        }
    }
    check(&node, &model, "at the end")?;
    node.stop();
    // One more life after a clean stop: nothing to recover, nothing lost.
    node.start();
    check(&node, &model, "after the last restart")?;
    prop_assert!(node.lives >= 2);
    Ok(())
}

fn cases() -> u32 {
    std::env::var("TAILRACE_LIFE_CASES").ok().and_then(|n| n.parse().ok()).unwrap_or(3)
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: cases(),
        max_shrink_iters: 16,
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    #[test]
    fn every_acknowledged_line_survives_a_nodes_whole_life(
        ops in proptest::collection::vec(op(), 4..10),
        max_file_bytes in prop_oneof![Just(2_048u64), Just(16_384), Just(8 * 1024 * 1024)],
        persist_ms in prop_oneof![Just(0u64), Just(300), Just(5_000)],
    ) {
        live(ops, max_file_bytes, persist_ms)?;
    }
}

/// The first scenario, step by step: 40 batches drained, Ctrl-C,
/// a restart, 5 more lines: all 4 005 in the log; then six lives
/// alternating `kill -9` (producers posting) and Ctrl-C.
#[test]
fn six_lives_alternating_kill_and_ctrl_c_lose_nothing() {
    live(
        vec![
            Op::Produce { run: 0, batches: 40, lines: 100 },
            Op::Drain,
            Op::Stop,
            Op::Produce { run: 0, batches: 5, lines: 1 },
            Op::Drain,
            Op::KillWhileProducing { run: 1, batches: 60, lines: 50, after_ms: 300 },
            Op::Stop,
            Op::KillWhileProducing { run: 2, batches: 60, lines: 50, after_ms: 200 },
            Op::Stop,
            Op::KillWhileProducing { run: 1, batches: 60, lines: 50, after_ms: 100 },
            Op::Produce { run: 0, batches: 3, lines: 7 },
        ],
        8 * 1024 * 1024,
        5_000,
    )
    .unwrap();
}
