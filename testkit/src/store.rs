//! A pub-sub store the test controls: lookups can be held back or fail.
#![allow(dead_code)]

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use tailrace::StreamId;
use tailrace::pubsub::{MemoryPubSubStore, PubSubError, PubSubStore, Subscription, SubscriptionId};
use tokio::sync::Semaphore;

#[derive(Default)]
pub struct GatedStore {
    pub inner: MemoryPubSubStore,
    pub lookups: AtomicUsize,
    /// The next lookups fail with this many injected errors.
    pub failures: AtomicUsize,
    pub gate: Mutex<Option<Arc<Semaphore>>>,
}

impl GatedStore {
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    pub fn hold(&self) {
        *self.gate.lock().unwrap() = Some(Arc::new(Semaphore::new(0)));
    }

    pub fn release(&self) {
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
