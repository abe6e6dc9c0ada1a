//! The in-process multi-node harness (filled in with the node).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use super::NodeId;
use crate::pubsub::{ConsumerAddress, ConsumerResolver, LocalConsumers, StreamConsumer};

/// Reaches the consumers of the other nodes of this process.
#[derive(Default)]
pub struct InProcessTransport {
    nodes: Mutex<HashMap<NodeId, Arc<LocalConsumers>>>,
}

impl InProcessTransport {
    /// No node yet.
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<NodeId, Arc<LocalConsumers>>> {
        // Plain data: a panic elsewhere cannot leave it torn.
        self.nodes.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Makes `consumers` reachable.
    pub fn add_node(&self, consumers: Arc<LocalConsumers>) {
        self.lock().insert(consumers.node().clone(), consumers);
    }

    /// Makes a node's consumers unreachable (it died).
    pub fn remove_node(&self, node: &NodeId) {
        self.lock().remove(node);
    }
}

impl ConsumerResolver for InProcessTransport {
    fn resolve(&self, address: &ConsumerAddress) -> Option<Arc<dyn StreamConsumer>> {
        self.lock().get(&address.node)?.get(&address.name)
    }
}

/// Several nodes in one process (placeholder until the node lands).
pub struct InProcessCluster;
