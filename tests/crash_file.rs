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
//! `#[ignore]`d entries below, chosen with `--ignored --exact`.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use common::*;
use tailrace::adapters::file::{FileAdapterFactory, FileOptions};
use tailrace::checkpoint::{Checkpointer, FileCheckpointer};
use tailrace::handoff::{FsyncPolicy, HandoffError, LoggingConsumer, WriterOptions};
use tailrace::pubsub::{ConsumerError, Delivery, DeliveryOutcome, ImplicitSubscriptions, StreamConsumer};
use tailrace::queue::{QueueId, QueueMapper};
use tailrace::stream::{Event, EventId, SequenceToken, StreamId};

const QUEUES: u32 = 2;

fn child(entry: &str, dir: &Path) -> Child {
    Command::new(std::env::current_exe().unwrap())
        .args(["--ignored", "--exact", entry, "--nocapture", "--test-threads", "1"])
        .env("TAILRACE_CRASH_DIR", dir)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap()
}

fn crash_dir() -> PathBuf {
    PathBuf::from(std::env::var("TAILRACE_CRASH_DIR").expect("run by the crash tests"))
}

fn streams() -> Vec<StreamId> {
    (0..6).map(|i| StreamId::new("crash", format!("s{i}"))).collect()
}

// ---------------------------------------------------------------- 1 ----

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
            writeln!(stdout, "acked {}", event.id).unwrap();
        }
        stdout.flush().unwrap();
    }
}

/// The id in an `acked <id>` line (libtest may print its own text first).
fn acked_id(line: &str) -> Option<String> {
    line.rfind("acked ").map(|at| line[at + 6..].to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_writer_loses_no_acknowledged_event() {
    let dir = tempfile::tempdir().unwrap();
    let mut writer = child("child_writer", dir.path());
    let mut acked = BTreeSet::new();
    let mut lines = BufReader::new(writer.stdout.take().unwrap()).lines();
    while acked.len() < 500 {
        let line = lines.next().expect("the writer runs").unwrap();
        if let Some(id) = acked_id(&line) {
            acked.insert(id);
        }
    }
    writer.kill().unwrap(); // SIGKILL
    writer.wait().unwrap();
    // Whatever it printed before dying was acknowledged too.
    for line in lines.map_while(Result::ok) {
        if let Some(id) = acked_id(&line) {
            acked.insert(id);
        }
    }

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

// ---------------------------------------------------------------- 2 ----

/// Records each delivery as `queue token id` lines in an append-only log,
/// slowly, so that the node is killed with deliveries in flight.
struct Audit {
    log: std::sync::Mutex<std::fs::File>,
    mapper: QueueMapper,
}

#[async_trait]
impl StreamConsumer for Audit {
    async fn deliver(&self, delivery: &Delivery) -> Result<DeliveryOutcome, ConsumerError> {
        tokio::time::sleep(Duration::from_millis(1)).await;
        let queue = self.mapper.queue_for(&delivery.stream);
        let mut text = String::new();
        for (event, token) in delivery.events() {
            text.push_str(&format!("{} {token} {}\n", queue.0, event.id));
        }
        let mut log = self.log.lock().unwrap();
        log.write_all(text.as_bytes()).map_err(ConsumerError::failed)?;
        Ok(DeliveryOutcome::Continue)
    }
}

struct AuditFactory(Arc<Audit>);

impl tailrace::pubsub::ConsumerFactory for AuditFactory {
    fn name(&self) -> &str {
        "audit"
    }

    fn create(&self, _: &StreamId) -> Arc<dyn StreamConsumer> {
        self.0.clone()
    }
}

/// Child: a node reading the file queues (written by the parent), auditing
/// every delivery, until killed.
#[test]
#[ignore = "a child process of the crash tests"]
fn child_node() {
    let dir = crash_dir();
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    runtime.block_on(async move {
        let log = std::fs::OpenOptions::new().create(true).append(true).open(dir.join("deliveries.log")).unwrap();
        let audit = Arc::new(Audit { log: std::sync::Mutex::new(log), mapper: QueueMapper::new(QUEUES) });
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
        let implicit = ImplicitSubscriptions::new().bind("crash", Arc::new(AuditFactory(audit)));
        let _node = TestNode::start(factory, config, implicit).await;
        println!("\ntailrace-child-ready");
        std::future::pending::<()>().await;
    });
}

/// `queue token id` lines the node logged.
fn deliveries(dir: &Path) -> Vec<(u32, SequenceToken, String)> {
    let text = std::fs::read_to_string(dir.join("deliveries.log")).unwrap_or_default();
    text.lines()
        .filter_map(|line| {
            let mut parts = line.split(' ');
            Some((parts.next()?.parse().ok()?, parts.next()?.parse().ok()?, parts.next()?.to_string()))
        })
        .collect()
}

fn wait_ready(node: &mut Child) {
    let mut lines = BufReader::new(node.stdout.as_mut().unwrap()).lines();
    while let Some(Ok(line)) = lines.next() {
        if line.ends_with("tailrace-child-ready") {
            return;
        }
    }
    panic!("the node never became ready");
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

    let mut node = child("child_node", dir.path());
    wait_ready(&mut node);
    let started = Instant::now();
    while deliveries(dir.path()).len() < 1_000 {
        assert!(started.elapsed() < Duration::from_secs(60), "the node delivers too slowly");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    node.kill().unwrap(); // SIGKILL, mid-delivery
    node.wait().unwrap();
    let checkpoints = FileCheckpointer::new(dir.path().join("checkpoints")).unwrap();
    let mut at_kill = BTreeMap::new();
    for q in 0..QUEUES {
        at_kill.insert(q, checkpoints.load(QueueId(q)).await.unwrap());
    }
    let before = deliveries(dir.path()).len();
    assert!(before < produced.len(), "the kill came before the end");

    let mut node = child("child_node", dir.path());
    wait_ready(&mut node);
    let started = Instant::now();
    let delivered_ids = || deliveries(dir.path()).into_iter().map(|(_, _, id)| id).collect::<BTreeSet<_>>();
    while !delivered_ids().is_superset(&produced) {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "lost: {:?}",
            produced.difference(&delivered_ids()).take(10).collect::<Vec<_>>()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    node.kill().unwrap();
    node.wait().unwrap();

    // Duplicates exist only past the checkpoint stored when the node died.
    let mut seen = BTreeSet::new();
    let mut duplicates = 0;
    for (queue, token, id) in deliveries(dir.path()) {
        if !seen.insert(id.clone()) {
            duplicates += 1;
            let checkpoint = at_kill[&queue];
            assert!(
                checkpoint.is_none_or(|c| token > c),
                "{id} at {token} repeated though queue {queue}'s checkpoint was {checkpoint:?}"
            );
        }
    }
    println!(
        "delivered {} lines for {} events: {duplicates} duplicates after the checkpoint",
        deliveries(dir.path()).len(),
        produced.len()
    );
}
