//! The state of this node's links to its peers, as the node server reports
//! them (opened, authenticated, ready, closed), by peer name.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use parking_lot::Mutex;
use ractor::ActorId;
use ractor_cluster::NodeEventSubscription;
use ractor_cluster::node::NodeServerSessionInformation;
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::stream::NodeId;

/// One peer's link.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Link {
    /// Dialed or accepted; not authenticated yet.
    Opening,
    /// Authenticated and synchronised: calls go through.
    Ready,
    /// Closed before authenticating (a wrong cookie, or a duplicate
    /// connection the peer dropped).
    ClosedBeforeAuth,
    /// Closed after it was up.
    Down,
}

/// The links, updated from the node server's events. Bounded by the peers
/// that connected (at most `membership.max_members` live ones, each with its
/// few sessions: a simultaneous dial from both sides makes two, one of
/// which the node server drops).
pub(super) struct Sessions {
    links: Mutex<HashMap<NodeId, Peer>>,
    changed: Notify,
    /// Peers whose last ready session closed (bounded: a slow listener
    /// skips what it missed).
    lost: tokio::sync::broadcast::Sender<NodeId>,
}

/// Lost links kept for a slow listener.
const LOST_KEPT: usize = 64;

impl Default for Sessions {
    fn default() -> Self {
        Self { links: Mutex::default(), changed: Notify::new(), lost: tokio::sync::broadcast::channel(LOST_KEPT).0 }
    }
}

/// One peer: its sessions that are ready, the last state otherwise, and
/// when it was last dialed.
struct Peer {
    ready: BTreeSet<ActorId>,
    last: Link,
    dialed: Option<Instant>,
}

impl Peer {
    fn link(&self) -> Link {
        if self.ready.is_empty() { self.last } else { Link::Ready }
    }
}

/// `node@host` as the node server names peers: the node's name.
fn peer_of(session: &NodeServerSessionInformation) -> Option<NodeId> {
    let name = &session.peer_name.as_ref()?.name;
    let node = name.rsplit_once('@').map_or(name.as_str(), |(node, _)| node);
    Some(NodeId::new(node))
}

impl Sessions {
    pub(super) fn link(&self, peer: &NodeId) -> Option<Link> {
        self.links.lock().get(peer).map(Peer::link)
    }

    /// Resolves at the next change.
    pub(super) fn changed(&self) -> impl std::future::Future<Output = ()> + '_ {
        self.changed.notified()
    }

    /// Being dialed.
    pub(super) fn opening(&self, peer: &NodeId) {
        self.update(peer, |p| {
            p.last = Link::Opening;
            p.dialed = Some(Instant::now());
        });
    }

    /// Whether a dial of `peer` is still within `within` of its start and
    /// has not settled (another dial now would only race it).
    pub(super) fn dialing(&self, peer: &NodeId, within: std::time::Duration) -> bool {
        self.links
            .lock()
            .get(peer)
            .is_some_and(|p| p.link() == Link::Opening && p.dialed.is_some_and(|at| at.elapsed() < within))
    }

    /// A dial failed.
    pub(super) fn down(&self, peer: &NodeId) {
        self.update(peer, |p| p.last = Link::Down);
    }

    /// Each peer whose last ready session closes, as it closes.
    pub(super) fn lost(&self) -> tokio::sync::broadcast::Receiver<NodeId> {
        self.lost.subscribe()
    }

    pub(super) fn ready(&self) -> BTreeSet<NodeId> {
        self.links.lock().iter().filter(|(_, p)| !p.ready.is_empty()).map(|(peer, _)| peer.clone()).collect()
    }

    fn update(&self, peer: &NodeId, change: impl FnOnce(&mut Peer)) {
        let mut links = self.links.lock();
        change(links.entry(peer.clone()).or_insert_with(|| Peer {
            ready: BTreeSet::new(),
            last: Link::Down,
            dialed: None,
        }));
        drop(links);
        self.changed.notify_waiters();
    }
}

/// What the node server is subscribed with: the shared sessions.
pub(super) struct Events(pub(super) Arc<Sessions>);

impl NodeEventSubscription for Events {
    fn node_session_opened(&self, _session: NodeServerSessionInformation) {}

    fn node_session_disconnected(&self, session: NodeServerSessionInformation) {
        let Some(peer) = peer_of(&session) else { return };
        let id = session.actor.get_id();
        let mut lost = false;
        self.0.update(&peer, |p| {
            if p.ready.remove(&id) {
                p.last = Link::Down;
                lost = p.ready.is_empty();
            } else if p.ready.is_empty() {
                p.last = Link::ClosedBeforeAuth;
            }
        });
        tracing::info!(%peer, address = %session.peer_addr, "cluster session closed");
        if lost {
            let _ = self.0.lost.send(peer);
        }
    }

    fn node_session_authenticated(&self, session: NodeServerSessionInformation) {
        if let Some(peer) = peer_of(&session) {
            tracing::debug!(%peer, "cluster session authenticated");
        }
    }

    fn node_session_ready(&self, session: NodeServerSessionInformation) {
        let Some(peer) = peer_of(&session) else { return };
        let id = session.actor.get_id();
        self.0.update(&peer, |p| {
            p.ready.insert(id);
        });
        tracing::info!(%peer, address = %session.peer_addr, "cluster session ready");
    }
}
