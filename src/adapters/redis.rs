//! The `redis` adapter: one Redis stream per queue (`{prefix}:{qn}:stream`,
//! under the queue lease's hash tag; the layout is in `fence.rs`), for
//! clusters. Also the Redis checkpointer and pub-sub store, so every node
//! sees the same checkpoints and subscriptions.
//!
//! - At connect, the old layout's keys (`{prefix}:q{n}`,
//!   `{prefix}:checkpoint:q{n}`) are renamed to the new ones once.
//! - A fenced receiver (`create_receiver` with `Fence::lease`, the agent's
//!   under a lease) acks, trims, claims and takes new entries in scripts that first
//!   check the queue's fencing counter: a paused old owner can neither
//!   strand entries in its pending list nor ack or trim after a newer lease
//!   was granted.
//! - `enqueue` appends one entry per batch (`XADD`); concurrent appends to a
//!   queue go out together as one pipeline.
//! - Receivers read through a consumer group (`XREADGROUP … COUNT n`, in a
//!   script that also answers the stream's last id when nothing is new),
//!   ack with `XACK`, and on start take over every entry a previous owner
//!   left pending (`XAUTOCLAIM`), reading those first, so nothing is
//!   stranded. The group is created at the stream's start (`0`, never
//!   `$`), so nothing appended before it existed is skipped; a group that
//!   vanished with its stream (the key deleted, a Redis that lost its data)
//!   is created again on the next read.
//! - No read blocks, and receivers share the adapter's connection: an idle
//!   queue's agent sleeps until Redis tells the process of a write to its
//!   stream (`wake.rs`), so an idle queue costs no command at all.
//! - New entries are always numbered past the stored checkpoint and past
//!   what the receiver read (`XSETID` when the stream's ids fell behind),
//!   so a new entry is never taken for an old one.
//! - A subscriber asking for an older token is served with `XRANGE` while the
//!   stream still holds it.
//! - The stream is trimmed (`XTRIM MINID`) up to the stored checkpoint, never
//!   past it (or never, by configuration).
//! - A lost connection or a Redis restart is retried with backoff by the
//!   connection manager; callers see transient errors, never a panic.

mod batch;
mod fence;
mod receiver;
mod store;
mod wake;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use backon::Retryable;
use serde::{Deserialize, Serialize};

pub use store::{RedisCheckpointer, RedisPubSubStore};

use super::entry::encode_entry;
use fence::Fence;

use super::{BuiltInFactory, MappedAdapter};
use crate::queue::{Direction, QueueAdapter, QueueError, QueueMapper, QueueReceiver};
use crate::redis_conn::{self, RedisAccess, RedisConn, RedisConnError, RedisEndpoint};
use crate::stream::{Event, QueueId, SequenceToken, StreamId};

const NAME: &str = "redis";

/// What `XTRIM` may remove.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum TrimPolicy {
    /// Entries below the stored checkpoint (the default).
    #[default]
    Checkpoint,
    /// Nothing: the stream keeps every entry.
    Never,
}

/// Settings of the Redis adapter (`[adapters.redis]`). `Debug` shows
/// neither the password nor the URL's.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RedisOptions {
    /// The server, `redis://[user:password@]host:port/db` (`rediss://`:
    /// TLS).
    pub url: String,
    /// The ACL user (instead of the URL's).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub username: Option<String>,
    /// The password (instead of the URL's; `TAILRACE_REDIS_PASSWORD` wins).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub password: Option<String>,
    /// A file holding the password (excludes `password`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub password_file: Option<PathBuf>,
    /// PEM authority the server's certificate must chain to (`rediss://`;
    /// the system's roots without it).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tls_ca_file: Option<PathBuf>,
    /// PEM client certificate chain, for mutual TLS.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tls_cert_file: Option<PathBuf>,
    /// PEM private key of `tls_cert_file`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tls_key_file: Option<PathBuf>,
    /// Prefix of every key tailrace writes.
    pub key_prefix: String,
    /// The consumer group (one per provider).
    pub group: String,
    /// What trimming may remove.
    pub trim: TrimPolicy,
    /// How often a receiver trims its stream.
    #[serde(with = "humantime_serde")]
    pub trim_every: Duration,
    /// Limit of one command.
    #[serde(with = "humantime_serde")]
    pub response_timeout: Duration,
    /// Connections the receivers of a node share (queue `n` reads over
    /// connection `n mod reader_connections`); producers use another.
    pub reader_connections: usize,
    /// `url` is a seed of a Redis Cluster: every command goes to the shard
    /// of its keys' slot (a queue's keys share a hash tag, a run's another).
    /// It switches everything a process keeps in Redis: queues,
    /// checkpoints, leases, membership, subscriptions, the Redis run log
    /// store.
    pub cluster: bool,
    /// Replicas that must have an append before it is acknowledged (`WAIT
    /// n`, in the same pipeline as the `XADD`, so on the same master), and
    /// a lease grant, a checkpoint or a run log append before it counts; 0:
    /// acknowledged once the master has it (replication is asynchronous: a
    /// failover may lose what no replica had yet).
    pub wait_replicas: u32,
    /// How long an append waits for `wait_replicas` (less than
    /// `response_timeout`).
    #[serde(with = "humantime_serde")]
    pub wait_timeout: Duration,
}

