//! Nodes and what they share: identity, membership, queue leases, the
//! directory of running agents, and the in-process multi-node harness.
//!
//! A node is one OS process of a cluster, or one of several nodes hosted by a
//! single process (tests, the demo). Membership says which nodes are live;
//! every node runs the same balancer over it; a queue lease makes sure one
//! node at a time pulls a queue and that a new owner starts only after the old
//! one finished its ordered shutdown (or died).

mod directory;
mod harness;
mod lease;
mod membership;

pub use directory::AgentDirectory;
pub use harness::{InProcessCluster, InProcessTransport};
pub use lease::{MemoryLeases, QueueLeases};
pub use membership::Membership;

use std::fmt;

use compact_str::CompactString;
use serde::{Deserialize, Serialize};

/// A node's name, unique in its cluster.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct NodeId(CompactString);

impl NodeId {
    /// Names a node.
    pub fn new(name: impl Into<CompactString>) -> Self {
        Self(name.into())
    }

    /// The name.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for NodeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for NodeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Node({})", self.0)
    }
}
