//! The archiver: the run log store's one writer, as the implicit
//! subscriber of the `logs` namespace, and the read-only view the edge
//! gets. What a run's stream carries is `run_stream`'s.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use parking_lot::Mutex;
use tokio::time::Instant;

use super::run_stream::{Contents, batch_fingerprint};
use super::{Append, InvalidName, RunInfo, RunKey, RunLogStore, RunSummary, StoreError};
use crate::pubsub::{
    ConsumerError, ConsumerFactory, Delivery, DeliveryOutcome, StartPosition, StreamConsumer, SubscriptionInfo,
};
use crate::stream::{SequenceToken, StreamId};
use crate::telemetry;

/// The run log store as the edge sees it: read-only. The archiver is the
/// store's one writer; a reader comes from [`Archiver::reader`].
#[derive(Clone)]
pub struct RunLogReader {
    store: Arc<dyn RunLogStore>,
}

impl RunLogReader {
    /// See [`RunLogStore::info`].
    pub async fn info(&self, run: &RunKey) -> Result<Option<RunInfo>, StoreError> {
        self.store.info(run).await
    }

    /// See [`RunLogStore::info_and_recent`].
    pub async fn info_and_recent(&self, run: &RunKey) -> Result<Option<(RunInfo, Vec<u64>)>, StoreError> {
        self.store.info_and_recent(run).await
    }

    /// See [`RunLogStore::read`].
    pub async fn read(
        &self,
        run: &RunKey,
        from: u64,
        max_lines: usize,
        max_bytes: usize,
    ) -> Result<Vec<String>, StoreError> {
        self.store.read(run, from, max_lines, max_bytes).await
    }

    /// See [`RunLogStore::times`].
    pub async fn times(&self, run: &RunKey, from: u64, to: u64) -> Result<Vec<(u64, u64)>, StoreError> {
        self.store.times(run, from, to).await
    }

    /// See [`RunLogStore::wait_stored`].
    pub async fn wait_stored(&self, run: &RunKey, token: SequenceToken, within: Duration) -> bool {
        self.store.wait_stored(run, token, within).await
    }

    /// See [`RunLogStore::pipeline_exists`].
    pub async fn pipeline_exists(&self, fqn: &str) -> Result<bool, StoreError> {
        self.store.pipeline_exists(fqn).await
    }

    /// See [`RunLogStore::pipelines`].
    pub async fn pipelines(&self, limit: usize) -> Result<Vec<String>, StoreError> {
        self.store.pipelines(limit).await
    }

    /// See [`RunLogStore::runs`].
    pub async fn runs(&self, fqn: &str, limit: usize) -> Result<Vec<RunSummary>, StoreError> {
        self.store.runs(fqn, limit).await
    }
}

/// The run log store's one writer, and the implicit subscriber of `logs`:
/// bind it with
/// `ImplicitSubscriptions::new().bind(LOGS_NAMESPACE, archiver.clone())`.
/// Lines and status changes reach it through the runs' streams, and a run
/// becomes known with its first container stored; the edge only produces
/// and reads through [`Archiver::reader`].
///
/// ```
/// use std::sync::Arc;
/// use tailrace::archive::{Archiver, FileRunLogStore, RunKey};
/// use tailrace::pubsub::{ConsumerFactory, Delivery, SubscriptionId};
/// use tailrace::{BatchContainer, Event, SequenceToken};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let dir = tempfile::tempdir()?;
/// let archiver = Archiver::new(Arc::new(FileRunLogStore::open(dir.path(), true)?));
/// let run = RunKey::new("svc.etl", "run-7")?;
///
/// // What the run's agent hands the archiver: one container of lines.
/// let batch = BatchContainer {
///     stream: run.stream(),
///     token: SequenceToken::new(1, 0),
///     events: vec![Event::new("l-1", "starting"), Event::new("l-2", "done")],
/// };
/// let delivery = Delivery::new(SubscriptionId(1), run.stream(), vec![Arc::new(batch)]);
/// archiver.create(&run.stream()).deliver(&delivery).await?;
/// archiver.create(&run.stream()).deliver(&delivery).await?; // redelivered: stored once
///
/// let lines = archiver.reader().read(&run, 0, 100, 1 << 20).await?;
/// assert_eq!(lines, ["starting", "done"]);
/// # Ok(()) }
/// ```
pub struct Archiver {
    store: Arc<dyn RunLogStore>,
    health: Arc<Health>,
}

/// How long the archiver's writes may keep failing before it counts as
/// stuck (`GET /readyz`): longer than a Redis restart or failover.
pub(crate) const STUCK_AFTER: Duration = Duration::from_secs(30);

