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

use tailrace_testkit as common;

use common::life::{Op, ServeNode, node_ops, proptest_config, run_life};
use proptest::prelude::*;

/// A config with small files and the given checkpoint interval.
fn config(max_file_bytes: u64, persist_ms: u64) -> String {
    format!(
        "[adapters.file.writer]\nmax_file_bytes = {max_file_bytes}\n\n[checkpoint]\npersist_interval = \"{persist_ms}ms\"\n"
    )
}

fn live(mut ops: Vec<Op>, max_file_bytes: u64, persist_ms: u64) -> Result<(), TestCaseError> {
    // Something to check from the first step on.
    ops.insert(0, Op::Produce { run: 0, batches: 3, lines: 5 });
    let mut node = ServeNode::new(&config(max_file_bytes, persist_ms));
    let outcome = run_life(&mut node, ops, None);
    prop_assert!(outcome.is_ok(), "{}", outcome.unwrap_err());
    Ok(())
}

proptest! {
    #![proptest_config(proptest_config())]

    #[test]
    fn every_acknowledged_line_survives_a_nodes_whole_life(
        ops in proptest::collection::vec(node_ops(), 4..10),
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

/// A second `serve` on a data directory in use is refused by name; a start
/// that fails (its address is taken) leaves no writer lock behind, and the
/// next start serves.
#[test]
fn a_second_serve_is_refused_and_a_failed_start_leaves_nothing_behind() {
    let mut node = ServeNode::new("");
    node.start();
    let second = std::process::Command::new(env!("CARGO_BIN_EXE_tailrace"))
        .args(["serve", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(node.data_dir())
        .output()
        .unwrap();
    assert!(!second.status.success());
    let stderr = String::from_utf8_lossy(&second.stderr);
    assert!(stderr.contains("is in use by another tailrace process (pid "), "{stderr}");
    node.stop();
    // An address already taken: the start fails after the queues opened.
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let failed = std::process::Command::new(env!("CARGO_BIN_EXE_tailrace"))
        .args(["serve", "--listen", &taken.local_addr().unwrap().to_string(), "--data-dir"])
        .arg(node.data_dir())
        .output()
        .unwrap();
    assert!(!failed.status.success(), "{}", String::from_utf8_lossy(&failed.stdout));
    let queues = node.data_dir().join("queues");
    let mut locks = Vec::new();
    for queue in std::fs::read_dir(&queues).unwrap() {
        let queue = queue.unwrap().path();
        if queue.join(".events.lock").exists() {
            locks.push(queue);
        }
    }
    assert!(locks.is_empty(), "writer locks left behind: {locks:?}");
    assert!(queues.join("q0").exists(), "the failed start had opened the queues");
    node.start();
    node.stop();
}

/// Ctrl-C and SIGTERM on a node under load (four producers posting): it
/// stops within 5 s, leaves no writer lock or `.open` file, and the next
/// start holds every acknowledged line.
#[test]
fn a_signal_under_load_stops_within_five_seconds_and_leaves_nothing_to_recover() {
    use common::life::{Client, Model, produce_maybe};
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let mut node = ServeNode::new("");
    let mut model = Model::default();
    for (life, signal) in ["INT", "TERM"].into_iter().enumerate() {
        node.start();
        let client = std::sync::Arc::new(Client::new(&node));
        let producers: Vec<_> = (0..4u32)
            .map(|k| {
                let client = client.clone();
                let run = life as u32 * 4 + k;
                runtime.spawn(async move {
                    let mut model = Model::default();
                    produce_maybe(&client, &mut model, run, 10_000, 100).await;
                    model
                })
            })
            .collect();
        // Under load: wait for the first acknowledged lines, then signal.
        let loaded = runtime.block_on(async {
            let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(30);
            while client.log(life as u32 * 4).await.len() < 100 && tokio::time::Instant::now() < deadline {
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            }
            !client.log(life as u32 * 4).await.is_empty()
        });
        assert!(loaded, "life {life}: the producers got lines in");
        let took = node.stop_with(signal);
        eprintln!("SIG{signal} under load: stopped in {took:?}");
        assert!(took < std::time::Duration::from_secs(5), "SIG{signal} under load took {took:?}");
        for producer in producers {
            model.merge(runtime.block_on(producer).unwrap());
        }
        assert_eq!(node.leftovers(), Vec::<String>::new(), "SIG{signal}: nothing left to recover");
    }
    node.start();
    let client = Client::new(&node);
    let checked = runtime.block_on(client.drained(&model));
    assert!(checked.is_ok(), "{}\n{}", checked.unwrap_err(), node.log_tail());
    assert!(model.acked_lines() > 0);
    node.stop();
}
