//! [`TcpTransport`]: the cluster transport between processes (cargo
//! feature `cluster`), as the parent module describes it.

mod dialer;
mod handshake;
mod lane;
mod peers;
mod proxy;
mod serving;
mod settings;
mod tls;

use std::{collections::BTreeSet, sync::Arc, time::Duration};

use async_trait::async_trait;
use tokio::sync::{broadcast, watch};
use tokio_util::sync::CancellationToken;

use super::{ClusterTransport, Served, TransportError};
use crate::cluster::redis_membership::Member;
use crate::cluster::wire::{self, Refusal, Reply, Request};
use crate::pubsub::{ConsumerAddress, ConsumerResolver, Origin, StreamConsumer};
use crate::stream::NodeId;
use crate::tasks::Tasks;
use serving::{HandlerSlot, Serving};
pub use settings::TransportSettings;
use tls::Tls;
pub use tls::TlsFiles;

/// The transport between processes: TCP (or mutual TLS) connections
/// opened with the handshake. Clones share it.
#[derive(Clone)]
pub struct TcpTransport {
    inner: Arc<Inner>,
}

struct Inner {
    settings: TransportSettings,
    tls: Option<Tls>,
    handler: HandlerSlot,
    max_frame: usize,
    members: watch::Receiver<Vec<Member>>,
    peers: peers::Peers,
    /// Each peer whose lane closes, as it closes (bounded: a slow listener
    /// skips what it missed).
    lost: broadcast::Sender<NodeId>,
    tasks: Tasks,
}

/// Lost links kept for a slow listener.
const LOST_KEPT: usize = 64;

impl TcpTransport {
    /// Listens on `settings.listen` and opens a lane to every live member
    /// of `members` from then on (until [`TcpTransport::shutdown`]).
    /// Calls are refused as not ready until [`TcpTransport::serve_with`].
    pub async fn start(
        settings: TransportSettings,
        members: watch::Receiver<Vec<Member>>,
    ) -> Result<Self, TransportError> {
        let start_error = |message: String| TransportError::Start { listen: settings.listen, message };
        let tls = settings.tls.as_ref().map(Tls::load).transpose().map_err(start_error)?;
        let tasks = Tasks::new(CancellationToken::new());
        let handler = HandlerSlot::default();
        let serving = Serving::new(handler.clone(), settings.max_inflight);
        let max_frame = frame_limit(settings.max_message_bytes);
        let limits = lane::Limits { within: settings.call_timeout, max_frame };
        let acceptor = tls.as_ref().map(|tls| tls.acceptor.clone());
        let credentials = (settings.me.clone(), settings.cookie.clone());
        let listening = lane::Listener::start(settings.listen, limits, credentials, serving, acceptor, tasks.clone())
            .await
            .map_err(|error| start_error(error.to_string()))?;
        let transport = Self {
            inner: Arc::new(Inner {
                peers: peers::Peers::new(settings.max_inflight),
                settings,
                tls,
                handler,
                max_frame,
                members,
                lost: broadcast::channel(LOST_KEPT).0,
                tasks,
            }),
        };
        let dialer = transport.clone();
        transport.inner.tasks.spawn("cluster dialer", async move { dialer.dial_forever().await });
        tracing::info!(node = %transport.inner.settings.me, listen = %listening, "cluster transport listening");
        Ok(transport)
    }

    /// Answers calls with `handler` from now on.
    pub fn serve_with(&self, handler: Arc<dyn Served>) {
        self.inner.handler.set(handler);
    }

