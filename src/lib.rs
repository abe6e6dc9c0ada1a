//! tailrace: durable, ordered event streams in the style of Microsoft
//! Orleans' persistent streams.
//!
//! Nodes *pull* from durable queues. Each node's [`manager::PullingManager`]
//! applies queue-ownership notifications in sequence order and runs one
//! [`agent::PullingAgent`] per owned queue; an agent reads batches, caches
//! them in a pressure-bucketed [`cache::QueueCache`] with one cursor per
//! subscription, delivers in order with at-least-once semantics, checkpoints
//! its progress and hands its queue over in strict order on shutdown.
//!
//! Start with `docs/architecture.md`; `docs/adapters.md` shows how to plug in
//! a queue.

#![warn(missing_docs)]

pub mod adapters;
pub mod agent;
pub mod archive;
mod atomic_file;
pub mod backend;
pub mod balancer;
pub mod cache;
pub mod checkpoint;
pub mod cluster;
pub mod config;
pub mod conformance;
pub mod edge;
pub mod failure;
pub mod handoff;
pub mod harness;
pub mod manager;
pub mod node;
pub mod pubsub;
pub mod queue;
pub mod redis_conn;
pub mod retry;
pub mod stream;
pub mod tasks;
pub mod telemetry;
pub mod tls;
