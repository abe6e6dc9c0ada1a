//! The adapter itself: connecting (with the old layout's keys moved once),
//! appending batches, and making each queue's receiver.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use backon::Retryable;

use super::super::entry::encode_entry;
use super::super::{BuiltInFactory, MappedAdapter};
use super::fence::{self, Fence};
use super::{NAME, RedisCheckpointer, RedisOptions, RedisPubSubStore, receiver, wake};
use crate::queue::{Direction, QueueAdapter, QueueError, QueueMapper, QueueReceiver};
use crate::redis_conn::{self, RedisConn, RedisConnError};
use crate::stream::{Event, QueueId, SequenceToken, StreamId};

/// Connects to Redis with reconnection and backoff; a refused password or
/// certificate is a configuration error naming the setting.
pub(crate) async fn connect(options: &RedisOptions) -> Result<RedisConn, QueueError> {
    options.endpoint().connect_any(connection_config(options), options.response_timeout).await.map_err(|e| match e {
        RedisConnError::Unreachable { .. } => {
            QueueError::Backend { adapter: NAME.into(), message: format!("connecting: {e}"), transient: true }
        }
        other => QueueError::Config(other.to_string()),
    })
}

/// Settings that cannot work.
fn check_options(options: &RedisOptions) -> Result<(), QueueError> {
    if options.reader_connections == 0 {
        return Err(QueueError::Config("[adapters.redis] reader_connections must be at least 1".into()));
    }
    if options.wait_replicas > 0 && options.wait_timeout >= options.response_timeout {
        return Err(QueueError::Config(format!(
            "[adapters.redis] wait_timeout ({:?}) must be less than response_timeout ({:?})",
            options.wait_timeout, options.response_timeout
        )));
    }
    Ok(())
}

/// How the adapter's connections reconnect, and their command limit.
pub(super) fn connection_config(options: &RedisOptions) -> redis::aio::ConnectionManagerConfig {
    redis_conn::reconnecting(options.response_timeout)
}

/// A Redis error as a queue error (transient when a retry may help).
pub(crate) fn backend(error: &redis::RedisError, doing: &str) -> QueueError {
    let transient = crate::redis_conn::is_transient(error);
    QueueError::Backend { adapter: NAME.into(), message: format!("{doing}: {error}"), transient }
}

/// Waits between attempts of the key migration at connect.
const MIGRATE_RETRIES: crate::retry::Backoff =
    crate::retry::Backoff::new(Duration::from_millis(100), Duration::from_secs(1), Duration::from_millis(100));
/// How long connect keeps trying the key migration.
const MIGRATE_WITHIN: Duration = Duration::from_secs(10);

/// Builds the Redis adapter, checkpointer and pub-sub store.
pub type RedisAdapterFactory = BuiltInFactory<RedisAdapter, RedisCheckpointer>;

impl RedisAdapterFactory {
    /// Connects, to streams of `queue_count` queues.
    pub async fn connect(queue_count: u32, options: RedisOptions) -> Result<Self, QueueError> {
        check_options(&options)?;
        let conn = connect(&options).await?;
        // Before anything reads or appends: retried while Redis is not
        // ready (restarting, loading its data), as a receiver's start is.
        // (A Redis Cluster never ran the old layout, whose keys span slots.)
        let migrate = || {
            let (mut conn, prefix) = (conn.clone(), options.key_prefix.clone());
            let cluster = options.cluster;
            async move { if cluster { Ok(0) } else { fence::migrate_legacy_keys(&mut conn, &prefix, queue_count).await } }
        };
        migrate
            .retry(MIGRATE_RETRIES.within(MIGRATE_WITHIN))
            .notify(|error, wait| tracing::warn!(%error, ?wait, "redis not ready to move queue keys; retrying"))
            .await
            .map_err(|e| backend(&e, "moving queue keys to the new layout"))?;
        let mapper = QueueMapper::new(queue_count);
        let checkpointer =
            Arc::new(RedisCheckpointer::new(conn.clone(), &options.key_prefix).with_wait_replicas(options.wait()));
        let adapter = Arc::new(RedisAdapter {
            mapper,
            conn,
            readers: (0..options.reader_connections).map(|_| tokio::sync::OnceCell::new()).collect(),
            wakes: Arc::new(wake::Wakes::new(options.clone())),
            options,
            checkpointer: checkpointer.clone(),
        });
        Ok(Self::from_parts(adapter, checkpointer))
    }

