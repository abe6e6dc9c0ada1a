//! The cluster transport: how the nodes of a multi-process cluster call each
//! other. [`ClusterTransport`] is the seam (it also resolves consumers on
//! other nodes, as [`ConsumerResolver`]); [`RactorTransport`] puts
//! `ractor_cluster` behind it:
//!
//! - one `NodeServer` per process, in `Isolated` mode, bound to
//!   `cluster.listen`, authenticating peers with the cluster cookie;
//! - one remotable **gateway** actor per node, in the `pg` group named after
//!   the node; calls are [`wire`] envelopes, answered by the
//!   [`Served`] handler the node installs;
//! - a dialer that connects to every live member (from Redis membership) and
//!   re-dials with backoff after a session drops;
//! - per peer, a bounded number of calls in flight, each with
//!   `cluster.call_timeout`;
//! - per peer, a lane: direct connections (a strand per core), each opened
//!   with a ticket the peer issues over the session, that carry the calls
//!   while they are open (`cluster.lane`; the `lane` module says how).

mod error;
#[cfg(feature = "cluster")]
mod gateway;
#[cfg(feature = "cluster")]
mod lane;
#[cfg(feature = "cluster")]
mod lanes;
#[cfg(feature = "cluster")]
mod peers;
#[cfg(feature = "cluster")]
mod proxy;
#[cfg(feature = "cluster")]
mod sessions;
#[cfg(feature = "cluster")]
mod settings;
#[cfg(feature = "cluster")]
mod tls;

#[cfg(feature = "cluster")]
use std::{collections::BTreeSet, collections::HashMap, net::SocketAddr, sync::Arc, time::Duration};

use async_trait::async_trait;
#[cfg(feature = "cluster")]
use ractor::{ActorRef, rpc::CallResult};
#[cfg(feature = "cluster")]
use ractor_cluster::{NodeServer, NodeServerMessage};
#[cfg(feature = "cluster")]
use {tokio::sync::watch, tokio_util::sync::CancellationToken};

#[cfg(feature = "cluster")]
use super::redis_membership::Member;
#[cfg(feature = "cluster")]
use super::wire::{self, Refusal};
use super::wire::{Reply, Request};
use crate::pubsub::ConsumerResolver;
#[cfg(feature = "cluster")]
use crate::pubsub::{ConsumerAddress, Origin, StreamConsumer};
#[cfg(feature = "cluster")]
use crate::retry::Backoff;
use crate::stream::NodeId;
#[cfg(feature = "cluster")]
use crate::tasks::Tasks;
#[cfg(feature = "cluster")]
use crate::telemetry::TRANSPORT_SESSIONS;
pub use error::TransportError;
#[cfg(feature = "cluster")]
pub use gateway::GatewayMsg;
#[cfg(feature = "cluster")]
use gateway::{HandlerSlot, Serving};
#[cfg(feature = "cluster")]
use sessions::{Link, Sessions};
#[cfg(feature = "cluster")]
pub use settings::TransportSettings;
#[cfg(feature = "cluster")]
use tls::Tls;
#[cfg(feature = "cluster")]
pub use tls::TlsFiles;

/// What a node answers calls with (the node installs it once it runs).
#[async_trait]
pub trait Served: Send + Sync + 'static {
    /// Answers one call.
    async fn serve(&self, request: Request) -> Reply;
}

/// Calls to other nodes of the cluster.
#[async_trait]
pub trait ClusterTransport: ConsumerResolver {
    /// Sends `request` to `peer` and waits for its reply (a `Refused` reply
    /// comes back as [`TransportError::Refused`]). The request is dropped
    /// once encoded, before the reply is awaited.
    async fn call(&self, peer: &NodeId, request: Request) -> Result<Reply, TransportError>;

    /// Whether `peer` is a live member now.
    fn is_live(&self, peer: &NodeId) -> bool;
}

#[cfg(feature = "cluster")]
/// The `ractor_cluster` transport. Clones share it.
#[derive(Clone)]
pub struct RactorTransport {
    inner: Arc<Inner>,
}

