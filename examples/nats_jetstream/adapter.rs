//! A tailrace queue adapter over NATS JetStream, written only against
//! tailrace's public API.
//!
//! - **Queues**: tailrace queue `n` is the JetStream stream `{prefix}_q{n}`
//!   with the one subject `{prefix}.q{n}`, file storage, `DiscardNew` when
//!   `max_messages` is set: a full queue refuses a publish, which `enqueue`
//!   answers with `QueueError::Full` (back-pressure, nothing dropped).
//! - **Containers**: one enqueued batch is one message (JSON: the stream id
//!   and the events; a UTF-8 payload as text `p`, any other in base64 as
//!   `b64`). Its token is the message's stream sequence, `(seq, 0)`. A
//!   text payload is read back as a slice of the message, not a copy.
//! - **Connections**: two. Publishes and checkpoints go through one, the
//!   receivers' consumers through the other: on one shared connection the
//!   messages flowing to the receivers delayed the publish acks producers
//!   wait for (measured: a node moved 12-15% fewer events).
//! - **Receivers**: a durable pull consumer per receiver, acked with
//!   `AckAll`. `initialize` deletes the queue's previous consumers and
//!   creates its own just after the stored checkpoint: what the last owner
//!   read but never acknowledged is delivered again, in order, and the old
//!   receiver is fenced (its consumer is gone, so its reads fail).
//! - **Reads** take from a stream of pull requests the client keeps in
//!   flight (`pull_batch` messages each): a read waits up to `read_wait` for
//!   the first message and then takes only what has arrived, so a message
//!   is handed out as soon as it lands. Messages are handed out strictly in
//!   sequence order; a gap (a message lost in flight, say when a stream was
//!   made again after an error) is filled with a direct get, and the late
//!   redelivery is skipped.
//! - **Acks** are flow control for the consumer (`max_ack_pending`); where a
//!   new owner starts is the checkpoint's call. So one ack of the newest
//!   message `delivered` released releases every older one too, and it is
//!   sent once `ack_every` messages wait for it or a read finds the queue
//!   dry. Once the stored checkpoint has passed messages they are purged,
//!   which gives room back to producers (retention).
//! - **Rewind**: by sequence, with direct gets of the messages still held;
//!   a sequence already purged is answered with `CannotRewind`.
//! - **Checkpoints** live in the stream `{prefix}_checkpoints`, which keeps
//!   the last message of each queue's subject.

use std::borrow::Cow;
use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::{self, stream};
use async_trait::async_trait;
use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use bytes::Bytes;
use serde::{Deserialize, Serialize};
use tailrace::queue::{
    CheckpointError, Checkpointer, Direction, Fence, QueueAdapter, QueueAdapterFactory, QueueError, QueueMapper,
    QueueReceiver,
};
use tailrace::{BatchContainer, Event, EventId, QueueId, SequenceToken, StreamId};

use crate::receiver::JetStreamReceiver;

pub(crate) const NAME: &str = "nats-jetstream";

/// Settings of the JetStream adapter.
#[derive(Clone, Debug)]
pub struct JetStreamOptions {
    /// The server, `nats://127.0.0.1:4222`.
    pub url: String,
    /// Streams, subjects, consumers and the checkpoint bucket start with it.
    pub prefix: String,
    /// Most messages (batches) one queue holds; `None` is unbounded.
    pub max_messages: Option<i64>,
    /// How long a read with nothing new waits for a message.
    pub read_wait: Duration,
    /// Messages per pull request a receiver keeps in flight (the most it
    /// holds fetched and not yet read is about one and a half of these).
    pub pull_batch: usize,
    /// How often a receiver purges what the checkpoint passed.
    pub purge_every: Duration,
    /// Most containers one receiver holds unacknowledged.
    pub max_ack_pending: i64,
    /// Released containers a receiver acks at once (one `AckAll`); a queue
    /// that runs dry acks what it released at once.
    pub ack_every: usize,
}

impl JetStreamOptions {
    /// Defaults for the server at `url`.
    pub fn new(url: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            prefix: "tailrace".into(),
            max_messages: None,
            read_wait: Duration::from_millis(100),
            pull_batch: 256,
            purge_every: Duration::from_secs(1),
            max_ack_pending: 10_000,
            ack_every: 100,
        }
    }
}

/// A JetStream failure as a queue error.
pub(crate) fn backend(doing: &str, error: impl std::fmt::Display) -> QueueError {
    QueueError::Backend { adapter: NAME.into(), message: format!("{doing}: {error}"), transient: true }
}

/// Everything built from one connection: the adapter and its checkpointer.
pub struct JetStreamFactory {
    adapter: Arc<JetStreamAdapter>,
    checkpoints: Arc<StreamCheckpointer>,
}

