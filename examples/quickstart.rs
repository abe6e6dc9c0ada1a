//! The smallest tailrace program: one node over in-memory queues, one
//! subscriber, a few events.
//!
//! Run it with `cargo run --example quickstart`.

use std::sync::Arc;

use async_trait::async_trait;
use tailrace::Node;
use tailrace::adapters::memory::{MemoryAdapterFactory, MemoryOptions};
use tailrace::pubsub::{ConsumerError, Delivery, DeliveryOutcome, StartPosition, StreamConsumer};
use tailrace::{Event, NodeId, StreamId};

/// Prints what it receives.
struct Printer(tokio::sync::mpsc::Sender<String>);

#[async_trait]
impl StreamConsumer for Printer {
    async fn deliver(&self, delivery: &Delivery) -> Result<DeliveryOutcome, ConsumerError> {
        for (event, token) in delivery.events() {
            let line = format!("{} @ {token}: {}", delivery.stream, String::from_utf8_lossy(&event.payload));
            self.0.send(line).await.map_err(ConsumerError::failed)?;
        }
        Ok(DeliveryOutcome::Continue)
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let factory = Arc::new(MemoryAdapterFactory::new(8, MemoryOptions::default()));
    let node = Node::builder(NodeId::new("quickstart"), factory).start().await?;
    let stream = StreamId::new("logs", "etl.daily/run-1");
    let (tx, mut rx) = tokio::sync::mpsc::channel(16);
    // Returns once attached: everything produced from now on is delivered.
    node.subscribe(&stream, Arc::new(Printer(tx)), StartPosition::Latest).await?;
    for line in ["starting", "reading 3 tables", "done"] {
        node.produce(&stream, vec![Event::new(line, line)]).await?;
    }
    for _ in 0..3 {
        if let Some(line) = rx.recv().await {
            println!("{line}");
        }
    }
    node.shutdown().await?;
    Ok(())
}
