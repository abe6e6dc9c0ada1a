//! How a call to another node fails.

use std::net::SocketAddr;
use std::time::Duration;

use crate::cluster::wire::Refusal;
use crate::stream::NodeId;

/// A call to another node failed.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum TransportError {
    /// The peer is not a live member (it left, or died and its record lapsed).
    #[error("node {0} is not a live member of the cluster")]
    NotMember(NodeId),
    /// No open link to the peer now (it is being dialed).
    #[error("no link to node {0} yet (re-dialing)")]
    NoLink(NodeId),
    /// The peer did not answer in time.
    #[error("node {peer} did not answer within {after:?} (cluster.call_timeout)")]
    Timeout {
        /// The peer.
        peer: NodeId,
        /// How long it waited.
        after: Duration,
    },
    /// The link broke during the call.
    #[error("the link to node {peer} broke: {message}")]
    Link {
        /// The peer.
        peer: NodeId,
        /// What broke.
        message: String,
    },
    /// The peer refused the call.
    #[error("node {peer} refused the call: {refusal}")]
    Refused {
        /// The peer.
        peer: NodeId,
        /// Why.
        refusal: Refusal,
    },
    /// The message is larger than the peers accept.
    #[error("a message of {bytes} bytes to node {peer} exceeds cluster.max_message_bytes ({limit})")]
    TooLarge {
        /// The peer.
        peer: NodeId,
        /// Its size.
        bytes: usize,
        /// The limit.
        limit: usize,
    },
    /// The message could not be encoded.
    #[error("cannot encode a message to node {peer}: {message}")]
    Encode {
        /// The peer.
        peer: NodeId,
        /// Why.
        message: String,
    },
    /// The listener could not start.
    #[error("cannot start the cluster listener on {listen} (cluster.listen): {message}")]
    Start {
        /// Where it tried.
        listen: SocketAddr,
        /// Why.
        message: String,
    },
    /// A live member did not authenticate this node.
    #[error(
        "node {peer} at {address} did not accept this node: {reason} (do all nodes share the same cluster cookie, \
         cluster.cookie, cluster.cookie_file or TAILRACE_COOKIE?)"
    )]
    Rejected {
        /// The peer.
        peer: NodeId,
        /// Where it was dialed.
        address: String,
        /// What happened.
        reason: String,
    },
}

impl TransportError {
    /// Whether the peer may answer a retry (it is a member; the link or its
    /// load was the problem).
    pub fn is_transient(&self) -> bool {
        match self {
            TransportError::NoLink(_) | TransportError::Timeout { .. } | TransportError::Link { .. } => true,
            TransportError::Refused { refusal, .. } => matches!(refusal, Refusal::NotReady | Refusal::Busy(_)),
            _ => false,
        }
    }
}
