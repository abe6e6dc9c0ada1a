//! Wake on write for the idle Redis receivers of one process: a key wait
//! (client-side tracking, see [`crate::redis_conn::tracking`]) on the
//! stream, checked with `XREVRANGE stream + (last COUNT 1`.
//!
//! An idle receiver's last read came back empty: nothing past its
//! position. Its agent then waits on [`Wakes::wait`] from that position:
//! an entry added since that read is in the check's answer (the wait ends
//! at once); the next `XADD` from any node invalidates the key. This
//! process's own trims invalidate it too: the agent reads and finds
//! nothing.

use std::sync::Arc;

use redis::Value;

use super::RedisOptions;
use crate::queue::Wake;
use crate::redis_conn::tracking::KeyWaits;

/// The waits of one process's Redis receivers (on one server, or on every
/// shard of a Redis Cluster).
pub(crate) struct Wakes(Arc<KeyWaits>);

impl Wakes {
    /// Waits over a connection of `options`'s Redis, made at the first wait.
    pub(crate) fn new(options: RedisOptions) -> Self {
        let config = super::connection_config(&options);
        Self(Arc::new(KeyWaits::new(options.endpoint(), config, "idle queues are polled")))
    }

    /// A wake that completes once `stream` has an entry after `last_id`
    /// (the receiver's position at its empty read); `None` if this Redis
    /// cannot tell (poll instead).
    pub(crate) fn wait(&self, stream: String, last_id: String) -> Option<Wake> {
        let mut check = redis::cmd("XREVRANGE");
        check.arg(&stream).arg("+").arg(format!("({last_id}")).arg("COUNT").arg(1);
        self.0.wait(stream, check, |answer| matches!(answer, Value::Array(newer) if !newer.is_empty()))
    }
}
