//! The agent commands a node passes to its pulling manager (start, stop,
//! state, status), and the node's end: a graceful shutdown that hands its
//! queues over, or a crash.

use std::time::Duration;

use ractor::rpc::CallResult;

use super::{Node, NodeError, ownership};
use crate::agent::{AgentMsg, AgentStatus};
use crate::manager::{AgentsState, ManagerMsg, ManagerStatus};
use crate::stream::QueueId;
use crate::tasks::STOP_TIMEOUT;

/// How long a call to the pulling manager, or to an agent, may take.
const MANAGER_CALL_TIMEOUT: Duration = Duration::from_secs(30);

impl Node {
    async fn ask<T: Send + 'static>(
        &self,
        msg: impl FnOnce(ractor::RpcReplyPort<T>) -> ManagerMsg,
    ) -> Result<T, NodeError> {
        match self.manager.call(msg, Some(MANAGER_CALL_TIMEOUT)).await {
            Ok(CallResult::Success(value)) => Ok(value),
            Ok(CallResult::Timeout) => Err(NodeError::ManagerTimeout(MANAGER_CALL_TIMEOUT)),
            Ok(CallResult::SenderError) => Err(NodeError::ManagerGone),
            Err(e) => Err(NodeError::Manager(e.to_string())),
        }
    }

    /// `StartAgents`.
    pub async fn start_agents(&self) -> Result<(), NodeError> {
        if let Some(hook) = &self.on_agents {
            hook(true);
        }
        self.ask(|r| ManagerMsg::StartAgents(Some(r))).await
    }

    /// `StopAgents`: returns when every agent finished its ordered shutdown.
    pub async fn stop_agents(&self) -> Result<(), NodeError> {
        if let Some(hook) = &self.on_agents {
            hook(false);
        }
        self.ask(|r| ManagerMsg::StopAgents(Some(r))).await
    }
    /// `GetAgentsState`.
    pub async fn agents_state(&self) -> Result<AgentsState, NodeError> {
        self.ask(ManagerMsg::GetAgentsState).await
    }

    /// `GetNumberRunningAgents`.
    pub async fn running_agents(&self) -> Result<usize, NodeError> {
        self.ask(ManagerMsg::GetNumberRunningAgents).await
    }

    /// The manager's queues and counters.
    pub async fn status(&self) -> Result<ManagerStatus, NodeError> {
        self.ask(ManagerMsg::GetStatus).await
    }

    /// The counters of this node's agent of `queue` (reads, deliveries,
    /// acks, whether it sleeps…), or `None` when no agent of this node
    /// serves it (or it stopped before it answered).
    pub async fn agent_status(&self, queue: QueueId) -> Option<AgentStatus> {
        let agent = self.agents.get(queue)?;
        match agent.call(AgentMsg::GetStatus, Some(MANAGER_CALL_TIMEOUT)).await {
            Ok(CallResult::Success(status)) => Some(status),
            _ => None,
        }
    }

    /// Leaves the cluster gracefully: other nodes take the queues over as
    /// this node's agents finish their ordered shutdown. Returns once the
    /// manager stopped and every task of the node ended, or 2 s after the
    /// manager stopped (what still runs then is logged and left behind). The tasks are waited for even if the
    /// manager did not answer.
    pub async fn shutdown(&self) -> Result<(), NodeError> {
        self.membership.leave(&self.id);
        self.tasks.token().cancel();
        let stopped = self.ask(ManagerMsg::Stop).await;
        if stopped.is_ok() {
            let task = self.manager_task.lock().take();
            if let Some(task) = task {
                let _ = task.await;
            }
        }
        self.tasks.stop(self.id.as_str(), STOP_TIMEOUT).await;
        if stopped.is_ok() {
            ownership::release_leftovers(self.leases.as_ref(), self.mapper, &self.id).await;
        }
        stopped
    }

    /// Tasks of this node running now (the ownership driver, the manager's
    /// helpers, the agents' pumps and work lanes); none once
    /// [`Node::shutdown`] returned in time.
    pub fn tracked_tasks(&self) -> usize {
        self.tasks.len()
    }

    /// Dies at once, as with `kill -9`: no handoff, no checkpoint flush, no
    /// ack. Its leases stay held until the cluster drops them.
    pub fn crash(&self) {
        self.kill.cancel();
        self.driver.abort();
        self.manager.kill();
        self.membership.leave(&self.id);
    }
}