    /// A pub-sub store on the same server, shared by every node; each
    /// stream holds at most `max_per_stream` subscriptions.
    pub fn pubsub_store(&self, max_per_stream: usize) -> RedisPubSubStore {
        RedisPubSubStore::new(self.adapter.conn.clone(), &self.adapter.options.key_prefix, max_per_stream)
    }
}

impl MappedAdapter for RedisAdapter {
    fn mapper(&self) -> QueueMapper {
        self.mapper
    }
}

/// Appends to and reads from the Redis streams.
pub struct RedisAdapter {
    mapper: QueueMapper,
    /// Producers' (and the checkpointer's and pub-sub store's).
    conn: RedisConn,
    /// The receivers', made at the first receiver that needs each (no
    /// command blocks, so many queues share one).
    readers: Vec<tokio::sync::OnceCell<RedisConn>>,
    /// Where idle receivers wait for a write.
    wakes: Arc<wake::Wakes>,
    options: RedisOptions,
    checkpointer: Arc<RedisCheckpointer>,
}

impl RedisAdapter {
    /// The stream key of `queue`.
    pub fn key(&self, queue: QueueId) -> String {
        fence::stream_key(&self.options.key_prefix, queue)
    }
}

#[async_trait]
impl QueueAdapter for RedisAdapter {
    fn name(&self) -> &str {
        NAME
    }

    async fn health(&self) -> Result<(), QueueError> {
        let pong: String =
            redis::cmd("PING").query_async(&mut self.conn.clone()).await.map_err(|e| backend(&e, "PING"))?;
        match pong.as_str() {
            "PONG" => Ok(()),
            other => Err(QueueError::Backend {
                adapter: NAME.into(),
                message: format!("PING answered {other}"),
                transient: true,
            }),
        }
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
        // The connection is multiplexed: concurrent appends share it as one
        // pipeline, and one caller's appends stay in order.
        let key = self.key(self.mapper.queue_for(stream));
        let mut append = redis::cmd("XADD");
        append.arg(&key).arg("*").arg("b").arg(encode_entry(stream, &events));
        let id: String = match self.options.wait_replicas {
            0 => append.query_async(&mut self.conn.clone()).await.map_err(|e| backend(&e, "appending"))?,
            wanted => {
                let timeout = self.options.wait_timeout;
                let mut pipe = redis::pipe();
                pipe.add_command(append).cmd("WAIT").arg(wanted).arg(timeout.as_millis() as u64);
                let (id, confirmed): (String, u32) =
                    pipe.query_async(&mut self.conn.clone()).await.map_err(|e| backend(&e, "appending"))?;
                if confirmed < wanted {
                    return Err(QueueError::Backend {
                        adapter: NAME.into(),
                        message: format!(
                            "appending: {confirmed} of {wanted} replicas had the batch within {timeout:?} \
                             ([adapters.redis] wait_replicas): the master has it, a failover may lose it; \
                             a retry may store it twice"
                        ),
                        transient: true,
                    });
                }
                id
            }
        };
        id.parse().map_err(|e: crate::stream::ParseTokenError| QueueError::Backend {
            adapter: NAME.into(),
            message: format!("XADD answered `{id}`: {e}"),
            transient: false,
        })
    }

    async fn create_receiver(
        &self,
        queue: QueueId,
        fence: crate::queue::Fence,
    ) -> Result<Box<dyn QueueReceiver>, QueueError> {
        self.receiver(queue, fence.token()).await
    }
}

impl RedisAdapter {
    /// The receiver of `queue`, fenced with `token` if given.
    async fn receiver(&self, queue: QueueId, token: Option<u64>) -> Result<Box<dyn QueueReceiver>, QueueError> {
        if queue.0 >= self.mapper.queue_count() {
            return Err(QueueError::Config(format!(
                "queue {queue} does not exist (there are {})",
                self.mapper.queue_count()
            )));
        }
        let fence_key = fence::fence_key(&self.options.key_prefix, queue);
        let fence = match token {
            Some(token) => Fence::new(token, fence_key),
            None => Fence::open(fence_key),
        };
        let slot = &self.readers[queue.0 as usize % self.readers.len()];
        let conn = slot.get_or_try_init(|| connect(&self.options)).await?.clone();
        let shared = receiver::Shared {
            conn,
            options: self.options.clone(),
            checkpointer: self.checkpointer.clone(),
            wakes: self.wakes.clone(),
        };
        Ok(Box::new(receiver::RedisReceiver::new(queue, self.key(queue), fence, shared)))
    }
}
