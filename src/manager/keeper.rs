//! The lease keeper: the leases a node holds, and the task that renews them.
//!
//! The manager records every lease it takes in [`HeldLeases`] and removes
//! it when it releases it. The keeper renews all of them every
//! `lease.renew`, in one call to the store, the leases of stopping agents included (an ordered
//! shutdown may take longer than a lease lasts). A lease the store refuses
//! to renew, or that was not renewed by `expires_at − lease.margin()`, is
//! dropped from the table and reported to the manager, which kills its
//! agent with no ack and no checkpoint: by the time the lease lapses and
//! another node may take the queue, this one no longer pulls it.
//!
//! The keeper runs until the manager stops (it must outlive the ordered
//! shutdown) or the node crashes (a crashed node renews nothing).

use std::collections::BTreeMap;
use std::sync::Arc;

use parking_lot::Mutex;
use ractor::ActorRef;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::{Internal, ManagerInternal, ManagerMsg};
use crate::cluster::{Lease, LeaseOptions, QueueLeases};
use crate::stream::{NodeId, QueueId};
use crate::telemetry;

/// The leases a node holds, one per queue at most (so at most
/// `queues.count` of them).
#[derive(Default)]
pub(crate) struct HeldLeases {
    held: Mutex<BTreeMap<QueueId, Lease>>,
    /// Told of every lease lost (the lease balancer re-plans; a grant it
    /// asked for, or a lease it gave back, is no news).
    changed: tokio::sync::Notify,
}

impl HeldLeases {
    /// Records a new grant (it replaces an older one of the same queue).
    pub(crate) fn insert(&self, lease: Lease) {
        self.held.lock().insert(lease.queue, lease);
    }

    /// Forgets `queue`'s lease (given back), returning it.
    pub(crate) fn remove(&self, queue: QueueId) -> Option<Lease> {
        self.held.lock().remove(&queue)
    }

    /// Forgets `queue`'s lease, lost (another node has it): the lease
    /// balancer re-plans.
    pub(crate) fn lost(&self, queue: QueueId) {
        self.held.lock().remove(&queue);
        self.changed.notify_one();
    }

    /// The queues whose leases are held.
    pub(crate) fn queues(&self) -> Vec<QueueId> {
        self.held.lock().keys().copied().collect()
    }

    /// Completes at the next lease lost (or at once if one was since the
    /// last call).
    pub(crate) async fn changed(&self) {
        self.changed.notified().await
    }

    /// The token of `queue`'s lease, if held.
    pub(crate) fn token(&self, queue: QueueId) -> Option<u64> {
        self.held.lock().get(&queue).map(|l| l.token)
    }

    fn snapshot(&self) -> Vec<Lease> {
        self.held.lock().values().cloned().collect()
    }

    fn len(&self) -> usize {
        self.held.lock().len()
    }

    /// Records a renewal, unless the grant it renews was replaced meanwhile.
    fn renewed(&self, lease: Lease) {
        if let Some(held) = self.held.lock().get_mut(&lease.queue)
            && held.token == lease.token
        {
            *held = lease;
        }
    }

    /// Forgets `lease` if it is still the one held; whether it was.
    fn take(&self, lease: &Lease) -> bool {
        let mut held = self.held.lock();
        let current = held.get(&lease.queue).is_some_and(|l| l.token == lease.token);
        if current {
            held.remove(&lease.queue);
            self.changed.notify_one();
        }
        current
    }

    /// The earliest time a held lease must be given up.
    fn next_deadline(&self, options: &LeaseOptions) -> Option<Instant> {
        self.held.lock().values().map(|l| deadline(l, options)).min()
    }
}

/// When `lease` must be given up unless renewed.
fn deadline(lease: &Lease, options: &LeaseOptions) -> Instant {
    lease.expires_at.checked_sub(options.margin()).unwrap_or(lease.expires_at)
}

/// What the keeper works with.
pub(crate) struct Keeper {
    pub(crate) node: NodeId,
    pub(crate) leases: Arc<dyn QueueLeases>,
    pub(crate) held: Arc<HeldLeases>,
    pub(crate) options: LeaseOptions,
    pub(crate) manager: ActorRef<ManagerMsg>,
}

impl Keeper {
    /// Renews every held lease every `renew` until `stop`; wakes early for
    /// a lease whose deadline comes first.
    pub(crate) async fn run(self, stop: CancellationToken) {
        let held_gauge = metrics::gauge!(telemetry::LEASES_HELD, "node" => self.node.to_string());
        let mut next_renewal = Instant::now() + self.options.renew;
        loop {
            let wake = self.held.next_deadline(&self.options).map_or(next_renewal, |d| d.min(next_renewal));
            tokio::select! {
                _ = stop.cancelled() => break,
                _ = tokio::time::sleep_until(wake) => {}
            }
            if Instant::now() >= next_renewal {
                // The period counts from the send, not the answer: on a
                // link with a round trip of `rtt` renewals still go out
                // every `renew`, not every `renew + rtt` (which at a 2 s
                // round trip lands the answer on the deadline).
                next_renewal = Instant::now() + self.options.renew;
                self.renew_all().await;
            }
            let now = Instant::now();
            for lease in self.held.snapshot() {
                if now >= deadline(&lease, &self.options) {
                    self.lost(&lease, "not renewed in time");
                }
            }
            held_gauge.set(self.held.len() as f64);
        }
        tracing::debug!(node = %self.node, "lease keeper stopped");
    }

    /// Renews every held lease in one call to the store, bounded by the
    /// earliest deadline among them.
    async fn renew_all(&self) {
        let leases = self.held.snapshot();
        let Some(first) = leases.iter().map(|lease| deadline(lease, &self.options)).min() else { return };
        match tokio::time::timeout_at(first, self.leases.renew_all(&leases, self.options.ttl)).await {
            Ok(Ok(answers)) => {
                for (lease, answer) in leases.iter().zip(answers) {
                    match answer {
                        Some(renewed) => self.held.renewed(renewed),
                        None => self.lost(lease, "the store refused to renew it (expired or taken over)"),
                    }
                }
                tracing::trace!(node = %self.node, leases = leases.len(), "leases renewed");
            }
            // Tried again at the next renewal, unless the deadline passes first.
            Ok(Err(error)) => {
                tracing::warn!(node = %self.node, leases = leases.len(), %error, "lease renewal failed");
            }
            Err(_) => {
                let now = Instant::now();
                for lease in leases.iter().filter(|lease| now >= deadline(lease, &self.options)) {
                    self.lost(lease, "the renewal did not answer before the deadline");
                }
            }
        }
    }

    fn lost(&self, lease: &Lease, why: &str) {
        if !self.held.take(lease) {
            return;
        }
        tracing::warn!(node = %self.node, queue = %lease.queue, token = lease.token, why, "queue lease lost; stopping its agent");
        metrics::counter!(telemetry::LEASES_LOST, "node" => self.node.to_string()).increment(1);
        let msg = ManagerMsg::Internal(ManagerInternal(Internal::LeaseLost(lease.queue, lease.token)));
        let _ = self.manager.cast(msg);
    }
}

#[cfg(test)]
mod tests;