impl JetStreamFactory {
    /// Connects twice (publishes and checkpoints on one connection, the
    /// receivers on the other), and creates the queues' streams and the
    /// checkpoint stream if they do not exist yet.
    pub async fn connect(queue_count: u32, options: JetStreamOptions) -> Result<Self, QueueError> {
        let connect = || async {
            async_nats::connect(&options.url).await.map_err(|e| backend(&format!("connecting to {}", options.url), e))
        };
        let client = connect().await?;
        let reader = connect().await?;
        let js = jetstream::new(client.clone());
        let reader_js = jetstream::new(reader.clone());
        let mapper = QueueMapper::new(queue_count);
        let mut streams = Vec::new();
        for queue in mapper.all_queues() {
            let config = stream::Config {
                name: stream_name(&options.prefix, queue),
                subjects: vec![subject(&options.prefix, queue)],
                storage: stream::StorageType::File,
                retention: stream::RetentionPolicy::Limits,
                discard: stream::DiscardPolicy::New,
                max_messages: options.max_messages.unwrap_or(-1),
                ..Default::default()
            };
            // Bound to the receivers' connection: their consumers, direct
            // gets and purges go through it.
            let created = reader_js
                .get_or_create_stream(config)
                .await
                .map_err(|e| backend(&format!("creating the stream of {queue}"), e))?;
            streams.push(created);
        }
        let name = format!("{}_checkpoints", options.prefix);
        let config = stream::Config {
            name: name.clone(),
            subjects: vec![format!("{}.checkpoint.*", options.prefix)],
            storage: stream::StorageType::File,
            max_messages_per_subject: 1,
            ..Default::default()
        };
        let store =
            js.get_or_create_stream(config).await.map_err(|e| backend(&format!("creating the stream {name}"), e))?;
        let checkpoints = Arc::new(StreamCheckpointer { js: js.clone(), store, prefix: options.prefix.clone() });
        let adapter = Arc::new(JetStreamAdapter {
            clients: [client, reader],
            js,
            mapper,
            streams,
            options,
            checkpoints: checkpoints.clone(),
        });
        Ok(Self { adapter, checkpoints })
    }

    /// The adapter (for producers in this process).
    pub fn adapter(&self) -> Arc<JetStreamAdapter> {
        self.adapter.clone()
    }
}

#[async_trait]
impl QueueAdapterFactory for JetStreamFactory {
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
        Ok(self.checkpoints.clone())
    }
}

fn stream_name(prefix: &str, queue: QueueId) -> String {
    format!("{prefix}_{queue}")
}

fn subject(prefix: &str, queue: QueueId) -> String {
    format!("{prefix}.{queue}")
}

/// One batch as it travels in a message.
#[derive(Serialize)]
struct WireOut<'a> {
    namespace: &'a str,
    key: &'a str,
    events: Vec<EventOut<'a>>,
}

#[derive(Serialize)]
struct EventOut<'a> {
    id: &'a str,
    ts: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    p: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    b64: Option<String>,
}

/// The same, read back borrowing from the message.
#[derive(Deserialize)]
struct WireIn<'a> {
    #[serde(borrow)]
    namespace: Cow<'a, str>,
    #[serde(borrow)]
    key: Cow<'a, str>,
    #[serde(borrow)]
    events: Vec<EventIn<'a>>,
}

#[derive(Deserialize)]
struct EventIn<'a> {
    #[serde(borrow)]
    id: Cow<'a, str>,
    ts: u64,
    #[serde(borrow, default, deserialize_with = "borrowed")]
    p: Option<Cow<'a, str>>,
    #[serde(borrow, default, deserialize_with = "borrowed")]
    b64: Option<Cow<'a, str>>,
}

/// A string without escapes borrowed from the message: serde borrows a
/// `Cow<str>` field, but copies one inside an `Option` into a `String`.
fn borrowed<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<Option<Cow<'de, str>>, D::Error> {
    #[derive(Deserialize)]
    struct Text<'a>(#[serde(borrow)] Cow<'a, str>);
    Ok(Option::<Text>::deserialize(deserializer)?.map(|text| text.0))
}

fn encode(stream: &StreamId, events: &[Event]) -> Result<Bytes, QueueError> {
    let events: Vec<EventOut> = events
        .iter()
        .map(|e| match std::str::from_utf8(&e.payload) {
            Ok(text) => EventOut { id: e.id.as_str(), ts: e.timestamp_ms, p: Some(text), b64: None },
            Err(_) => {
                EventOut { id: e.id.as_str(), ts: e.timestamp_ms, p: None, b64: Some(STANDARD.encode(&e.payload)) }
            }
        })
        .collect();
    // Sized for the usual batch (text without escapes), so that the buffer
    // is not grown and copied as it fills.
    let size = 64 + stream.namespace().len() + stream.key().len();
    let mut body = Vec::with_capacity(events.iter().fold(size, |n, e| n + 40 + e.id.len() + e.p.map_or(0, str::len)));
    serde_json::to_writer(&mut body, &WireOut { namespace: stream.namespace(), key: stream.key(), events })
        .map(|()| Bytes::from(body))
        .map_err(|e| QueueError::Config(format!("encoding a batch of {stream}: {e}")))
}

