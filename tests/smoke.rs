use tailrace_testkit as common;

use std::sync::Arc;
use std::time::Duration;

use common::*;
use tailrace::Node;
use tailrace::NodeId;
use tailrace::adapters::memory::{MemoryAdapterFactory, MemoryOptions};
use tailrace::pubsub::StartPosition;

#[tokio::test]
async fn one_node_delivers_in_order_after_subscribe() {
    let factory = Arc::new(MemoryAdapterFactory::new(4, MemoryOptions::default()));
    let node = Node::builder(NodeId::new("n1"), factory).start().await.unwrap();
    let s = stream("test", "a");
    let recorder = Recorder::new();
    let handle = node.subscribe(&s, Arc::new(recorder.clone()), StartPosition::Latest).await.unwrap();
    for i in 0..10 {
        node.produce(&s, events("e", i * 10..i * 10 + 10)).await.unwrap();
    }
    assert!(eventually(Duration::from_secs(5), || recorder.total() == 100).await, "got {}", recorder.total());
    assert_eq!(recorder.ids(&s), ids("e", 0..100));
    node.unsubscribe(&handle).await.unwrap();
    node.shutdown().await.unwrap();
}
