//! The `memory` adapter: queues in this process's memory. Not durable; for
//! tests, benchmarks and the in-process cluster harness (every node built from
//! one factory shares its queues).
//!
//! - **Bounded, with back-pressure**: each queue holds at most
//!   `capacity_events` events not yet read; `enqueue` waits (FIFO) for room
//!   and never drops. A batch larger than the capacity is refused. What was
//!   read but not yet acknowledged is bounded by the reader's cache, so a
//!   queue never holds more than its capacity plus one cache.
//! - **Acks**: a container stays in its queue until its receiver acks it
//!   (`delivered`) or reports it dead-lettered (`failed`: its copy is in the
//!   dead-letter sink). A new receiver of the queue starts at the oldest
//!   unacknowledged container and fences the old one (its reads fail), so a
//!   crashed owner's in-flight containers are redelivered, not lost.
//! - **Rewind**: the last `history` acknowledged containers are kept, so a
//!   subscriber can ask for a recent token again.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use crossbeam_utils::CachePadded;
use parking_lot::{Mutex, MutexGuard};
use serde::{Deserialize, Serialize};
use tokio::sync::{Notify, Semaphore};

use super::{BuiltInFactory, MappedAdapter};
use crate::checkpoint::MemoryCheckpointer;
use crate::queue::{Direction, Fence, QueueAdapter, QueueError, QueueMapper, QueueReceiver, Wake};
use crate::stream::{BatchContainer, Event, QueueId, SequenceToken, StreamId};

/// Settings of the memory adapter.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MemoryOptions {
    /// Most events one queue holds unread (Orleans: 16 384 unacknowledged,
    /// and it throws when full; here producers wait).
    pub capacity_events: usize,
    /// Acknowledged containers kept per queue for rewinds (0: not rewindable).
    pub history: usize,
    /// How long a read of an empty queue waits for new data (a long poll,
    /// like Redis' `XREADGROUP BLOCK`); 0 answers at once.
    #[serde(with = "humantime_serde")]
    pub read_wait: Duration,
}

impl Default for MemoryOptions {
    fn default() -> Self {
        Self { capacity_events: 16_384, history: 1_024, read_wait: Duration::from_millis(100) }
    }
}

const NAME: &str = "memory";

/// Builds memory adapters that share one set of queues.
pub type MemoryAdapterFactory = BuiltInFactory<MemoryAdapter, MemoryCheckpointer>;

impl MemoryAdapterFactory {
    /// A factory (and its `queue_count` queues) with these options.
    pub fn new(queue_count: u32, options: MemoryOptions) -> Self {
        let mapper = QueueMapper::new(queue_count);
        let queues = mapper.all_queues().into_iter().map(|id| Arc::new(MemoryQueue::new(id, &options))).collect();
        Self::from_parts(Arc::new(MemoryAdapter { mapper, queues, options }), Arc::new(MemoryCheckpointer::new()))
    }

    /// The shared checkpoint store.
    pub fn checkpoints(&self) -> Arc<MemoryCheckpointer> {
        self.checkpointer.clone()
    }
}

impl MappedAdapter for MemoryAdapter {
    fn mapper(&self) -> QueueMapper {
        self.mapper
    }
}

/// Writes to and reads from the shared in-memory queues.
pub struct MemoryAdapter {
    mapper: QueueMapper,
    queues: Vec<Arc<MemoryQueue>>,
    options: MemoryOptions,
}

impl MemoryAdapter {
    fn queue(&self, id: QueueId) -> Result<&Arc<MemoryQueue>, QueueError> {
        self.queues
            .get(id.0 as usize)
            .ok_or_else(|| QueueError::Config(format!("queue {id} does not exist (there are {})", self.queues.len())))
    }

