//! Foreign Kafka records (`[adapters.kafka] records = "mapped"`), written
//! by a Kafka client that is not tailrace's (kafka-python, from PyPI) into
//! a topic on a Tansu broker: read as the mapping says and served to SSE
//! viewers in order per run, an unreadable or misplaced record sent to the
//! dead-letter sink with its partition and offset while the queue goes on,
//! a `kill -9` that loses and repeats no line, and tailrace's own produce
//! sharing the topic in the same mapping. Without a broker or kafka-python
//! each test says it skipped (a failure under CI).
#![cfg(feature = "kafka")]

use tailrace_testkit as common;

use std::sync::Arc;
use std::time::Duration;

use common::kafka_broker::{Foreign, KafkaBroker, Partition, kafka_python};
use common::logs::{Sse, text};
use tailrace::adapters::kafka::{KafkaAdapterFactory, KafkaMapping, KafkaOptions, RecordFormat};
use tailrace::archive::RunKey;
use tailrace::checkpoint::FileCheckpointer;
use tailrace::failure::MemoryDeadLetters;
use tailrace::queue::Checkpointer;
use tailrace::{Event, SequenceToken, StreamId};

/// How long a test waits for what a node shows.
const PATIENCE: Duration = Duration::from_secs(30);

/// The mapping of the node test: the record key names the run's stream
/// (`{pipeline}/{run}`), or the headers `pipeline` and `run` do; a
/// record's value is its lines.
const BY_HEADERS: &str = r#"records = "mapped"
[adapters.kafka.mapping]
pipeline = "header:pipeline"
run = "header:run"
"#;

