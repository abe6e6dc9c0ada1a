//! Reaching the brokers: clients (TLS, SASL, retries that end), the topic's
//! check or creation, partition clients, and the client's errors as queue
//! errors.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use rskafka::BackoffConfig;
use rskafka::client::error::{Error as KafkaError, ProtocolError};
use rskafka::client::partition::{PartitionClient, UnknownTopicHandling};
use rskafka::client::{Client, ClientBuilder, Credentials, SaslConfig};

use super::{KafkaOptions, NAME, PASSWORD_ENV, SaslMechanism};
use crate::queue::QueueError;
use crate::stream::SequenceToken;

/// The token of the record at `offset`.
pub(super) fn token(offset: i64) -> SequenceToken {
    SequenceToken::new(u64::try_from(offset).unwrap_or(0), 0)
}

/// The offset a token stands for (tokens of this adapter are `offset-0`).
pub(super) fn offset(token: SequenceToken) -> i64 {
    i64::try_from(token.major).unwrap_or(i64::MAX)
}

/// A record's timestamp for `ms` milliseconds since the epoch.
pub(super) fn timestamp(ms: u64) -> rskafka::chrono::DateTime<rskafka::chrono::Utc> {
    use rskafka::chrono::TimeZone;
    let ms = i64::try_from(ms).unwrap_or(i64::MAX);
    rskafka::chrono::Utc.timestamp_millis_opt(ms).single().unwrap_or_default()
}

/// A client of the brokers on connections of its own, named `tailrace-{role}`.
pub(super) async fn client(options: &KafkaOptions, role: &str) -> Result<Client, QueueError> {
    if options.brokers.is_empty() {
        return Err(QueueError::Config("[adapters.kafka] brokers lists no broker".into()));
    }
    let mut builder = ClientBuilder::new(options.brokers.clone())
        .client_id(format!("tailrace-{role}"))
        // The client retries a failed request by itself; never for longer
        // than one request may take.
        .backoff_config(BackoffConfig {
            init_backoff: Duration::from_millis(50),
            max_backoff: Duration::from_secs(1),
            base: 2.0,
            deadline: Some(options.response_timeout),
        });
    if options.tls {
        builder = builder.tls_config(Arc::new(tls(options)?));
    }
    if let Some(sasl) = sasl(options)? {
        builder = builder.sasl_config(sasl);
    }
    bounded(options, &format!("connecting to {}", options.brokers.join(",")), builder.build()).await
}

