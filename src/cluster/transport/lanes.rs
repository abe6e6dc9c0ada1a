//! How this node opens a lane to each peer whose session is ready, and
//! closes it when the session goes (see [`super::lane`]).

use tokio::net::TcpStream;
use tokio::time::Instant;

use super::lane::{Lane, Offer, Strand};
use super::sessions::Link;
use super::{GatewayMsg, RactorTransport, dialable, tls};
use crate::cluster::redis_membership::Member;
use crate::telemetry::TRANSPORT_LANES;

impl RactorTransport {
    /// Opens a lane (as a task) to each of `members` with a ready session
    /// and none open, unless the last attempt failed too recently; closes
    /// the lanes of peers whose session is not ready.
    pub(super) fn open_lanes(&self, members: &[Member]) {
        if self.inner.settings.lane_port.is_none() {
            return;
        }
        let now = Instant::now();
        let mut open = 0u32;
        for member in members.iter().filter(|m| m.name != self.inner.settings.me && dialable(m)) {
            let line = self.inner.peers.get(&member.name);
            if self.inner.sessions.link(&member.name) != Some(Link::Ready) {
                line.lane.close();
                continue;
            }
            if line.lane.lane().is_some() {
                open += 1;
            }
            if !line.lane.begin(now) {
                continue;
            }
            let transport = self.clone();
            let member = member.clone();
            self.inner.tasks.spawn("lane opener", async move {
                let opened = async {
                    let mut strands = Vec::new();
                    for _ in 0..Lane::wanted() {
                        strands.push(transport.open_strand(&member).await?);
                    }
                    Ok::<_, String>(strands)
                };
                match opened.await {
                    Ok(strands) => {
                        line.lane.finish(Some(strands));
                        tracing::info!(peer = %member.name, "lane open: calls to the peer bypass the session");
                    }
                    Err(error) => {
                        let failed = line.lane.finish(None);
                        if failed == 1 {
                            tracing::warn!(peer = %member.name, %error, "no lane to the peer; calls go over the session");
                        } else {
                            tracing::debug!(peer = %member.name, %error, failed, "no lane to the peer yet");
                        }
                    }
                }
            });
        }
        metrics::gauge!(TRANSPORT_LANES).set(f64::from(open));
    }

    /// Asks `member` for a ticket over the session, connects to its lane
    /// listener and presents the ticket: one strand of a lane.
    async fn open_strand(&self, member: &Member) -> Result<Strand, String> {
        let settings = &self.inner.settings;
        let within = settings.call_timeout;
        let gateway = self.gateway_of(&member.name).ok_or("no session with the peer")?;
        let bytes = self.call_session(&member.name, &gateway, GatewayMsg::lane).await.map_err(|e| e.to_string())?;
        let offer: Offer = serde_json::from_slice(&bytes)
            .map_err(|_| "the peer offers no lane (its cluster.lane is off, or it is an older build)".to_string())?;
        let (host, _) = member.advertise.rsplit_once(':').ok_or("the peer's address has no port")?;
        let address = format!("{host}:{}", offer.port);
        let connected = tokio::time::timeout(within, TcpStream::connect(&address))
            .await
            .map_err(|_| format!("connecting to {address} took longer than {within:?}"))?;
        let tcp = connected.map_err(|e| format!("cannot connect to {address}: {e}"))?;
        let _ = tcp.set_nodelay(true);
        let (frame, tasks) = (self.inner.max_frame, &self.inner.tasks);
        match &self.inner.tls {
            None => Strand::open(tcp, &offer.ticket, within, frame, tasks).await,
            Some(tls) => {
                let name = tls::server_name(&member.advertise)?;
                let handshake = tokio::time::timeout(within, tls.connector.connect(name, tcp))
                    .await
                    .map_err(|_| format!("the TLS handshake with {address} took longer than {within:?}"))?;
                let stream = handshake.map_err(|e| format!("TLS with {address}: {e}"))?;
                Strand::open(stream, &offer.ticket, within, frame, tasks).await
            }
        }
        .map_err(|e| format!("{address}: {e}"))
    }

    /// Closes a peer's lane as soon as its session goes (the dialer's next
    /// round would, a redial period later).
    pub(super) async fn close_lanes_of_lost_links(self) {
        let mut lost = self.inner.sessions.lost();
        let stop = self.inner.tasks.token().clone();
        loop {
            let peer = tokio::select! {
                _ = stop.cancelled() => return,
                peer = lost.recv() => peer,
            };
            match peer {
                Ok(peer) => self.inner.peers.get(&peer).lane.close(),
                Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {}
                Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
            }
        }
    }
}