    /// Opens a lane to every live member of `peers` and waits until each
    /// has accepted this node (within `deadline`); refuses with the first
    /// peer that refused the handshake or could not be reached in time.
    pub async fn authenticate(&self, peers: &[Member], deadline: Duration) -> Result<(), TransportError> {
        let until = tokio::time::Instant::now() + deadline;
        for peer in peers.iter().filter(|m| m.name != self.inner.settings.me && dialable(m)) {
            let rejected = |reason: String| TransportError::Rejected {
                peer: peer.name.clone(),
                address: peer.advertise.clone(),
                reason,
            };
            let line = self.inner.peers.get(&peer.name);
            loop {
                self.open_lane(peer, &line);
                if line.lane.wait_open(until).await.is_some() {
                    break;
                }
                if let Some(reason) = line.lane.rejected() {
                    return Err(rejected(reason));
                }
                if tokio::time::Instant::now() >= until {
                    let last = line.lane.last_failure().unwrap_or_else(|| "no answer".into());
                    return Err(rejected(format!("it could not be reached in {deadline:?} ({last})")));
                }
                // The last attempt failed and its pause runs: wait it out.
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
        Ok(())
    }

    /// Stops dialing and serving; every connection closes.
    pub async fn shutdown(&self) {
        self.inner.tasks.token().cancel();
        self.inner.peers.retain(|_| false);
        self.inner.tasks.stop(self.inner.settings.me.as_str(), Duration::from_secs(5)).await;
    }

    /// Each peer whose link closes, as it closes (the failure detector
    /// probes it).
    pub fn lost_links(&self) -> broadcast::Receiver<NodeId> {
        self.inner.lost.subscribe()
    }

    /// Peers with an open link now (a lane this node opened to them).
    pub fn connected(&self) -> BTreeSet<NodeId> {
        let members = self.inner.members.borrow().clone();
        members
            .into_iter()
            .map(|m| m.name)
            .filter(|name| name != &self.inner.settings.me && self.inner.peers.get(name).lane.lane().is_some())
            .collect()
    }

    async fn call_once(
        &self,
        peer: &NodeId,
        line: &Arc<peers::Peer>,
        request: Request,
    ) -> Result<Reply, TransportError> {
        let Some(member) = self.inner.members.borrow().iter().find(|m| &m.name == peer).cloned() else {
            return Err(TransportError::NotMember(peer.clone()));
        };
        // Room for the call id before the envelope. The request goes
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
        let lane = match line.lane.lane() {
            Some(lane) => lane,
            // No lane (the peer just joined or came back): open one now
            // rather than at the dialer's next round.
            None => {
                self.open_lane(&member, line);
                let until = tokio::time::Instant::now() + after;
                line.lane.wait_open(until).await.ok_or_else(|| TransportError::NoLink(peer.clone()))?
            }
        };
        let bytes = lane.call(bytes, after).await.map_err(|failure| match failure {
            lane::Failure::Timeout => TransportError::Timeout { peer: peer.clone(), after },
            lane::Failure::Closed => TransportError::Link { peer: peer.clone(), message: "the link closed".into() },
        })?;
        match wire::decode::<Reply>(&bytes) {
            Ok(Reply::Refused { refusal }) => Err(TransportError::Refused { peer: peer.clone(), refusal }),
            Ok(reply) => Ok(reply),
            Err(refusal) => Err(TransportError::Refused { peer: peer.clone(), refusal }),
        }
    }
}

/// The largest frame: the largest message plus the call id and room for
/// the envelope's own framing.
fn frame_limit(max_message_bytes: usize) -> usize {
    max_message_bytes.saturating_add(64 * 1024)
}

/// Whether a member accepts node connections (a `serve` process does not).
fn dialable(member: &Member) -> bool {
    member.advertise.rsplit_once(':').is_some_and(|(host, _)| !host.is_empty())
}

#[async_trait]
impl ClusterTransport for TcpTransport {
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

impl ConsumerResolver for TcpTransport {
    fn resolve(&self, address: &ConsumerAddress) -> Option<Arc<dyn StreamConsumer>> {
        Some(Arc::new(proxy::Proxy::new(Arc::new(self.clone()), address.clone(), None)))
    }

    fn resolve_from(&self, address: &ConsumerAddress, origin: Origin) -> Option<Arc<dyn StreamConsumer>> {
        Some(Arc::new(proxy::Proxy::new(Arc::new(self.clone()), address.clone(), Some(origin))))
    }
}
