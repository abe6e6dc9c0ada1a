//! What the nodes of a cluster share: identity, membership and queue leases.
//! (The in-process multi-node harness is [`crate::harness`]; the directory
//! of running agents is the manager's.)
//!
//! A node is one OS process of a cluster, or one of several nodes hosted by a
//! single process (tests, the demo). Membership says which nodes are live;
//! every node runs the same balancer over it; a queue lease makes sure one
//! node at a time pulls a queue and that a new owner starts only after the old
//! one finished its ordered shutdown (or died). Leases live in memory
//! ([`MemoryLeases`], the in-process cluster) or in Redis ([`RedisLeases`]);
//! the live set is fed by the nodes of one process or, across processes, by
//! [`RedisMembership`]. Their settings (`[lease]`, `[membership]`) are
//! [`LeaseOptions`] and [`MembershipOptions`].

// The server's (a member of a multi-process cluster).
#[cfg(all(feature = "edge", feature = "cluster"))]
mod detector;
mod lease;
mod membership;
#[cfg(feature = "redis")]
mod redis_leases;
#[cfg(feature = "redis")]
mod redis_membership;
mod settings;
// Being rewritten (one `TcpTransport`): its files keep their `pub` items
// until then; what a program needs of it is re-exported below.
pub(crate) mod transport;
pub mod wire;

#[cfg(all(feature = "edge", feature = "cluster"))]
pub(crate) use detector::FailureDetector;
pub use lease::{Lease, LeaseError, MemoryLeases, QueueLeases};
pub use membership::Membership;
#[cfg(feature = "redis")]
pub use redis_leases::RedisLeases;
#[cfg(feature = "redis")]
pub(crate) use redis_leases::queue_tag;
#[cfg(feature = "redis")]
pub use redis_membership::{Member, MembershipError, RedisMembership};
pub use settings::{LeaseOptions, MembershipOptions};
pub use transport::{ClusterTransport, Served, TransportError};
#[cfg(feature = "cluster")]
pub use transport::{TcpTransport, TlsFiles, TransportSettings};
