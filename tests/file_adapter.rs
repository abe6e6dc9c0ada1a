//! The `file` adapter: the conformance kit, restarts, corrupt lines,
//! deletion of consumed files, the budget, recovery, external writers.

use tailrace_testkit as common;

use std::sync::Arc;
use std::time::Duration;

use common::*;
use tailrace::adapters::file::{FileAdapterFactory, FileOptions};
use tailrace::config::Config;
use tailrace::conformance::{self, Claims};
use tailrace::failure::MemoryDeadLetters;
use tailrace::handoff::{LoggingConsumer, WriterOptions};
use tailrace::pubsub::{ImplicitSubscriptions, StartPosition};
use tailrace::queue::{QueueAdapter, QueueAdapterFactory};

const WAIT: Duration = Duration::from_secs(15);

fn options(dir: &std::path::Path) -> FileOptions {
    FileOptions {
        dir: dir.to_path_buf(),
        writer: WriterOptions { max_file_age: Some(Duration::from_millis(10)), ..FileOptions::default().writer },
        ..FileOptions::default()
    }
}

fn config() -> Config {
    let mut config = quick_config();
    config.checkpoint.persist_interval = Duration::from_millis(50);
    config
}

/// The whole kit: durable across a fresh factory on the same directory,
/// rewindable with consumed files deleted (retention), bounded by a small
/// byte budget; two receivers of one queue are not fenced (leases do that).
#[tokio::test]
async fn passes_the_conformance_kit() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_path_buf();
    let claims =
        Claims { durable: true, rewindable: true, exclusive_receivers: false, bounded: Some(2_000), trims: true };
    let opened = Arc::new(std::sync::Mutex::new(Vec::new()));
    let last = opened.clone();
    let report = conformance::run(claims, move || {
        let options = FileOptions {
            writer: WriterOptions { max_total_bytes: 128 * 1024, ..options(&path).writer },
            ..options(&path)
        };
        let opened = opened.clone();
        async move {
            let factory = Arc::new(FileAdapterFactory::new(4, options)?);
            opened.lock().unwrap().push(factory.adapter());
            Ok(factory as Arc<dyn QueueAdapterFactory>)
        }
    })
    .await
    .unwrap_or_else(|failures| panic!("{failures}"));
    println!("{report}");
    assert_eq!(report.checks_run(), 16, "{report}");
    assert_eq!(report.not_claimed, [("exclusive", "exclusive_receivers")]);
    let adapter = last.lock().unwrap().pop().unwrap();
    adapter.close().await.unwrap();
}

#[tokio::test]
async fn events_survive_a_restart_and_are_not_delivered_again() {
    let dir = tempfile::tempdir().unwrap();
    let recorder = Recorder::new();
    let s = stream("f", "a");
    {
        let factory = Arc::new(FileAdapterFactory::new(2, options(dir.path())).unwrap());
        let adapter = factory.adapter();
        let node = TestNode::start(factory, config(), implicit("f", &recorder)).await;
        node.node.produce(&s, events("e", 0..5)).await.unwrap();
        node.node.produce(&s, events("e", 5..8)).await.unwrap();
        assert!(eventually(WAIT, || recorder.total() == 8).await, "{}", recorder.total());
        node.node.shutdown().await.unwrap();
        adapter.close().await.unwrap();
    }
    // Produced while no node ran (another process, or this one later).
    {
        let factory = Arc::new(FileAdapterFactory::new(2, options(dir.path())).unwrap());
        let adapter = factory.adapter();
        adapter.enqueue(&s, events("e", 8..10)).await.unwrap();
        let node = TestNode::start(factory, config(), implicit("f", &recorder)).await;
        assert!(eventually(WAIT, || recorder.total() == 10).await, "{}", recorder.total());
        node.node.shutdown().await.unwrap();
        adapter.close().await.unwrap();
    }
    assert_eq!(recorder.ids(&s), ids("e", 0..10), "each event exactly once, in order");
}

