//! The balancer drivers: they follow membership (and, for the lease
//! balancer, who holds which lease) and tell the manager which queues are
//! this node's, each time with a higher sequence number.

use std::sync::Arc;
use std::time::Duration;

use ractor::ActorRef;
use tokio_util::sync::CancellationToken;

use crate::balancer::{BalancerKind, LeasePlanner, responsibility};
use crate::cluster::{Membership, QueueLeases};
use crate::manager::{HeldLeases, ManagerMsg};
use crate::queue::QueueMapper;
use crate::stream::{NodeId, QueueId};

/// Follows membership and tells the manager which queues are this node's,
/// each time with a higher sequence number.
pub(super) async fn drive_ownership(
    me: NodeId,
    balancer: BalancerKind,
    mapper: QueueMapper,
    membership: Membership,
    manager: ActorRef<ManagerMsg>,
    stop: CancellationToken,
) {
    let mut live = membership.subscribe();
    let all = mapper.all_queues();
    let mut seq = 0;
    loop {
        let nodes: Vec<NodeId> = live.borrow_and_update().iter().cloned().collect();
        if nodes.contains(&me) {
            seq += 1;
            let queues = balancer.queues_for(&me, &nodes, &all);
            if manager.cast(ManagerMsg::Ownership { seq, queues }).is_err() {
                return;
            }
        }
        tokio::select! {
            changed = live.changed() => if changed.is_err() { return },
            _ = stop.cancelled() => return,
        }
    }
}

/// What the lease balancer's driver works with.
pub(super) struct LeaseDriver {
    pub(super) me: NodeId,
    pub(super) mapper: QueueMapper,
    pub(super) membership: Membership,
    pub(super) leases: Arc<dyn QueueLeases>,
    /// What this node holds (its manager's).
    pub(super) held: Arc<HeldLeases>,
    pub(super) manager: ActorRef<ManagerMsg>,
    /// `lease.acquire`: how often an unsettled node runs a round.
    pub(super) period: Duration,
    pub(super) stop: CancellationToken,
}

/// The lease balancer: a round on every membership change and on every
/// lease lost, and every `period` until the node is settled
/// (it holds exactly the queues it wants, as many as its share); a settled
/// node reads no lease. A new plan goes to the manager when it differs
/// from the last.
pub(super) async fn drive_leases(driver: LeaseDriver) {
    let LeaseDriver { me, mapper, membership, leases, held: mine, manager, period, stop } = driver;
    let mut live = membership.subscribe();
    let all = mapper.all_queues();
    let mut planner = LeasePlanner::new(me.clone());
    let mut tick = tokio::time::interval(period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let (mut seq, mut wanted): (u64, Vec<QueueId>) = (0, Vec::new());
    loop {
        tokio::select! {
            changed = live.changed() => if changed.is_err() { return },
            _ = mine.changed() => {}
            _ = tick.tick() => {}
            _ = stop.cancelled() => return,
        }
        let nodes: Vec<NodeId> = live.borrow_and_update().iter().cloned().collect();
        let share = responsibility(&me, &nodes, all.len());
        if seq > 0 && wanted.len() == share && mine.queues() == wanted {
            continue;
        }
        let held = match leases.holders(&all).await {
            Ok(held) => held,
            Err(error) => {
                tracing::warn!(node = %me, %error, "lease balancer: cannot read the leases; next round");
                continue;
            }
        };
        let holders: Vec<(QueueId, NodeId)> = held.into_iter().map(|l| (l.queue, l.holder)).collect();
        let plan = planner.plan(&nodes, &all, &holders, &wanted);
        if seq == 0 || plan != wanted {
            seq += 1;
            tracing::debug!(node = %me, seq, ?plan, "lease balancer: new plan");
            wanted = plan.clone();
            if manager.cast(ManagerMsg::Ownership { seq, queues: plan }).is_err() {
                return;
            }
        }
    }
}

/// After the manager stopped (its agents released their leases): releases
/// every lease still held under `me`. A lease balancer stopped during an
/// acquire that the lease store carried out anyway leaves one behind (its
/// answer was dropped); without this it would block its queue until it
/// lapses. Best effort: what cannot be released lapses after its TTL.
pub(super) async fn release_leftovers(leases: &dyn QueueLeases, mapper: QueueMapper, me: &NodeId) {
    let held = match leases.holders(&mapper.all_queues()).await {
        Ok(held) => held,
        Err(error) => {
            tracing::warn!(node = %me, %error, "cannot list leases at shutdown; any left lapse after their ttl");
            return;
        }
    };
    for lease in held.into_iter().filter(|lease| &lease.holder == me) {
        match leases.release(&lease).await {
            Ok(true) => tracing::info!(node = %me, queue = %lease.queue, "released a lease left by a stopped acquire"),
            Ok(false) => {}
            Err(error) => tracing::warn!(node = %me, queue = %lease.queue, %error, "cannot release a leftover lease"),
        }
    }
}