/// The container in message `sequence`, whose body is `data`.
pub(crate) fn decode(sequence: u64, data: &Bytes) -> Result<BatchContainer, String> {
    let wire: WireIn =
        serde_json::from_slice(data).map_err(|e| format!("message {sequence} is not a tailrace batch: {e}"))?;
    let mut events = Vec::with_capacity(wire.events.len());
    for event in wire.events {
        let payload = match (event.p, event.b64) {
            (Some(Cow::Borrowed(text)), None) => data.slice_ref(text.as_bytes()),
            (Some(Cow::Owned(text)), None) => Bytes::from(text),
            (None, Some(b64)) => STANDARD
                .decode(b64.as_bytes())
                .map_err(|e| format!("message {sequence}, event {}: {e}", event.id))?
                .into(),
            _ => return Err(format!("message {sequence}, event {}: needs exactly one of `p` and `b64`", event.id)),
        };
        events.push(Event { id: EventId::new(event.id.as_ref()), timestamp_ms: event.ts, payload });
    }
    Ok(BatchContainer {
        stream: StreamId::new(wire.namespace, wire.key),
        token: SequenceToken::new(sequence, 0),
        events,
    })
}

/// Writes batches to the queues' streams and hands out receivers.
pub struct JetStreamAdapter {
    /// The publishers' connection and the receivers'.
    clients: [async_nats::Client; 2],
    js: jetstream::Context,
    mapper: QueueMapper,
    streams: Vec<stream::Stream>,
    options: JetStreamOptions,
    checkpoints: Arc<StreamCheckpointer>,
}

impl JetStreamAdapter {
    fn stream(&self, queue: QueueId) -> Result<&stream::Stream, QueueError> {
        self.streams.get(queue.0 as usize).ok_or_else(|| {
            QueueError::Config(format!("queue {queue} does not exist (there are {})", self.streams.len()))
        })
    }
}

#[async_trait]
impl QueueAdapter for JetStreamAdapter {
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
        let body = encode(stream, &events)?;
        let sent = self.js.publish(subject(&self.options.prefix, queue), body).await;
        let ack = match sent {
            Ok(pending) => pending.await,
            Err(e) => return Err(backend(&format!("publishing to {queue}"), e)),
        };
        match ack {
            Ok(ack) => Ok(SequenceToken::new(ack.sequence, 0)),
            Err(e) if e.to_string().contains("maximum messages") || e.to_string().contains("maximum bytes") => {
                let capacity = self.options.max_messages.unwrap_or(0).max(0) as usize;
                Err(QueueError::Full { queue, capacity })
            }
            Err(e) => Err(backend(&format!("publishing to {queue}"), e)),
        }
    }

    async fn create_receiver(&self, queue: QueueId, _fence: Fence) -> Result<Box<dyn QueueReceiver>, QueueError> {
        let stream = self.stream(queue)?.clone();
        Ok(Box::new(JetStreamReceiver::new(queue, stream, self.options.clone(), self.checkpoints.clone())))
    }

    async fn close(&self) -> Result<(), QueueError> {
        for client in &self.clients {
            client.flush().await.map_err(|e| backend("flushing a connection", e))?;
        }
        Ok(())
    }
}

/// Checkpoints in a stream of their own that keeps the last message of
/// each subject `{prefix}.checkpoint.q{n}` (what a key-value bucket is).
pub struct StreamCheckpointer {
    js: jetstream::Context,
    store: stream::Stream,
    prefix: String,
}

impl StreamCheckpointer {
    fn subject(&self, queue: QueueId) -> String {
        format!("{}.checkpoint.{queue}", self.prefix)
    }
}

#[async_trait]
impl Checkpointer for StreamCheckpointer {
    async fn load(&self, queue: QueueId) -> Result<Option<SequenceToken>, CheckpointError> {
        let value = match self.store.get_last_raw_message_by_subject(&self.subject(queue)).await {
            Ok(message) => message.payload,
            Err(e) if e.kind() == stream::LastRawMessageErrorKind::NoMessageFound => return Ok(None),
            Err(e) => return Err(CheckpointError::Backend(format!("loading the checkpoint of {queue}: {e}"))),
        };
        let text = String::from_utf8_lossy(&value);
        text.parse().map(Some).map_err(|e| CheckpointError::Backend(format!("checkpoint of {queue}: {e}")))
    }

    async fn save(&self, queue: QueueId, token: SequenceToken, _fence: Fence) -> Result<(), CheckpointError> {
        let failed = |e: &dyn std::fmt::Display| CheckpointError::Backend(format!("saving {token} for {queue}: {e}"));
        let pending =
            self.js.publish(self.subject(queue), Bytes::from(token.to_string())).await.map_err(|e| failed(&e))?;
        pending.await.map(|_| ()).map_err(|e| failed(&e))
    }
}
