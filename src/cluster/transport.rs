//! The cluster transport: how the nodes of a multi-process cluster call each
//! other. [`ClusterTransport`] is the seam (it also resolves consumers on
//! other nodes, as [`ConsumerResolver`]); [`TcpTransport`] carries it
//! between processes:
//!
//! - one listener per node on `cluster.listen`, which runs the
//!   handshake (`tcp/handshake.rs`: both sides prove they hold the cluster cookie; inside
//!   mutual TLS when `[cluster.tls]` is set) and serves each connection's
//!   calls with the [`Served`] handler the node installs;
//! - per live member (from Redis membership), a lane: a connection per
//!   core that carries this node's calls to it as [`wire`](super::wire) envelopes,
//!   opened by the dialer and again, with backoff, after it breaks; a lane
//!   that breaks tells the failure detector ([`TcpTransport::lost_links`]);
//! - per peer, a bounded number of calls in flight, each with
//!   `cluster.call_timeout`.

mod error;
#[cfg(feature = "cluster")]
mod tcp;

use async_trait::async_trait;

use super::wire::{Reply, Request};
use crate::pubsub::ConsumerResolver;
use crate::stream::NodeId;
pub use error::TransportError;
#[cfg(feature = "cluster")]
pub use tcp::{TcpTransport, TlsFiles, TransportSettings};

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
