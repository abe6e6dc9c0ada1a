//! The receiver of one JetStream queue: a durable pull consumer of its own,
//! messages handed out strictly by sequence, acks, purges and rewinds. See
//! the adapter module for the whole design.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_nats::jetstream::{self, consumer, stream};
use async_trait::async_trait;
use futures::{FutureExt, StreamExt, TryStreamExt};
use tailrace::queue::{Checkpointer, QueueError, QueueReceiver};
use tailrace::{BatchContainer, QueueId, SequenceToken};

use crate::adapter::{JetStreamOptions, NAME, StreamCheckpointer, backend, decode};

/// How long one of the stream's pull requests waits on the server; the
/// client makes the next one as the last runs low or ends.
const PULL_EXPIRES: Duration = Duration::from_secs(10);

/// Reads one queue through its own durable pull consumer.
pub struct JetStreamReceiver {
    queue: QueueId,
    stream: stream::Stream,
    options: JetStreamOptions,
    checkpoints: Arc<StreamCheckpointer>,
    consumer: Option<consumer::Consumer<consumer::pull::Config>>,
    /// The consumer's messages: pull requests of `pull_batch` kept in
    /// flight by the client (made again after an error).
    messages: Option<consumer::pull::Stream>,
    /// Messages read and not yet acked, by sequence (bounded by the
    /// consumer's `max_ack_pending`).
    held: BTreeMap<u64, jetstream::Message>,
    /// The newest message released and not acked yet, and how many
    /// released messages wait for its ack.
    ack_due: Option<jetstream::Message>,
    unacked: usize,
    /// Messages fetched and not yet handed out (bounded the same way).
    ahead: BTreeMap<u64, jetstream::Message>,
    /// The sequence to hand out next.
    next: u64,
    last_purge: Instant,
    shut_down: bool,
}

impl JetStreamReceiver {
    pub(crate) fn new(
        queue: QueueId,
        stream: stream::Stream,
        options: JetStreamOptions,
        checkpoints: Arc<StreamCheckpointer>,
    ) -> Self {
        Self {
            queue,
            stream,
            options,
            checkpoints,
            consumer: None,
            messages: None,
            held: BTreeMap::new(),
            ack_due: None,
            unacked: 0,
            ahead: BTreeMap::new(),
            next: 1,
            last_purge: Instant::now(),
            shut_down: false,
        }
    }

    fn consumer(&self) -> Result<&consumer::Consumer<consumer::pull::Config>, QueueError> {
        if self.shut_down {
            return Err(QueueError::ShutDown(self.queue));
        }
        self.consumer
            .as_ref()
            .ok_or_else(|| backend(&format!("reading {}", self.queue), "the receiver was not initialized"))
    }

    /// Where the previous owners got to: just after the stored checkpoint.
    /// Their consumers are deleted, which fences their receivers. (A
    /// consumer's ack floor is not used: acks with gaps can move it past
    /// containers that were never acknowledged.)
    async fn take_over(&mut self) -> Result<u64, QueueError> {
        let queue = self.queue;
        let mut old = Vec::new();
        let mut consumers = self.stream.consumers();
        while let Some(info) =
            consumers.try_next().await.map_err(|e| backend(&format!("listing the consumers of {queue}"), e))?
        {
            old.push(info.name);
        }
        for name in old {
            // Gone already is fine: another receiver took it first.
            let _ = self.stream.delete_consumer(&name).await;
        }
        let stored = self
            .checkpoints
            .load(queue)
            .await
            .map_err(|e| backend(&format!("loading the checkpoint of {queue}"), e))?;
        Ok(stored.map_or(0, |t| t.major))
    }

    /// Purges the messages the stored checkpoint passed (now and then).
    async fn purge(&mut self) {
        if self.last_purge.elapsed() < self.options.purge_every {
            return;
        }
        self.last_purge = Instant::now();
        let Ok(Some(checkpoint)) = self.checkpoints.load(self.queue).await else { return };
        if let Err(error) = self.stream.purge().sequence(checkpoint.major.saturating_add(1)).await {
            eprintln!("queue {}: purging up to {checkpoint} failed: {error}", self.queue);
        }
    }

