//! What the transport needs of `[cluster]`.

use std::net::SocketAddr;
use std::time::Duration;

use super::TlsFiles;
use crate::stream::NodeId;

/// `[cluster]` as the transport needs it.
#[derive(Clone, Debug)]
pub struct TransportSettings {
    /// This node.
    pub me: NodeId,
    /// Where to listen for other nodes.
    pub listen: SocketAddr,
    /// The shared secret.
    pub cookie: String,
    /// Limit of one call.
    pub call_timeout: Duration,
    /// Largest message, either way.
    pub max_message_bytes: usize,
    /// Most calls in flight to one peer, and served at once.
    pub max_inflight: usize,
    /// How often the dialer looks for peers to connect to.
    pub redial: Duration,
    /// TLS between nodes, if configured.
    pub tls: Option<TlsFiles>,
}
