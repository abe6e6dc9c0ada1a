//! The built-in queue adapters and the registry that builds one by name.
//!
//! This is the only place that names concrete adapters; the runtime sees the
//! traits of [`crate::queue`] only.

pub mod memory;
