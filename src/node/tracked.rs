//! The consumer-side handle of an explicit subscription: it remembers the
//! subscription and the last token its consumer processed, answers
//! handshakes with it (or, before anything was processed, with the
//! subscription's own start), drops redeliveries of what was already
//! processed (so a graceful handoff, or a restarted agent, delivers nothing
//! twice to a live consumer), and refuses deliveries once unsubscribed.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use async_trait::async_trait;
use parking_lot::Mutex;

use crate::pubsub::{
    ConsumerError, Delivery, DeliveryOutcome, StartPosition, StreamConsumer, Subscription, SubscriptionInfo,
};
use crate::stream::SequenceToken;

pub(crate) struct TrackedConsumer {
    inner: Arc<dyn StreamConsumer>,
    /// The subscription as stored (its start made concrete once attached).
    record: Mutex<Option<Subscription>>,
    last: Mutex<Option<SequenceToken>>,
    closed: AtomicBool,
}

impl TrackedConsumer {
    pub(crate) fn new(inner: Arc<dyn StreamConsumer>) -> Self {
        Self { inner, record: Mutex::new(None), last: Mutex::new(None), closed: AtomicBool::new(false) }
    }

    pub(crate) fn close(&self) {
        self.closed.store(true, Ordering::SeqCst);
    }

    #[cfg(all(feature = "edge", feature = "cluster"))]
    pub(crate) fn is_closed(&self) -> bool {
        self.closed.load(Ordering::SeqCst)
    }

    /// Remembers the subscription this handle serves, as stored.
    pub(crate) fn remember(&self, subscription: Subscription) {
        *self.record.lock() = Some(subscription);
    }

    pub(crate) fn record(&self) -> Option<Subscription> {
        self.record.lock().clone()
    }

    fn last(&self) -> Option<SequenceToken> {
        *self.last.lock()
    }

    fn set_last(&self, token: SequenceToken) {
        *self.last.lock() = Some(token);
    }
}

#[async_trait]
impl StreamConsumer for TrackedConsumer {
    async fn handshake(&self, subscription: &SubscriptionInfo) -> Result<Option<StartPosition>, ConsumerError> {
        if self.closed.load(Ordering::SeqCst) {
            return Err(ConsumerError::Unavailable("unsubscribed".into()));
        }
        match self.inner.handshake(subscription).await? {
            Some(start) => Ok(Some(start)),
            None => Ok(self.last().map(StartPosition::After).or_else(|| self.record().map(|r| r.start))),
        }
    }

    async fn deliver(&self, delivery: &Delivery) -> Result<DeliveryOutcome, ConsumerError> {
        if self.closed.load(Ordering::SeqCst) {
            return Err(ConsumerError::Unavailable("unsubscribed".into()));
        }
        let last = self.last();
        let fresh = |token: SequenceToken| last.is_none_or(|l| token > l);
        let outcome = if delivery.batches.iter().all(|b| fresh(b.token)) {
            self.inner.deliver(delivery).await?
        } else {
            let batches: Vec<_> = delivery.batches.iter().filter(|b| fresh(b.token)).cloned().collect();
            if batches.is_empty() {
                return Ok(DeliveryOutcome::Continue);
            }
            let fresh_part = Delivery { batches, ..delivery.clone() };
            self.inner.deliver(&fresh_part).await?
        };
        match outcome {
            DeliveryOutcome::Continue => {
                if let Some(token) = delivery.last_token() {
                    self.set_last(token);
                }
            }
            DeliveryOutcome::SeekAfter(token) => self.set_last(token),
        }
        Ok(outcome)
    }

    async fn on_error(&self, subscription: &SubscriptionInfo, error: &str) {
        self.inner.on_error(subscription, error).await;
    }
}
