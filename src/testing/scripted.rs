//! A queue adapter the test drives by hand: it hands out the containers the
//! test pushes (with the tokens the test chooses), can hold reads back,
//! fail them, and records every call. One queue. (The test kit's
//! `scripted.rs`, over this crate's types.)

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::checkpoint::MemoryCheckpointer;
use crate::queue::{
    CacheOptions, Checkpointer, Direction, Fence, QueueAdapter, QueueAdapterFactory, QueueError, QueueMapper,
    QueueReceiver,
};
use crate::stream::{BatchContainer, Event, EventId, QueueId, SequenceToken, StreamId};
use async_trait::async_trait;
use tokio::sync::Semaphore;

/// What the receiver did and will do.
#[derive(Default)]
pub(crate) struct Script {
    /// Containers waiting to be read, in order.
    pub(crate) pending: Mutex<VecDeque<Arc<BatchContainer>>>,
    /// Errors the next reads return, in order.
    pub(crate) read_errors: Mutex<VecDeque<QueueError>>,
    /// `read` calls and the `max` each asked for.
    pub(crate) read_max: Mutex<Vec<usize>>,
    /// Every `delivered` call.
    pub(crate) acks: Mutex<Vec<Vec<SequenceToken>>>,
    /// Errors the next `delivered` calls return (acking nothing), in order.
    pub(crate) ack_errors: Mutex<VecDeque<QueueError>>,
    /// Every `failed` call.
    pub(crate) failed: Mutex<Vec<Vec<SequenceToken>>>,
    pub(crate) inits: AtomicUsize,
    pub(crate) shutdowns: AtomicUsize,
    pub(crate) receivers: AtomicUsize,
    /// When set, each read takes one permit first (holds reads back).
    pub(crate) gate: Mutex<Option<Arc<Semaphore>>>,
    /// The next this many reads panic (a broken adapter).
    pub(crate) panics: AtomicUsize,
    /// Reads per receiver, by the receiver's number (1, 2, ...).
    pub(crate) reads_by_receiver: Mutex<Vec<usize>>,
    /// When set, `delivered`, `failed` and `shutdown` never return (a
    /// receiver whose backend hangs).
    pub(crate) hang: std::sync::atomic::AtomicBool,
}

impl Script {
    pub(crate) fn push(&self, stream: &StreamId, token: u64, ids: &[&str]) {
        let events = ids.iter().map(|id| Event::new(EventId::new(*id), format!("payload of {id}"))).collect();
        self.pending.lock().unwrap().push_back(Arc::new(BatchContainer {
            stream: stream.clone(),
            token: SequenceToken::new(token, 0),
            events,
        }));
    }

    pub(crate) fn read_calls(&self) -> usize {
        self.read_max.lock().unwrap().len()
    }

    pub(crate) fn acked(&self) -> Vec<u64> {
        self.acks.lock().unwrap().iter().flatten().map(|t| t.major).collect()
    }

    /// Holds every read until `release` is called.
    pub(crate) fn hold_reads(&self) -> Arc<Semaphore> {
        let gate = Arc::new(Semaphore::new(0));
        *self.gate.lock().unwrap() = Some(gate.clone());
        gate
    }

    pub(crate) fn release_reads(&self) {
        if let Some(gate) = self.gate.lock().unwrap().take() {
            gate.add_permits(1_000_000);
        }
    }
}

pub(crate) struct ScriptedFactory {
    pub(crate) script: Arc<Script>,
    pub(crate) checkpoints: Arc<MemoryCheckpointer>,
    pub(crate) cache: CacheOptions,
}

impl ScriptedFactory {
    pub(crate) fn new() -> Arc<Self> {
        Self::with_cache(CacheOptions::default())
    }

    pub(crate) fn with_cache(cache: CacheOptions) -> Arc<Self> {
        Arc::new(Self { script: Arc::new(Script::default()), checkpoints: Arc::new(MemoryCheckpointer::new()), cache })
    }
}

#[async_trait]
impl QueueAdapterFactory for ScriptedFactory {
    fn name(&self) -> &str {
        "scripted"
    }

    fn queue_mapper(&self) -> QueueMapper {
        QueueMapper::new(1)
    }

    async fn create_adapter(&self) -> Result<Arc<dyn QueueAdapter>, QueueError> {
        Ok(Arc::new(ScriptedAdapter { script: self.script.clone() }))
    }

    async fn create_checkpointer(&self) -> Result<Arc<dyn Checkpointer>, QueueError> {
        Ok(self.checkpoints.clone())
    }

    fn cache_options(&self) -> CacheOptions {
        self.cache.clone()
    }
}

pub(crate) struct ScriptedAdapter {
    script: Arc<Script>,
}

#[async_trait]
impl QueueAdapter for ScriptedAdapter {
    fn name(&self) -> &str {
        "scripted"
    }

    fn direction(&self) -> Direction {
        Direction::ReadWrite
    }

    fn is_rewindable(&self) -> bool {
        false
    }

    async fn enqueue(&self, _: &StreamId, _: Vec<Event>) -> Result<SequenceToken, QueueError> {
        Err(QueueError::Config("the scripted adapter is fed by the test".into()))
    }

    async fn create_receiver(&self, _: QueueId, _: Fence) -> Result<Box<dyn QueueReceiver>, QueueError> {
        let number = self.script.receivers.fetch_add(1, Ordering::SeqCst) + 1;
        self.script.reads_by_receiver.lock().unwrap().push(0);
        Ok(Box::new(ScriptedReceiver { script: self.script.clone(), number }))
    }
}

struct ScriptedReceiver {
    script: Arc<Script>,
    number: usize,
}

impl ScriptedReceiver {
    async fn hang_if_asked(&self) {
        if self.script.hang.load(Ordering::SeqCst) {
            std::future::pending::<()>().await;
        }
    }
}

#[async_trait]
impl QueueReceiver for ScriptedReceiver {
    async fn initialize(&mut self, _: Duration) -> Result<(), QueueError> {
        self.script.inits.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }

    async fn read(&mut self, max: usize) -> Result<Vec<Arc<BatchContainer>>, QueueError> {
        self.script.read_max.lock().unwrap().push(max);
        self.script.reads_by_receiver.lock().unwrap()[self.number - 1] += 1;
        if self.script.panics.load(Ordering::SeqCst) > 0 {
            self.script.panics.fetch_sub(1, Ordering::SeqCst);
            panic!("scripted receiver breaks");
        }
        let gate = self.script.gate.lock().unwrap().clone();
        if let Some(gate) = gate {
            let _ = gate.acquire().await.map(|p| p.forget());
        }
        if let Some(error) = self.script.read_errors.lock().unwrap().pop_front() {
            return Err(error);
        }
        let mut pending = self.script.pending.lock().unwrap();
        let n = pending.len().min(max);
        Ok(pending.drain(..n).collect())
    }

    async fn delivered(&mut self, tokens: &[SequenceToken]) -> Result<(), QueueError> {
        self.hang_if_asked().await;
        if let Some(error) = self.script.ack_errors.lock().unwrap().pop_front() {
            return Err(error);
        }
        self.script.acks.lock().unwrap().push(tokens.to_vec());
        Ok(())
    }

    async fn failed(&mut self, tokens: &[SequenceToken]) -> Result<(), QueueError> {
        self.hang_if_asked().await;
        self.script.failed.lock().unwrap().push(tokens.to_vec());
        Ok(())
    }

    async fn shutdown(&mut self, _: Duration) -> Result<(), QueueError> {
        self.hang_if_asked().await;
        self.script.shutdowns.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }
}
