//! The `redis` adapter: one Redis stream per queue (`{prefix}:{qn}:stream`,
//! under the queue lease's hash tag; the layout is in `fence.rs`), for
//! clusters. Also the Redis checkpointer and pub-sub store, so every node
//! sees the same checkpoints and subscriptions.
//!
//! - At connect, the old layout's keys (`{prefix}:q{n}`,
//!   `{prefix}:checkpoint:q{n}`) are renamed to the new ones once.
//! - `enqueue` appends one entry per batch (`XADD`); concurrent appends to a
//!   queue go out together as one pipeline.
//! - A receiver reads its stream as a log, as the Kafka adapter reads a
//!   partition: `XRANGE stream (position + COUNT n`, starting after the
//!   stored checkpoint. No consumer group, no pending list, no per-entry
//!   ack or claim: the agent's checkpoint is the ack, a new owner starts at
//!   it, and a read whose reply was lost moved nothing. On a queue an older
//!   release read through the consumer group `group` and never
//!   checkpointed, the first start is at the group's first entry not acked.
//! - A fenced receiver (`create_receiver` with `Fence::lease`, the agent's
//!   under a lease) reads the queue's fencing counter in the same pipeline
//!   as each read, and trims in a script that checks it first: a paused old
//!   owner, once a newer lease was granted, reads nothing to deliver and
//!   trims nothing; its checkpoint saves are refused too (`store.rs`).
//! - No read blocks, and receivers share the adapter's connections: an
//!   idle queue's agent sleeps until Redis tells the process of a write to
//!   its stream past its position (`wake.rs`), so an idle queue costs no
//!   command at all.
//! - New entries are always numbered past the stored checkpoint and past
//!   what the receiver read (`XSETID` when the stream's ids fell behind),
//!   so a new entry is never taken for an old one.
//! - A subscriber asking for an older token is served with `XRANGE` while the
//!   stream still holds it.
//! - The stream is trimmed (`XTRIM MINID`) up to the stored checkpoint, never
//!   past it (or never, by configuration).
//! - A lost connection or a Redis restart is retried with backoff by the
//!   connection manager; callers see transient errors, never a panic.

#[cfg(feature = "redis")]
mod adapter;
#[cfg(feature = "redis")]
mod fence;
#[cfg(feature = "redis")]
mod receiver;
#[cfg(feature = "redis")]
mod store;
#[cfg(feature = "redis")]
mod wake;

use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

#[cfg(all(feature = "redis", feature = "kafka"))]
pub(crate) use adapter::connect;
#[cfg(feature = "redis")]
pub use adapter::{RedisAdapter, RedisAdapterFactory};
#[cfg(feature = "redis")]
use adapter::{backend, connection_config};
#[cfg(feature = "redis")]
pub use store::{RedisCheckpointer, RedisPubSubStore};

use crate::redis_conn::{self, RedisAccess, RedisEndpoint};

#[cfg(feature = "redis")]
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
    /// The consumer group an older release read the queues through: a
    /// queue with no checkpoint yet starts where that group stopped (see
    /// `docs/upgrading.md`). Nothing reads through it any more.
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
