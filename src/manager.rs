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

mod directory;
mod keeper;
mod options;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort, SupervisionEvent};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::agent::{AgentArgs, AgentMsg, AgentServices, PullingAgent};
use crate::cluster::{LeaseOptions, NodeId, QueueLeases};
use crate::queue::QueueId;
use crate::telemetry;
pub use directory::AgentDirectory;
use keeper::{HeldLeases, Keeper};
pub use options::{ManagerOptions, ManagerStatus, RunState};

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
    Lease(QueueId, Result<Option<crate::cluster::Lease>, String>),
    RetryLease(QueueId),
    Spawned(QueueId, Result<(ActorRef<AgentMsg>, CancellationToken), String>),
    Restart(QueueId),
    ShutdownTimeout(QueueId, ractor::ActorId),
    /// The keeper gave up the lease with this token.
    LeaseLost(QueueId, u64),
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
pub struct ManagerArgs {
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
    /// The leases this node holds (renewed by the keeper).
    held: Arc<HeldLeases>,
    /// Stops the keeper once the manager stopped.
    keeper_stop: CancellationToken,
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
        let held = Arc::new(HeldLeases::default());
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

    /// Starts an agent under the lease held for `queue`, or takes the lease
    /// again first if it is gone.
    fn start_agent(&mut self, queue: QueueId) {
        match self.held.token(queue) {
            Some(token) => self.spawn_agent(queue, token),
            None => self.acquire(queue),
        }
    }

    fn spawn_agent(&mut self, queue: QueueId, token: u64) {
        self.slots.insert(queue, Slot::Spawning(token));
        let kill = self.args.services.kill.child_token();
        // The token is for fenced writes, which only a lease store whose
        // counters the queue stores can see makes meaningful.
        let lease_token = self.args.leases.fences_queue_stores().then_some(token);
        let services = Arc::new(AgentServices { kill: kill.clone(), lease_token, ..(*self.args.services).clone() });
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
                    // Nobody waits for this grant: give it back, not leave
                    // it to expire.
                    if let Ok(Some(lease)) = result
                        && self.held.token(queue) != Some(lease.token)
                    {
                        let _ = self.args.leases.release(&lease).await;
                    }
                    return;
                }
                self.slots.remove(&queue);
                if let Ok(Some(lease)) = &result {
                    tracing::info!(node = %self.node, %queue, token = lease.token, "queue lease acquired");
                    self.held.insert(lease.clone());
                } else if let Ok(None) = &result {
                    // Another node holds it: any older grant of ours is gone.
                    self.held.remove(queue);
                }
                match result {
                    Ok(Some(lease)) if self.desired(queue) => self.spawn_agent(queue, lease.token),
                    _ if !self.desired(queue) => self.release(queue).await,
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
                let Some(Slot::Spawning(token)) = self.slots.get(&queue) else {
                    return;
                };
                let lease_kept = self.held.token(queue) == Some(*token);
                self.slots.remove(&queue);
                match result {
                    // Its lease was lost while it started.
                    Ok((agent, kill)) if !lease_kept => {
                        kill.cancel();
                        agent.kill();
                        self.slots.insert(queue, Slot::Killed(agent));
                    }
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
                        // Still ours? A fresh grant also fences whatever the
                        // crashed agent left running.
                        self.acquire(queue);
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
            Internal::LeaseLost(queue, token) => self.on_lease_lost(queue, token),
        }
        self.reconcile().await;
    }

    /// The keeper gave up `queue`'s lease: its agent dies at once, with no
    /// ack and no checkpoint, as another node may take the queue now.
    fn on_lease_lost(&mut self, queue: QueueId, token: u64) {
        match self.slots.remove(&queue) {
            Some(Slot::Running(agent, kill) | Slot::Stopping(agent, kill)) => {
                tracing::warn!(node = %self.node, %queue, token, "lease lost: killing the agent (no ack, no checkpoint)");
                kill.cancel();
                agent.kill();
                self.args.agents.unregister(queue, &agent);
                self.slots.insert(queue, Slot::Killed(agent));
            }
            // Nothing runs; the queue waits for its lease again.
            Some(Slot::Backoff) => {
                self.restart_attempts.remove(&queue);
            }
            // An acquire decides by its answer; a spawn checks the lease
            // when it completes.
            Some(slot) => {
                self.slots.insert(queue, slot);
            }
            None => {}
        }
    }

    async fn on_agent_exit(&mut self, id: ractor::ActorId, exit: Exit) {
        let Some(queue) = self.slots.iter().find_map(|(q, s)| match s {
            Slot::Running(a, _) | Slot::Stopping(a, _) | Slot::Killed(a) if a.get_id() == id => Some(*q),
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
            // Its lease is gone: nothing to release; the queue waits for it.
            Slot::Killed(_) => return self.reconcile().await,
            _ => return,
        };
        // Whatever the agent left running must not outlive it.
        kill.cancel();
        self.args.agents.unregister(queue, &agent);
        if let Exit::Fenced(error) = &exit {
            // Not a crash: a newer receiver has the queue, so its lease is
            // gone. Forget it (no release) and wait for the lease again.
            tracing::warn!(node = %self.node, %queue, %error, "pulling agent fenced: its lease is gone");
            self.held.remove(queue);
            self.restart_attempts.remove(&queue);
            return self.reconcile().await;
        }
        let (failure, reason) = match exit {
            Exit::Failed(error) => (Some(error), None),
            Exit::Stopped(reason) => (None, reason),
            Exit::Fenced(_) => (None, None),
        };
        let crashed = failure.is_some() || (was_running && reason.as_deref() != Some(crate::agent::HANDED_OVER));
        if crashed && self.desired(queue) {
            tracing::error!(node = %self.node, %queue, error = ?failure, ?reason, "pulling agent crashed; restarting with backoff");
            self.status.restarts += 1;
            metrics::counter!(telemetry::AGENT_RESTARTS, "node" => self.node.to_string()).increment(1);
            self.schedule_restart(queue);
        } else if self.desired(queue) {
            // Moved off and back: a fresh agent, now that the old one is gone.
            self.restart_attempts.remove(&queue);
            self.start_agent(queue);
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
            waiting: pick(|s| matches!(s, Slot::Acquiring | Slot::WaitingLease | Slot::Spawning(_))),
            stopping: pick(|s| matches!(s, Slot::Stopping(..) | Slot::Killed(_))),
            restarting: pick(|s| matches!(s, Slot::Backoff)),
            ..self.status.clone()
        }
    }
}
