//! The factory and the adapter: producing (in the topic's record format),
//! and handing out receivers.

use std::sync::Arc;

use async_trait::async_trait;
use parking_lot::Mutex;
use rskafka::client::partition::{Compression, PartitionClient};
use tokio::sync::Notify;

use super::records::Records;
use super::{KafkaOptions, NAME, connect, receiver};
use crate::failure::{DeadLetterSink, LogDeadLetters};
use crate::queue::{
    CacheOptions, Checkpointer, Direction, Fence, QueueAdapter, QueueAdapterFactory, QueueError, QueueMapper,
    QueueReceiver,
};
use crate::stream::{Event, QueueId, SequenceToken, StreamId};

/// Builds the Kafka adapter; checkpoints go to the checkpointer it is given.
pub struct KafkaAdapterFactory {
    adapter: Arc<KafkaAdapter>,
    checkpointer: Arc<dyn Checkpointer>,
    cache: CacheOptions,
}

impl KafkaAdapterFactory {
    /// Checks the settings (`records`, `[adapters.kafka.mapping]`),
    /// connects to the brokers and checks (or creates) the topic: it must
    /// have `queue_count` partitions.
    pub async fn connect(
        queue_count: u32,
        options: KafkaOptions,
        checkpointer: Arc<dyn Checkpointer>,
    ) -> Result<Self, QueueError> {
        let records = Records::new(&options)?;
        let client = connect::client(&options, "producer").await?;
        connect::topic(&client, &options, queue_count).await?;
        let mut partitions = Vec::with_capacity(queue_count as usize);
        for partition in 0..queue_count {
            partitions.push(Arc::new(connect::partition(&client, &options, partition).await?));
        }
        let adapter = Arc::new(KafkaAdapter {
            mapper: records.mapper(queue_count),
            records: Arc::new(records),
            dead_letters: Mutex::new(Arc::new(LogDeadLetters)),
            options,
            client,
            written: (0..queue_count).map(|_| Arc::new(Notify::new())).collect(),
            partitions,
            checkpointer: checkpointer.clone(),
        });
        Ok(Self { adapter, checkpointer, cache: CacheOptions::default() })
    }

    /// Uses these cache options for every queue.
    pub fn with_cache(mut self, cache: CacheOptions) -> Self {
        self.cache = cache;
        self
    }

    /// Where unreadable records go (default: the log).
    pub fn with_dead_letters(self, sink: Arc<dyn DeadLetterSink>) -> Self {
        *self.adapter.dead_letters.lock() = sink;
        self
    }

    /// The shared adapter (for producers in the same process).
    pub fn adapter(&self) -> Arc<KafkaAdapter> {
        self.adapter.clone()
    }
}

#[async_trait]
impl QueueAdapterFactory for KafkaAdapterFactory {
    fn name(&self) -> &str {
        NAME
    }

    fn queue_mapper(&self) -> QueueMapper {
        self.adapter.mapper
    }

    async fn create_adapter(&self) -> Result<Arc<dyn QueueAdapter>, QueueError> {
        Ok(self.adapter.clone())
    }

    async fn create_checkpointer(&self) -> Result<Arc<dyn Checkpointer>, QueueError> {
        Ok(self.checkpointer.clone())
    }

    fn cache_options(&self) -> CacheOptions {
        self.cache.clone()
    }
}

/// Produces to and fetches from the topic's partitions.
pub struct KafkaAdapter {
    mapper: QueueMapper,
    /// The topic's record format.
    records: Arc<Records>,
    /// Where receivers send unreadable records.
    dead_letters: Mutex<Arc<dyn DeadLetterSink>>,
    options: KafkaOptions,
    /// Producers' connection (and metadata's).
    client: rskafka::client::Client,
    /// Each queue's partition, on the producers' connection.
    partitions: Vec<Arc<PartitionClient>>,
    /// Signalled when this process produced to the queue.
    written: Vec<Arc<Notify>>,
    checkpointer: Arc<dyn Checkpointer>,
}

impl KafkaAdapter {
    fn partition(&self, queue: QueueId) -> Result<&Arc<PartitionClient>, QueueError> {
        self.partitions.get(queue.0 as usize).ok_or_else(|| {
            QueueError::Config(format!("queue {queue} does not exist (there are {})", self.partitions.len()))
        })
    }
}

#[async_trait]
impl QueueAdapter for KafkaAdapter {
    fn name(&self) -> &str {
        NAME
    }

    fn direction(&self) -> Direction {
        Direction::ReadWrite
    }

    fn is_rewindable(&self) -> bool {
        true
    }

    async fn enqueue(&self, stream: &StreamId, events: Vec<Event>) -> Result<SequenceToken, QueueError> {
        if events.is_empty() {
            return Err(QueueError::EmptyBatch(stream.clone()));
        }
        let queue = self.mapper.queue_for(stream);
        let (records, bytes) = self.records.encode(stream, &events)?;
        if bytes > self.options.max_record_bytes {
            return Err(QueueError::BatchTooManyBytes { queue, bytes, limit: self.options.max_record_bytes });
        }
        let partition = self.partition(queue)?;
        let produced =
            connect::bounded(&self.options, "producing", partition.produce(records, Compression::NoCompression))
                .await?;
        // A batch of several records is one container each: its token is the last one's.
        let offset = produced.last().copied().ok_or_else(|| QueueError::Backend {
            adapter: NAME.into(),
            message: format!("producing to partition {}: the broker answered no offset", queue.0),
            transient: false,
        })?;
        // A permit stays if the receiver is not waiting yet: its next wait ends at once.
        self.written[queue.0 as usize].notify_one();
        Ok(connect::token(offset))
    }

    async fn create_receiver(&self, queue: QueueId, _fence: Fence) -> Result<Box<dyn QueueReceiver>, QueueError> {
        self.partition(queue)?;
        let dead_letters = self.dead_letters.lock().clone();
        Ok(Box::new(receiver::KafkaReceiver::new(
            queue,
            self.options.clone(),
            self.checkpointer.clone(),
            self.written[queue.0 as usize].clone(),
            receiver::Reading { records: self.records.clone(), mapper: self.mapper, dead_letters },
        )))
    }

    /// The topic's metadata answers within `response_timeout`.
    async fn health(&self) -> Result<(), QueueError> {
        connect::bounded(&self.options, "reading the topic's metadata", self.client.list_topics()).await.map(drop)
    }
}