#[tokio::test]
async fn a_corrupt_line_goes_to_the_dead_letter_sink_and_the_queue_goes_on() {
    let dir = tempfile::tempdir().unwrap();
    let letters = Arc::new(MemoryDeadLetters::new(10));
    let factory = FileAdapterFactory::new(1, FileOptions { write: false, ..options(dir.path()) })
        .unwrap()
        .with_dead_letters(letters.clone());
    let s = stream("f", "c");
    // An external writer feeds the queue; then the file is damaged.
    let mut writer = LoggingConsumer::open(dir.path().join("q0"), "events", WriterOptions::default()).unwrap();
    writer.append(&s, &tailrace::Event::new("e0", "zero")).unwrap();
    writer.append(&s, &tailrace::Event::new("e1", "one")).unwrap();
    writer.close().unwrap();
    let file = dir.path().join("q0/events-1.jsonl");
    let mut text = std::fs::read_to_string(&file).unwrap();
    text.insert_str(0, "{this is not json}\n");
    std::fs::write(&file, text).unwrap();
    let recorder = Recorder::new();
    let node = TestNode::start(Arc::new(factory), config(), implicit("f", &recorder)).await;
    assert!(eventually(WAIT, || recorder.total() == 2).await);
    assert_eq!(recorder.ids(&s), ["e0", "e1"]);
    let letter = &letters.letters()[0];
    assert_eq!(letter.origin.as_deref(), Some("q0/events-1.jsonl:1"));
    assert!(letter.error.contains("key must be a string"), "{}", letter.error);
    assert_eq!(letter.events[0].payload, "{this is not json}");
    drop(node);
}

#[tokio::test]
async fn consumed_files_are_deleted_once_the_checkpoint_passed_them() {
    let dir = tempfile::tempdir().unwrap();
    let factory = Arc::new(FileAdapterFactory::new(1, options(dir.path())).unwrap());
    let adapter = factory.adapter();
    let recorder = Recorder::new();
    let node = TestNode::start(factory, config(), implicit("f", &recorder)).await;
    let s = stream("f", "d");
    for i in 0..20 {
        node.node.produce(&s, events("e", i..i + 1)).await.unwrap();
    }
    assert!(eventually(WAIT, || recorder.total() == 20).await);
    let sealed = || {
        std::fs::read_dir(dir.path().join("q0"))
            .unwrap()
            .filter(|e| e.as_ref().unwrap().file_name().to_string_lossy().ends_with(".jsonl"))
            .count()
    };
    assert!(eventually(WAIT, || sealed() == 0).await, "{} sealed files left", sealed());
    node.node.shutdown().await.unwrap();
    adapter.close().await.unwrap();
    let left: Vec<_> = std::fs::read_dir(dir.path().join("q0"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(left, [".events.state"], "nothing is left behind but the numbers used");
}

#[tokio::test]
async fn enqueue_waits_for_budget_then_refuses_clearly() {
    let dir = tempfile::tempdir().unwrap();
    let options = FileOptions {
        write: true,
        enqueue_timeout: Duration::from_millis(300),
        writer: WriterOptions { max_total_bytes: 2_000, max_file_age: None, ..FileOptions::default().writer },
        ..options(dir.path())
    };
    let factory = FileAdapterFactory::new(1, options).unwrap();
    let adapter = factory.adapter();
    let s = stream("f", "b");
    let mut accepted = 0;
    let err = loop {
        match adapter.enqueue(&s, events("e", accepted..accepted + 1)).await {
            Ok(_) => accepted += 1,
            Err(e) => break e,
        }
    };
    assert!(err.to_string().contains("refused the events") && err.to_string().contains("max_total_bytes"), "{err}");
    assert!(accepted > 5);
    adapter.close().await.unwrap();
}

#[tokio::test]
async fn leftovers_of_a_crash_stop_the_adapter_with_a_recovery_error() {
    let dir = tempfile::tempdir().unwrap();
    let queue_dir = dir.path().join("q0");
    std::fs::create_dir_all(&queue_dir).unwrap();
    std::fs::write(queue_dir.join("events-3.open"), "{}\n").unwrap();
    let err = FileAdapterFactory::new(1, options(dir.path())).err().unwrap();
    let text = err.to_string();
    assert!(
        text.contains("RECOVERY_REQUIRED")
            && text.contains("events-3.open")
            && text.contains("tailrace handoff recover"),
        "{text}"
    );
}

#[tokio::test]
async fn subscribing_at_an_old_token_rereads_the_files_still_on_disk() {
    let dir = tempfile::tempdir().unwrap();
    let factory =
        Arc::new(FileAdapterFactory::new(1, FileOptions { delete_consumed: false, ..options(dir.path()) }).unwrap());
    let adapter = factory.adapter();
    let node = TestNode::start(factory, config(), ImplicitSubscriptions::new()).await;
    node.agent(0).await;
    let s = stream("f", "r");
    let mut tokens = Vec::new();
    for i in 0..6 {
        tokens.push(node.node.produce(&s, events("e", i..i + 1)).await.unwrap());
    }
    node.wait_status(0, |st| st.acked >= 6).await;
    let recorder = Recorder::new();
    node.node.subscribe(&s, Arc::new(recorder.clone()), StartPosition::At(tokens[2])).await.unwrap();
    node.node.produce(&s, events("e", 6..7)).await.unwrap();
    assert!(eventually(WAIT, || recorder.total() == 5).await, "{:?}", recorder.ids(&s));
    assert_eq!(recorder.ids(&s), ids("e", 2..7));
    node.node.shutdown().await.unwrap();
    adapter.close().await.unwrap();
}

/// The queue's sealed files, by name.
fn sealed_files(dir: &std::path::Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".jsonl"))
        .collect();
    names.sort();
    names
}

