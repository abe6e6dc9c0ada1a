//! The pulling manager: one actor per node that turns queue ownership into
//! running pulling agents.
//!
//! - Ownership notifications `(seq, queues)` are applied in order; one whose
//!   `seq` is not newer than the last applied is dropped as stale.
//! - A newly owned queue starts only once its lease is ours (the previous
//!   owner finished its ordered shutdown or died) and, on this node, once its
//!   previous agent here has fully stopped.
//! - A lost queue's agent runs its ordered shutdown; the lease is released
//!   only after it.
//! - `StopAgents` stops every agent and stopped means stopped: ownership keeps
//!   being recorded but starts nothing until `StartAgents` (Orleans starts
//!   agents anyway, their bug #10093).
//! - A crashed agent is restarted with backoff while its queue is still owned
//!   (ractor's default would stop the manager; supervision is overridden).

mod directory;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort, SupervisionEvent};
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::agent::{AgentArgs, AgentMsg, AgentServices, PullingAgent};
use crate::cluster::{NodeId, QueueLeases};
use crate::queue::QueueId;
use crate::retry::Backoff;
use crate::telemetry;
pub use directory::AgentDirectory;

/// Whether the manager runs agents (Orleans' `RunState`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RunState {
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

/// Messages of the pulling manager.
pub enum ManagerMsg {
    /// The balancer's view: this node owns `queues` (as of `seq`).
    Ownership {
        /// Increases with every notification.
        seq: u64,
        /// The queues this node should pull.
        queues: Vec<QueueId>,
    },
    /// Start agents for owned queues; answered at once.
    StartAgents(Option<RpcReplyPort<()>>),
    /// Stop every agent; answered when all finished their ordered shutdown.
    StopAgents(Option<RpcReplyPort<()>>),
    /// The run state.
    GetAgentsState(RpcReplyPort<RunState>),
    /// How many agents run.
    GetNumberRunningAgents(RpcReplyPort<usize>),
    /// Queues and counters.
    GetStatus(RpcReplyPort<ManagerStatus>),
    /// Stop every agent in order, then the manager (node shutdown).
    Stop(RpcReplyPort<()>),
    /// Internal completions and timers.
    Internal(ManagerInternal),
}

impl ractor::Message for ManagerMsg {}

/// An internal message of the manager.
pub struct ManagerInternal(Internal);

enum Internal {
    Lease(QueueId, Result<bool, String>),
    RetryLease(QueueId),
    Spawned(QueueId, Result<(ActorRef<AgentMsg>, CancellationToken), String>),
    Restart(QueueId),
    ShutdownTimeout(QueueId, ractor::ActorId),
}

enum Slot {
    Acquiring,
    WaitingLease,
    Spawning,
    Running(ActorRef<AgentMsg>, CancellationToken),
    Stopping(ActorRef<AgentMsg>, CancellationToken),
    Backoff,
}

/// Spawn arguments of a manager.
pub struct ManagerArgs {
    /// Shared by every agent of the node.
    pub services: Arc<AgentServices>,
    /// Queue leases of the cluster.
    pub leases: Arc<dyn QueueLeases>,
    /// Where running agents are published (for attach).
    pub agents: Arc<AgentDirectory>,
    /// Settings.
    pub options: ManagerOptions,
}

/// The manager's state.
pub struct Manager {
    node: NodeId,
    myself: ActorRef<ManagerMsg>,
    args: ManagerArgs,
    state: RunState,
    owned: BTreeSet<QueueId>,
    slots: BTreeMap<QueueId, Slot>,
    restart_attempts: BTreeMap<QueueId, u32>,
    status: ManagerStatus,
    stop_waiters: Vec<RpcReplyPort<()>>,
    exit_waiters: Vec<RpcReplyPort<()>>,
    running_gauge: metrics::Gauge,
    /// The lifecycle span (`pulling_manager{node}`).
    span: tracing::Span,
}

/// The pulling manager actor.
pub struct PullingManager;

impl Actor for PullingManager {
    type Msg = ManagerMsg;
    type State = Manager;
    type Arguments = ManagerArgs;

