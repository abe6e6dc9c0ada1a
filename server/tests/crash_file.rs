//! Crash tests on the file handoff, as separate processes killed with
//! SIGKILL (`kill -9`):
//!
//! 1. a writer appending continuously is killed: every event its append
//!    acknowledged (flush returned under `every-flush`) is delivered after
//!    recovery, and the leftovers are reported as recovery-required;
//! 2. a node pulling the file queues is killed mid-delivery and restarted:
//!    every event is delivered at least once, duplicates only after the
//!    last checkpoint, none lost.
//!
//! The child processes are this test binary run again on one of the
//! `#[ignore]`d entries below.

use tailrace_testkit as common;

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader, Write};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::crash::*;
use common::*;
use tailrace::adapters::file::{FileAdapterFactory, FileOptions};
use tailrace::checkpoint::FileCheckpointer;
use tailrace::handoff::{FsyncPolicy, HandoffError, LoggingConsumer, WriterOptions};
use tailrace::queue::QueueMapper;
use tailrace::{Event, EventId, QueueId, StreamId};

const QUEUES: u32 = 2;

fn streams() -> Vec<StreamId> {
    (0..6).map(|i| StreamId::new("crash", format!("s{i}"))).collect()
}

fn env(dir: &std::path::Path) -> Vec<(&'static str, String)> {
    vec![("TAILRACE_CRASH_DIR", dir.display().to_string())]
}

/// Child: appends batches to `q0` forever, printing `acked <id>` after each
/// flush returned (the acknowledgement under `every-flush`).
#[test]
#[ignore = "a child process of the crash tests"]
fn child_writer() {
    let dir = crash_dir().join("q0");
    let options = WriterOptions { fsync: FsyncPolicy::EveryFlush, max_file_bytes: 4_096, ..WriterOptions::default() };
    let mut writer = LoggingConsumer::open(&dir, "events", options).unwrap();
    let streams = streams();
    let mut stdout = std::io::stdout();
    for n in 0u64.. {
        let stream = &streams[(n % streams.len() as u64) as usize];
        let batch: Vec<Event> =
            (0..1 + n % 3).map(|k| Event::new(EventId::new(format!("w{n}.{k}")), "payload")).collect();
        writer.append_batch(stream, &batch).unwrap();
        writer.flush().unwrap();
        for event in &batch {
            writeln!(stdout, "\nacked {}", event.id).unwrap();
        }
        stdout.flush().unwrap();
    }
}

/// The id in an `acked <id>` line.
fn acked_id(line: &str) -> Option<String> {
    line.strip_prefix("acked ").map(str::to_string)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_writer_loses_no_acknowledged_event() {
    let dir = tempfile::tempdir().unwrap();
    let mut writer = child("child_writer", &env(dir.path()));
    let mut acked = BTreeSet::new();
    let mut lines = BufReader::new(writer.stdout.take().unwrap()).lines();
    while acked.len() < 500 {
        let line = lines.next().expect("the writer runs").unwrap();
        acked.extend(acked_id(&line));
    }
    writer.kill().unwrap(); // SIGKILL
    writer.wait().unwrap();
    // Whatever it printed before dying was acknowledged too.
    acked.extend(lines.map_while(Result::ok).filter_map(|line| acked_id(&line)));

    let queue_dir = dir.path().join("q0");
    let err = LoggingConsumer::open(&queue_dir, "events", WriterOptions::default()).unwrap_err();
    assert!(
        matches!(&err, HandoffError::RecoveryRequired { files, .. } if files.iter().any(|f| f.to_string_lossy().ends_with(".open"))),
        "{err}"
    );
    let report = tailrace::handoff::recover(&queue_dir, "events", true).unwrap();
    assert!(report.stale_lock.is_some(), "{report}");

    // A node reads the queue after recovery: every acknowledged event arrives.
    let recorder = Recorder::new();
    let options = FileOptions {
        dir: dir.path().into(),
        write: false,
        read_wait: Duration::from_millis(20),
        ..FileOptions::default()
    };
    let factory = Arc::new(FileAdapterFactory::new(1, options).unwrap());
    let node = TestNode::start(factory, quick_config(), implicit("crash", &recorder)).await;
    let delivered = || -> BTreeSet<String> { recorder.snapshot().events.values().flatten().cloned().collect() };
    assert!(
        eventually(Duration::from_secs(30), || delivered().is_superset(&acked)).await,
        "acknowledged but not delivered: {:?}",
        acked.difference(&delivered()).take(10).collect::<Vec<_>>()
    );
    node.node.shutdown().await.unwrap();
}

/// Child: a node reading the file queues (written by the parent), auditing
/// every delivery, until killed.
#[test]
#[ignore = "a child process of the crash tests"]
fn child_node() {
    let dir = crash_dir();
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    runtime.block_on(async move {
        let audit = Audit::open(&dir, QueueMapper::new(QUEUES));
        let options = FileOptions {
            dir: dir.clone(),
            write: false,
            read_wait: Duration::from_millis(20),
            ..FileOptions::default()
        };
        let factory = Arc::new(FileAdapterFactory::new(QUEUES, options).unwrap());
        let mut config = quick_config();
        config.checkpoint.persist_interval = Duration::from_millis(100);
        config.agent.max_delivery_batch = 1;
        let _node = TestNode::start(factory, config, audit.implicit("crash")).await;
        println!("\n{READY}");
        std::future::pending::<()>().await;
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_killed_mid_delivery_loses_nothing_and_repeats_only_after_its_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let mapper = QueueMapper::new(QUEUES);
    // The parent is the producer: one writer per queue directory.
    let mut writers: Vec<LoggingConsumer> = (0..QUEUES)
        .map(|q| {
            LoggingConsumer::open(dir.path().join(QueueId(q).to_string()), "events", WriterOptions::default()).unwrap()
        })
        .collect();
    let mut produced = BTreeSet::new();
    for n in 0..3_000u64 {
        let stream = &streams()[(n % 6) as usize];
        let id = format!("p{n}");
        writers[mapper.queue_for(stream).0 as usize].append(stream, &Event::new(id.as_str(), "x")).unwrap();
        produced.insert(id);
        if n % 100 == 99 {
            for writer in &mut writers {
                writer.rotate().unwrap();
            }
        }
    }
    for writer in writers {
        writer.close().unwrap();
    }

    let checkpoints = FileCheckpointer::new(dir.path().join("checkpoints")).unwrap();
    let mut node = child("child_node", &env(dir.path()));
    wait_ready(&mut node);
    let started = Instant::now();
    while deliveries(dir.path()).len() < 1_000 {
        assert!(started.elapsed() < Duration::from_secs(60), "the node delivers too slowly");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Mid-delivery, once every queue has a saved checkpoint.
    wait_for_checkpoints(&checkpoints, QUEUES, &BTreeMap::new()).await;
    node.kill().unwrap(); // SIGKILL
    node.wait().unwrap();
    let mut lives = Lives::default();
    lives.ended(dir.path(), &checkpoints, QUEUES, End::Killed).await;
    assert!(deliveries(dir.path()).len() < produced.len(), "the kill came before the end");

    let node = child("child_node", &env(dir.path()));
    restart_delivers_everything(node, dir.path(), &produced, &lives).await;
}
