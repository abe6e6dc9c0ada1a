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
//!   (ractor's default would stop the manager; supervision is overridden),
//!   and only once its lease was taken again (a fresh token, which fences
//!   what the crashed agent left behind).
//! - Leases are renewed by the keeper (`keeper.rs`). A lost lease, or a read
//!   fenced by a newer receiver, kills the queue's agent at once (no ack, no
//!   checkpoint, no restart) and the queue waits for its lease again.

mod agents;
mod directory;
mod keeper;
mod options;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort, SupervisionEvent};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::agent::{AgentArgs, AgentMsg, AgentServices, PullingAgent};
use crate::cluster::{LeaseOptions, QueueLeases};
use crate::stream::{NodeId, QueueId};
use crate::telemetry;
pub(crate) use directory::AgentDirectory;
pub(crate) use keeper::HeldLeases;
use keeper::Keeper;
pub use options::{AgentsState, ManagerOptions, ManagerStatus};

/// Messages of the pulling manager (its tests drive a manager through
/// them; the node's methods are the API).
pub(crate) enum ManagerMsg {
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
    GetAgentsState(RpcReplyPort<AgentsState>),
    /// How many agents run.
    GetNumberRunningAgents(RpcReplyPort<usize>),
    /// Queues and counters.
    GetStatus(RpcReplyPort<ManagerStatus>),
    /// Stop every agent in order, then the manager (node shutdown).
    Stop(RpcReplyPort<()>),
    /// Internal completions and timers.
    Internal(ManagerInternal),
}

/// An internal message of the manager.
pub(crate) struct ManagerInternal(Internal);

enum Internal {
    Lease(QueueId, Result<Option<crate::cluster::Lease>, String>),
    RetryLease(QueueId),
    Spawned(QueueId, Result<(ActorRef<AgentMsg>, CancellationToken), String>),
    Restart(QueueId),
    ShutdownTimeout(QueueId, ractor::ActorId),
    /// The keeper gave up the lease with this token.
    LeaseLost(QueueId, u64),
}

impl Internal {
    /// The queue it is about.
    fn queue(&self) -> QueueId {
        match self {
            Internal::Lease(queue, _)
            | Internal::RetryLease(queue)
            | Internal::Spawned(queue, _)
            | Internal::Restart(queue)
            | Internal::ShutdownTimeout(queue, _)
            | Internal::LeaseLost(queue, _) => *queue,
        }
    }
}

/// How an agent ended.
enum Exit {
    /// It stopped, with this reason.
    Stopped(Option<String>),
    /// Its queue was taken over by a newer receiver.
    Fenced(String),
    /// It failed.
    Failed(String),
}

enum Slot {
    Acquiring,
    WaitingLease,
    /// Starting an agent under the lease with this token.
    Spawning(u64),
    Running(ActorRef<AgentMsg>, CancellationToken),
    Stopping(ActorRef<AgentMsg>, CancellationToken),
    /// Killed because its lease was lost; waits for its exit.
    Killed(ActorRef<AgentMsg>),
    Backoff,
}

/// Spawn arguments of a manager.
pub(crate) struct ManagerArgs {
    /// Shared by every agent of the node.
    pub services: Arc<AgentServices>,
    /// Queue leases of the cluster.
    pub leases: Arc<dyn QueueLeases>,
    /// Where running agents are published (for attach).
    pub agents: Arc<AgentDirectory>,
    /// Settings.
    pub options: ManagerOptions,
    /// Lease durations.
    pub lease: LeaseOptions,
    /// The leases this node holds (the lease balancer reads them too).
    pub(crate) held: Arc<HeldLeases>,
}

/// The manager's state.
pub(crate) struct Manager {
    node: NodeId,
    myself: ActorRef<ManagerMsg>,
    args: ManagerArgs,
    state: AgentsState,
    owned: BTreeSet<QueueId>,
    slots: BTreeMap<QueueId, Slot>,
    restart_attempts: BTreeMap<QueueId, u32>,
    status: ManagerStatus,
    stop_waiters: Vec<RpcReplyPort<()>>,
    exit_waiters: Vec<RpcReplyPort<()>>,
    running_gauge: metrics::Gauge,
    /// The leases this node holds (renewed by the keeper).
    held: Arc<HeldLeases>,
    /// Stops the keeper once the manager stopped.
    keeper_stop: CancellationToken,
    /// The lifecycle span (`pulling_manager{node}`).
    span: tracing::Span,
}

/// The pulling manager actor.
pub(crate) struct PullingManager;

impl Actor for PullingManager {
    type Msg = ManagerMsg;
    type State = Manager;
    type Arguments = ManagerArgs;