    /// Takes up to `max` messages from the consumer's stream: waits up to
    /// `read_wait` for the first, then takes only what has arrived. A
    /// stream that failed is dropped (and made again by the next read);
    /// a deleted consumer means a newer receiver fenced this one.
    async fn pull(&mut self, max: usize) -> Result<(), QueueError> {
        let queue = self.queue;
        if self.messages.is_none() {
            let stream = self
                .consumer()?
                .stream()
                .max_messages_per_batch(self.options.pull_batch)
                .expires(PULL_EXPIRES)
                .messages()
                .await
                .map_err(|e| backend(&format!("reading {queue}"), e))?;
            self.messages = Some(stream);
        }
        let Some(stream) = self.messages.as_mut() else { return Ok(()) };
        let mut got = Vec::new();
        // With messages already in hand, only what has arrived is taken.
        let wait = if self.ahead.is_empty() { self.options.read_wait } else { Duration::ZERO };
        let mut next = match tokio::time::timeout(wait, stream.next()).await {
            Ok(first) => first,
            Err(_) => return Ok(()),
        };
        let mut failure = None;
        loop {
            match next {
                Some(Ok(message)) => got.push(message),
                Some(Err(error)) => {
                    failure = Some(error);
                    break;
                }
                None => {
                    self.messages = None;
                    break;
                }
            }
            if got.len() >= max {
                break;
            }
            match stream.next().now_or_never() {
                Some(message) => next = message,
                None => break,
            }
        }
        if let Some(error) = failure {
            self.messages = None;
            if error.kind() == consumer::pull::MessagesErrorKind::ConsumerDeleted {
                return Err(QueueError::Fenced(queue));
            }
            // What was taken is handed out; the next read makes a new stream.
            eprintln!("queue {queue}: reading: {error}; pulling again");
        }
        for message in got {
            let sequence = message.info().map_err(|e| backend(&format!("reading {queue}"), e))?.stream_sequence;
            if sequence < self.next {
                // Handed out already (a late redelivery): done with it.
                let _ = message.ack().await;
            } else {
                self.ahead.insert(sequence, message);
            }
        }
        Ok(())
    }

    /// Hands out up to `max` containers strictly in sequence order. A gap
    /// (a message lost in flight, say when the stream was made again
    /// after an error) is filled with a direct get, as is everything up to
    /// `delivered`; the late redelivery of such a message is skipped.
    async fn hand_out(&mut self, max: usize, delivered: u64) -> Result<Vec<Arc<BatchContainer>>, QueueError> {
        let queue = self.queue;
        let mut out = Vec::new();
        while out.len() < max {
            let sequence = self.next;
            let first = self.ahead.keys().next().copied();
            let message = if first == Some(sequence) { self.ahead.remove(&sequence) } else { None };
            if message.is_none() && first.is_none() && sequence > delivered {
                break;
            }
            let container = match &message {
                Some(message) => decode(sequence, &message.payload),
                None => match self.stream.get_raw_message(sequence).await {
                    Ok(stored) => decode(sequence, &stored.payload),
                    Err(e) if e.kind() == stream::LastRawMessageErrorKind::NoMessageFound => {
                        self.next += 1;
                        continue;
                    }
                    Err(e) => return Err(backend(&format!("reading {queue} at {sequence}"), e)),
                },
            };
            self.next += 1;
            match container {
                Ok(container) => {
                    out.push(Arc::new(container));
                    if let Some(message) = message {
                        self.held.insert(sequence, message);
                    }
                }
                Err(error) => eprintln!("queue {queue}: {error}; skipped"),
            }
        }
        Ok(out)
    }

    /// Acks are flow control (`max_ack_pending`), not where the next owner
    /// starts (that is the checkpoint's business), so one ack of the
    /// newest released message releases every older one too (`AckAll`),
    /// and it is sent once `ack_every` messages wait for it, or when the
    /// queue runs dry.
    async fn ack(&mut self, tokens: &[SequenceToken]) {
        // An unknown token (never read here, or released already) is fine.
        let Some(top) = tokens.iter().map(|t| t.major).filter(|s| self.held.contains_key(s)).max() else { return };
        let newer = self.held.split_off(&(top + 1));
        let mut released = std::mem::replace(&mut self.held, newer);
        self.unacked += released.len();
        self.ack_due = released.remove(&top);
        if self.unacked >= self.options.ack_every {
            self.send_ack().await;
        }
    }

    /// Sends the ack that is due, if one is.
    async fn send_ack(&mut self) {
        let Some(message) = self.ack_due.take() else { return };
        self.unacked = 0;
        // A lost ack only means a redelivery, which is acked and skipped.
        if let Err(error) = message.ack().await {
            eprintln!(
                "queue {}: acking up to {:?} failed: {error}",
                self.queue,
                message.info().map(|i| i.stream_sequence)
            );
        }
    }
}

