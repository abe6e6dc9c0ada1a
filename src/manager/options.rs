//! The manager's settings (`[manager]`), its run state and its status
//! report: plain data, no rules.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::retry::Backoff;
use crate::stream::QueueId;

/// Whether the manager runs agents (Orleans' `RunState`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AgentsState {
    /// Created; waits for `StartAgents`.
    Initialized,
    /// Runs an agent per owned queue.
    AgentsStarted,
    /// Runs none, whatever it owns.
    AgentsStopped,
}

/// Manager settings.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ManagerOptions {
    /// Start agents as soon as the node starts (Orleans' default), or wait
    /// for `agents start`.
    pub start_agents: bool,
    /// Backoff between restarts of a crashed agent.
    pub restart_backoff: Backoff,
    /// How often to retry a queue lease another node still holds.
    #[serde(with = "humantime_serde")]
    pub lease_poll: Duration,
    /// An agent whose ordered shutdown takes longer is killed (its queue is
    /// then replayed from the last checkpoint by the next owner).
    #[serde(with = "humantime_serde")]
    pub agent_shutdown_timeout: Duration,
}

impl Default for ManagerOptions {
    fn default() -> Self {
        Self {
            start_agents: true,
            restart_backoff: Backoff::new(Duration::from_secs(1), Duration::from_secs(30), Duration::from_secs(1)),
            lease_poll: Duration::from_millis(250),
            agent_shutdown_timeout: Duration::from_secs(90),
        }
    }
}

/// What the manager reports about its queues.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct ManagerStatus {
    /// Queues the balancer gave this node.
    pub owned: Vec<QueueId>,
    /// Queues with a running agent.
    pub running: Vec<QueueId>,
    /// Queues waiting for their lease.
    pub waiting: Vec<QueueId>,
    /// Queues whose agent is shutting down.
    pub stopping: Vec<QueueId>,
    /// Queues whose crashed agent waits to restart.
    pub restarting: Vec<QueueId>,
    /// The last applied notification.
    pub last_seq: u64,
    /// Stale notifications dropped.
    pub stale_dropped: u64,
    /// Agent restarts after crashes.
    pub restarts: u64,
}