    /// Like `enqueue` but fails with [`QueueError::Full`] instead of waiting.
    pub fn try_enqueue(&self, stream: &StreamId, events: Vec<Event>) -> Result<SequenceToken, QueueError> {
        let queue = self.queue(self.mapper.queue_for(stream))?;
        let permits = queue.permits_for(stream, &events)?;
        let permit = queue
            .space
            .try_acquire_many(permits)
            .map_err(|_| QueueError::Full { queue: queue.id, capacity: queue.capacity })?;
        permit.forget();
        Ok(queue.push(stream, events))
    }

    /// Unacknowledged events in `queue` now (for tests and metrics).
    pub fn held_events(&self, queue: QueueId) -> usize {
        self.queue(queue).map_or(0, |q| q.lock().held_events)
    }

    /// The options this adapter runs with.
    pub fn options(&self) -> &MemoryOptions {
        &self.options
    }
}

#[async_trait]
impl QueueAdapter for MemoryAdapter {
    fn name(&self) -> &str {
        NAME
    }

    fn direction(&self) -> Direction {
        Direction::ReadWrite
    }

    fn is_rewindable(&self) -> bool {
        self.options.history > 0
    }

    async fn enqueue(&self, stream: &StreamId, events: Vec<Event>) -> Result<SequenceToken, QueueError> {
        let queue = self.queue(self.mapper.queue_for(stream))?;
        let permits = queue.permits_for(stream, &events)?;
        // Room now is taken without awaiting: an awaited acquire also spends
        // the producer's cooperative budget, so a producer with room would
        // yield every 128 batches and the agent would read them in small
        // pieces. Taking room never jumps the queue: while producers wait,
        // freed room goes to them first, never to the counter.
        let permit = match queue.space.try_acquire_many(permits) {
            Ok(permit) => permit,
            Err(_) => queue.space.acquire_many(permits).await.map_err(|_| QueueError::ShutDown(queue.id))?,
        };
        permit.forget();
        Ok(queue.push(stream, events))
    }

    async fn create_receiver(&self, queue: QueueId, _fence: Fence) -> Result<Box<dyn QueueReceiver>, QueueError> {
        Ok(Box::new(MemoryReceiver { queue: self.queue(queue)?.clone(), epoch: 0, shut_down: false }))
    }
}

struct Entry {
    /// The container's token, kept here so that an ack finds its entry
    /// without reading the container.
    token: SequenceToken,
    batch: Arc<BatchContainer>,
    acked: bool,
    /// Read at least once: its room was given back to producers.
    read: bool,
}

struct QueueState {
    /// Unacknowledged containers (and acked ones not yet at the front).
    pending: VecDeque<Entry>,
    /// Recently acknowledged containers, oldest first (for rewinds).
    history: VecDeque<Arc<BatchContainer>>,
    /// Index into `pending` of the next container to read.
    read_index: usize,
    held_events: usize,
    next_seq: u64,
    epoch: u64,
    /// The newest container no longer held anywhere (dropped from history).
    forgotten_through: Option<SequenceToken>,
}

impl QueueState {
    /// Where `token`'s entry is in `pending`. Tokens are consecutive
    /// numbers, so it is found by subtraction.
    fn index_of(&self, token: SequenceToken) -> Option<usize> {
        let first = self.pending.front()?.token.major;
        let index = usize::try_from(token.major.checked_sub(first)?).ok()?;
        self.pending.get(index).is_some_and(|e| e.token == token).then_some(index)
    }
}

struct MemoryQueue {
    id: QueueId,
    capacity: usize,
    history: usize,
    read_wait: Duration,
    // What producers and the reader write is kept apart, and apart from the
    // settings above, which every enqueue reads: on one cache line, each
    // write by one core made the next read by the other miss.
    /// Room for unread events; producers wait on it.
    space: CachePadded<Semaphore>,
    /// Signalled by an enqueue that finds nothing unread (a stored permit
    /// if nobody waits): a reader only waits after reading everything.
    data: CachePadded<Notify>,
    state: CachePadded<Mutex<QueueState>>,
}

