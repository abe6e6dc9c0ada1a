//! What every built-in factory is: one shared adapter, one checkpointer and
//! the cache options, handed out as the runtime asks. Each adapter module
//! adds its own constructor and accessors to its instance of
//! [`BuiltInFactory`].

use std::sync::Arc;

use async_trait::async_trait;

use crate::queue::{CacheOptions, Checkpointer, QueueAdapter, QueueAdapterFactory, QueueError, QueueMapper};

/// An adapter that knows how its streams map to queues.
pub trait MappedAdapter: QueueAdapter {
    /// The adapter's queue mapper.
    fn mapper(&self) -> QueueMapper;
}

/// A factory of one adapter `A` (shared by every caller) and its
/// checkpointer `C`.
pub struct BuiltInFactory<A, C> {
    pub(super) adapter: Arc<A>,
    pub(super) checkpointer: Arc<C>,
    pub(super) cache: CacheOptions,
}

impl<A, C> BuiltInFactory<A, C> {
    pub(super) fn from_parts(adapter: Arc<A>, checkpointer: Arc<C>) -> Self {
        Self { adapter, checkpointer, cache: CacheOptions::default() }
    }

    /// Uses these cache options for every queue.
    pub fn with_cache(mut self, cache: CacheOptions) -> Self {
        self.cache = cache;
        self
    }

    /// The shared adapter (for producers in the same process).
    pub fn adapter(&self) -> Arc<A> {
        self.adapter.clone()
    }
}

#[async_trait]
impl<A: MappedAdapter, C: Checkpointer> QueueAdapterFactory for BuiltInFactory<A, C> {
    fn name(&self) -> &str {
        self.adapter.name()
    }

    fn queue_mapper(&self) -> QueueMapper {
        self.adapter.mapper()
    }

    async fn create_adapter(&self) -> Result<Arc<dyn QueueAdapter>, QueueError> {
        Ok(self.adapter.clone())
    }

    async fn create_checkpointer(&self) -> Result<Arc<dyn Checkpointer>, QueueError> {
        Ok(self.checkpointer.clone())
    }

    fn cache_options(&self) -> CacheOptions {
        self.cache.clone()
    }
}
