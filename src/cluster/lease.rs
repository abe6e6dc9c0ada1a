//! Queue leases: at most one node pulls a queue, and a new owner starts only
//! after the old one released it at the end of its ordered shutdown, or its
//! lease expired because it stopped renewing it (it died, paused or lost
//! the store).
//!
//! A lease lasts `ttl` unless renewed. Every grant carries a fencing token
//! from a per-queue counter that only grows (never reset by a release or an
//! expiry), so whoever holds a lower token knows it lost the queue, and a
//! store can refuse its writes. This module owns the trait, the
//! [`Lease`] it hands out and the in-memory store of the in-process cluster;
//! [`super::RedisLeases`] is the store of a multi-process cluster.

use std::collections::HashMap;
use std::time::Duration;

use async_trait::async_trait;
use parking_lot::Mutex;
use tokio::time::Instant;

use crate::stream::{NodeId, QueueId};

/// A lease store could not answer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LeaseError {
    /// The store could not be reached at all.
    #[error("queue lease store at {url}: cannot connect: {message}")]
    Connect {
        /// Where it was looked for.
        url: String,
        /// Why it failed.
        message: String,
    },
    /// The connection settings are wrong, or Redis refused them: the
    /// message names the setting.
    #[error("{0}")]
    Refused(String),
    /// The store failed or could not be reached (a retry may help).
    #[error("queue lease store: {operation} of {queue}: {message}")]
    Backend {
        /// `acquire`, `renew`, `release` or `holders`.
        operation: &'static str,
        /// The queue.
        queue: QueueId,
        /// What the store said.
        message: String,
    },
    /// The store holds something tailrace did not write.
    #[error("queue lease store: {key} holds an unexpected value: {message}")]
    Corrupt {
        /// The key (or entry) read.
        key: String,
        /// What is wrong with it.
        message: String,
    },
}

/// One grant of a queue to a node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Lease {
    /// The queue.
    pub queue: QueueId,
    /// The node that holds it.
    pub holder: NodeId,
    /// The fencing token: higher than every earlier grant of this queue.
    pub token: u64,
    /// When it lapses unless renewed, on this process's monotonic clock. A
    /// store that keeps its own clock reports a time no later than its own
    /// expiry (it counts from when the request was sent).
    pub expires_at: Instant,
}

impl Lease {
    /// Whether it lapsed by `now`.
    pub fn expired(&self, now: Instant) -> bool {
        now >= self.expires_at
    }
}

/// Grants each queue to one node at a time.
#[async_trait]
pub trait QueueLeases: Send + Sync + 'static {
    /// Takes `queue` for `node` for `ttl` if it is free, expired or already
    /// `node`'s. Every grant gets a new token, higher than any before it
    /// (taking its own lease again fences the node's older agent). `None`:
    /// another node holds it.
    async fn acquire(&self, queue: QueueId, node: &NodeId, ttl: Duration) -> Result<Option<Lease>, LeaseError>;

    /// Extends `lease` to `ttl` from now if it is still held with its token.
    /// `None`: it was lost (expired, taken over or released).
    async fn renew(&self, lease: &Lease, ttl: Duration) -> Result<Option<Lease>, LeaseError>;

    /// Renews every lease of `leases` (one node's), answering for each in
    /// order. A store whose leases live with their holder renews them all
    /// with one call; the default renews each.
    async fn renew_all(&self, leases: &[Lease], ttl: Duration) -> Result<Vec<Option<Lease>>, LeaseError> {
        let renewals = leases.iter().map(|lease| self.renew(lease, ttl));
        futures::future::try_join_all(renewals).await
    }

    /// Frees every lease `node` holds at once (it is known dead); whether
    /// there was anything to free. Its fencing counters are untouched, so
    /// a node that was not dead after all is refused by the fences. The
    /// default frees nothing (the leases lapse after their TTL).
    async fn evict(&self, node: &NodeId) -> Result<bool, LeaseError> {
        let _ = node;
        Ok(false)
    }

    /// Gives `lease` back at once if it is still held with its token;
    /// `false` if it was not (nothing changes then).
    async fn release(&self, lease: &Lease) -> Result<bool, LeaseError>;

    /// The live leases among `queues`, in the order given.
    async fn holders(&self, queues: &[QueueId]) -> Result<Vec<Lease>, LeaseError>;

    /// The live lease of `queue`, if any.
    async fn holder(&self, queue: QueueId) -> Result<Option<Lease>, LeaseError> {
        Ok(self.holders(&[queue]).await?.pop())
    }

    /// Whether the queue stores can check this store's tokens: its fencing
    /// counters live where the queues' fenced writes look for them (as
    /// [`super::RedisLeases`]' do, on the Redis adapter's server under the
    /// same key prefix). Only then do agents write fenced; another store's
    /// tokens would be compared with counters they have nothing to do
    /// with. The default: no.
    fn fences_queue_stores(&self) -> bool {
        false
    }
}

/// A live grant in memory.
struct Entry {
    holder: NodeId,
    token: u64,
    expires_at: Instant,
}

#[derive(Default)]
struct State {
    /// The grants, expired ones included until they are looked at. At most
    /// one per queue of the cluster (`queues.count`).
    live: HashMap<QueueId, Entry>,
    /// The last token of each queue (never reset); one per queue, too.
    fences: HashMap<QueueId, u64>,
}

