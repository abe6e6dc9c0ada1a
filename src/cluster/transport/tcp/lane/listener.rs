//! The listener on `cluster.listen`: accepts peers' connections, runs the
//! handshake as its listening side, and serves the calls of each
//! connection that proved itself (with the node's handler, under the
//! node's bound on calls served at once).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_rustls::TlsAcceptor;
use tokio_util::codec::{FramedRead, FramedWrite};

use super::outbox::Outbox;
use super::{codec, split_id};
use crate::cluster::transport::tcp::handshake::Credentials;
use crate::cluster::transport::tcp::serving::Serving;
use crate::stream::NodeId;
use crate::tasks::{Tasks, poll_now};

/// Connections in their handshake at once, at most (a lane per member and
/// core: this is several peers' lanes opening together; more are closed
/// and dialed again).
const MAX_PENDING: usize = 64;

/// The limits a lane is served with.
#[derive(Clone, Copy)]
pub(in crate::cluster::transport) struct Limits {
    /// How long a connection may take for its TLS handshake and for ours
    /// (`cluster.call_timeout`).
    pub(in crate::cluster::transport) within: Duration,
    /// Largest frame (`cluster.max_message_bytes` and the framing), and
    /// the bytes of replies one strand holds for its writer before it stops
    /// reading calls.
    pub(in crate::cluster::transport) max_frame: usize,
}

/// This node's listener.
pub(in crate::cluster::transport) struct Listener {
    limits: Limits,
    me: NodeId,
    cookie: String,
}

impl Listener {
    /// Listens on `at` (port 0: any free port) as `me` and serves
    /// connections as tasks of `tasks` until they stop. Returns where it
    /// listens.
    pub(in crate::cluster::transport) async fn start(
        at: SocketAddr,
        limits: Limits,
        (me, cookie): (NodeId, String),
        serving: Serving,
        tls: Option<TlsAcceptor>,
        tasks: Tasks,
    ) -> std::io::Result<SocketAddr> {
        let socket = TcpListener::bind(at).await?;
        let bound = socket.local_addr()?;
        let listener = Arc::new(Self { limits, me, cookie });
        let accepting = Accepting { listener, serving, tls, tasks: tasks.clone() };
        tasks.spawn("cluster listener", accepting.run(socket));
        Ok(bound)
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
                    tracing::warn!(%error, "the cluster listener cannot accept; pausing");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
            let Ok(slot) = presenting.clone().try_acquire_owned() else {
                tracing::warn!(%from, "too many node connections in their handshake; closed one");
                continue;
            };
            let _ = tcp.set_nodelay(true);
            self.tasks.spawn("node connection", self.clone().serve(tcp, from, slot));
        }
    }

    async fn serve(self, tcp: TcpStream, from: SocketAddr, slot: OwnedSemaphorePermit) {
        match self.tls.clone() {
            None => self.serve_stream(tcp, from, slot).await,
            Some(tls) => match tokio::time::timeout(self.listener.limits.within, tls.accept(tcp)).await {
                Ok(Ok(stream)) => self.serve_stream(stream, from, slot).await,
                Ok(Err(error)) => tracing::warn!(%from, %error, "a node connection failed its TLS handshake; closed"),
                Err(_) => tracing::warn!(%from, "a node connection did not finish its TLS handshake in time; closed"),
            },
        }
    }

    /// Runs the handshake, then answers calls until the connection ends.
    async fn serve_stream<S>(self, stream: S, from: SocketAddr, slot: OwnedSemaphorePermit)
    where
        S: AsyncRead + AsyncWrite + Send + 'static,
    {
        let limits = self.listener.limits;
        let (read, write) = tokio::io::split(stream);
        let mut reads = FramedRead::new(read, codec(limits.max_frame));
        let mut writes = FramedWrite::new(write, codec(limits.max_frame));
        let listener = &self.listener;
        let credentials = Credentials { me: &listener.me, cookie: &listener.cookie, within: limits.within };
        let peer = match credentials.accept(&mut reads, &mut writes).await {
            Ok(peer) => peer,
            Err(failed) => {
                tracing::warn!(%from, reason = %failed, "a node connection failed the handshake; closed");
                return;
            }
        };
        drop(slot);
        tracing::debug!(%from, %peer, "node connection accepted");
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
        tracing::debug!(%from, %peer, "node connection closed");
    }
}
