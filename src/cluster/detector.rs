//! The failure detector: a dead node's queues move in about a second, not
//! after its lease TTL.
//!
//! **The rule.** When this node's lane to a peer closes, the detector dials the peer's advertised address at
//! once. If the dial is *refused* (the host answers that nothing listens
//! on that port), the peer's process is gone: a process that dies closes
//! its sockets, its listener with them, and the kernel refuses new
//! connections. The detector then evicts it: its member record (that
//! incarnation only) and its leases' alive key are deleted, so every
//! survivor re-plans at once and takes its queues under higher tokens.
//! Anything else (the dial is accepted and kept open, times out, or fails otherwise) proves
//! nothing, and the peer's leases lapse after their TTL as before:
//!
//! - a paused process (SIGSTOP, a long GC-like stall) still has its
//!   listener: the kernel accepts the dial, nothing is evicted;
//! - a partition between nodes times the dial out: nothing is evicted
//!   (both sides keep reaching Redis and keep their leases);
//! - a false positive (something between refuses for a live peer) costs a
//!   handover, never a write: the evicted node finds its alive key gone at
//!   its next renewal (within `lease.renew`), stops those agents and takes
//!   a new epoch, and until then the queues' fences refuse every write it
//!   makes under its old tokens once a survivor took the lease.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::broadcast;
use tokio_util::sync::CancellationToken;

use super::{QueueLeases, RedisMembership};
use crate::stream::NodeId;
use crate::telemetry;

/// How long the dial of a peer whose link closed may take.
pub(super) const PROBE_TIMEOUT: Duration = Duration::from_millis(500);

/// What a dial of a lost peer found.
#[derive(Debug, PartialEq, Eq)]
enum Probe {
    /// Nothing listens there: the process is gone.
    Refused,
    /// It answered, or the dial timed out or failed otherwise: no proof.
    Inconclusive(String),
}

/// Watches this node's links and evicts peers found dead. See the module
/// documentation for the rule.
pub(crate) struct FailureDetector {
    /// This node.
    pub me: NodeId,
    /// Where the peers' addresses are, and where eviction writes.
    pub membership: RedisMembership,
    /// Whose alive keys eviction deletes.
    pub leases: Arc<dyn QueueLeases>,
}

impl FailureDetector {
    /// Runs until `stop`, on `lost` (the transport's
    /// [`super::TcpTransport::lost_links`]).
    pub(crate) async fn run(self, mut lost: broadcast::Receiver<NodeId>, stop: CancellationToken) {
        loop {
            let peer = tokio::select! {
                _ = stop.cancelled() => return,
                peer = lost.recv() => peer,
            };
            match peer {
                Ok(peer) => self.on_lost(peer).await,
                Err(broadcast::error::RecvError::Lagged(missed)) => {
                    tracing::warn!(missed, "failure detector: missed lost links; their leases lapse after the ttl")
                }
                Err(broadcast::error::RecvError::Closed) => return,
            }
        }
    }

    async fn on_lost(&self, peer: NodeId) {
        let member = self.membership.everyone().borrow().iter().find(|m| m.name == peer).cloned();
        let Some(member) = member.filter(|m| m.name != self.me) else { return };
        match probe(&member.advertise).await {
            Probe::Refused => {
                tracing::warn!(%peer, address = %member.advertise, "link closed and nothing listens at the peer's address: evicting it");
                metrics::counter!(telemetry::NODES_EVICTED, "peer" => peer.to_string()).increment(1);
                if let Err(error) = self.leases.evict(&peer).await {
                    tracing::warn!(%peer, %error, "cannot free the evicted node's leases; they lapse after the ttl");
                }
                if let Err(error) = self.membership.evict(&member).await {
                    tracing::warn!(%peer, %error, "cannot remove the evicted node's member record; it lapses after the ttl");
                }
            }
            Probe::Inconclusive(why) => {
                tracing::info!(%peer, address = %member.advertise, %why, "link closed, the peer may be alive: its leases decide");
            }
        }
    }
}

/// Dials `address`, within [`PROBE_TIMEOUT`] per step.
///
/// A process being killed closes its sockets one by one, so the link to it
/// can close while its listener still takes dials into its backlog. Such a
/// dial is reset when the listener closes a moment later; a live node keeps
/// it open (it waits for the dialer to speak first). So an accepted dial is
/// held: closed or reset, the peer is dialed again ([`PROBE_DIALS`] at
/// most, [`REDIAL_PAUSE`] times the dials so far apart: a loaded machine
/// may take a while to tear a big process down); kept open, the peer is
/// alive or paused, and that proves nothing.
async fn probe(address: &str) -> Probe {
    use tokio::io::AsyncReadExt;
    for dial in 0..PROBE_DIALS {
        if dial > 0 {
            tokio::time::sleep(REDIAL_PAUSE * dial as u32).await;
        }
        let mut stream = match tokio::time::timeout(PROBE_TIMEOUT, tokio::net::TcpStream::connect(address)).await {
            Ok(Err(error)) if error.kind() == std::io::ErrorKind::ConnectionRefused => return Probe::Refused,
            Ok(Err(error)) => return Probe::Inconclusive(error.to_string()),
            Err(_) => return Probe::Inconclusive(format!("the dial did not answer within {PROBE_TIMEOUT:?}")),
            Ok(Ok(stream)) => stream,
        };
        match tokio::time::timeout(PROBE_TIMEOUT, stream.read(&mut [0u8; 1])).await {
            Err(_) => return Probe::Inconclusive("it accepted the dial and kept it open".into()),
            Ok(Ok(n)) if n > 0 => return Probe::Inconclusive("it answered the dial".into()),
            Ok(_) => continue,
        }
    }
    Probe::Inconclusive(format!("it accepted and closed {PROBE_DIALS} dials"))
}

/// How many accepted-then-closed dials the probe makes before it gives up.
const PROBE_DIALS: usize = 5;

/// The pause before the probe's second dial; the next ones wait longer
/// (`REDIAL_PAUSE × dials so far`: 0.5 s in all over five dials).
const REDIAL_PAUSE: Duration = Duration::from_millis(50);

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn only_a_refused_dial_proves_a_peer_dead() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let address = listener.local_addr().unwrap().to_string();
        assert!(matches!(probe(&address).await, Probe::Inconclusive(_)), "a listener keeps the dial open");
        drop(listener);
        assert_eq!(probe(&address).await, Probe::Refused, "nothing listens any more");
        assert!(matches!(probe("not an address").await, Probe::Inconclusive(_)));
    }

    #[tokio::test]
    async fn a_listener_that_closes_as_it_is_dialed_is_a_dying_process() {
        // A killed process whose listener still took the first dial: it
        // resets that dial as it closes, and the next dial is refused.
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap().to_string();
        let dying = tokio::spawn(async move {
            let accepted = listener.accept().await;
            drop(listener);
            drop(accepted);
        });
        assert_eq!(probe(&address).await, Probe::Refused);
        dying.await.unwrap();
    }
}
