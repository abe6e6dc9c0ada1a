//! Queue leases: at most one node pulls a queue, and a new owner starts only
//! after the old one released it at the end of its ordered shutdown (or its
//! lease was dropped because it died).

use std::collections::HashMap;

use async_trait::async_trait;
use parking_lot::Mutex;

use crate::stream::{NodeId, QueueId};

/// A lease store could not answer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("queue lease store failed: {0}")]
pub struct LeaseError(pub String);

/// Grants each queue to one node at a time.
#[async_trait]
pub trait QueueLeases: Send + Sync + 'static {
    /// Takes `queue` for `node` if it is free (or already `node`'s).
    async fn try_acquire(&self, queue: QueueId, node: &NodeId) -> Result<bool, LeaseError>;

    /// Gives `queue` back, if `node` holds it.
    async fn release(&self, queue: QueueId, node: &NodeId) -> Result<(), LeaseError>;

    /// Who holds `queue`.
    async fn holder(&self, queue: QueueId) -> Result<Option<NodeId>, LeaseError>;
}

/// Leases in this process's memory (the in-process cluster). A dead node's
/// leases are dropped with [`MemoryLeases::release_node`], which stands for
/// a lease expiring.
#[derive(Default)]
pub struct MemoryLeases {
    holders: Mutex<HashMap<QueueId, NodeId>>,
}

impl MemoryLeases {
    /// No lease held.
    pub fn new() -> Self {
        Self::default()
    }

    /// Drops every lease `node` holds (it died).
    pub fn release_node(&self, node: &NodeId) {
        self.holders.lock().retain(|_, holder| holder != node);
    }
}

#[async_trait]
impl QueueLeases for MemoryLeases {
    async fn try_acquire(&self, queue: QueueId, node: &NodeId) -> Result<bool, LeaseError> {
        let mut holders = self.holders.lock();
        match holders.get(&queue) {
            Some(holder) => Ok(holder == node),
            None => {
                holders.insert(queue, node.clone());
                Ok(true)
            }
        }
    }

    async fn release(&self, queue: QueueId, node: &NodeId) -> Result<(), LeaseError> {
        let mut holders = self.holders.lock();
        if holders.get(&queue) == Some(node) {
            holders.remove(&queue);
        }
        Ok(())
    }

    async fn holder(&self, queue: QueueId) -> Result<Option<NodeId>, LeaseError> {
        Ok(self.holders.lock().get(&queue).cloned())
    }
}
