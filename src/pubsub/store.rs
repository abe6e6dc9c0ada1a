//! Where explicit subscriptions are kept: the [`PubSubStore`] trait and its
//! in-memory implementation (bounded by `max_subscriptions`).

use std::collections::{BTreeMap, HashMap};

use async_trait::async_trait;
use parking_lot::Mutex;

use super::{Subscription, SubscriptionId, SubscriptionState};
use crate::stream::{NodeId, StreamId};

/// A pub-sub operation failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PubSubError {
    /// The store itself failed.
    #[error("pub-sub store failed: {0}")]
    Store(String),
    /// The store is at its bound.
    #[error("the pub-sub store already holds its limit of {limit} subscriptions (setting pubsub.max_subscriptions)")]
    TooManySubscriptions {
        /// The bound.
        limit: usize,
    },
    /// The stream is at its bound in a shared store.
    #[error(
        "stream {stream} already has its limit of {limit} subscriptions (setting pubsub.max_subscriptions_per_stream)"
    )]
    TooManyOnStream {
        /// The stream.
        stream: String,
        /// The bound.
        limit: usize,
    },
    /// The node's consumer directory is at its bound.
    #[error("node {node} already hosts its limit of {limit} consumers (setting pubsub.max_local_consumers)")]
    TooManyConsumers {
        /// The node.
        node: String,
        /// The bound.
        limit: usize,
    },
}

/// Keeps explicit subscriptions, per stream.
#[async_trait]
pub trait PubSubStore: Send + Sync + 'static {
    /// Every subscription of `stream` (active and faulted).
    async fn subscriptions(&self, stream: &StreamId) -> Result<Vec<Subscription>, PubSubError>;

    /// Adds or replaces a subscription (by id).
    async fn upsert(&self, subscription: Subscription) -> Result<(), PubSubError>;

    /// Removes a subscription; whether it existed.
    async fn remove(&self, stream: &StreamId, id: SubscriptionId) -> Result<bool, PubSubError>;

    /// Marks a subscription faulted with the cause; it gets no more events.
    async fn fault(&self, stream: &StreamId, id: SubscriptionId, reason: &str) -> Result<(), PubSubError>;

    /// Removes every subscription whose consumer lives on `node` (a node
    /// that died, or restarted: its consumers are gone); how many. A store
    /// that cannot list by node keeps them (the default): their agents then
    /// detach them when a handshake finds the consumer unavailable.
    async fn remove_node(&self, node: &NodeId) -> Result<usize, PubSubError> {
        let _ = node;
        Ok(0)
    }
}

/// The store's count and its subscriptions per stream.
type Table = (usize, HashMap<StreamId, BTreeMap<SubscriptionId, Subscription>>);

/// Subscriptions in memory; lost when the process ends.
pub struct MemoryPubSubStore {
    max_subscriptions: usize,
    state: Mutex<Table>,
}

impl MemoryPubSubStore {
    /// A store holding at most `max_subscriptions`.
    pub fn new(max_subscriptions: usize) -> Self {
        Self { max_subscriptions, state: Mutex::new((0, HashMap::new())) }
    }
}

impl Default for MemoryPubSubStore {
    fn default() -> Self {
        Self::new(100_000)
    }
}

#[async_trait]
impl PubSubStore for MemoryPubSubStore {
    async fn subscriptions(&self, stream: &StreamId) -> Result<Vec<Subscription>, PubSubError> {
        Ok(self.state.lock().1.get(stream).map(|m| m.values().cloned().collect()).unwrap_or_default())
    }

    async fn upsert(&self, subscription: Subscription) -> Result<(), PubSubError> {
        let mut guard = self.state.lock();
        let (count, map) = &mut *guard;
        let exists = map.get(&subscription.stream).is_some_and(|m| m.contains_key(&subscription.id));
        if !exists && *count >= self.max_subscriptions {
            return Err(PubSubError::TooManySubscriptions { limit: self.max_subscriptions });
        }
        if !exists {
            *count += 1;
        }
        map.entry(subscription.stream.clone()).or_default().insert(subscription.id, subscription);
        Ok(())
    }

    async fn remove(&self, stream: &StreamId, id: SubscriptionId) -> Result<bool, PubSubError> {
        let mut guard = self.state.lock();
        let (count, map) = &mut *guard;
        let Some(subs) = map.get_mut(stream) else {
            return Ok(false);
        };
        let removed = subs.remove(&id).is_some();
        if subs.is_empty() {
            map.remove(stream);
        }
        if removed {
            *count -= 1;
        }
        Ok(removed)
    }

    async fn fault(&self, stream: &StreamId, id: SubscriptionId, reason: &str) -> Result<(), PubSubError> {
        if let Some(sub) = self.state.lock().1.get_mut(stream).and_then(|m| m.get_mut(&id)) {
            sub.state = SubscriptionState::Faulted(reason.to_string());
        }
        Ok(())
    }

    async fn remove_node(&self, node: &NodeId) -> Result<usize, PubSubError> {
        let mut guard = self.state.lock();
        let (count, map) = &mut *guard;
        let mut removed = 0;
        map.retain(|_, subs| {
            let before = subs.len();
            subs.retain(|_, sub| &sub.consumer.node != node);
            removed += before - subs.len();
            !subs.is_empty()
        });
        *count -= removed;
        Ok(removed)
    }
}
