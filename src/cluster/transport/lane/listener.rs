//! The lane listener: accepts lanes from peers that present a ticket this
//! node's gateway issued over their session, and serves their calls as the
//! gateway serves the session's (the same handler, the same bound on calls
//! served at once).

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::{SinkExt, StreamExt};
use parking_lot::Mutex;
use subtle::ConstantTimeEq;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;
use tokio_rustls::TlsAcceptor;
use tokio_util::codec::{FramedRead, FramedWrite};

use super::outbox::Outbox;
use super::{Offer, codec, split_id};
use crate::cluster::transport::gateway::Serving;
use crate::tasks::{Tasks, poll_now};

/// Tickets issued and not presented yet, and connections presenting one
/// at once, at most (as many as the members a node tracks by default;
/// each peer holds one lane).
const MAX_PENDING: usize = 64;

/// The limits a lane is served with.
#[derive(Clone, Copy)]
pub(in crate::cluster::transport) struct Limits {
    /// How long a ticket stays valid, and a connection may take to
    /// present it (`cluster.call_timeout`).
    pub(in crate::cluster::transport) within: Duration,
    /// Largest frame (`cluster.max_message_bytes` and the framing), and
    /// the bytes of replies one strand holds for its writer before it stops
    /// reading calls.
    pub(in crate::cluster::transport) max_frame: usize,
}

/// This node's lane listener.
pub(in crate::cluster::transport) struct Listener {
    port: u16,
    limits: Limits,
    tickets: Mutex<VecDeque<(String, Instant)>>,
}

impl Listener {
    /// Listens on `at` (port 0: any free port) and serves lanes as tasks
    /// of `tasks` until they stop.
    pub(in crate::cluster::transport) async fn start(
        at: SocketAddr,
        limits: Limits,
        serving: Serving,
        tls: Option<TlsAcceptor>,
        tasks: Tasks,
    ) -> std::io::Result<Arc<Self>> {
        let socket = TcpListener::bind(at).await?;
        let port = socket.local_addr()?.port();
        let listener = Arc::new(Self { port, limits, tickets: Mutex::new(VecDeque::new()) });
        let accepting = Accepting { listener: listener.clone(), serving, tls, tasks: tasks.clone() };
        tasks.spawn("lane listener", accepting.run(socket));
        tracing::debug!(port, "lane listener up");
        Ok(listener)
    }

    /// A one-time ticket for a peer that asked over its session (the
    /// oldest unpresented ticket goes when there are too many).
    pub(in crate::cluster::transport) fn offer(&self) -> Offer {
        let ticket = format!("{:032x}", rand::random::<u128>());
        let mut tickets = self.tickets.lock();
        let now = Instant::now();
        tickets.retain(|(_, until)| *until > now);
        if tickets.len() >= MAX_PENDING {
            tickets.pop_front();
        }
        tickets.push_back((ticket.clone(), now + self.limits.within));
        Offer { port: self.port, ticket }
    }

    /// Whether `presented` is a ticket issued and not yet presented (it
    /// cannot be presented again).
    fn redeem(&self, presented: &[u8]) -> bool {
        let mut tickets = self.tickets.lock();
        let now = Instant::now();
        // In constant time: how much of a ticket a guess got right takes
        // no longer to find out than a guess that got nothing.
        let matches = |ticket: &String| bool::from(ticket.as_bytes().ct_eq(presented));
        match tickets.iter().position(|(ticket, until)| matches(ticket) && *until > now) {
            Some(at) => tickets.remove(at).is_some(),
            None => false,
        }
    }
}

/// The accept loop and what each lane needs.
#[derive(Clone)]
struct Accepting {
    listener: Arc<Listener>,
    serving: Serving,
    tls: Option<TlsAcceptor>,
    tasks: Tasks,
}

impl Accepting {
    async fn run(self, socket: TcpListener) {
        let presenting = Arc::new(Semaphore::new(MAX_PENDING));
        loop {
            let accepted = tokio::select! {
                _ = self.tasks.token().cancelled() => return,
                accepted = socket.accept() => accepted,
            };
            let (tcp, from) = match accepted {
                Ok(accepted) => accepted,
                Err(error) => {
                    // Out of file descriptors, most likely: pause, not spin.
                    tracing::warn!(%error, "lane listener cannot accept; pausing");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
            let Ok(slot) = presenting.clone().try_acquire_owned() else {
                tracing::warn!(%from, "too many lane connections presenting a ticket; closed one");
                continue;
            };
            let _ = tcp.set_nodelay(true);
            self.tasks.spawn("lane", self.clone().serve(tcp, from, slot));
        }
    }

    async fn serve(self, tcp: TcpStream, from: SocketAddr, slot: OwnedSemaphorePermit) {
        match self.tls.clone() {
            None => self.serve_stream(tcp, from, slot).await,
            Some(tls) => match tokio::time::timeout(self.listener.limits.within, tls.accept(tcp)).await {
                Ok(Ok(stream)) => self.serve_stream(stream, from, slot).await,
                Ok(Err(error)) => tracing::warn!(%from, %error, "a lane connection failed its TLS handshake; closed"),
                Err(_) => tracing::warn!(%from, "a lane connection did not finish its TLS handshake in time; closed"),
            },
        }
    }

    /// Takes the ticket, then answers calls until the connection ends.
    async fn serve_stream<S>(self, stream: S, from: SocketAddr, slot: OwnedSemaphorePermit)
    where
        S: AsyncRead + AsyncWrite + Send + 'static,
    {
        let limits = self.listener.limits;
        let (read, write) = tokio::io::split(stream);
        let mut reads = FramedRead::new(read, codec(limits.max_frame));
        let mut writes = FramedWrite::new(write, codec(limits.max_frame));
        let presented = tokio::time::timeout(limits.within, reads.next()).await;
        let accepted = matches!(&presented, Ok(Some(Ok(ticket))) if self.listener.redeem(ticket));
        if !accepted {
            tracing::warn!(%from, "a lane connection presented no valid ticket; closed");
            return;
        }
        if writes.send(Bytes::new()).await.is_err() {
            return;
        }
        drop(slot);
        tracing::debug!(%from, "lane accepted");
        let stop = self.tasks.token().child_token();
        let replies = Arc::new(Outbox::new(limits.max_frame));
        let writer = (replies.clone(), stop.clone());
        self.tasks.spawn("lane writer", async move { writer.0.write_to(writes.into_inner(), &writer.1).await });
        let stopped = stop.cancelled();
        tokio::pin!(stopped);
        loop {
            replies.room().await;
            let frame = tokio::select! {
                _ = &mut stopped => break,
                frame = reads.next() => frame,
            };
            let Some((id, request)) = frame.and_then(Result::ok).and_then(split_id) else { break };
            let prefix = id.to_be_bytes();
            let admitted = match self.serving.admit(&prefix) {
                Ok(admitted) => admitted,
                Err(refusal) => {
                    if !replies.push(id, &refusal) {
                        break;
                    }
                    continue;
                }
            };
            let replies = replies.clone();
            let mut call = Box::pin(async move {
                let reply = admitted.answer(&request, &prefix).await;
                replies.push(id, &reply);
            });
            // As the gateway: a call answered without waiting is answered
            // here (a lane has a connection per core, so calls are decoded
            // on as many cores), one that waits becomes a task of its own.
            if poll_now(call.as_mut()).is_pending() {
                self.tasks.spawn("lane call", call);
            }
        }
        stop.cancel();
        tracing::debug!(%from, "lane closed");
    }
}
