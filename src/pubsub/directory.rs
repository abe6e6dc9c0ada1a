//! Finding a subscription's consumer from its address.
//!
//! Each node keeps its own consumers in a bounded [`LocalConsumers`]; a
//! [`ConsumerDirectory`] answers for the local node and asks a
//! [`ConsumerResolver`] (the cluster transport) for the others.

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::Mutex;
use serde::{Deserialize, Serialize};

use super::{ConsumerAddress, PubSubError, StreamConsumer};
use crate::stream::{NodeId, QueueId};

/// Who is calling a consumer: the queue of the delivering agent and the
/// fencing token of the lease it runs under. A node that hosts consumers
/// refuses calls carrying a lower token than the highest it has seen for
/// that queue (a paused old owner's).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Origin {
    /// The delivering agent's queue.
    pub queue: QueueId,
    /// Its lease's fencing token, if its writes are fenced.
    pub fence: Option<u64>,
}

/// Turns an address into something the agent can call.
pub trait ConsumerResolver: Send + Sync + 'static {
    /// The consumer at `address`, if reachable.
    fn resolve(&self, address: &ConsumerAddress) -> Option<Arc<dyn StreamConsumer>>;

    /// The consumer at `address`, called on behalf of `origin` (the cluster
    /// transport carries it so the consumer's node can refuse a stale
    /// owner). By default the origin is not needed.
    fn resolve_from(&self, address: &ConsumerAddress, origin: Origin) -> Option<Arc<dyn StreamConsumer>> {
        let _ = origin;
        self.resolve(address)
    }
}

/// The consumers hosted by one node, by name. Bounded.
pub(crate) struct LocalConsumers {
    node: NodeId,
    limit: usize,
    consumers: Mutex<HashMap<String, Arc<dyn StreamConsumer>>>,
}

impl LocalConsumers {
    /// An empty directory for `node` holding at most `limit` consumers.
    pub(crate) fn new(node: NodeId, limit: usize) -> Self {
        Self { node, limit, consumers: Mutex::new(HashMap::new()) }
    }

    /// The node these consumers live on.
    pub(crate) fn node(&self) -> &NodeId {
        &self.node
    }

    /// Registers `consumer` under `name`; returns its address.
    pub(crate) fn register(
        &self,
        name: String,
        consumer: Arc<dyn StreamConsumer>,
    ) -> Result<ConsumerAddress, PubSubError> {
        let mut consumers = self.consumers.lock();
        if !consumers.contains_key(&name) && consumers.len() >= self.limit {
            return Err(PubSubError::TooManyConsumers { node: self.node.to_string(), limit: self.limit });
        }
        consumers.insert(name.clone(), consumer);
        Ok(ConsumerAddress { node: self.node.clone(), name })
    }

    /// Removes a consumer.
    pub(crate) fn unregister(&self, name: &str) {
        self.consumers.lock().remove(name);
    }

    /// The consumer named `name`.
    pub(crate) fn get(&self, name: &str) -> Option<Arc<dyn StreamConsumer>> {
        self.consumers.lock().get(name).cloned()
    }
}

/// Resolves addresses: local ones from the node's consumers, others through
/// the cluster transport.
#[derive(Clone)]
pub(crate) struct ConsumerDirectory {
    local: Arc<LocalConsumers>,
    remote: Option<Arc<dyn ConsumerResolver>>,
}

impl ConsumerDirectory {
    /// A directory over `local`, asking `remote` for other nodes.
    pub(crate) fn new(local: Arc<LocalConsumers>, remote: Option<Arc<dyn ConsumerResolver>>) -> Self {
        Self { local, remote }
    }
}

impl ConsumerResolver for ConsumerDirectory {
    fn resolve(&self, address: &ConsumerAddress) -> Option<Arc<dyn StreamConsumer>> {
        if &address.node == self.local.node() {
            self.local.get(&address.name)
        } else {
            self.remote.as_ref()?.resolve(address)
        }
    }

    fn resolve_from(&self, address: &ConsumerAddress, origin: Origin) -> Option<Arc<dyn StreamConsumer>> {
        if &address.node == self.local.node() {
            self.local.get(&address.name)
        } else {
            self.remote.as_ref()?.resolve_from(address, origin)
        }
    }
}
