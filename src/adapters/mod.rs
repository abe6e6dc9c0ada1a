//! The built-in queue adapters. [`crate::backend::build`] picks one by the
//! name in the config; the runtime sees the traits of [`crate::queue`] only.

// The batch container encoding Redis entries and Kafka records share.
#[cfg(any(feature = "redis", feature = "kafka"))]
mod entry;
mod factory;
pub mod file;
pub mod kafka;
pub mod memory;
pub mod redis;

pub use factory::{BuiltInFactory, MappedAdapter};