    async fn pre_start(&self, myself: ActorRef<ManagerMsg>, args: ManagerArgs) -> Result<Manager, ActorProcessingErr> {
        let node = args.services.node.clone();
        let state = if args.options.start_agents { RunState::AgentsStarted } else { RunState::Initialized };
        tracing::info!(%node, ?state, "pulling manager started");
        Ok(Manager {
            span: tracing::info_span!("pulling_manager", %node),
            running_gauge: metrics::gauge!(telemetry::AGENTS_RUNNING, "node" => node.to_string()),
            node,
            myself,
            args,
            state,
            owned: BTreeSet::new(),
            slots: BTreeMap::new(),
            restart_attempts: BTreeMap::new(),
            status: ManagerStatus::default(),
            stop_waiters: Vec::new(),
            exit_waiters: Vec::new(),
        })
    }

    async fn handle(
        &self,
        _: ActorRef<ManagerMsg>,
        msg: ManagerMsg,
        m: &mut Manager,
    ) -> Result<(), ActorProcessingErr> {
        let span = m.span.clone();
        m.on_message(msg).instrument(span).await;
        Ok(())
    }

    async fn handle_supervisor_evt(
        &self,
        _: ActorRef<ManagerMsg>,
        event: SupervisionEvent,
        m: &mut Manager,
    ) -> Result<(), ActorProcessingErr> {
        let span = m.span.clone();
        m.on_supervision(event).instrument(span).await;
        Ok(())
    }
}

impl Manager {
    async fn on_message(&mut self, msg: ManagerMsg) {
        match msg {
            ManagerMsg::Ownership { seq, queues } => self.on_ownership(seq, queues).await,
            ManagerMsg::StartAgents(reply) => {
                if self.exit_waiters.is_empty() {
                    self.state = RunState::AgentsStarted;
                    self.reconcile().await;
                }
                reply.map(|r| r.send(()));
            }
            ManagerMsg::StopAgents(reply) => {
                self.state = RunState::AgentsStopped;
                self.stop_waiters.extend(reply);
                self.reconcile().await;
            }
            ManagerMsg::GetAgentsState(reply) => {
                let _ = reply.send(self.state);
            }
            ManagerMsg::GetNumberRunningAgents(reply) => {
                let _ = reply.send(self.running().count());
            }
            ManagerMsg::GetStatus(reply) => {
                let _ = reply.send(self.report());
            }
            ManagerMsg::Stop(reply) => {
                tracing::info!("pulling manager stopping: handing every queue over");
                self.state = RunState::AgentsStopped;
                self.exit_waiters.push(reply);
                self.reconcile().await;
            }
            ManagerMsg::Internal(ManagerInternal(internal)) => self.on_internal(internal).await,
        }
        self.answer_waiters();
    }

    async fn on_supervision(&mut self, event: SupervisionEvent) {
        match event {
            SupervisionEvent::ActorTerminated(cell, _, reason) => self.on_agent_exit(cell.get_id(), None, reason).await,
            SupervisionEvent::ActorFailed(cell, error) => {
                self.on_agent_exit(cell.get_id(), Some(error.to_string()), None).await
            }
            _ => {}
        }
        self.answer_waiters();
    }