/// Leases in this process's memory (the in-process cluster), on tokio's
/// clock, so tests with paused time control expiry. A dead node's leases
/// can be dropped at once with [`MemoryLeases::release_node`] (the harness
/// does, instead of waiting for them to expire).
#[derive(Default)]
pub struct MemoryLeases {
    state: Mutex<State>,
}

impl MemoryLeases {
    /// No lease held.
    pub fn new() -> Self {
        Self::default()
    }

    /// Drops every lease `node` holds (it died); their tokens stay used.
    pub fn release_node(&self, node: &NodeId) {
        self.state.lock().live.retain(|_, entry| &entry.holder != node);
    }

    fn lease(queue: QueueId, entry: &Entry) -> Lease {
        Lease { queue, holder: entry.holder.clone(), token: entry.token, expires_at: entry.expires_at }
    }
}

#[async_trait]
impl QueueLeases for MemoryLeases {
    async fn acquire(&self, queue: QueueId, node: &NodeId, ttl: Duration) -> Result<Option<Lease>, LeaseError> {
        let now = Instant::now();
        let mut state = self.state.lock();
        if let Some(entry) = state.live.get(&queue)
            && &entry.holder != node
            && entry.expires_at > now
        {
            return Ok(None);
        }
        let fence = state.fences.entry(queue).or_insert(0);
        *fence += 1;
        let entry = Entry { holder: node.clone(), token: *fence, expires_at: now + ttl };
        let lease = Self::lease(queue, &entry);
        state.live.insert(queue, entry);
        Ok(Some(lease))
    }

    async fn renew(&self, lease: &Lease, ttl: Duration) -> Result<Option<Lease>, LeaseError> {
        let now = Instant::now();
        let mut state = self.state.lock();
        match state.live.get_mut(&lease.queue) {
            Some(entry) if entry.token == lease.token && entry.holder == lease.holder && entry.expires_at > now => {
                entry.expires_at = now + ttl;
                Ok(Some(Self::lease(lease.queue, entry)))
            }
            _ => Ok(None),
        }
    }

    async fn release(&self, lease: &Lease) -> Result<bool, LeaseError> {
        let mut state = self.state.lock();
        let ours = state.live.get(&lease.queue).is_some_and(|e| e.token == lease.token && e.holder == lease.holder);
        if ours {
            state.live.remove(&lease.queue);
        }
        Ok(ours)
    }

    async fn holders(&self, queues: &[QueueId]) -> Result<Vec<Lease>, LeaseError> {
        let now = Instant::now();
        let state = self.state.lock();
        Ok(queues
            .iter()
            .filter_map(|q| state.live.get(q).filter(|e| e.expires_at > now).map(|e| Self::lease(*q, e)))
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TTL: Duration = Duration::from_secs(8);

    #[tokio::test(start_paused = true)]
    async fn one_holder_at_a_time_and_tokens_only_grow() {
        let leases = MemoryLeases::new();
        let (a, b, q) = (NodeId::new("a"), NodeId::new("b"), QueueId(3));
        let first = leases.acquire(q, &a, TTL).await.unwrap().unwrap();
        assert_eq!(leases.acquire(q, &b, TTL).await.unwrap(), None);
        // Taking its own lease again fences the older grant.
        let again = leases.acquire(q, &a, TTL).await.unwrap().unwrap();
        assert!(again.token > first.token);
        assert_eq!(leases.renew(&first, TTL).await.unwrap(), None);
        assert!(!leases.release(&first).await.unwrap());
        assert_eq!(leases.holder(q).await.unwrap().map(|l| l.token), Some(again.token));
        // Released: free at once, and the next token is higher still.
        assert!(leases.release(&again).await.unwrap());
        let theirs = leases.acquire(q, &b, TTL).await.unwrap().unwrap();
        assert!(theirs.token > again.token);
        leases.release_node(&b);
        assert_eq!(leases.holder(q).await.unwrap(), None);
        let after = leases.acquire(q, &a, TTL).await.unwrap().unwrap();
        assert!(after.token > theirs.token);
    }

    #[tokio::test(start_paused = true)]
    async fn an_unrenewed_lease_expires_and_a_renewed_one_does_not() {
        let leases = MemoryLeases::new();
        let (a, b, q) = (NodeId::new("a"), NodeId::new("b"), QueueId(0));
        let lease = leases.acquire(q, &a, TTL).await.unwrap().unwrap();
        tokio::time::advance(Duration::from_secs(6)).await;
        let renewed = leases.renew(&lease, TTL).await.unwrap().unwrap();
        assert_eq!(renewed.token, lease.token);
        assert!(renewed.expires_at > lease.expires_at);
        tokio::time::advance(Duration::from_secs(6)).await;
        assert_eq!(leases.acquire(q, &b, TTL).await.unwrap(), None, "renewed: still a's");
        tokio::time::advance(Duration::from_secs(2)).await;
        assert_eq!(leases.holders(&[q]).await.unwrap(), []);
        assert_eq!(leases.renew(&renewed, TTL).await.unwrap(), None, "expired: cannot be renewed");
        let taken = leases.acquire(q, &b, TTL).await.unwrap().unwrap();
        assert!(taken.token > renewed.token);
        assert_eq!(leases.holders(&[QueueId(1), q]).await.unwrap(), [taken]);
    }
}