#[cfg(feature = "cluster")]
struct Inner {
    settings: TransportSettings,
    tls: Option<Tls>,
    server: ActorRef<NodeServerMessage>,
    gateway: ActorRef<GatewayMsg>,
    handler: HandlerSlot,
    max_frame: usize,
    members: watch::Receiver<Vec<Member>>,
    sessions: Arc<Sessions>,
    peers: peers::Peers,
    tasks: Tasks,
}

/// The `pg` group of `node`'s gateway.
#[cfg(feature = "cluster")]
fn group(node: &NodeId) -> String {
    format!("tailrace-gateway:{node}")
}

#[cfg(feature = "cluster")]
impl RactorTransport {
    /// Starts the node server and the gateway, and dials every live member
    /// of `members` from then on (until [`RactorTransport::shutdown`]).
    /// Calls are refused as not ready until [`RactorTransport::serve_with`].
    pub async fn start(
        settings: TransportSettings,
        members: watch::Receiver<Vec<Member>>,
    ) -> Result<Self, TransportError> {
        let start_error = |message: String| TransportError::Start { listen: settings.listen, message };
        let hostname = settings.listen.ip().to_string();
        let tls = settings.tls.as_ref().map(Tls::load).transpose().map_err(start_error)?;
        let encryption = tls.as_ref().map(|tls| ractor_cluster::IncomingEncryptionMode::Tls(tls.acceptor.clone()));
        let server = NodeServer::new(
            settings.listen.port(),
            settings.cookie.clone(),
            settings.me.to_string(),
            hostname,
            encryption,
            Some(ractor_cluster::node::NodeConnectionMode::Isolated),
        )
        .with_listen_addr(settings.listen.ip())
        .with_max_inbound_frame_size(frame_limit(settings.max_message_bytes));
        let (server, _) = ractor::Actor::spawn(None, server, ()).await.map_err(|e| start_error(e.to_string()))?;
        let sessions = Arc::new(Sessions::default());
        let subscribed = server.cast(NodeServerMessage::SubscribeToEvents {
            id: "tailrace-sessions".into(),
            subscription: Box::new(sessions::Events(sessions.clone())),
        });
        let tasks = Tasks::new(CancellationToken::new());
        let handler = HandlerSlot::default();
        let serving = Serving::new(handler.clone(), settings.max_inflight);
        let max_frame = usize::try_from(frame_limit(settings.max_message_bytes)).unwrap_or(usize::MAX);
        let lanes = match settings.lane_port {
            None => None,
            Some(port) => {
                let limits = lane::Limits { within: settings.call_timeout, max_frame };
                let at = SocketAddr::new(settings.listen.ip(), port);
                let acceptor = tls.as_ref().map(|tls| tls.acceptor.clone());
                match lane::Listener::start(at, limits, serving.clone(), acceptor, tasks.clone()).await {
                    Ok(listener) => Some(listener),
                    Err(error) => {
                        server.stop(None);
                        return Err(start_error(format!("the lane listener on {at} (cluster.lane_port): {error}")));
                    }
                }
            }
        };
        let spawned = gateway::spawn(serving, lanes, tasks.clone()).await;
        let started = match subscribed {
            Err(error) => Err(error.to_string()),
            Ok(()) => spawned.map_err(|error| error.to_string()),
        };
        let gateway = match started {
            Ok(gateway) => gateway,
            Err(message) => {
                server.stop(None);
                return Err(start_error(message));
            }
        };
        ractor::pg::join(group(&settings.me), vec![gateway.get_cell()]);
        let transport = Self {
            inner: Arc::new(Inner {
                peers: peers::Peers::new(settings.max_inflight),
                settings,
                tls,
                server,
                gateway,
                handler,
                max_frame,
                members,
                sessions,
                tasks,
            }),
        };
        let dialer = transport.clone();
        transport.inner.tasks.spawn("cluster dialer", async move { dialer.dial_forever().await });
        let closer = transport.clone();
        transport.inner.tasks.spawn("lane closer", async move { closer.close_lanes_of_lost_links().await });
        tracing::info!(node = %transport.inner.settings.me, listen = %transport.inner.settings.listen, "cluster transport listening");
        Ok(transport)
    }

