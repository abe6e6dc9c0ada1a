//! The registry of built-in backends: builds the queue adapter (and, when
//! it has one, the shared pub-sub store) that `[queues] adapter` names.
//!
//! This is the only place that names concrete adapters; it sits above both
//! [`crate::config`] and [`crate::adapters`] so neither reads the other.

use std::sync::Arc;

use crate::adapters::{file, memory};
use crate::config::Config;
use crate::handoff::DataDirLock;
use crate::pubsub::PubSubStore;
use crate::queue::{QueueAdapterFactory, QueueError};

/// What a configured backend provides.
pub struct Backend {
    /// The queues.
    pub factory: Arc<dyn QueueAdapterFactory>,
    /// A pub-sub store every node of the cluster shares, when the backend
    /// has one (Redis); otherwise each node keeps subscriptions in memory.
    pub store: Option<Arc<dyn PubSubStore>>,
}

/// Builds the backend `config.queues.adapter` names, with its section of
/// `[adapters]` and the `[cache]` options. Connects to servers it needs.
/// `owner`, the held lock of the node's data directory, lets the `file`
/// adapter recover what a crash left there.
pub async fn build(config: &Config, owner: Option<&DataDirLock>) -> Result<Backend, QueueError> {
    let (count, cache) = (config.queues.count, config.cache.clone());
    let (factory, store): (Arc<dyn QueueAdapterFactory>, Option<Arc<dyn PubSubStore>>) =
        match config.queues.adapter.as_str() {
            "memory" => (
                Arc::new(memory::MemoryAdapterFactory::new(count, config.adapters.memory.clone()).with_cache(cache)),
                None,
            ),
            "file" => {
                let options = config.adapters.file.clone();
                let factory = match owner {
                    Some(owner) => file::FileAdapterFactory::new_owned(count, options, owner)?,
                    None => file::FileAdapterFactory::new(count, options)?,
                };
                (Arc::new(factory.with_cache(cache)), None)
            }
            "redis" => redis(config).await?,
            "kafka" => (kafka(config).await?, None),
            other => {
                return Err(QueueError::Config(format!(
                    "unknown queue adapter `{other}` (built in: file, memory, redis, kafka)"
                )));
            }
        };
    Ok(Backend { factory, store })
}

/// The Kafka adapter, its checkpoints in files or in the Redis of
/// `[adapters.redis]` (`auto` means files here: `tailrace node` makes it
/// Redis before it builds the backend).
#[cfg(feature = "kafka")]
async fn kafka(config: &Config) -> Result<Arc<dyn QueueAdapterFactory>, QueueError> {
    use crate::adapters::kafka::{CheckpointStore, KafkaAdapterFactory};
    let options = config.adapters.kafka.clone();
    let checkpointer: Arc<dyn crate::queue::Checkpointer> = match options.checkpoints {
        CheckpointStore::Redis => redis_checkpointer(config).await?,
        CheckpointStore::File | CheckpointStore::Auto => Arc::new(
            crate::checkpoint::FileCheckpointer::new(&options.checkpoint_dir)
                .map_err(|e| QueueError::Config(format!("[adapters.kafka] checkpoint_dir: {e}")))?,
        ),
    };
    let factory = KafkaAdapterFactory::connect(config.queues.count, options, checkpointer).await?;
    Ok(Arc::new(factory.with_cache(config.cache.clone())))
}

/// The Redis adapter and its pub-sub store, shared by the nodes.
#[cfg(feature = "redis")]
async fn redis(config: &Config) -> Result<(Arc<dyn QueueAdapterFactory>, Option<Arc<dyn PubSubStore>>), QueueError> {
    use crate::adapters::redis::RedisAdapterFactory;
    let factory = RedisAdapterFactory::connect(config.queues.count, config.adapters.redis.clone()).await?;
    let store = Arc::new(factory.pubsub_store(config.pubsub.max_subscriptions_per_stream));
    Ok((Arc::new(factory.with_cache(config.cache.clone())), Some(store)))
}

/// This build has no Redis adapter.
#[cfg(not(feature = "redis"))]
async fn redis(_config: &Config) -> Result<(Arc<dyn QueueAdapterFactory>, Option<Arc<dyn PubSubStore>>), QueueError> {
    Err(without("Redis adapter", "redis"))
}

/// Checkpoints in the Redis of `[adapters.redis]`.
#[cfg(all(feature = "kafka", feature = "redis"))]
async fn redis_checkpointer(config: &Config) -> Result<Arc<dyn crate::queue::Checkpointer>, QueueError> {
    use crate::adapters::redis;
    let options = &config.adapters.redis;
    let conn = redis::connect(options).await?;
    Ok(Arc::new(redis::RedisCheckpointer::new(conn, &options.key_prefix).with_wait_replicas(options.wait())))
}

/// This build cannot keep checkpoints in Redis.
#[cfg(all(feature = "kafka", not(feature = "redis")))]
async fn redis_checkpointer(_config: &Config) -> Result<Arc<dyn crate::queue::Checkpointer>, QueueError> {
    Err(without("Kafka checkpoints in Redis ([adapters.kafka] checkpoints = \"redis\")", "redis"))
}

/// What a build without `feature` says when the config asks for `what`.
#[cfg(any(not(feature = "redis"), not(feature = "kafka")))]
fn without(what: &str, feature: &str) -> QueueError {
    QueueError::Config(format!("this build of tailrace has no {what} (it was built without the `{feature}` feature)"))
}

/// This build has no Kafka adapter.
#[cfg(not(feature = "kafka"))]
async fn kafka(_config: &Config) -> Result<Arc<dyn QueueAdapterFactory>, QueueError> {
    Err(without("Kafka adapter", "kafka"))
}

#[cfg(all(test, not(feature = "redis")))]
mod tests {
    use super::*;

    /// A build without `redis` refuses a config that asks for it, naming
    /// the feature, instead of failing later or quietly running something
    /// else.
    #[tokio::test]
    async fn a_build_without_redis_refuses_the_redis_adapter_naming_the_feature() {
        let config = Config::from_toml("[queues]\nadapter = \"redis\"\n", "a test").unwrap();
        let refused = build(&config, None).await.err().map(|e| e.to_string()).unwrap_or_default();
        assert!(refused.contains("has no Redis adapter (it was built without the `redis` feature)"), "{refused}");
    }
}