#[async_trait]
impl QueueReceiver for JetStreamReceiver {
    async fn initialize(&mut self, timeout: Duration) -> Result<(), QueueError> {
        let deadline = Instant::now() + timeout;
        let after = loop {
            match self.take_over().await {
                Ok(after) => break after,
                Err(error) if Instant::now() < deadline => {
                    eprintln!("queue {}: {error}; retrying", self.queue);
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                Err(error) => return Err(error),
            }
        };
        let name = format!("{}_{}_{}", self.options.prefix, self.queue, unique());
        let config = consumer::pull::Config {
            durable_name: Some(name.clone()),
            deliver_policy: if after == 0 {
                consumer::DeliverPolicy::All
            } else {
                consumer::DeliverPolicy::ByStartSequence { start_sequence: after + 1 }
            },
            ack_policy: consumer::AckPolicy::All,
            // Resuming is by checkpoint; a timed redelivery only frees a
            // message lost in flight (it is acked and skipped).
            ack_wait: Duration::from_secs(30),
            max_ack_pending: self.options.max_ack_pending,
            ..Default::default()
        };
        let consumer =
            self.stream.create_consumer(config).await.map_err(|e| backend(&format!("creating consumer {name}"), e))?;
        self.held.clear();
        self.ack_due = None;
        self.unacked = 0;
        self.ahead.clear();
        self.next = after + 1;
        self.messages = None;
        self.consumer = Some(consumer);
        Ok(())
    }

    async fn read(&mut self, max: usize) -> Result<Vec<Arc<BatchContainer>>, QueueError> {
        let queue = self.queue;
        let max = max.max(1);
        if self.ahead.len() < max {
            self.pull(max - self.ahead.len()).await?;
        }
        let mut out = self.hand_out(max, 0).await?;
        if out.is_empty() {
            // Idle, fenced (a newer receiver deleted our consumer and the
            // server then simply sends nothing), or the newest messages
            // were lost in flight: the consumer's info tells which.
            let info = match self.consumer()?.get_info().await {
                Ok(info) => info,
                Err(error) if error.to_string().contains("not found") => return Err(QueueError::Fenced(queue)),
                Err(error) => return Err(backend(&format!("checking the consumer of {queue}"), error)),
            };
            out = self.hand_out(max, info.delivered.stream_sequence).await?;
        }
        if out.is_empty() {
            self.send_ack().await;
            self.purge().await;
        }
        Ok(out)
    }

    async fn delivered(&mut self, tokens: &[SequenceToken]) -> Result<(), QueueError> {
        self.ack(tokens).await;
        self.purge().await;
        Ok(())
    }

    /// Dead-lettered containers are released: their copy is in the sink.
    async fn failed(&mut self, tokens: &[SequenceToken]) -> Result<(), QueueError> {
        self.ack(tokens).await;
        Ok(())
    }

    async fn rewind(&mut self, from: SequenceToken, max: usize) -> Result<Vec<Arc<BatchContainer>>, QueueError> {
        let queue = self.queue;
        self.consumer()?;
        let state = self.stream.info().await.map_err(|e| backend(&format!("rewinding {queue}"), e))?.state.clone();
        if from.major < state.first_sequence && state.first_sequence > 1 {
            return Err(QueueError::CannotRewind {
                adapter: NAME.into(),
                queue,
                requested: from,
                reason: format!(
                    "the stream now starts at sequence {} (older messages were purged)",
                    state.first_sequence
                ),
                oldest: Some(SequenceToken::new(state.first_sequence, 0)),
            });
        }
        let mut out = Vec::new();
        let mut sequence = from.major.max(1);
        while out.len() < max && sequence <= state.last_sequence {
            match self.stream.get_raw_message(sequence).await {
                Ok(message) => match decode(sequence, &message.payload) {
                    Ok(container) => out.push(Arc::new(container)),
                    Err(error) => eprintln!("queue {queue}: {error}; skipped"),
                },
                // Purged or deleted meanwhile: the next one.
                Err(error) if error.kind() == stream::LastRawMessageErrorKind::NoMessageFound => {}
                Err(error) => return Err(backend(&format!("rewinding {queue} at {sequence}"), error)),
            }
            sequence += 1;
        }
        Ok(out)
    }

    async fn shutdown(&mut self, _timeout: Duration) -> Result<(), QueueError> {
        // The consumer stays until the next owner deletes it and starts
        // after the checkpoint.
        self.send_ack().await;
        self.shut_down = true;
        self.messages = None;
        self.held.clear();
        self.ahead.clear();
        Ok(())
    }
}

/// A name part no other receiver (of this or another process) uses.
fn unique() -> String {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0);
    format!("{}_{nanos}_{n}", std::process::id())
}
