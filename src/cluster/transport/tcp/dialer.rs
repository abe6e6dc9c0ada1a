//! How this node opens a lane to each live member (see [`super::lane`]):
//! a round every `redial` period, and at once when a call finds none.

use std::sync::{Arc, Weak};

use tokio::net::TcpStream;
use tokio::time::Instant;

use super::handshake::{Credentials, Failed};
use super::lane::{Lane, Strand};
use super::peers::Peer;
use super::{TcpTransport, dialable, tls};
use crate::cluster::redis_membership::Member;
use crate::telemetry::TRANSPORT_LINKS;

impl TcpTransport {
    /// Opens a lane to every live member without one, each attempt after
    /// the pause the last failure set, until the transport stops; forgets
    /// (and disconnects) members that left.
    pub(super) async fn dial_forever(self) {
        let stop = self.inner.tasks.token().clone();
        loop {
            let members = self.inner.members.borrow().clone();
            self.inner.peers.retain(|name| members.iter().any(|m| &m.name == name));
            let mut open = 0u32;
            for member in members.iter().filter(|m| m.name != self.inner.settings.me && dialable(m)) {
                let line = self.inner.peers.get(&member.name);
                if line.lane.lane().is_some() {
                    open += 1;
                } else {
                    self.open_lane(member, &line);
                }
            }
            metrics::gauge!(TRANSPORT_LINKS).set(f64::from(open));
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(self.inner.settings.redial) => {}
            }
        }
    }

    /// Opens a lane to `member` as a task, unless one is open, being
    /// opened, or the last attempt failed too recently.
    pub(super) fn open_lane(&self, member: &Member, line: &Arc<Peer>) {
        let Some(attempt) = line.lane.begin(Instant::now()) else { return };
        let transport = self.clone();
        let (member, line) = (member.clone(), Arc::downgrade(line));
        self.inner.tasks.spawn("lane opener", async move {
            let opened = async {
                let mut strands = Vec::new();
                for _ in 0..Lane::wanted() {
                    strands.push(transport.open_strand(&member, attempt, line.clone()).await?);
                }
                Ok::<_, Failed>(strands)
            };
            let opened = opened.await;
            let Some(line) = line.upgrade() else { return };
            match opened {
                Ok(strands) => {
                    line.lane.finish(attempt, Ok(strands));
                    tracing::info!(peer = %member.name, address = %member.advertise, "link to the peer open");
                }
                Err(failed) => {
                    let reason = failed.to_string();
                    let rejected = matches!(failed, Failed::Rejected(_));
                    match line.lane.finish(attempt, Err(failed)) {
                        1 if rejected => tracing::warn!(peer = %member.name, %reason, "the peer refused this node"),
                        1 => tracing::info!(peer = %member.name, %reason, "no link to the peer yet; re-dialing"),
                        failed => tracing::debug!(peer = %member.name, %reason, failed, "no link to the peer yet"),
                    }
                }
            }
        });
    }

    /// Connects to `member`'s advertised address and runs the handshake:
    /// one strand of the lane `attempt` opens. When the strand's connection
    /// ends, that lane closes and the peer is reported lost.
    async fn open_strand(&self, member: &Member, attempt: u64, line: Weak<Peer>) -> Result<Strand, Failed> {
        let settings = &self.inner.settings;
        let within = settings.call_timeout;
        let address = &member.advertise;
        let connected = tokio::time::timeout(within, TcpStream::connect(address))
            .await
            .map_err(|_| Failed::Broken(format!("connecting to {address} took longer than {within:?}")))?;
        let tcp = connected.map_err(|e| Failed::Broken(format!("cannot connect to {address}: {e}")))?;
        let _ = tcp.set_nodelay(true);
        let credentials = Credentials { me: &settings.me, cookie: &settings.cookie, within };
        let (peer, lost) = (member.name.clone(), self.inner.lost.clone());
        let closed = Box::new(move || {
            if line.upgrade().is_some_and(|line| line.lane.close(attempt)) {
                tracing::info!(%peer, "link to the peer closed");
                let _ = lost.send(peer);
            }
        });
        let (frame, tasks) = (self.inner.max_frame, &self.inner.tasks);
        match &self.inner.tls {
            None => Strand::open(tcp, &credentials, &member.name, frame, tasks, closed).await,
            Some(tls) => {
                let name = tls::server_name(address).map_err(Failed::Rejected)?;
                let handshake = tokio::time::timeout(within, tls.connector.connect(name, tcp)).await.map_err(|_| {
                    Failed::Broken(format!("the TLS handshake with {address} took longer than {within:?}"))
                })?;
                let stream = handshake.map_err(|e| Failed::Broken(format!("TLS with {address}: {e}")))?;
                Strand::open(stream, &credentials, &member.name, frame, tasks, closed).await
            }
        }
    }
}
