//! Coming back: a node whose member record lapsed (it was paused or cut
//! off past `membership.ttl`, or Redis restarted and took every deadline
//! with it) was "not a member" to the other nodes for a while, and their
//! agents let go of its subscriptions (a consumer on a node that left is
//! gone). When its heartbeat finds its record gone and writes it again,
//! the node attaches each of its subscriptions again where its queue is
//! pulled now. Each attach is a handshake: the consumer answers where it
//! continues (after the last token it processed), the agent catches up
//! from the queue from there, and what the queue no longer holds reaches
//! the consumer as a gap on its next delivery, never as silence.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use tokio::sync::watch;

use super::{Node, SubscribeError};
use crate::pubsub::{StartPosition, Subscription};

/// Attaches re-tried per subscription after a rejoin.
const ATTEMPTS: u32 = 5;
/// Subscriptions attached at once.
const AT_ONCE: usize = 16;

impl Node {
    /// Until the node shuts down: after each rejoin `rejoins` tells of,
    /// waits `settle` (so every other node has seen this one's record
    /// again: at least one of their heartbeats) and attaches every
    /// subscription of this node again, each up to five times,
    /// `settle` apart.
    pub(crate) fn reattach_on_rejoin(self: &Arc<Self>, mut rejoins: watch::Receiver<u64>, settle: Duration) {
        let node = Arc::downgrade(self);
        let stop = self.tasks.token().clone();
        self.tasks.spawn("reattach on rejoin", async move {
            loop {
                tokio::select! {
                    _ = stop.cancelled() => return,
                    changed = rejoins.changed() => if changed.is_err() { return },
                }
                tokio::select! {
                    _ = stop.cancelled() => return,
                    _ = tokio::time::sleep(settle) => {}
                }
                let Some(node) = node.upgrade() else { return };
                tokio::select! {
                    _ = stop.cancelled() => return,
                    _ = node.reattach_all(settle) => {}
                }
            }
        });
    }

    async fn reattach_all(&self, settle: Duration) {
        // A subscription whose queue this node pulls was never let go: its
        // agent delivers here without the transport.
        let records: Vec<Subscription> = self
            .tracked
            .lock()
            .values()
            .filter(|t| !t.is_closed())
            .filter_map(|t| t.record())
            .filter(|record| self.agents.get(self.mapper.queue_for(&record.stream)).is_none())
            .collect();
        tracing::info!(node = %self.id, subscriptions = records.len(), "attaching this node's subscriptions again");
        futures::stream::iter(records)
            .for_each_concurrent(AT_ONCE, |record| async move {
                for attempt in 1..=ATTEMPTS {
                    match self.reattach(&record).await {
                        Ok(()) => return,
                        Err(error) if attempt == ATTEMPTS => {
                            tracing::warn!(stream = %record.stream, subscription = %record.id, %error, "could not attach a subscription again");
                        }
                        Err(error) => {
                            tracing::debug!(stream = %record.stream, subscription = %record.id, %error, "attach again failed; retrying");
                            tokio::time::sleep(settle).await;
                        }
                    }
                }
            })
            .await;
    }

    /// Attaches `record` again, storing it first if a purge removed it
    /// while this node was away (its consumer is still here). The attach
    /// asks for no position of its own: the handshake decides.
    async fn reattach(&self, record: &Subscription) -> Result<(), SubscribeError> {
        if self.tracked.lock().get(&record.id).is_none_or(|t| t.is_closed()) {
            return Ok(());
        }
        let stored = self.store.subscriptions(&record.stream).await?.iter().any(|s| s.id == record.id);
        if !stored {
            self.store.upsert(record.clone()).await?;
        }
        let attach = Subscription { start: StartPosition::EarliestAvailable, ..record.clone() };
        self.attach(attach).await.map(drop)
    }
}