    fn running(&self) -> impl Iterator<Item = QueueId> + '_ {
        self.slots.iter().filter(|(_, s)| matches!(s, Slot::Running(..))).map(|(q, _)| *q)
    }

    fn desired(&self, queue: QueueId) -> bool {
        self.state == RunState::AgentsStarted && self.owned.contains(&queue)
    }

    async fn on_ownership(&mut self, seq: u64, queues: Vec<QueueId>) {
        if seq <= self.status.last_seq {
            self.status.stale_dropped += 1;
            tracing::debug!(node = %self.node, seq, last = self.status.last_seq, "stale ownership notification dropped");
            return;
        }
        self.status.last_seq = seq;
        self.owned = queues.into_iter().collect();
        tracing::info!(node = %self.node, seq, owned = ?self.owned, state = ?self.state, "queue ownership changed");
        self.reconcile().await;
    }

    /// Moves every queue toward what is desired.
    async fn reconcile(&mut self) {
        let wanted: Vec<QueueId> = self.owned.iter().copied().filter(|q| self.desired(*q)).collect();
        for queue in wanted {
            if !self.slots.contains_key(&queue) {
                self.acquire(queue);
            }
        }
        let unwanted: Vec<QueueId> = self.slots.keys().copied().filter(|q| !self.desired(*q)).collect();
        for queue in unwanted {
            match self.slots.remove(&queue) {
                Some(Slot::Running(agent, kill)) => {
                    self.args.agents.unregister(queue, &agent);
                    let _ = agent.cast(AgentMsg::Shutdown(None));
                    let id = agent.get_id();
                    self.myself.send_after(self.args.options.agent_shutdown_timeout, move || {
                        ManagerMsg::Internal(ManagerInternal(Internal::ShutdownTimeout(queue, id)))
                    });
                    self.slots.insert(queue, Slot::Stopping(agent, kill));
                }
                Some(Slot::WaitingLease | Slot::Backoff) => self.release(queue).await,
                // Finishes first; its completion looks at `desired` again.
                Some(slot @ (Slot::Acquiring | Slot::Spawning | Slot::Stopping(..))) => {
                    self.slots.insert(queue, slot);
                }
                None => {}
            }
        }
        self.running_gauge.set(self.running().count() as f64);
    }

    fn acquire(&mut self, queue: QueueId) {
        self.slots.insert(queue, Slot::Acquiring);
        let (leases, node, myself) = (self.args.leases.clone(), self.node.clone(), self.myself.clone());
        self.args.services.tasks.spawn("lease acquire", async move {
            let result = leases.try_acquire(queue, &node).await.map_err(|e| e.to_string());
            let _ = myself.cast(ManagerMsg::Internal(ManagerInternal(Internal::Lease(queue, result))));
        });
    }

    /// Gives the lease back. Awaited in the handler so that a later acquire
    /// of the same queue can never overtake it.
    async fn release(&mut self, queue: QueueId) {
        self.restart_attempts.remove(&queue);
        if let Err(error) = self.args.leases.release(queue, &self.node).await {
            tracing::warn!(node = %self.node, %queue, %error, "lease release failed; it will expire");
        }
    }

    fn spawn_agent(&mut self, queue: QueueId) {
        self.slots.insert(queue, Slot::Spawning);
        let kill = self.args.services.kill.child_token();
        let services = Arc::new(AgentServices { kill: kill.clone(), ..(*self.args.services).clone() });
        let (myself, supervisor) = (self.myself.clone(), self.myself.get_cell());
        self.args.services.tasks.spawn("agent start", async move {
            let spawned = Actor::spawn_linked(None, PullingAgent, AgentArgs { queue, services }, supervisor).await;
            let result = spawned.map(|(agent, _)| (agent, kill)).map_err(|e| e.to_string());
            let _ = myself.cast(ManagerMsg::Internal(ManagerInternal(Internal::Spawned(queue, result))));
        });
    }

    async fn on_internal(&mut self, internal: Internal) {
        match internal {
            Internal::Lease(queue, result) => {
                if !matches!(self.slots.get(&queue), Some(Slot::Acquiring)) {
                    return;
                }
                self.slots.remove(&queue);
                match result {
                    Ok(true) if self.desired(queue) => self.spawn_agent(queue),
                    Ok(true) => self.release(queue).await,
                    Ok(false) | Err(_) if !self.desired(queue) => {}
                    outcome => {
                        if let Err(error) = outcome {
                            tracing::warn!(node = %self.node, %queue, %error, "lease store failed; retrying");
                        }
                        self.slots.insert(queue, Slot::WaitingLease);
                        self.myself.send_after(self.args.options.lease_poll, move || {
                            ManagerMsg::Internal(ManagerInternal(Internal::RetryLease(queue)))
                        });
                    }
                }
            }
            Internal::RetryLease(queue) => {
                if matches!(self.slots.get(&queue), Some(Slot::WaitingLease)) && self.desired(queue) {
                    self.acquire(queue);
                }
            }
            Internal::Spawned(queue, result) => {
                if !matches!(self.slots.get(&queue), Some(Slot::Spawning)) {
                    return;
                }
                self.slots.remove(&queue);
                match result {
                    // Its exit may have been handled before this message (the
                    // supervision port is separate): then it is a crash.
                    Ok((agent, kill)) if agent.get_status() >= ractor::ActorStatus::Stopping => {
                        kill.cancel();
                        tracing::error!(%queue, "pulling agent stopped right after starting");
                        self.schedule_restart(queue);
                    }
                    Ok((agent, kill)) => {
                        self.args.agents.register(queue, agent.clone());
                        self.slots.insert(queue, Slot::Running(agent, kill));
                    }
                    Err(error) => {
                        tracing::error!(node = %self.node, %queue, %error, "pulling agent failed to start");
                        self.schedule_restart(queue);
                    }
                }
            }
            Internal::Restart(queue) => {
                if matches!(self.slots.get(&queue), Some(Slot::Backoff)) {
                    if self.desired(queue) {
                        self.spawn_agent(queue);
                    } else {
                        self.slots.remove(&queue);
                        self.release(queue).await;
                    }
                }
            }
            Internal::ShutdownTimeout(queue, id) => {
                if let Some(Slot::Stopping(agent, kill)) = self.slots.get(&queue)
                    && agent.get_id() == id
                {
                    tracing::error!(node = %self.node, %queue, "agent shutdown timed out; killing it (the next owner replays from the checkpoint)");
                    kill.cancel();
                    agent.kill();
                }
            }
        }
        self.reconcile().await;
    }

    async fn on_agent_exit(&mut self, id: ractor::ActorId, failure: Option<String>, reason: Option<String>) {
        let Some(queue) = self.slots.iter().find_map(|(q, s)| match s {
            Slot::Running(a, _) | Slot::Stopping(a, _) if a.get_id() == id => Some(*q),
            _ => None,
        }) else {
            return;
        };
        let Some(slot) = self.slots.remove(&queue) else {
            return;
        };
        let (agent, kill, was_running) = match slot {
            Slot::Running(agent, kill) => (agent, kill, true),
            Slot::Stopping(agent, kill) => (agent, kill, false),
            _ => return,
        };
        // Whatever the agent left running must not outlive it.
        kill.cancel();
        self.args.agents.unregister(queue, &agent);
        let crashed = failure.is_some() || (was_running && reason.as_deref() != Some(crate::agent::HANDED_OVER));
        if crashed && self.desired(queue) {
            tracing::error!(node = %self.node, %queue, error = ?failure, ?reason, "pulling agent crashed; restarting with backoff");
            self.status.restarts += 1;
            metrics::counter!(telemetry::AGENT_RESTARTS, "node" => self.node.to_string()).increment(1);
            self.schedule_restart(queue);
        } else if self.desired(queue) {
            // Moved off and back: a fresh agent, now that the old one is gone.
            self.restart_attempts.remove(&queue);
            self.spawn_agent(queue);
        } else {
            self.release(queue).await;
        }
        self.reconcile().await;
    }

    fn schedule_restart(&mut self, queue: QueueId) {
        let attempt = self.restart_attempts.entry(queue).or_insert(0);
        let wait = self.args.options.restart_backoff.delay(*attempt);
        *attempt += 1;
        self.slots.insert(queue, Slot::Backoff);
        self.myself.send_after(wait, move || ManagerMsg::Internal(ManagerInternal(Internal::Restart(queue))));
    }

    fn answer_waiters(&mut self) {
        let busy = self.slots.values().any(|s| !matches!(s, Slot::WaitingLease | Slot::Backoff));
        if busy || self.state == RunState::AgentsStarted {
            return;
        }
        for waiter in self.stop_waiters.drain(..) {
            let _ = waiter.send(());
        }
        if !self.exit_waiters.is_empty() && self.slots.is_empty() {
            for waiter in self.exit_waiters.drain(..) {
                let _ = waiter.send(());
            }
            tracing::info!(node = %self.node, "pulling manager stopped");
            self.myself.stop(None);
        }
    }

    fn report(&self) -> ManagerStatus {
        let pick = |f: fn(&Slot) -> bool| self.slots.iter().filter(|(_, s)| f(s)).map(|(q, _)| *q).collect();
        ManagerStatus {
            owned: self.owned.iter().copied().collect(),
            running: pick(|s| matches!(s, Slot::Running(..))),
            waiting: pick(|s| matches!(s, Slot::Acquiring | Slot::WaitingLease | Slot::Spawning)),
            stopping: pick(|s| matches!(s, Slot::Stopping(..))),
            restarting: pick(|s| matches!(s, Slot::Backoff)),
            ..self.status.clone()
        }
    }
}
