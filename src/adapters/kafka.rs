//! The `kafka` adapter: one topic, partition `n` is queue `n`; a record's
//! offset is its container's token (`offset-0`). Kafka keeps the data;
//! tailrace does what a consumer group would, its own way: the balancer
//! (leases under `tailrace node`) decides which node reads a partition,
//! and checkpoints live in the checkpointer the factory is given (Redis or
//! files), fenced by the leases.
//!
//! - At connect the topic must have as many partitions as `[queues] count`
//!   (or is created so, with `create_topic`): a mismatch is refused, naming
//!   both numbers.
//! - `records` says what a record is (`records.rs`): tailrace's own (one
//!   record per batch container, its value the container's JSON, the Redis
//!   entry's format, its key the stream), or `mapped`, records others
//!   write (Vector, Fluent Bit, a team's own producers), read and written
//!   as `[adapters.kafka.mapping]` says (`mapping.rs`): one record per
//!   event, keyed by the stream's key, on the partition Kafka's default
//!   partitioner gives that key.
//! - `enqueue` produces (`acks = all`; the client offers no idempotent
//!   producer, so a produce retried after a lost answer may store the
//!   batch twice, with other offsets).
//! - A receiver fetches from the offset after the stored checkpoint (or
//!   the partition's start) on a connection of its own: a broker serves one
//!   connection's requests one at a time, so a fetch that waits must not
//!   hold up producers or other partitions. Acks cost nothing: the
//!   checkpoint is the ack. A record that does not read as a container of
//!   its partition goes to the dead-letter sink (`dead_letters.rs`), and
//!   the queue goes on.
//! - An idle receiver waits on a fetch that the broker holds until a record
//!   arrives (`idle_wait`), or on this process's own produce to the
//!   partition.
//! - `rewind` fetches from any offset the partition still holds; an offset
//!   its retention removed is refused, naming the partition's start.
//! - Every request is bounded by `response_timeout`; the client's own
//!   retries end there too.
//!
//! The settings are always here; the adapter is built with the `kafka`
//! cargo feature (on by default).

#[cfg(feature = "kafka")]
mod adapter;
#[cfg(feature = "kafka")]
mod connect;
#[cfg(feature = "kafka")]
mod dead_letters;
mod mapping;
#[cfg(feature = "kafka")]
mod receiver;
#[cfg(feature = "kafka")]
mod records;

use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

#[cfg(feature = "kafka")]
pub use adapter::{KafkaAdapter, KafkaAdapterFactory};
pub use mapping::KafkaMapping;

#[cfg(feature = "kafka")]
const NAME: &str = "kafka";

/// Where a Kafka queue's checkpoints are kept.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum CheckpointStore {
    /// Redis under `tailrace node` (shared by the nodes, fenced by the
    /// leases); files in `checkpoint_dir` for one process alone.
    #[default]
    Auto,
    /// Files in `checkpoint_dir` (one process alone: not shared, not
    /// fenced).
    File,
    /// The Redis of `[adapters.redis]`, under its `key_prefix`.
    Redis,
}

/// What the topic's records are (`records`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum RecordFormat {
    /// tailrace's own: one record per batch, its value the batch's JSON,
    /// its key the stream.
    #[default]
    Tailrace,
    /// Records others write (and tailrace writes alike), read as
    /// `[adapters.kafka.mapping]` says.
    Mapped,
}

/// A SASL mechanism the client speaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum SaslMechanism {
    /// `PLAIN` (send it over TLS only).
    Plain,
    /// `SCRAM-SHA-256`: `"scram-sha-256"` (`"scram-sha256"`, which
    /// earlier builds took, is read too).
    #[serde(rename = "scram-sha-256", alias = "scram-sha256")]
    ScramSha256,
    /// `SCRAM-SHA-512`: `"scram-sha-512"` (or `"scram-sha512"`).
    #[serde(rename = "scram-sha-512", alias = "scram-sha512")]
    ScramSha512,
}

