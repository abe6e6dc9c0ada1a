//! What the checks share: the adapter under test, a receiver wrapper that
//! acts like a pulling agent (records what it read, acks, saves the
//! checkpoint before shutting down), time limits on every call, and the
//! events the kit writes.

use std::collections::BTreeSet;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;

use super::{Claims, Failure};
use crate::queue::{Checkpointer, Fence, QueueAdapter, QueueAdapterFactory, QueueError, QueueMapper, QueueReceiver};
use crate::stream::{BatchContainer, Event, EventId, QueueId, SequenceToken, StreamId};

/// How long a check waits for containers to become readable, unless told.
pub(super) const READ_DEADLINE: Duration = Duration::from_secs(10);
/// The longest any single call of the adapter may take.
pub(super) const CALL_LIMIT: Duration = Duration::from_secs(30);
/// What the kit gives `initialize` and `shutdown`.
const RECEIVER_TIMEOUT: Duration = Duration::from_secs(5);

pub(super) fn fail(check: &'static str, message: impl Into<String>) -> Failure {
    Failure { check, message: message.into() }
}

/// Runs one call of the adapter within [`CALL_LIMIT`].
pub(super) async fn within<T>(
    check: &'static str,
    what: impl FnOnce() -> String,
    call: impl Future<Output = Result<T, QueueError>>,
) -> Result<T, Failure> {
    match tokio::time::timeout(CALL_LIMIT, call).await {
        Ok(Ok(value)) => Ok(value),
        Ok(Err(error)) => Err(fail(check, format!("{}: {error}", what()))),
        Err(_) => Err(fail(check, format!("{} did not answer within {CALL_LIMIT:?}", what()))),
    }
}

/// The adapter under test.
pub(super) struct Kit {
    pub(super) claims: Claims,
    pub(super) adapter: Arc<dyn QueueAdapter>,
    pub(super) checkpointer: Arc<dyn crate::queue::Checkpointer>,
    pub(super) mapper: QueueMapper,
    /// How long a check waits for containers to become readable.
    pub(super) read_deadline: Duration,
}

impl Kit {
    pub(super) async fn open<F, Fut>(claims: Claims, read_deadline: Duration, open: &F) -> Result<Self, Failure>
    where
        F: Fn() -> Fut,
        Fut: Future<Output = Result<Arc<dyn QueueAdapterFactory>, QueueError>>,
    {
        const CHECK: &str = "setup";
        let factory = within(CHECK, || "opening the factory".into(), open()).await?;
        let adapter = within(CHECK, || "create_adapter".into(), factory.create_adapter()).await?;
        let checkpointer = within(CHECK, || "create_checkpointer".into(), factory.create_checkpointer()).await?;
        Ok(Self { claims, adapter, checkpointer, mapper: factory.queue_mapper(), read_deadline })
    }

    /// Enqueues one batch, naming the stream and first event on failure.
    pub(super) async fn write(
        &self,
        check: &'static str,
        stream: &StreamId,
        batch: Vec<Event>,
    ) -> Result<SequenceToken, Failure> {
        let first = batch.first().map(|e| e.id.to_string()).unwrap_or_default();
        let queue = self.mapper.queue_for(stream);
        within(
            check,
            || format!("enqueue of {first} to stream {stream} (queue {queue})"),
            self.adapter.enqueue(stream, batch),
        )
        .await
    }

    /// A receiver of `queue`, created and initialized.
    pub(super) async fn reader(&self, check: &'static str, queue: QueueId) -> Result<Reader, Failure> {
        let mut inner =
            within(check, || format!("create_receiver({queue})"), self.adapter.create_receiver(queue, Fence::NONE))
                .await?;
        within(check, || format!("initialize of the receiver of queue {queue}"), inner.initialize(RECEIVER_TIMEOUT))
            .await?;
        Ok(Reader {
            check,
            queue,
            inner,
            checkpointer: self.checkpointer.clone(),
            read_deadline: self.read_deadline,
            read: BTreeSet::new(),
            done: BTreeSet::new(),
        })
    }
}

/// A receiver driven the way a pulling agent drives it.
pub(super) struct Reader {
    pub(super) check: &'static str,
    pub(super) queue: QueueId,
    pub(super) inner: Box<dyn QueueReceiver>,
    checkpointer: Arc<dyn Checkpointer>,
    read_deadline: Duration,
    /// Every token read so far, of any stream.
    read: BTreeSet<SequenceToken>,
    /// Tokens acked or reported failed.
    done: BTreeSet<SequenceToken>,
}

impl Reader {
    /// One `read(max)`.
    pub(super) async fn read(&mut self, max: usize) -> Result<Vec<Arc<BatchContainer>>, Failure> {
        let queue = self.queue;
        let batch = within(self.check, || format!("read({max}) on queue {queue}"), self.inner.read(max)).await?;
        self.read.extend(batch.iter().map(|b| b.token));
        Ok(batch)
    }

