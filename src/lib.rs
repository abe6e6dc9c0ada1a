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
//! The types a program needs are at the root: a [`Node`] (built with
//! [`Node::builder`]) [produces](Node::produce) [`Event`]s to a
//! [`StreamId`] and [subscribes](Node::subscribe) a [`StreamConsumer`];
//! a queue plugs in as a [`QueueAdapterFactory`] (checked by
//! [`conformance`]); the [`Archiver`] keeps pipeline runs' logs.
//!
//! Start with `docs/architecture.md`; `docs/adapters.md` shows how to plug in
//! a queue.

#![warn(missing_docs)]

pub mod adapters;
mod agent;
pub mod archive;
mod atomic_file;
#[doc(hidden)]
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
pub mod handoff;
pub mod harness;
mod manager;
mod node;
pub mod pubsub;
pub mod queue;
#[doc(hidden)]
pub mod redis_conn;
#[doc(hidden)]
pub mod retry;
#[cfg(all(feature = "edge", feature = "cluster"))]
pub mod server;
mod stream;
#[doc(hidden)]
pub mod tasks;
pub mod telemetry;
#[cfg(test)]
mod testing;
#[doc(hidden)]
pub mod tls;

// The front door: the node, its errors and reports, and the vocabulary of
// streams. Their modules are private: these are their one path. Everything
// else is at its module's path (`queue`, `pubsub`, `config`, `archive`…).
pub use agent::{AgentStatus, AttachError};
pub use manager::{AgentsState, ManagerStatus};
pub use node::{Node, NodeBuilder, NodeError, SubscribeError, SubscriptionHandle};
pub use stream::{BatchContainer, Event, EventId, NodeId, ParseTokenError, QueueId, SequenceToken, StreamId};