impl MemoryQueue {
    fn new(id: QueueId, options: &MemoryOptions) -> Self {
        let capacity = options.capacity_events.clamp(1, Semaphore::MAX_PERMITS);
        Self {
            id,
            capacity,
            history: options.history,
            read_wait: options.read_wait,
            space: CachePadded::new(Semaphore::new(capacity)),
            data: CachePadded::new(Notify::new()),
            state: CachePadded::new(Mutex::new(QueueState {
                pending: VecDeque::new(),
                history: VecDeque::new(),
                read_index: 0,
                held_events: 0,
                next_seq: 1,
                epoch: 0,
                forgotten_through: None,
            })),
        }
    }

    fn lock(&self) -> MutexGuard<'_, QueueState> {
        // The state is plain data; a panic elsewhere cannot leave it torn.
        self.state.lock()
    }

    fn permits_for(&self, stream: &StreamId, events: &[Event]) -> Result<u32, QueueError> {
        let too_large = || QueueError::BatchTooLarge { queue: self.id, events: events.len(), capacity: self.capacity };
        if events.is_empty() {
            return Err(QueueError::EmptyBatch(stream.clone()));
        }
        if events.len() > self.capacity {
            return Err(too_large());
        }
        u32::try_from(events.len()).map_err(|_| too_large())
    }

    fn push(&self, stream: &StreamId, events: Vec<Event>) -> SequenceToken {
        let count = events.len();
        // Made before the lock is taken (producers contend for it); only
        // its token is set under the lock, where the order is decided.
        let mut batch = Arc::new(BatchContainer { stream: stream.clone(), token: SequenceToken::default(), events });
        let mut state = self.lock();
        let token = SequenceToken::new(state.next_seq, 0);
        state.next_seq += 1;
        state.held_events += count;
        if let Some(unshared) = Arc::get_mut(&mut batch) {
            unshared.token = token;
        }
        let was_read_up = state.read_index >= state.pending.len();
        state.pending.push_back(Entry { token, batch, acked: false, read: false });
        drop(state);
        if was_read_up {
            self.data.notify_one();
        }
        token
    }

    /// Takes up to `max` unread containers for receiver `epoch`; their room
    /// goes back to producers (what was read is bounded by the reader's
    /// cache from here on).
    fn take(&self, epoch: u64, max: usize) -> Result<Vec<Arc<BatchContainer>>, QueueError> {
        let mut released = 0;
        let batch = {
            let mut state = self.lock();
            if state.epoch != epoch {
                return Err(QueueError::Fenced(self.id));
            }
            let start = state.read_index;
            let end = (start + max).min(state.pending.len());
            let mut batch = Vec::with_capacity(end - start);
            for entry in state.pending.range_mut(start..end).filter(|e| !e.acked) {
                if !entry.read {
                    entry.read = true;
                    released += entry.batch.events.len();
                }
                batch.push(entry.batch.clone());
            }
            state.read_index = end;
            batch
        };
        self.space.add_permits(released);
        Ok(batch)
    }

    /// Marks containers done; drains finished ones from the front into the
    /// rewind history. Acks from a fenced receiver still count: those
    /// containers were delivered.
    fn acknowledge(&self, tokens: &[SequenceToken]) {
        // What leaves the queue is dropped after the lock is released:
        // dropping its events under the lock held producers up.
        let mut gone = Vec::new();
        let mut state = self.lock();
        for token in tokens {
            let Some(index) = state.index_of(*token) else { continue };
            let entry = &mut state.pending[index];
            if !entry.acked {
                entry.acked = true;
                let events = entry.batch.events.len();
                state.held_events -= events;
            }
        }
        while state.pending.front().is_some_and(|e| e.acked) {
            let Some(entry) = state.pending.pop_front() else { break };
            state.read_index = state.read_index.saturating_sub(1);
            state.history.push_back(entry.batch);
            if state.history.len() > self.history
                && let Some(forgotten) = state.history.pop_front()
            {
                state.forgotten_through = Some(forgotten.token);
                gone.push(forgotten);
            }
        }
        drop(state);
        drop(gone);
    }
}

