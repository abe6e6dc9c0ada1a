//! The audit log (`[diagnostics] audit_namespace`, `audit_path`): one JSON
//! line per delivered event, in the file before the delivery is
//! acknowledged, in order per stream.

use tailrace_testkit as common;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use tailrace::Node;
use tailrace::adapters::memory::{MemoryAdapterFactory, MemoryOptions};
use tailrace::archive::{AuditLine, AuditLog};
use tailrace::pubsub::{ConsumerFactory, Delivery, SubscriptionId};
use tailrace::queue::Fence;
use tailrace::{BatchContainer, NodeId, SequenceToken, StreamId};

/// The complete lines of the audit file: a line the node is still
/// writing (no newline yet) is not one.
/// Microseconds since the Unix epoch, as the audit log stamps its lines.
fn now_us() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_micros() as u64)
}

fn lines(path: &std::path::Path) -> Vec<AuditLine> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    text.split_inclusive('\n')
        .filter_map(|l| l.strip_suffix('\n'))
        .map(|l| AuditLine::parse(l).unwrap_or_else(|e| panic!("`{l}`: {e}")))
        .collect()
}

#[tokio::test]
async fn a_delivery_is_in_the_file_when_deliver_returns() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("sub/audit.jsonl");
    let audit = AuditLog::open(&path, "n1").unwrap();
    let stream = StreamId::new("audit", "s1");
    let consumer = audit.create(&stream);
    let batch = |major, ids: &[&str]| {
        Arc::new(BatchContainer {
            stream: stream.clone(),
            token: SequenceToken::new(major, 0),
            events: ids.iter().map(|id| tailrace::Event::new(*id, "x")).collect(),
        })
    };
    let delivery = Delivery::new(
        SubscriptionId::implicit("audit", &stream),
        stream.clone(),
        vec![batch(1, &["a", "b"]), batch(2, &["c"])],
    )
    .fenced(Fence::lease(7));
    let before = now_us();
    consumer.deliver(&delivery).await.unwrap();
    let after = now_us();
    // No wait: the lines are written before deliver returns.
    let seen = lines(&path);
    let want = [("a", "1-0"), ("b", "1-0"), ("c", "2-0")];
    assert_eq!(seen.len(), 3, "{seen:?}");
    for (line, (event, token)) in seen.iter().zip(want) {
        assert_eq!(
            line,
            &AuditLine {
                node: "n1".into(),
                stream: "s1".into(),
                token: token.into(),
                event: event.into(),
                fence: Some(7),
                at_us: line.at_us,
            }
        );
        assert!((before..=after).contains(&line.at_us), "written while delivering: {}", line.at_us);
    }
    // Appends: a second log on the same file (another process) adds to it.
    let again = AuditLog::open(&path, "n2").unwrap();
    again.append(&delivery.fenced(Fence::NONE)).await.unwrap();
    let seen = lines(&path);
    assert_eq!(seen.len(), 6);
    assert_eq!((seen[5].node.as_str(), seen[5].fence), ("n2", None));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_audits_every_event_of_its_namespace_in_order_per_stream() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("audit.jsonl");
    let audit = AuditLog::open(&path, "n1").unwrap();
    let implicit = tailrace::pubsub::ImplicitSubscriptions::new().bind("audit", audit);
    let factory = Arc::new(MemoryAdapterFactory::new(4, MemoryOptions::default()));
    let node = Node::builder(NodeId::new("n1"), factory).implicit(implicit).start().await.unwrap();
    let streams: Vec<StreamId> = (0..6).map(|i| StreamId::new("audit", format!("s{i}"))).collect();
    let mut want: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for round in 0..20u64 {
        for (i, stream) in streams.iter().enumerate() {
            let events = common::events(&format!("s{i}-"), round * 3..round * 3 + 3);
            want.entry(format!("s{i}")).or_default().extend(events.iter().map(|e| e.id.to_string()));
            node.produce(stream, events).await.unwrap();
        }
    }
    // Another namespace is not audited.
    node.produce(&StreamId::new("other", "x"), common::events("x", 0..5)).await.unwrap();
    let total: usize = want.values().map(Vec::len).sum();
    assert!(common::eventually(Duration::from_secs(20), || lines(&path).len() >= total).await, "not all audited");
    let mut seen: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for line in lines(&path) {
        assert_eq!(line.node, "n1");
        seen.entry(line.stream).or_default().push(line.event);
    }
    assert_eq!(seen, want, "one line per event, in order per stream, nothing else");
    node.shutdown().await.unwrap();
}