/// Since when the archiver's writes have failed without one succeeding.
#[derive(Default)]
struct Health {
    failing_since: Mutex<Option<(Instant, String)>>,
}

impl Archiver {
    /// Archives into `store`.
    pub fn new(store: Arc<dyn RunLogStore>) -> Arc<Self> {
        Arc::new(Self { store, health: Arc::default() })
    }

    /// A read-only view of the store.
    pub fn reader(&self) -> RunLogReader {
        RunLogReader { store: self.store.clone() }
    }

    /// Why the archiver counts as stuck: its writes have failed for
    /// `STUCK_AFTER` (30 s) or longer without one succeeding (the first failure's
    /// error, as logged). `None` while it stores, or fails only briefly.
    pub fn stuck(&self) -> Option<(Duration, String)> {
        let failing = self.health.failing_since.lock();
        let (since, error) = failing.as_ref()?;
        (since.elapsed() >= STUCK_AFTER).then(|| (since.elapsed(), error.clone()))
    }
}

impl Health {
    fn note<T, E: std::fmt::Display>(&self, outcome: &Result<T, E>) {
        let mut failing = self.failing_since.lock();
        match outcome {
            Ok(_) => *failing = None,
            Err(error) => {
                failing.get_or_insert_with(|| (Instant::now(), error.to_string()));
            }
        }
    }
}

impl ConsumerFactory for Archiver {
    fn name(&self) -> &str {
        "archiver"
    }

    fn create(&self, stream: &StreamId) -> Arc<dyn StreamConsumer> {
        let (store, health) = (self.store.clone(), self.health.clone());
        Arc::new(ArchiverConsumer { run: RunKey::from_stream(stream), store, health })
    }
}

struct ArchiverConsumer {
    run: Result<RunKey, InvalidName>,
    store: Arc<dyn RunLogStore>,
    health: Arc<Health>,
}

/// A store that cannot take a write now (its disk full or failing, Redis
/// down) is waited for, without a time limit: the archiver is the run
/// log's one writer, and a batch it gave up on would be missing from the
/// log for good. What a retry cannot mend (a fenced append, corrupt data)
/// goes to the failure handler.
fn store_failed(error: StoreError) -> ConsumerError {
    match error {
        StoreError::Io { .. } | StoreError::Backend(_) | StoreError::Task(_) => {
            ConsumerError::Unreachable(error.to_string())
        }
        other => ConsumerError::failed(other),
    }
}

impl ArchiverConsumer {
    fn run(&self) -> Result<&RunKey, ConsumerError> {
        self.run.as_ref().map_err(ConsumerError::failed)
    }
}

#[async_trait]
impl StreamConsumer for ArchiverConsumer {
    /// Continue after the last container stored: nothing twice, nothing lost.
    async fn handshake(&self, _: &SubscriptionInfo) -> Result<Option<StartPosition>, ConsumerError> {
        let info = self.store.info(self.run()?).await.map_err(ConsumerError::failed)?;
        Ok(info.and_then(|i| i.last_token).map(StartPosition::After))
    }

    async fn deliver(&self, delivery: &Delivery) -> Result<DeliveryOutcome, ConsumerError> {
        let stored = self.store_all(delivery).await;
        self.health.note(&stored);
        stored
    }
}

impl ArchiverConsumer {
    async fn store_all(&self, delivery: &Delivery) -> Result<DeliveryOutcome, ConsumerError> {
        let run = self.run()?;
        for batch in &delivery.batches {
            let contents = Contents::of(&batch.events);
            if let Some(state) = contents.status {
                // Set before the token moves past the container: a crash in
                // between repeats the (idempotent) change, never loses it.
                let info = self.store.info(run).await.map_err(store_failed)?;
                if info.and_then(|i| i.last_token).is_none_or(|last| last < batch.token) {
                    self.store.set_state(run, state).await.map_err(store_failed)?;
                }
            }
            let lines: Vec<&str> = contents.lines().collect();
            let fingerprint = batch_fingerprint(&batch.events);
            let store = &self.store;
            // Fenced with the delivering agent's lease token, if it has one:
            // a paused old owner cannot append after its successor did.
            let how = Append::new().fenced(delivery.fence);
            let how = if contents.texts.is_empty() { how } else { how.batch(fingerprint) };
            // When its lines arrived: the edge's ingest time, for the viewer.
            let arrived = batch.events.iter().map(|e| e.timestamp_ms).find(|&ms| ms > 0);
            let how = arrived.map_or(how, |ms| how.arrived(ms));
            let appended = store.append(run, batch.token, &lines, how).await;
            if appended.map_err(store_failed)? {
                metrics::counter!(telemetry::ARCHIVE_LINES).increment(lines.len() as u64);
            }
        }
        Ok(DeliveryOutcome::Continue)
    }
}
