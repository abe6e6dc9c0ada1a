//! Which nodes are live. Every node follows the same view through a watch
//! channel. Two sources feed it: each [`Node`](crate::node::Node) joins the
//! membership it was given when it starts and leaves it when it stops or is
//! killed (the nodes of one process, the in-process harness and the demo,
//! share one); and [`RedisMembership`](super::RedisMembership) replaces the
//! view with the live members it reads from Redis (nodes in separate
//! processes).

use std::collections::BTreeSet;
use std::sync::Arc;

use tokio::sync::watch;

use crate::stream::NodeId;

/// A shared, observable set of live nodes.
#[derive(Clone)]
pub struct Membership {
    live: Arc<watch::Sender<BTreeSet<NodeId>>>,
}

impl Default for Membership {
    fn default() -> Self {
        Self::new()
    }
}

impl Membership {
    /// No live nodes yet.
    pub fn new() -> Self {
        Self { live: Arc::new(watch::Sender::new(BTreeSet::new())) }
    }

    /// Marks `node` live.
    pub fn join(&self, node: NodeId) {
        self.live.send_if_modified(|live| live.insert(node));
    }

    /// Marks `node` gone (it left or died).
    pub fn leave(&self, node: &NodeId) {
        self.live.send_if_modified(|live| live.remove(node));
    }

    /// Replaces the whole view (a source that reads every member at once).
    pub fn replace(&self, nodes: BTreeSet<NodeId>) {
        self.live.send_if_modified(|live| {
            let changed = *live != nodes;
            *live = nodes;
            changed
        });
    }

    /// The live nodes, sorted.
    pub fn live(&self) -> Vec<NodeId> {
        self.live.borrow().iter().cloned().collect()
    }

    /// Follows changes.
    pub fn subscribe(&self) -> watch::Receiver<BTreeSet<NodeId>> {
        self.live.subscribe()
    }
}