/// Reads one memory queue.
pub struct MemoryReceiver {
    queue: Arc<MemoryQueue>,
    epoch: u64,
    shut_down: bool,
}

impl MemoryReceiver {
    fn check(&self) -> Result<(), QueueError> {
        if self.shut_down { Err(QueueError::ShutDown(self.queue.id)) } else { Ok(()) }
    }
}

#[async_trait]
impl QueueReceiver for MemoryReceiver {
    async fn initialize(&mut self, _timeout: Duration) -> Result<(), QueueError> {
        let mut state = self.queue.lock();
        state.epoch += 1;
        self.epoch = state.epoch;
        // Everything unacknowledged is read again by the new owner.
        state.read_index = 0;
        Ok(())
    }

    async fn read(&mut self, max: usize) -> Result<Vec<Arc<BatchContainer>>, QueueError> {
        self.check()?;
        let batch = self.queue.take(self.epoch, max)?;
        if !batch.is_empty() || self.queue.read_wait.is_zero() {
            return Ok(batch);
        }
        // The permit an enqueue stored may be stale (what it announced was
        // read since): a wake that finds nothing waits again, so an empty
        // answer means `read_wait` passed without a write. (Answering empty
        // at once sent the agent into its idle backoff while producers
        // filled the queue: a third of the pipeline's time went there.)
        let deadline = tokio::time::Instant::now() + self.queue.read_wait;
        loop {
            if tokio::time::timeout_at(deadline, self.queue.data.notified()).await.is_err() {
                return self.queue.take(self.epoch, max);
            }
            let batch = self.queue.take(self.epoch, max)?;
            if !batch.is_empty() {
                return Ok(batch);
            }
        }
    }

    async fn delivered(&mut self, tokens: &[SequenceToken]) -> Result<(), QueueError> {
        self.queue.acknowledge(tokens);
        Ok(())
    }

    /// Completes at the next enqueue (or at once if one came since the
    /// last read: `Notify` keeps its permit).
    fn wake_on_write(&mut self) -> Option<Wake> {
        let queue = self.queue.clone();
        Some(Box::pin(async move { queue.data.notified().await }))
    }

    /// Dead-lettered containers are released: their copy is in the sink, and
    /// a memory queue has no later redelivery to offer them.
    async fn failed(&mut self, tokens: &[SequenceToken]) -> Result<(), QueueError> {
        self.queue.acknowledge(tokens);
        Ok(())
    }

    async fn rewind(&mut self, from: SequenceToken, max: usize) -> Result<Vec<Arc<BatchContainer>>, QueueError> {
        self.check()?;
        let state = self.queue.lock();
        if state.epoch != self.epoch {
            return Err(QueueError::Fenced(self.queue.id));
        }
        if self.queue.history == 0 {
            return Err(QueueError::NotRewindable { requested: from });
        }
        if let Some(gone) = state.forgotten_through.filter(|gone| from <= *gone) {
            let reason = format!("containers up to {gone} are no longer held");
            let oldest = state.history.front().map(|b| b.token).or_else(|| state.pending.front().map(|e| e.token));
            return Err(QueueError::CannotRewind {
                adapter: NAME.into(),
                queue: self.queue.id,
                requested: from,
                reason,
                oldest,
            });
        }
        // Everything still held, read or not: the agent keeps what it lacks.
        // Both lists are in token order, so the start is found by bisection.
        let history = state.history.range(state.history.partition_point(|b| b.token < from)..);
        let pending = state.pending.range(state.pending.partition_point(|e| e.batch.token < from)..);
        Ok(history.chain(pending.map(|e| &e.batch)).take(max).cloned().collect())
    }

    async fn shutdown(&mut self, _timeout: Duration) -> Result<(), QueueError> {
        self.shut_down = true;
        Ok(())
    }
}
