//! The manager's agents, one per owned queue: spawned under the queue's
//! lease token, their lifecycle events (started, stopped, lease lost),
//! their exits, and restarts with backoff while the queue is still owned.

use super::*;

impl Manager {
    /// Starts an agent under the lease held for `queue`, or takes the lease
    /// again first if it is gone.
    pub(super) fn start_agent(&mut self, queue: QueueId) {
        match self.held.token(queue) {
            Some(token) => self.spawn_agent(queue, token),
            None => self.acquire(queue),
        }
    }

    pub(super) fn spawn_agent(&mut self, queue: QueueId, token: u64) {
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

    pub(super) async fn on_internal(&mut self, internal: Internal) {
        let queue = internal.queue();
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
                    self.held.lost(queue);
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
        self.reconcile_queue(queue).await;
    }

    /// The keeper gave up `queue`'s lease: its agent dies at once, with no
    /// ack and no checkpoint, as another node may take the queue now.
    pub(super) fn on_lease_lost(&mut self, queue: QueueId, token: u64) {
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

    pub(super) async fn on_agent_exit(&mut self, id: ractor::ActorId, exit: Exit) {
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
            Slot::Killed(_) => return self.reconcile_queue(queue).await,
            _ => return,
        };
        // Whatever the agent left running must not outlive it.
        kill.cancel();
        self.args.agents.unregister(queue, &agent);
        if let Exit::Fenced(error) = &exit {
            // Not a crash: a newer receiver has the queue, so its lease is
            // gone. Forget it (no release) and wait for the lease again.
            tracing::warn!(node = %self.node, %queue, %error, "pulling agent fenced: its lease is gone");
            self.held.lost(queue);
            self.restart_attempts.remove(&queue);
            return self.reconcile_queue(queue).await;
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
        self.reconcile_queue(queue).await;
    }

    pub(super) fn schedule_restart(&mut self, queue: QueueId) {
        let attempt = self.restart_attempts.entry(queue).or_insert(0);
        let wait = self.args.options.restart_backoff.delay(*attempt);
        *attempt += 1;
        self.slots.insert(queue, Slot::Backoff);
        self.myself.send_after(wait, move || ManagerMsg::Internal(ManagerInternal(Internal::Restart(queue))));
    }
}
