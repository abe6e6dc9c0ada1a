//! tailrace: durable, ordered event streams in the style of Microsoft
//! Orleans' persistent streams.
//!
//! Nodes *pull* from durable queues. Each node's pulling manager applies
//! queue-ownership notifications in sequence order and runs one pulling
//! agent per owned queue; an agent reads batches, caches them in a
//! pressure-bucketed queue cache with one cursor per subscription, delivers
//! in order with at-least-once semantics, checkpoints its progress and hands
//! its queue over in strict order on shutdown.
//!
//! At the root: a [`Node`] (built with [`Node::builder`])
//! [produces](Node::produce) [`Event`]s to a [`StreamId`] and
//! [subscribes](Node::subscribe) a consumer, with the node's errors and
//! reports. Everything else has one path, in its module:
//!
//! - [`pubsub`]: consumers ([`pubsub::StreamConsumer`]), deliveries and
//!   subscriptions;
//! - [`queue`]: the traits a queue adapter implements
//!   ([`queue::QueueAdapterFactory`]), checked by [`conformance`];
//!   [`adapters`]: the built-in ones, which [`backend::build`] picks by
//!   the name in the config; [`checkpoint`]: checkpointers;
//! - [`config`]: the settings of a node;
//! - [`archive`]: pipeline runs' logs ([`archive::Archiver`]); [`handoff`]:
//!   the file adapter's writer and its recovery;
//! - [`cluster`]: membership and queue leases; [`harness`]: several nodes
//!   in one process; [`failure`]: delivery failures and dead letters;
//! - `server` and `edge` (features `edge` and `cluster`): a whole node with
//!   its HTTP edge, as the `tailrace` binary runs it;
//! - [`telemetry`]: metric names; [`redis_conn`] and [`tls`]: how Redis
//!   and TLS files named in settings are reached and read.
//!
//! Cargo features, all on by default, add the optional parts: `redis`,
//! `kafka` (those adapters and what keeps state in Redis), `edge` (the HTTP
//! edge) and `cluster` (several processes as one cluster). Without them the
//! runtime keeps the memory and file adapters and the conformance kit.
//!
//! Start with `docs/architecture.md`; `docs/adapters.md` shows how to plug in
//! a queue.

#![warn(missing_docs)]
#![warn(unreachable_pub)]

pub mod adapters;
mod agent;
pub mod archive;
mod atomic_file;
pub mod backend;
mod balancer;
mod cache;
pub mod checkpoint;
pub mod cluster;
pub mod config;
pub mod conformance;
#[cfg(feature = "edge")]
pub mod edge;
pub mod failure;
#[cfg(any(test, feature = "test-fixtures"))]
#[doc(hidden)]
pub mod fixtures;
pub mod handoff;
pub mod harness;
mod json_shape;
mod manager;
mod node;
pub mod pubsub;
pub mod queue;
pub mod redis_conn;
mod retry;
#[cfg(all(feature = "edge", feature = "cluster"))]
pub mod server;
mod stream;
mod tasks;
pub mod telemetry;
#[cfg(test)]
mod testing;
pub mod tls;

// The front door: the node, its errors and reports, and the vocabulary of
// streams. Their modules are private: these are their one path. Everything
// else is at its module's path (`queue`, `pubsub`, `config`, `archive`…).
pub use agent::{AgentStatus, AttachError};
pub use manager::{AgentsState, ManagerStatus};
pub use node::{Node, NodeBuilder, NodeError, SubscribeError, SubscriptionHandle};
pub use stream::{BatchContainer, Event, EventId, NodeId, ParseTokenError, QueueId, SequenceToken, StreamId};
