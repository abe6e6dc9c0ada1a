//! Writing your own queue adapter: a small in-process queue with acks, not
//! rewindable, proven by the conformance kit and then run under a node.
//!
//! Run it with `cargo run --example custom_adapter`. It needs none of the
//! library's optional parts: `cargo run --example custom_adapter
//! --no-default-features` builds it against the runtime alone (no Redis,
//! Kafka, HTTP or cluster crates). `docs/adapters.md` walks through it.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use tailrace::checkpoint::MemoryCheckpointer;
use tailrace::conformance::Claims;
use tailrace::queue::{
    Checkpointer, Direction, Fence, QueueAdapter, QueueAdapterFactory, QueueError, QueueMapper, QueueReceiver,
};
use tailrace::{BatchContainer, Event, QueueId, SequenceToken, StreamId};

/// One queue: containers in order, each with an "acked" flag.
#[derive(Default)]
struct Queue {
    entries: VecDeque<(Arc<BatchContainer>, bool)>,
    next: u64,
    /// Index of the next entry to hand out.
    cursor: usize,
}

struct ListFactory {
    mapper: QueueMapper,
    queues: Arc<Vec<Mutex<Queue>>>,
    checkpoints: Arc<MemoryCheckpointer>,
}

impl ListFactory {
    fn new(queue_count: u32) -> Self {
        let mapper = QueueMapper::new(queue_count);
        let queues = (0..mapper.queue_count()).map(|_| Mutex::new(Queue::default())).collect();
        Self { mapper, queues: Arc::new(queues), checkpoints: Arc::new(MemoryCheckpointer::new()) }
    }
}

#[async_trait]
impl QueueAdapterFactory for ListFactory {
    fn name(&self) -> &str {
        "list"
    }

    fn queue_mapper(&self) -> QueueMapper {
        self.mapper
    }

    async fn create_adapter(&self) -> Result<Arc<dyn QueueAdapter>, QueueError> {
        Ok(Arc::new(ListAdapter { mapper: self.mapper, queues: self.queues.clone() }))
    }

    async fn create_checkpointer(&self) -> Result<Arc<dyn Checkpointer>, QueueError> {
        Ok(self.checkpoints.clone())
    }
}

struct ListAdapter {
    mapper: QueueMapper,
    queues: Arc<Vec<Mutex<Queue>>>,
}

#[async_trait]
impl QueueAdapter for ListAdapter {
    fn name(&self) -> &str {
        "list"
    }

    fn direction(&self) -> Direction {
        Direction::ReadWrite
    }

    fn is_rewindable(&self) -> bool {
        false
    }

    async fn enqueue(&self, stream: &StreamId, events: Vec<Event>) -> Result<SequenceToken, QueueError> {
        if events.is_empty() {
            return Err(QueueError::EmptyBatch(stream.clone()));
        }
        let queue = &self.queues[self.mapper.queue_for(stream).0 as usize];
        let mut queue = queue.lock().unwrap();
        queue.next += 1;
        let token = SequenceToken::new(queue.next, 0);
        queue.entries.push_back((Arc::new(BatchContainer { stream: stream.clone(), token, events }), false));
        Ok(token)
    }

    async fn create_receiver(&self, queue: QueueId, _fence: Fence) -> Result<Box<dyn QueueReceiver>, QueueError> {
        if queue.0 >= self.mapper.queue_count() {
            return Err(QueueError::Config(format!("no queue {queue}")));
        }
        Ok(Box::new(ListReceiver { queues: self.queues.clone(), queue, open: true }))
    }
}

struct ListReceiver {
    queues: Arc<Vec<Mutex<Queue>>>,
    queue: QueueId,
    open: bool,
}

impl ListReceiver {
    fn queue(&self) -> std::sync::MutexGuard<'_, Queue> {
        self.queues[self.queue.0 as usize].lock().unwrap()
    }
}

#[async_trait]
impl QueueReceiver for ListReceiver {
    async fn initialize(&mut self, _: Duration) -> Result<(), QueueError> {
        // A new owner starts again at the oldest unacknowledged container.
        self.queue().cursor = 0;
        Ok(())
    }

    async fn read(&mut self, max: usize) -> Result<Vec<Arc<BatchContainer>>, QueueError> {
        if !self.open {
            return Err(QueueError::ShutDown(self.queue));
        }
        let mut queue = self.queue();
        let start = queue.cursor;
        let end = (start + max).min(queue.entries.len());
        queue.cursor = end;
        Ok(queue.entries.range(start..end).filter(|(_, acked)| !acked).map(|(b, _)| b.clone()).collect())
    }

    async fn delivered(&mut self, tokens: &[SequenceToken]) -> Result<(), QueueError> {
        let mut queue = self.queue();
        for entry in queue.entries.iter_mut().filter(|(b, _)| tokens.contains(&b.token)) {
            entry.1 = true;
        }
        while queue.entries.front().is_some_and(|(_, acked)| *acked) {
            queue.entries.pop_front();
            queue.cursor = queue.cursor.saturating_sub(1);
        }
        Ok(())
    }

    async fn shutdown(&mut self, _: Duration) -> Result<(), QueueError> {
        self.open = false;
        Ok(())
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // 1. Prove the adapter against the contract.
    // Not durable, not rewindable, no fencing, unbounded: it claims nothing,
    // so the kit checks the core contract and says what was not claimed.
    let factory: Arc<dyn QueueAdapterFactory> = Arc::new(ListFactory::new(4));
    let report = tailrace::conformance::run(Claims::default(), move || {
        let factory = factory.clone();
        async move { Ok(factory) }
    })
    .await?;
    println!("conformance: {report}");

    // 2. Run it: the runtime never needs to know what it is.
    let node = tailrace::Node::builder(tailrace::NodeId::new("n1"), Arc::new(ListFactory::new(4))).start().await?;
    while node.running_agents().await? < 4 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let stream = StreamId::new("orders", "42");
    let token = node.produce(&stream, vec![Event::new("o-1", "created")]).await?;
    println!("produced at {token}; agents running: {}", node.running_agents().await?);
    node.shutdown().await?;
    Ok(())
}