/// The node's log without the terminal colours it is written with.
fn plain_log(node: &common::cluster::Proc) -> String {
    let log = node.log_text();
    let mut out = String::with_capacity(log.len());
    let mut chars = log.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            // `ESC [ … m`
            for c in chars.by_ref() {
                if c == 'm' {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// A run's log as the node's download serves it.
async fn download(node: &common::cluster::Proc, fqn: &str, run: &str) -> String {
    let url = node.url(&format!("/api/v1/services/ingestionPipelines/logs/{fqn}/last/download?runId={run}"));
    let answer = common::http_client().get(url).send().await.unwrap();
    assert_eq!(answer.status(), 200, "download of {fqn}/{run}");
    answer.text().await.unwrap()
}

/// The lines of a run's stream from its start, once `count` came.
async fn viewed(node: &common::cluster::Proc, fqn: &str, run: &str, count: usize) -> String {
    node.wait_stored(fqn, run).await;
    let url = node.url(&format!("/api/v1/services/ingestionPipelines/logs/{fqn}/stream/{run}"));
    let mut viewer = Sse::open(&common::http_client(), &url).await;
    assert_eq!(viewer.status, 200);
    text(&viewer.lines(count).await)
}

/// `tailrace node` on a topic others write: kafka-python's keyed records
/// and header-named records reach SSE viewers as lines of their runs, in
/// order; a record whose key names no run, and one on a partition its run
/// is not read from, go to the dead-letter sink (the log says where) and
/// the queue goes on; a line posted to the node is written in the mapping
/// (a foreign consumer reads it so); after a `kill -9` and a restart every
/// run's log holds each line once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn foreign_records_reach_viewers_as_mapped_and_a_kill_9_loses_and_repeats_none() {
    let Some(broker) = KafkaBroker::start() else { return };
    let Some(python) = kafka_python() else { return };
    let redis = common::redis_server::RedisServer::start();
    let (url, brokers) = (redis.url(), broker.address());
    // A short lease: the restarted node takes the dead one's queues soon.
    let lease = "[lease]\nttl = \"3s\"\nrenew = \"1s\"\n";
    let start = || {
        tokio::task::block_in_place(|| {
            common::kafka_broker::node_with(&url, &brokers, "foreign", "n1", BY_HEADERS, lease)
        })
    };
    let mut node = start();
    let produce = |records: &[Foreign]| tokio::task::block_in_place(|| python.produce(&brokers, "foreign", records));
    let billing = [("pipeline", "svc.billing"), ("run", "r-2")];
    let placed = produce(&[
        Foreign::keyed("svc.orders/r-1", "a-1"),
        Foreign::keyed("svc.orders/r-1", "a-2\na-3\n"),
        Foreign::headed(&billing, "b-1", Partition::As("svc.billing/r-2".into())),
        // Its key names no run: unreadable, on run r-1's partition.
        Foreign {
            key: Some("not-a-run".into()),
            ..Foreign::headed(&[], "junk", Partition::As("svc.orders/r-1".into()))
        },
        Foreign::keyed("svc.orders/r-1", "a-4"),
        // Of run r-2, on a partition run r-2 is not read from.
        Foreign::headed(&billing, "b-lost", Partition::NextTo("svc.billing/r-2".into())),
        Foreign::headed(&billing, "b-2", Partition::As("svc.billing/r-2".into())),
    ]);
    let (orders, junk, lost) = (placed[0].0, placed[3], placed[5]);
    assert_eq!(junk.0, orders, "the unreadable record is among run r-1's");
    assert_ne!(lost.0, placed[2].0, "the misplaced record is not where its run is read");
    assert_eq!(viewed(&node, "svc.orders", "r-1", 4).await, "a-1\na-2\na-3\na-4", "the queue went on past junk");
    assert_eq!(viewed(&node, "svc.billing", "r-2", 2).await, "b-1\nb-2");

    // Each is in the log with its place and why, and counted.
    let unreadable = |reason: &'static str| node.metric_sum("tailrace_queue_unreadable_total", Some(reason));
    let counted = common::eventually(PATIENCE, || {
        let log = plain_log(&node);
        log.contains(&format!("origin=kafka:foreign/{}@{}", junk.0, junk.1))
            && log.contains(&format!("origin=kafka:foreign/{}@{}", lost.0, lost.1))
    })
    .await;
    assert!(counted, "the dead letters are not in the log:\n{}", plain_log(&node));
    let log = plain_log(&node);
    assert!(log.contains("stream `logs/not-a-run` is no run"), "{log}");
    assert!(log.contains("its stream `logs/svc.billing/r-2` is read from partition"), "{log}");
    assert_eq!(unreadable("reason=\"format\"").await, Some(1.0));
    assert_eq!(unreadable("reason=\"misplaced\"").await, Some(1.0));

    // A line posted through the node is a record of the mapping, keyed by
    // its run, named in the headers, its id in `tailrace-id`.
    let post = common::http_client()
        .post(node.url("/api/v1/logs/svc.orders/runs/r-1/lines"))
        .header("content-type", "application/x-ndjson")
        .body("{\"line\":\"a-5 posted\",\"id\":\"post-1\"}\n")
        .send()
        .await
        .unwrap();
    assert_eq!(post.status(), 202);
    let records = tokio::task::block_in_place(|| python.records(&brokers, "foreign"));
    let posted = records.iter().find(|r| r["value"] == "a-5 posted").expect("the posted line is in the topic");
    assert_eq!(posted["partition"], orders, "on its run's partition");
    assert_eq!(posted["key"], "svc.orders/r-1");
    let headers = &posted["headers"];
    assert_eq!(
        (&headers["pipeline"], &headers["run"], &headers["tailrace-id"]),
        (&"svc.orders".into(), &"r-1".into(), &"post-1".into())
    );

    // A burst the node is reading when it is killed, more while it is
    // down and after it is back: each run's log whole, each line once.
    assert_eq!(viewed(&node, "svc.orders", "r-1", 5).await, "a-1\na-2\na-3\na-4\na-5 posted");
    let burst: Vec<Foreign> = (6..56).map(|i| Foreign::keyed("svc.orders/r-1", &format!("a-{i}"))).collect();
    produce(&burst);
    node.signal("KILL");
    tokio::task::block_in_place(|| node.wait_exit());
    produce(&[
        Foreign::keyed("svc.orders/r-1", "a-56"),
        Foreign::headed(&billing, "b-3\nb-4", Partition::As("svc.billing/r-2".into())),
    ]);
    let node = start();
    produce(&[Foreign::keyed("svc.orders/r-1", "a-57")]);
    let orders_log: Vec<String> =
        (1..=57).map(|i| if i == 5 { "a-5 posted".to_string() } else { format!("a-{i}") }).collect();
    let orders_log = orders_log.join("\n");
    assert_eq!(viewed(&node, "svc.orders", "r-1", 57).await, orders_log);
    assert_eq!(viewed(&node, "svc.billing", "r-2", 4).await, "b-1\nb-2\nb-3\nb-4");
    assert_eq!(download(&node, "svc.orders", "r-1").await.trim_end(), orders_log, "stored once each");
    assert_eq!(download(&node, "svc.billing", "r-2").await.trim_end(), "b-1\nb-2\nb-3\nb-4");
}

/// In one process, a topic that kafka-python and tailrace both write, in
/// the JSON a log shipper sends (`{"pipeline", "run_id", "message"}`,
/// keyed by the run): the run's subscriber gets both producers' records
/// in the partition's order, tailrace's record reads back to a foreign
/// consumer as the mapping says, and a record that is not JSON goes to
/// the dead-letter sink with its place, its bytes and why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shared_topic_of_json_records_is_read_written_and_dead_lettered_in_order() {
    let Some(broker) = KafkaBroker::start() else { return };
    let Some(python) = kafka_python() else { return };
    let dir = tempfile::tempdir().unwrap();
    let checkpointer: Arc<dyn Checkpointer> = Arc::new(FileCheckpointer::new(dir.path()).unwrap());
    let mapping = KafkaMapping {
        pipeline: Some("json-field:pipeline".into()),
        run: Some("json-field:run_id".into()),
        value: "json-field:message".into(),
        ..KafkaMapping::default()
    };
    let options = KafkaOptions {
        brokers: vec![broker.address()],
        topic: "shipped".into(),
        read_wait: Duration::from_millis(20),
        idle_wait: Duration::from_millis(200),
        records: RecordFormat::Mapped,
        mapping,
        ..KafkaOptions::default()
    };
    let letters = Arc::new(MemoryDeadLetters::new(10));
    let factory =
        KafkaAdapterFactory::connect(4, options, checkpointer).await.unwrap().with_dead_letters(letters.clone());
    let recorder = common::Recorder::new();
    let mut config = common::quick_config();
    config.queues.count = 4;
    let node = common::TestNode::start(Arc::new(factory), config, common::implicit("logs", &recorder)).await;

    let run = RunKey::new("svc.etl", "r-1").unwrap().stream();
    let shipped = |message: &str| {
        let value = serde_json::json!({ "pipeline": "svc.etl", "run_id": "r-1", "message": message }).to_string();
        Foreign::keyed("svc.etl/r-1", &value)
    };
    let produce =
        |records: &[Foreign]| tokio::task::block_in_place(|| python.produce(&broker.address(), "shipped", records));
    let first = produce(&[shipped("extract started")]);
    let token = node.node.produce(&run, vec![Event::new("t-1", "from tailrace")]).await.unwrap();
    let rest = produce(&[shipped("extract done"), Foreign::keyed("svc.etl/r-1", "not json"), shipped("load started")]);
    let partition = first[0].0;
    assert!(rest.iter().all(|(p, _)| *p == partition), "one run, one partition: {first:?} {rest:?}");
    assert_eq!(token, SequenceToken::new(u64::try_from(first[0].1).unwrap() + 1, 0), "tailrace's record is next");
    let ids = |offset: i64| format!("{partition}@{offset}");
    let expected = vec![ids(first[0].1), "t-1".to_string(), ids(rest[0].1), ids(rest[2].1)];
    let delivered = common::eventually(PATIENCE, || recorder.ids(&run).len() >= 4).await;
    assert!(delivered, "{:?}", recorder.ids(&run));
    assert_eq!(recorder.ids(&run), expected, "both producers' records, in the partition's order, the junk passed");

    let letters = letters.letters();
    assert_eq!(letters.len(), 1, "{letters:?}");
    let letter = &letters[0];
    let origin = format!("kafka:shipped/{partition}@{}", rest[1].1);
    assert_eq!(letter.origin.as_deref(), Some(origin.as_str()));
    assert_eq!(letter.token, SequenceToken::new(u64::try_from(rest[1].1).unwrap(), 0));
    assert_eq!(letter.stream, StreamId::new("tailrace.corrupt", "kafka:shipped"));
    assert_eq!(letter.events[0].payload, "not json");
    assert!(letter.error.starts_with("unreadable record: its value is not a JSON object"), "{}", letter.error);

    let records = tokio::task::block_in_place(|| python.records(&broker.address(), "shipped"));
    let ours = records.iter().find(|r| r["offset"] == first[0].1 + 1 && r["partition"] == partition).unwrap();
    assert_eq!(ours["key"], "svc.etl/r-1");
    assert_eq!(ours["headers"], serde_json::json!({ "tailrace-id": "t-1" }));
    let value: serde_json::Value = serde_json::from_str(ours["value"].as_str().unwrap()).unwrap();
    assert_eq!(value, serde_json::json!({ "pipeline": "svc.etl", "run_id": "r-1", "message": "from tailrace" }));
    node.node.shutdown().await.unwrap();
}