/// Checks that the topic has `count` partitions, creating it when it is
/// missing and `create_topic` allows.
pub(super) async fn topic(client: &Client, options: &KafkaOptions, count: u32) -> Result<(), QueueError> {
    let name = &options.topic;
    let listed = bounded(options, "listing topics", client.list_topics()).await?;
    match listed.iter().find(|t| &t.name == name) {
        Some(topic) if topic.partitions.len() == count as usize => return Ok(()),
        Some(topic) => {
            return Err(QueueError::Config(format!(
                "[adapters.kafka] topic `{name}` has {} partitions but [queues] count is {count}: each queue is one \
                 partition; set count = {} on every node, or use a topic with {count} partitions",
                topic.partitions.len(),
                topic.partitions.len()
            )));
        }
        None if !options.create_topic => {
            return Err(QueueError::Config(format!(
                "[adapters.kafka] topic `{name}` does not exist on {}: create it with {count} partitions ([queues] \
                 count), or set create_topic = true",
                options.brokers.join(",")
            )));
        }
        None => {}
    }
    let controller = client.controller_client().map_err(|e| backend("reaching the controller", &e))?;
    let timeout_ms = i32::try_from(options.response_timeout.as_millis()).unwrap_or(i32::MAX);
    let partitions = i32::try_from(count).map_err(|_| QueueError::Config(format!("{count} queues")))?;
    let created = controller.create_topic(name.as_str(), partitions, options.replication_factor, timeout_ms);
    match bounded(options, &format!("creating topic `{name}`"), created).await {
        Ok(()) => tracing::info!(topic = %name, partitions, "kafka topic created"),
        // Another node created it first: check it as it is.
        Err(_) if topic_exists(client, options).await => {}
        Err(error) => return Err(error),
    }
    // A topic is seen by every broker shortly after it is created.
    let deadline = tokio::time::Instant::now() + options.response_timeout;
    while !topic_exists(client, options).await {
        if tokio::time::Instant::now() >= deadline {
            return Err(QueueError::Backend {
                adapter: NAME.into(),
                message: format!(
                    "topic `{name}` was created but its metadata did not show it within {:?}",
                    options.response_timeout
                ),
                transient: true,
            });
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Box::pin(topic(client, &KafkaOptions { create_topic: false, ..options.clone() }, count)).await
}

async fn topic_exists(client: &Client, options: &KafkaOptions) -> bool {
    bounded(options, "listing topics", client.list_topics())
        .await
        .is_ok_and(|topics| topics.iter().any(|t| t.name == options.topic))
}

/// The client of partition `n` of the topic.
pub(super) async fn partition(client: &Client, options: &KafkaOptions, n: u32) -> Result<PartitionClient, QueueError> {
    let partition = i32::try_from(n).map_err(|_| QueueError::Config(format!("partition {n}")))?;
    let made = client.partition_client(options.topic.as_str(), partition, UnknownTopicHandling::Retry);
    bounded(options, &format!("reaching partition {n} of topic `{}`", options.topic), made).await
}

/// Runs one request of the client within `response_timeout`.
pub(super) async fn bounded<T>(
    options: &KafkaOptions,
    doing: &str,
    request: impl Future<Output = Result<T, KafkaError>>,
) -> Result<T, QueueError> {
    match tokio::time::timeout(options.response_timeout, request).await {
        Ok(Ok(value)) => Ok(value),
        Ok(Err(error)) => Err(backend(doing, &error)),
        Err(_) => Err(QueueError::Backend {
            adapter: NAME.into(),
            message: format!(
                "{doing}: no answer within {:?} ([adapters.kafka] response_timeout)",
                options.response_timeout
            ),
            transient: true,
        }),
    }
}

/// The client's error as a queue error: transient unless the broker
/// refused the request itself for a reason a retry cannot change.
pub(super) fn backend(doing: &str, error: &KafkaError) -> QueueError {
    let transient = match error {
        KafkaError::ServerError { protocol_error, .. } => !matches!(
            protocol_error,
            ProtocolError::MessageTooLarge
                | ProtocolError::RecordListTooLarge
                | ProtocolError::InvalidRecord
                | ProtocolError::TopicAuthorizationFailed
                | ProtocolError::ClusterAuthorizationFailed
                | ProtocolError::SaslAuthenticationFailed
                | ProtocolError::InvalidReplicationFactor
                | ProtocolError::InvalidPartitions
        ),
        _ => true,
    };
    QueueError::Backend { adapter: NAME.into(), message: format!("{doing}: {error}"), transient }
}

/// The TLS configuration `tls_ca_file`, `tls_cert_file` and `tls_key_file`
/// describe.
fn tls(options: &KafkaOptions) -> Result<rustls::ClientConfig, QueueError> {
    let config = |e: crate::tls::TlsError| QueueError::Config(e.to_string());
    let roots = match &options.tls_ca_file {
        Some(ca) => crate::tls::roots("[adapters.kafka] tls_ca_file", ca).map_err(config)?,
        None => {
            let mut roots = rustls::RootCertStore::empty();
            let found = rustls_native_certs::load_native_certs();
            roots.add_parsable_certificates(found.certs);
            roots
        }
    };
    let builder = rustls::ClientConfig::builder_with_provider(crate::tls::provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| QueueError::Config(format!("[adapters.kafka] tls: {e}")))?
        .with_root_certificates(roots);
    match (&options.tls_cert_file, &options.tls_key_file) {
        (Some(cert), Some(key)) => {
            let chain = crate::tls::cert_chain("[adapters.kafka] tls_cert_file", cert).map_err(config)?;
            let key = crate::tls::private_key("[adapters.kafka] tls_key_file", key).map_err(config)?;
            builder
                .with_client_auth_cert(chain, key)
                .map_err(|e| QueueError::Config(format!("[adapters.kafka] tls_cert_file and tls_key_file: {e}")))
        }
        (None, None) => Ok(builder.with_no_client_auth()),
        _ => Err(QueueError::Config("[adapters.kafka] tls_cert_file and tls_key_file go together".into())),
    }
}

/// The SASL settings, the password from `TAILRACE_KAFKA_PASSWORD` first.
fn sasl(options: &KafkaOptions) -> Result<Option<SaslConfig>, QueueError> {
    let Some(mechanism) = options.sasl_mechanism else { return Ok(None) };
    let password = std::env::var(PASSWORD_ENV).ok().or_else(|| options.sasl_password.clone());
    let (Some(username), Some(password)) = (options.sasl_username.clone(), password) else {
        return Err(QueueError::Config(format!(
            "[adapters.kafka] sasl_mechanism needs sasl_username and a password (sasl_password or {PASSWORD_ENV})"
        )));
    };
    let credentials = Credentials::new(username, password);
    Ok(Some(match mechanism {
        SaslMechanism::Plain => SaslConfig::Plain(credentials),
        SaslMechanism::ScramSha256 => SaslConfig::ScramSha256(credentials),
        SaslMechanism::ScramSha512 => SaslConfig::ScramSha512(credentials),
    }))
}