    /// Answers calls with `handler` from now on.
    pub fn serve_with(&self, handler: Arc<dyn Served>) {
        self.inner.handler.set(handler);
    }

    /// Dials every live member of `peers` and waits until each has
    /// authenticated this node (within `deadline`); refuses with the first
    /// peer that closed the handshake or never answered.
    pub async fn authenticate(&self, peers: &[Member], deadline: Duration) -> Result<(), TransportError> {
        let until = tokio::time::Instant::now() + deadline;
        for peer in peers.iter().filter(|m| m.name != self.inner.settings.me) {
            self.authenticate_with(peer, until).await?;
        }
        Ok(())
    }

    /// Dials `peer` until a session with it is ready. A peer not listening
    /// yet (it joined the membership a moment before its listener) is
    /// dialed again until `until`; a peer that closes the handshake three
    /// times rejects this node (a close may also be a simultaneous dial
    /// from the other side, which the node server drops).
    async fn authenticate_with(&self, peer: &Member, until: tokio::time::Instant) -> Result<(), TransportError> {
        // Random, so that two nodes dialing each other at once (each drops
        // both connections) do not meet again.
        let pause = || Duration::from_millis(rand::random_range(150..600));
        let rejected = |reason: &str| TransportError::Rejected {
            peer: peer.name.clone(),
            address: peer.advertise.clone(),
            reason: reason.into(),
        };
        let mut closed = 0;
        loop {
            if self.inner.sessions.link(&peer.name) == Some(Link::Ready) {
                return Ok(());
            }
            if closed >= 3 {
                return Err(rejected("it closed the connection during the handshake"));
            }
            if tokio::time::Instant::now() >= until {
                return Err(rejected("it could not be reached, or did not complete the handshake in time"));
            }
            self.inner.sessions.opening(&peer.name);
            if let Err(error) = self.dial(&peer.advertise).await {
                tracing::debug!(peer = %peer.name, address = %peer.advertise, %error, "cannot dial yet");
                self.inner.sessions.down(&peer.name);
                tokio::time::sleep(pause()).await;
                continue;
            }
            // This dial's outcome: ready, closed, or still opening at the
            // call timeout.
            let settled = until.min(tokio::time::Instant::now() + self.inner.settings.call_timeout);
            loop {
                let changed = self.inner.sessions.changed();
                match self.inner.sessions.link(&peer.name) {
                    Some(Link::Ready) => return Ok(()),
                    Some(Link::ClosedBeforeAuth) => {
                        closed += 1;
                        break;
                    }
                    Some(Link::Down) => break,
                    Some(Link::Opening) | None => {}
                }
                if tokio::time::timeout_at(settled, changed).await.is_err() {
                    break;
                }
            }
            tokio::time::sleep(pause()).await;
        }
    }

    /// Stops dialing and serving; the node server and its sessions end.
    pub async fn shutdown(&self) {
        self.inner.tasks.token().cancel();
        ractor::pg::leave(group(&self.inner.settings.me), vec![self.inner.gateway.get_cell()]);
        self.inner.gateway.stop(None);
        self.inner.server.stop(None);
        self.inner.tasks.stop(self.inner.settings.me.as_str(), Duration::from_secs(5)).await;
    }

    /// Each peer whose link closes, as it closes (the failure detector
    /// probes it).
    pub fn lost_links(&self) -> tokio::sync::broadcast::Receiver<NodeId> {
        self.inner.sessions.lost()
    }

    /// Peers with an authenticated session now.
    pub fn connected(&self) -> BTreeSet<NodeId> {
        self.inner.sessions.ready()
    }

    /// Attempts in a row to open a lane to `peer` that failed (0 after one
    /// opened).
    pub fn lane_failures(&self, peer: &NodeId) -> u32 {
        self.inner.peers.get(peer).lane.failures()
    }

    /// Peers whose calls take a lane now (a direct connection beside the
    /// session; see `cluster.lane`).
    pub fn laned(&self) -> BTreeSet<NodeId> {
        let members = self.inner.members.borrow().clone();
        members
            .into_iter()
            .map(|m| m.name)
            .filter(|name| name != &self.inner.settings.me && self.inner.peers.get(name).lane.lane().is_some())
            .collect()
    }