impl Default for RedisOptions {
    fn default() -> Self {
        Self {
            url: "redis://127.0.0.1:6379".into(),
            username: None,
            password: None,
            password_file: None,
            tls_ca_file: None,
            tls_cert_file: None,
            tls_key_file: None,
            key_prefix: "tailrace".into(),
            group: "tailrace".into(),
            trim: TrimPolicy::Checkpoint,
            trim_every: Duration::from_secs(10),
            response_timeout: Duration::from_secs(5),
            reader_connections: 2,
            cluster: false,
            wait_replicas: 0,
            wait_timeout: Duration::from_secs(1),
        }
    }
}

impl std::fmt::Debug for RedisOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisOptions")
            .field("url", &redis_conn::redact(&self.url))
            .field("access", &self.access())
            .field("key_prefix", &self.key_prefix)
            .field("group", &self.group)
            .field("trim", &self.trim)
            .field("trim_every", &self.trim_every)
            .field("response_timeout", &self.response_timeout)
            .field("reader_connections", &self.reader_connections)
            .finish()
    }
}

impl RedisOptions {
    /// The user, password and TLS files of `[adapters.redis]` (the
    /// `[archive]` Redis store uses them too).
    pub fn access(&self) -> RedisAccess {
        RedisAccess {
            section: "[adapters.redis]".into(),
            username: self.username.clone(),
            password: self.password.clone(),
            password_file: self.password_file.clone(),
            tls_ca_file: self.tls_ca_file.clone(),
            tls_cert_file: self.tls_cert_file.clone(),
            tls_key_file: self.tls_key_file.clone(),
            cluster: self.cluster,
        }
    }

    /// `wait_replicas` and `wait_timeout`, when replicas are waited for.
    pub fn wait(&self) -> Option<crate::redis_conn::WaitReplicas> {
        (self.wait_replicas > 0)
            .then_some(crate::redis_conn::WaitReplicas { replicas: self.wait_replicas, timeout: self.wait_timeout })
    }

    /// The queues' Redis: `url` with [`RedisOptions::access`].
    pub fn endpoint(&self) -> RedisEndpoint {
        RedisEndpoint { url: self.url.clone(), url_setting: "[adapters.redis] url".into(), access: self.access() }
    }
}

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
fn connection_config(options: &RedisOptions) -> redis::aio::ConnectionManagerConfig {
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
    /// Connects. `consumer` names this node in the consumer group.
    pub async fn connect(queue_count: u32, options: RedisOptions, consumer: &str) -> Result<Self, QueueError> {
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
            batcher: (!options.cluster).then(|| batch::Batcher::start(options.endpoint(), options.response_timeout)),
            options,
            consumer: consumer.to_string(),
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
    /// The fenced receivers' reads and acks, many queues per round trip
    /// (one server only).
    batcher: Option<batch::Batcher>,
    options: RedisOptions,
    consumer: String,
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
            consumer: self.consumer.clone(),
            checkpointer: self.checkpointer.clone(),
            wakes: self.wakes.clone(),
            batcher: self.batcher.clone(),
        };
        Ok(Box::new(receiver::RedisReceiver::new(queue, self.key(queue), fence, shared)))
    }
}