    async fn pre_start(&self, myself: ActorRef<ManagerMsg>, args: ManagerArgs) -> Result<Manager, ActorProcessingErr> {
        let node = args.services.node.clone();
        let state = if args.options.start_agents { AgentsState::AgentsStarted } else { AgentsState::Initialized };
        tracing::info!(%node, ?state, "pulling manager started");
        let held = args.held.clone();
        // A child of the kill switch: a crashed node renews nothing.
        let keeper_stop = args.services.kill.child_token();
        let keeper = Keeper {
            node: node.clone(),
            leases: args.leases.clone(),
            held: held.clone(),
            options: args.lease.clone(),
            manager: myself.clone(),
        };
        let keeper_span = tracing::info_span!("lease_keeper", %node);
        args.services.tasks.spawn("lease keeper", keeper.run(keeper_stop.clone()).instrument(keeper_span));
        Ok(Manager {
            held,
            keeper_stop,
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

    async fn post_stop(&self, _: ActorRef<ManagerMsg>, m: &mut Manager) -> Result<(), ActorProcessingErr> {
        m.keeper_stop.cancel();
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
                    self.state = AgentsState::AgentsStarted;
                    self.reconcile().await;
                }
                reply.map(|r| r.send(()));
            }
            ManagerMsg::StopAgents(reply) => {
                self.state = AgentsState::AgentsStopped;
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
                self.state = AgentsState::AgentsStopped;
                self.exit_waiters.push(reply);
                self.reconcile().await;
            }
            ManagerMsg::Internal(ManagerInternal(internal)) => self.on_internal(internal).await,
        }
        self.answer_waiters();
    }

    async fn on_supervision(&mut self, event: SupervisionEvent) {
        match event {
            SupervisionEvent::ActorTerminated(cell, _, reason) => {
                self.on_agent_exit(cell.get_id(), Exit::Stopped(reason)).await
            }
            SupervisionEvent::ActorFailed(cell, error) if crate::agent::is_fenced(&error) => {
                self.on_agent_exit(cell.get_id(), Exit::Fenced(error.to_string())).await
            }
            SupervisionEvent::ActorFailed(cell, error) => {
                self.on_agent_exit(cell.get_id(), Exit::Failed(error.to_string())).await
            }
            _ => {}
        }
        self.answer_waiters();
    }

    fn running(&self) -> impl Iterator<Item = QueueId> + '_ {
        self.slots.iter().filter(|(_, s)| matches!(s, Slot::Running(..))).map(|(q, _)| *q)
    }

    fn desired(&self, queue: QueueId) -> bool {
        self.state == AgentsState::AgentsStarted && self.owned.contains(&queue)
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

    /// Moves every queue toward what is desired (after a change of
    /// ownership or state).
    async fn reconcile(&mut self) {
        let queues: BTreeSet<QueueId> = self.owned.iter().chain(self.slots.keys()).copied().collect();
        for queue in queues {
            self.reconcile_queue(queue).await;
        }
    }

    /// Moves `queue` toward what is desired (after an event of its own:
    /// the other queues did not change).
    async fn reconcile_queue(&mut self, queue: QueueId) {
        if self.desired(queue) {
            if !self.slots.contains_key(&queue) {
                self.acquire(queue);
            }
        } else {
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
                Some(slot @ (Slot::Acquiring | Slot::Spawning(_) | Slot::Stopping(..) | Slot::Killed(_))) => {
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
        let ttl = self.args.lease.ttl;
        self.args.services.tasks.spawn("lease acquire", async move {
            let result = leases.acquire(queue, &node, ttl).await.map_err(|e| e.to_string());
            let _ = myself.cast(ManagerMsg::Internal(ManagerInternal(Internal::Lease(queue, result))));
        });
    }

    /// Gives the lease back. Awaited in the handler so that a later acquire
    /// of the same queue can never overtake it.
    async fn release(&mut self, queue: QueueId) {
        self.restart_attempts.remove(&queue);
        let Some(lease) = self.held.remove(queue) else {
            return;
        };
        match self.args.leases.release(&lease).await {
            Ok(true) => tracing::info!(node = %self.node, %queue, token = lease.token, "queue lease released"),
            Ok(false) => tracing::warn!(node = %self.node, %queue, token = lease.token, "queue lease was already lost"),
            Err(error) => tracing::warn!(node = %self.node, %queue, %error, "lease release failed; it will expire"),
        }
    }

    fn answer_waiters(&mut self) {
        let busy = self.slots.values().any(|s| !matches!(s, Slot::WaitingLease | Slot::Backoff));
        if busy || self.state == AgentsState::AgentsStarted {
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
            waiting: pick(|s| matches!(s, Slot::Acquiring | Slot::WaitingLease | Slot::Spawning(_))),
            stopping: pick(|s| matches!(s, Slot::Stopping(..) | Slot::Killed(_))),
            restarting: pick(|s| matches!(s, Slot::Backoff)),
            ..self.status.clone()
        }
    }
}

#[cfg(test)]
mod tests;