    /// Connects to every live member without a session, each re-dialed with
    /// backoff while it stays unreachable.
    async fn dial_forever(self) {
        const BACKOFF: Backoff =
            Backoff::new(Duration::from_millis(200), Duration::from_secs(5), Duration::from_millis(200));
        let stop = self.inner.tasks.token().clone();
        let mut attempts: HashMap<NodeId, (u32, tokio::time::Instant)> = HashMap::new();
        loop {
            let members = self.inner.members.borrow().clone();
            let now = tokio::time::Instant::now();
            attempts.retain(|name, _| members.iter().any(|m| &m.name == name));
            self.inner.peers.retain(|name| members.iter().any(|m| &m.name == name));
            for member in members.iter().filter(|m| m.name != self.inner.settings.me && dialable(m)) {
                if self.inner.sessions.link(&member.name) == Some(Link::Ready) {
                    attempts.remove(&member.name);
                    continue;
                }
                // A dial in progress (this node joining, or the last round)
                // is not raced: two at once make the peer drop both. One
                // that never settled (a handshake cut before the peer named
                // itself reports nothing) is dialed again after a call
                // timeout.
                if self.inner.sessions.dialing(&member.name, self.inner.settings.call_timeout) {
                    continue;
                }
                let (tries, next) = attempts.get(&member.name).copied().unwrap_or((0, now));
                if now < next {
                    continue;
                }
                attempts.insert(member.name.clone(), (tries + 1, now + BACKOFF.delay(tries)));
                self.inner.sessions.opening(&member.name);
                if let Err(error) = self.dial(&member.advertise).await {
                    tracing::debug!(peer = %member.name, address = %member.advertise, %error, "dial failed; retrying");
                    self.inner.sessions.down(&member.name);
                }
            }
            self.open_lanes(&members);
            metrics::gauge!(TRANSPORT_SESSIONS).set(self.inner.sessions.ready().len() as f64);
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(self.inner.settings.redial) => {}
            }
        }
    }

    /// Opens a connection to `address` (over TLS if configured); the node
    /// server runs the handshake from there.
    async fn dial(&self, address: &str) -> Result<(), String> {
        match &self.inner.tls {
            None => ractor_cluster::client_connect(&self.inner.server, address).await.map_err(|e| e.to_string()),
            Some(tls) => {
                let name = tls::server_name(address)?;
                ractor_cluster::client_connect_enc(&self.inner.server, address, tls.connector.clone(), name)
                    .await
                    .map_err(|e| e.to_string())
            }
        }
    }

    /// The gateway of `peer`, if a session with it is up.
    fn gateway_of(&self, peer: &NodeId) -> Option<ActorRef<GatewayMsg>> {
        let cell = ractor::pg::get_members(&group(peer)).into_iter().find(|cell| !cell.get_id().is_local())?;
        Some(cell.into())
    }

    /// Sends `message` to `peer`'s gateway over the session and waits for
    /// the reply's bytes (at most `cluster.call_timeout`).
    async fn call_session(
        &self,
        peer: &NodeId,
        gateway: &ActorRef<GatewayMsg>,
        message: impl FnOnce(ractor::RpcReplyPort<Vec<u8>>) -> GatewayMsg,
    ) -> Result<Vec<u8>, TransportError> {
        let after = self.inner.settings.call_timeout;
        match gateway.call(message, Some(after)).await {
            Ok(CallResult::Success(bytes)) => Ok(bytes),
            Ok(CallResult::Timeout) => Err(TransportError::Timeout { peer: peer.clone(), after }),
            Ok(CallResult::SenderError) => {
                Err(TransportError::Link { peer: peer.clone(), message: "the session closed".into() })
            }
            Err(error) => Err(TransportError::Link { peer: peer.clone(), message: error.to_string() }),
        }
    }

    async fn call_once(&self, peer: &NodeId, line: &peers::Peer, request: Request) -> Result<Reply, TransportError> {
        if !self.is_live(peer) {
            return Err(TransportError::NotMember(peer.clone()));
        }
        // Room for a lane's call id before the envelope. The request goes
        // here, on the worker that made it (freed on another after the
        // reply, it cost the allocator more than its encoding).
        let bytes = wire::encode_after(&[0; lane::ID_BYTES], &request)
            .map_err(|message| TransportError::Encode { peer: peer.clone(), message })?;
        drop(request);
        let limit = self.inner.settings.max_message_bytes;
        if bytes.len() - lane::ID_BYTES > limit {
            return Err(TransportError::TooLarge { peer: peer.clone(), bytes: bytes.len() - lane::ID_BYTES, limit });
        }
        let after = self.inner.settings.call_timeout;
        // A free slot is taken at once; only a full peer is waited for.
        let acquired = match line.permits.try_acquire() {
            Ok(permit) => Ok(permit),
            Err(_) => tokio::time::timeout(after, line.permits.acquire())
                .await
                .map_err(|_| ())
                .and_then(|p| p.map_err(|_| ())),
        };
        let Ok(_permit) = acquired else {
            return Err(TransportError::Refused {
                peer: peer.clone(),
                refusal: Refusal::Busy(self.inner.settings.max_inflight),
            });
        };
        let bytes = match line.lane.lane() {
            Some(lane) => lane.call(bytes, after).await.map_err(|failure| match failure {
                lane::Failure::Timeout => TransportError::Timeout { peer: peer.clone(), after },
                lane::Failure::Closed => TransportError::Link { peer: peer.clone(), message: "the lane closed".into() },
            })?,
            None => {
                let gateway = self.gateway_of(peer).ok_or_else(|| TransportError::NoSession(peer.clone()))?;
                let mut bytes = bytes;
                bytes.drain(..lane::ID_BYTES);
                bytes::Bytes::from(self.call_session(peer, &gateway, |reply| GatewayMsg::new(bytes, reply)).await?)
            }
        };
        match wire::decode::<Reply>(&bytes) {
            Ok(Reply::Refused { refusal }) => Err(TransportError::Refused { peer: peer.clone(), refusal }),
            Ok(reply) => Ok(reply),
            Err(refusal) => Err(TransportError::Refused { peer: peer.clone(), refusal }),
        }
    }
}

