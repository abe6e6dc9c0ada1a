//! A pub-sub store the test controls: lookups can be held back or fail.
//! (The test kit's `store.rs`, over this crate's types.)

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use crate::pubsub::{MemoryPubSubStore, PubSubError, PubSubStore, Subscription, SubscriptionId};
use crate::stream::StreamId;
use async_trait::async_trait;
use tokio::sync::Semaphore;

#[derive(Default)]
pub(crate) struct GatedStore {
    pub(crate) inner: MemoryPubSubStore,
    pub(crate) lookups: AtomicUsize,
    /// The next lookups fail with this many injected errors.
    pub(crate) failures: AtomicUsize,
    pub(crate) gate: Mutex<Option<Arc<Semaphore>>>,
}

impl GatedStore {
    pub(crate) fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    pub(crate) fn hold(&self) {
        *self.gate.lock().unwrap() = Some(Arc::new(Semaphore::new(0)));
    }

    pub(crate) fn release(&self) {
        if let Some(gate) = self.gate.lock().unwrap().take() {
            gate.add_permits(1_000_000);
        }
    }
}

#[async_trait]
impl PubSubStore for GatedStore {
    async fn subscriptions(&self, stream: &StreamId) -> Result<Vec<Subscription>, PubSubError> {
        self.lookups.fetch_add(1, Ordering::SeqCst);
        let gate = self.gate.lock().unwrap().clone();
        if let Some(gate) = gate {
            let _ = gate.acquire().await.map(|p| p.forget());
        }
        if self.failures.load(Ordering::SeqCst) > 0 {
            self.failures.fetch_sub(1, Ordering::SeqCst);
            return Err(PubSubError::Store("injected storage read error".into()));
        }
        self.inner.subscriptions(stream).await
    }

    async fn upsert(&self, subscription: Subscription) -> Result<(), PubSubError> {
        self.inner.upsert(subscription).await
    }

    async fn remove(&self, stream: &StreamId, id: SubscriptionId) -> Result<bool, PubSubError> {
        self.inner.remove(stream, id).await
    }

    async fn fault(&self, stream: &StreamId, id: SubscriptionId, reason: &str) -> Result<(), PubSubError> {
        self.inner.fault(stream, id, reason).await
    }
}
