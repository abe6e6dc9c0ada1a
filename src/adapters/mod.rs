//! The built-in queue adapters and the registry that builds one by name.
//!
//! This is the only place that names concrete adapters; the runtime sees the
//! traits of [`crate::queue`] only.

pub mod file;
pub mod memory;
pub mod redis;

use std::sync::Arc;

use crate::config::Config;
use crate::queue::{QueueAdapterFactory, QueueError};

/// Builds the adapter factory `config.queues.adapter` names, with its
/// section of `[adapters]` and the `[cache]` options.
pub fn build(config: &Config) -> Result<Arc<dyn QueueAdapterFactory>, QueueError> {
    match config.queues.adapter.as_str() {
        "memory" => Ok(Arc::new(
            memory::MemoryAdapterFactory::new(config.queues.count, config.adapters.memory.clone())
                .with_cache(config.cache.clone()),
        )),
        "file" => Ok(Arc::new(
            file::FileAdapterFactory::new(config.queues.count, config.adapters.file.clone())?
                .with_cache(config.cache.clone()),
        )),
        other => Err(QueueError::Config(format!("unknown queue adapter `{other}` (built in: file, memory)"))),
    }
}