    /// Reads until `until` holds for the containers of `namespace` read so
    /// far (others are read and ignored), or fails at the deadline.
    pub(super) async fn read_while(
        &mut self,
        namespace: &str,
        until: impl Fn(&[Arc<BatchContainer>]) -> bool,
        waiting_for: impl Fn(&[Arc<BatchContainer>]) -> String,
    ) -> Result<Vec<Arc<BatchContainer>>, Failure> {
        let patience = self.read_deadline;
        let deadline = tokio::time::Instant::now() + patience;
        let mut got = Vec::new();
        while !until(&got) {
            if tokio::time::Instant::now() >= deadline {
                return Err(fail(
                    self.check,
                    format!("queue {}: {} within {patience:?}; read {}", self.queue, waiting_for(&got), show(&got)),
                ));
            }
            let batch = self.read(64).await?;
            if batch.is_empty() {
                // Not every adapter waits for data inside `read`.
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            got.extend(batch.into_iter().filter(|b| b.stream.namespace() == namespace));
        }
        Ok(got)
    }

    /// Reads until `want` containers of `namespace` came back.
    pub(super) async fn read_n(&mut self, namespace: &str, want: usize) -> Result<Vec<Arc<BatchContainer>>, Failure> {
        self.read_while(
            namespace,
            |got| got.len() >= want,
            |got| format!("only {} of {want} containers came back", got.len()),
        )
        .await
    }

    /// Reads until every token of `want` came back (others may too).
    pub(super) async fn read_tokens(
        &mut self,
        namespace: &str,
        want: &[SequenceToken],
    ) -> Result<Vec<Arc<BatchContainer>>, Failure> {
        let all = |got: &[Arc<BatchContainer>]| want.iter().all(|t| got.iter().any(|b| b.token == *t));
        let missing = |got: &[Arc<BatchContainer>]| {
            let missing: Vec<String> =
                want.iter().filter(|t| !got.iter().any(|b| b.token == **t)).map(|t| t.to_string()).collect();
            format!("the containers {} did not come back", missing.join(", "))
        };
        self.read_while(namespace, all, missing).await
    }

    /// Acks `tokens`.
    pub(super) async fn ack(&mut self, tokens: &[SequenceToken]) -> Result<(), Failure> {
        let queue = self.queue;
        within(self.check, || format!("ack of {} on queue {queue}", list(tokens)), self.inner.delivered(tokens))
            .await?;
        self.done.extend(tokens.iter().copied());
        Ok(())
    }

    /// Reports `tokens` failed (dead-lettered).
    pub(super) async fn fail_tokens(&mut self, tokens: &[SequenceToken]) -> Result<(), Failure> {
        let queue = self.queue;
        within(self.check, || format!("failed({}) on queue {queue}", list(tokens)), self.inner.failed(tokens)).await?;
        self.done.extend(tokens.iter().copied());
        Ok(())
    }

    /// Acks everything read and not yet acked, of every stream.
    pub(super) async fn ack_everything(&mut self) -> Result<(), Failure> {
        let open: Vec<SequenceToken> = self.read.difference(&self.done).copied().collect();
        if open.is_empty() { Ok(()) } else { self.ack(&open).await }
    }

    /// Saves the checkpoint an agent would: the newest token at or below
    /// which everything this receiver read is done.
    pub(super) async fn save_checkpoint(&mut self) -> Result<(), Failure> {
        let mut newest = None;
        for token in &self.read {
            if !self.done.contains(token) {
                break;
            }
            newest = Some(*token);
        }
        let Some(token) = newest else { return Ok(()) };
        let queue = self.queue;
        match tokio::time::timeout(CALL_LIMIT, self.checkpointer.save(queue, token, Fence::NONE)).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(error)) => Err(fail(self.check, format!("saving checkpoint {token} of queue {queue}: {error}"))),
            Err(_) => Err(fail(self.check, format!("saving checkpoint {token} of queue {queue} did not answer"))),
        }
    }

    /// Shuts the receiver down (after saving the checkpoint, as the agent
    /// does).
    pub(super) async fn shutdown(&mut self) -> Result<(), Failure> {
        self.save_checkpoint().await?;
        let queue = self.queue;
        within(
            self.check,
            || format!("shutdown of the receiver of queue {queue}"),
            self.inner.shutdown(RECEIVER_TIMEOUT),
        )
        .await
    }

    /// Acks everything read, saves the checkpoint and shuts down.
    pub(super) async fn close(mut self) -> Result<(), Failure> {
        self.ack_everything().await?;
        self.shutdown().await
    }
}

/// Containers as `token stream [first event id …]`, for messages.
pub(super) fn show(batches: &[Arc<BatchContainer>]) -> String {
    let shown: Vec<String> = batches
        .iter()
        .take(12)
        .map(|b| format!("{} {} [{}]", b.token, b.stream, b.events.first().map(|e| e.id.as_str()).unwrap_or("")))
        .collect();
    let more = batches.len().saturating_sub(12);
    if more > 0 { format!("[{}, … {more} more]", shown.join(", ")) } else { format!("[{}]", shown.join(", ")) }
}

pub(super) fn list(tokens: &[SequenceToken]) -> String {
    let shown: Vec<String> = tokens.iter().map(|t| t.to_string()).collect();
    format!("[{}]", shown.join(", "))
}

pub(super) fn tokens(batches: &[Arc<BatchContainer>]) -> Vec<SequenceToken> {
    batches.iter().map(|b| b.token).collect()
}

/// Small text events `{prefix}{i}` with fixed timestamps.
pub(super) fn events(prefix: &str, range: std::ops::Range<u64>) -> Vec<Event> {
    range
        .map(|i| Event {
            id: EventId::new(format!("{prefix}{i}")),
            timestamp_ms: 1_700_000_000_000 + i,
            payload: Bytes::from(format!("conformance event {prefix}{i} with some text to take some room")),
        })
        .collect()
}

/// Tokens must increase within one queue's reads.
pub(super) fn check_increasing(
    check: &'static str,
    queue: QueueId,
    batches: &[Arc<BatchContainer>],
) -> Result<(), Failure> {
    for pair in batches.windows(2) {
        if pair[0].token >= pair[1].token {
            return Err(fail(
                check,
                format!(
                    "queue {queue}: tokens must increase, but {} (stream {}) was followed by {} (stream {})",
                    pair[0].token, pair[0].stream, pair[1].token, pair[1].stream
                ),
            ));
        }
    }
    Ok(())
}