/// Settings of the Kafka adapter (`[adapters.kafka]`). `Debug` leaves the
/// password out.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct KafkaOptions {
    /// Bootstrap brokers, `host:port`.
    pub brokers: Vec<String>,
    /// The topic: partition `n` is queue `n`.
    pub topic: String,
    /// Create the topic (with `[queues] count` partitions) when it is missing.
    pub create_topic: bool,
    /// Replicas of each partition of a topic this adapter creates.
    pub replication_factor: i16,
    /// Where checkpoints are kept.
    pub checkpoints: CheckpointStore,
    /// The directory of file checkpoints.
    pub checkpoint_dir: PathBuf,
    /// How long a read with nothing new waits at the broker.
    #[serde(with = "humantime_serde")]
    pub read_wait: Duration,
    /// How long an idle queue's fetch waits at the broker for a record
    /// before it asks again.
    #[serde(with = "humantime_serde")]
    pub idle_wait: Duration,
    /// Most bytes one fetch returns.
    pub fetch_max_bytes: u32,
    /// Largest container (one record's value) accepted; larger batches
    /// are refused whole (the broker's `message.max.bytes` is 1 MiB by
    /// default).
    pub max_record_bytes: usize,
    /// Limit of one request, the client's retries included.
    #[serde(with = "humantime_serde")]
    pub response_timeout: Duration,
    /// Connect with TLS.
    pub tls: bool,
    /// PEM authority the brokers' certificates must chain to (with `tls`;
    /// the system's roots without it).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tls_ca_file: Option<PathBuf>,
    /// PEM client certificate chain, for mutual TLS.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tls_cert_file: Option<PathBuf>,
    /// PEM private key of `tls_cert_file`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tls_key_file: Option<PathBuf>,
    /// SASL authentication, if the brokers ask for it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sasl_mechanism: Option<SaslMechanism>,
    /// The SASL user.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sasl_username: Option<String>,
    /// The SASL password (`TAILRACE_KAFKA_PASSWORD` wins).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sasl_password: Option<String>,
    /// What the topic's records are: tailrace's own, or `mapped`.
    pub records: RecordFormat,
    /// Where `mapped` records name their stream, run and lines (last: a
    /// table, written after the plain values).
    pub mapping: KafkaMapping,
}

impl Default for KafkaOptions {
    fn default() -> Self {
        Self {
            brokers: vec!["127.0.0.1:9092".into()],
            topic: "tailrace".into(),
            create_topic: true,
            replication_factor: 1,
            checkpoints: CheckpointStore::Auto,
            checkpoint_dir: PathBuf::from("data/kafka"),
            read_wait: Duration::from_millis(100),
            idle_wait: Duration::from_millis(500),
            fetch_max_bytes: 1024 * 1024,
            max_record_bytes: 1024 * 1024,
            response_timeout: Duration::from_secs(5),
            tls: false,
            tls_ca_file: None,
            tls_cert_file: None,
            tls_key_file: None,
            sasl_mechanism: None,
            sasl_username: None,
            sasl_password: None,
            records: RecordFormat::Tailrace,
            mapping: KafkaMapping::default(),
        }
    }
}

impl KafkaOptions {
    /// Checks `records` and `[adapters.kafka.mapping]` (a mapping given
    /// while tailrace's own records are read is refused: it would do
    /// nothing).
    pub(crate) fn check(&self) -> Result<(), mapping::MappingError> {
        self.mapping.compile()?;
        if self.records == RecordFormat::Tailrace && self.mapping != KafkaMapping::default() {
            return Err(mapping::MappingError::Unused);
        }
        Ok(())
    }
}

impl std::fmt::Debug for KafkaOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KafkaOptions")
            .field("brokers", &self.brokers)
            .field("topic", &self.topic)
            .field("checkpoints", &self.checkpoints)
            .field("records", &self.records)
            .field("mapping", &self.mapping)
            .field("tls", &self.tls)
            .field("sasl_mechanism", &self.sasl_mechanism)
            .field("sasl_username", &self.sasl_username)
            .finish_non_exhaustive()
    }
}

/// The environment variable whose value, when set, is the SASL password.
pub const PASSWORD_ENV: &str = "TAILRACE_KAFKA_PASSWORD";

#[cfg(test)]
mod tests {
    use super::*;

    /// Every spelling the docs and `defaults.toml` show parses (the docs
    /// said `scram-sha-256` while only `scram-sha256` was taken: a user
    /// who copied them got `unknown variant` and no node).
    #[test]
    fn every_documented_sasl_mechanism_parses() {
        let parse = |name: &str| toml::from_str::<KafkaOptions>(&format!("sasl_mechanism = \"{name}\"\n"));
        for (name, mechanism) in [
            ("plain", SaslMechanism::Plain),
            ("scram-sha-256", SaslMechanism::ScramSha256),
            ("scram-sha-512", SaslMechanism::ScramSha512),
            ("scram-sha256", SaslMechanism::ScramSha256),
            ("scram-sha512", SaslMechanism::ScramSha512),
        ] {
            assert_eq!(parse(name).map(|o| o.sasl_mechanism).ok(), Some(Some(mechanism)), "{name}");
        }
        let shown =
            toml::to_string(&KafkaOptions { sasl_mechanism: Some(SaslMechanism::ScramSha256), ..Default::default() });
        assert!(shown.is_ok_and(|text| text.contains("\"scram-sha-256\"")), "written as the docs spell it");
        let refused = parse("scram-sha-1").err().map(|e| e.to_string()).unwrap_or_default();
        assert!(refused.contains("scram-sha-256"), "the refusal lists the spellings: {refused}");
    }
}
