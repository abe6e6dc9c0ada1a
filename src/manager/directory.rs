//! Where each queue's running agent is, so `subscribe` can attach to it.
//! The manager registers the agents it runs; the node reads it.

use std::collections::HashMap;

use parking_lot::Mutex;
use ractor::ActorRef;

use crate::agent::AgentMsg;
use crate::stream::QueueId;

/// The running agent of each queue (shared by the nodes of one process).
#[derive(Default)]
pub(crate) struct AgentDirectory {
    agents: Mutex<HashMap<QueueId, ActorRef<AgentMsg>>>,
}

impl AgentDirectory {
    /// Empty.
    pub(crate) fn new() -> Self {
        Self::default()
    }

    /// `agent` now serves `queue`.
    pub(crate) fn register(&self, queue: QueueId, agent: ActorRef<AgentMsg>) {
        self.agents.lock().insert(queue, agent);
    }

    /// `agent` no longer serves `queue` (a newer registration is kept).
    pub(crate) fn unregister(&self, queue: QueueId, agent: &ActorRef<AgentMsg>) {
        let mut agents = self.agents.lock();
        if agents.get(&queue).is_some_and(|a| a.get_id() == agent.get_id()) {
            agents.remove(&queue);
        }
    }

    /// The agent serving `queue`, if any.
    pub(crate) fn get(&self, queue: QueueId) -> Option<ActorRef<AgentMsg>> {
        self.agents.lock().get(&queue).cloned()
    }
}