/// The inbound frame limit: the largest message plus the protocol's own
/// framing.
#[cfg(feature = "cluster")]
fn frame_limit(max_message_bytes: usize) -> u64 {
    u64::try_from(max_message_bytes).unwrap_or(u64::MAX).saturating_add(64 * 1024)
}

/// Whether a member accepts node connections (a `serve` process does not).
#[cfg(feature = "cluster")]
fn dialable(member: &Member) -> bool {
    member.advertise.rsplit_once(':').is_some_and(|(host, _)| !host.is_empty())
}

#[cfg(feature = "cluster")]
#[async_trait]
impl ClusterTransport for RactorTransport {
    async fn call(&self, peer: &NodeId, request: Request) -> Result<Reply, TransportError> {
        let line = self.inner.peers.get(peer);
        let result = self.call_once(peer, &line, request).await;
        let outcome = match &result {
            Ok(_) => "ok",
            Err(TransportError::Refused { refusal: Refusal::Fenced { .. }, .. }) => "fenced",
            Err(TransportError::Refused { .. }) => "refused",
            Err(TransportError::Timeout { .. }) => "timeout",
            Err(TransportError::NotMember(_)) => "not_member",
            Err(_) => "link",
        };
        line.count(outcome);
        result
    }

    fn is_live(&self, peer: &NodeId) -> bool {
        self.inner.members.borrow().iter().any(|m| &m.name == peer)
    }
}

#[cfg(feature = "cluster")]
impl ConsumerResolver for RactorTransport {
    fn resolve(&self, address: &ConsumerAddress) -> Option<Arc<dyn StreamConsumer>> {
        Some(Arc::new(proxy::Proxy::new(Arc::new(self.clone()), address.clone(), None)))
    }

    fn resolve_from(&self, address: &ConsumerAddress, origin: Origin) -> Option<Arc<dyn StreamConsumer>> {
        Some(Arc::new(proxy::Proxy::new(Arc::new(self.clone()), address.clone(), Some(origin))))
    }
}