/// Issue: after the queue drained (every file consumed and deleted, the
/// checkpoint far along) and a restart, new events were written below the
/// checkpoint and never delivered. Several lives on one directory.
#[tokio::test]
async fn events_after_a_drained_restart_are_delivered_in_every_life() {
    let dir = tempfile::tempdir().unwrap();
    let s = stream("f", "drained");
    let mut expected = Vec::new();
    for life in 0..4u64 {
        let recorder = Recorder::new();
        let factory = Arc::new(FileAdapterFactory::new(1, options(dir.path())).unwrap());
        let adapter = factory.adapter();
        let node = TestNode::start(factory, config(), implicit("f", &recorder)).await;
        let batches = if life == 0 { 40 } else { 5 };
        let mut produced = Vec::new();
        for b in 0..batches {
            let first = life * 1000 + b * 10;
            node.node.produce(&s, events("e", first..first + 10)).await.unwrap();
            produced.extend(ids("e", first..first + 10));
        }
        expected.extend(produced.iter().cloned());
        assert!(
            eventually(WAIT, || recorder.ids(&s).ends_with(&produced)).await,
            "life {life}: delivered {} of {}",
            recorder.ids(&s).len(),
            produced.len()
        );
        // Drained: every file consumed and deleted before the stop.
        assert!(eventually(WAIT, || sealed_files(&dir.path().join("q0")).is_empty()).await, "life {life}");
        node.node.shutdown().await.unwrap();
        adapter.close().await.unwrap();
        let checkpoint = tailrace::checkpoint::FileCheckpointer::new(dir.path().join("checkpoints"))
            .unwrap()
            .load_blocking(tailrace::QueueId(0))
            .unwrap();
        assert!(checkpoint.is_some(), "life {life}: a checkpoint was saved");
        // Nothing from an earlier life came again, nothing of this one is missing.
        assert_eq!(recorder.ids(&s), produced, "life {life}");
    }
    assert_eq!(expected.len(), 400 + 3 * 50);
}

/// A read of a drained queue waits for this node's next seal even when an
/// earlier seal left a wake the reader no longer needs (it used to answer
/// empty at once, and the agent backed off while writes piled up).
#[tokio::test]
async fn a_read_of_a_drained_queue_waits_for_the_next_seal_despite_a_stale_wake() {
    let dir = tempfile::tempdir().unwrap();
    let factory =
        FileAdapterFactory::new(1, FileOptions { read_wait: Duration::from_secs(10), ..options(dir.path()) }).unwrap();
    let adapter = factory.adapter();
    let s = stream("f", "stale");
    let mut receiver = adapter.create_receiver(tailrace::QueueId(0), tailrace::queue::Fence::NONE).await.unwrap();
    receiver.initialize(Duration::from_secs(1)).await.unwrap();
    for life in 0..3u64 {
        // Sealed while nobody reads: the seal leaves a wake behind.
        adapter.enqueue(&s, events("e", life * 10..life * 10 + 3)).await.unwrap();
        assert!(eventually(WAIT, || !sealed_files(&dir.path().join("q0")).is_empty()).await);
        let read = receiver.read(10).await.unwrap();
        assert_eq!(read_ids(&read), ids("e", life * 10..life * 10 + 3), "life {life}");
        receiver.delivered(&read.iter().map(|b| b.token).collect::<Vec<_>>()).await.unwrap();
        let writer = enqueue_after(&adapter, &s, events("late", life..life + 1), Duration::from_millis(200));
        let next = receiver.read(10).await.unwrap();
        writer.await.unwrap();
        assert_eq!(read_ids(&next), ids("late", life..life + 1), "life {life}: the read answered before the next seal");
        receiver.delivered(&next.iter().map(|b| b.token).collect::<Vec<_>>()).await.unwrap();
    }
    adapter.close().await.unwrap();
}
