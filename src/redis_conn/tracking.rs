//! Waits that end when a key changes, for any number of waiters of one
//! process, over one connection (one cluster client on a Redis Cluster,
//! whose shards each track the keys registered with them) and with no
//! command while nothing changes.
//!
//! A waiter knows the key's state it last saw. [`KeyWaits::wait`] asks
//! Redis to tell this process when the key changes: the wait connection
//! speaks RESP3 with client-side tracking on (`CLIENT TRACKING ON`), and a
//! check command (a read of the key) both tells whether the key already
//! moved past what the waiter saw and makes Redis remember the key for this
//! connection. The next write to the key (from any node) sends one
//! `invalidate` push for it, which completes every wait on the key. Redis
//! forgets the key once it told us, so each wait costs two commands, once.
//!
//! - Nothing is missed: a write between the waiter's look and the
//!   registration shows in the check's answer, so the wait ends at once;
//!   any later one invalidates the key.
//! - Waking for nothing is harmless (the waiter looks and finds nothing):
//!   a lost connection (the library's `Disconnection` push) or an
//!   invalidation of everything (`null`) ends every wait.
//! - `CLIENT TRACKING ON` goes with every registration, in the same
//!   pipeline: a connection made again after a drop has tracking on before
//!   its first key.
//! - A Redis that cannot track (older than 6.2, or an ACL user without
//!   `CLIENT`) is told apart once; from then on waiters poll (`None`).

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use parking_lot::Mutex;
use redis::aio::ConnectionManagerConfig;
use redis::{PushInfo, PushKind, Value};
use tokio::sync::{OnceCell, oneshot};

use super::{RedisConn, RedisEndpoint};

/// How long a wait whose registration failed (Redis unreachable) lasts
/// before the waiter looks again: an idle queue finds a Redis that came
/// back within this (its read then fails fast while Redis is still down,
/// and the agent backs off behind its probe).
const RETRY_AFTER: Duration = Duration::from_millis(100);

/// Limit of one registration on a Redis Cluster (one server's connection
/// has `config`'s).
const RESPONSE_TIMEOUT: Duration = Duration::from_secs(5);

/// A wait that ends when its key changed (or may have).
pub(crate) type KeyWait = Pin<Box<dyn Future<Output = ()> + Send + 'static>>;

/// The key waits of one process on one server. See the module docs.
pub(crate) struct KeyWaits {
    endpoint: RedisEndpoint,
    config: ConnectionManagerConfig,
    /// What happens without tracking ("idle queues are polled"), for the
    /// warning of a Redis that cannot track.
    purpose: &'static str,
    conn: OnceCell<RedisConn>,
    waiting: Arc<Mutex<Waiting>>,
    /// Redis refused tracking: waiters poll.
    unsupported: AtomicBool,
}

/// Who waits on which key, with the waits of each (pruned of the abandoned
/// ones on every new wait, and dropped as their key is told of).
#[derive(Default)]
struct Waiting {
    by_key: HashMap<Vec<u8>, Vec<oneshot::Sender<()>>>,
}

impl Waiting {
    fn add(&mut self, key: &str, waiter: oneshot::Sender<()>) {
        let waiters = self.by_key.entry(key.as_bytes().to_vec()).or_default();
        waiters.retain(|w| !w.is_closed());
        waiters.push(waiter);
    }

    fn wake(&mut self, key: &[u8]) {
        for waiter in self.by_key.remove(key).into_iter().flatten() {
            let _ = waiter.send(());
        }
    }

    fn wake_all(&mut self) {
        for (_, waiters) in self.by_key.drain() {
            for waiter in waiters {
                let _ = waiter.send(());
            }
        }
    }

    /// What Redis (or the library) pushed on the wait connection.
    fn on_push(&mut self, push: PushInfo) {
        match push.kind {
            PushKind::Invalidate => match push.data.first() {
                Some(Value::Array(keys)) => {
                    for key in keys {
                        if let Value::BulkString(key) = key {
                            self.wake(key);
                        }
                    }
                }
                // `null`: every key (a flush, or the tracking table full).
                _ => self.wake_all(),
            },
            // Tracking ended with the connection: nothing would be told.
            PushKind::Disconnection => self.wake_all(),
            _ => {}
        }
    }
}

impl KeyWaits {
    /// Waits over a connection to `endpoint` (made with `config` at the
    /// first wait); `purpose` says what is done without tracking, for the
    /// one warning a Redis that cannot track gets.
    pub(crate) fn new(endpoint: RedisEndpoint, config: ConnectionManagerConfig, purpose: &'static str) -> Self {
        Self {
            endpoint,
            config,
            purpose,
            conn: OnceCell::new(),
            waiting: Arc::new(Mutex::new(Waiting::default())),
            unsupported: AtomicBool::new(false),
        }
    }

    /// A wait that completes once `key` changes, or at once if `check` (a
    /// read of `key`) answers what `moved` calls moved on; `None` if this
    /// Redis cannot tell (poll instead).
    pub(crate) fn wait(
        self: &Arc<Self>,
        key: String,
        check: redis::Cmd,
        moved: impl FnOnce(&Value) -> bool + Send + 'static,
    ) -> Option<KeyWait> {
        if self.unsupported.load(Ordering::Relaxed) {
            return None;
        }
        let (waiter, woken) = oneshot::channel();
        self.waiting.lock().add(&key, waiter);
        let waits = self.clone();
        Some(Box::pin(async move {
            match waits.track(&key, check).await {
                Ok(answer) if moved(&answer) => {}
                // A dropped waiter means the waits were cleared: wake too.
                Ok(_) => drop(woken.await),
                // Redis unreachable or loading (as opposed to refusing tracking).
                Err(error) if super::is_transient(&error) => {
                    tracing::debug!(%key, %error, "cannot register a wait; looking again soon");
                    tokio::time::sleep(RETRY_AFTER).await;
                }
                Err(error) => {
                    if !waits.unsupported.swap(true, Ordering::Relaxed) {
                        let purpose = waits.purpose;
                        tracing::warn!(%error, "this Redis cannot tell of writes (client-side tracking, Redis 6.2+, the `client` command); {purpose} instead");
                    }
                }
            }
        }))
    }

    /// Turns tracking on (again) and runs `check`, which registers `key`,
    /// both on `key`'s server (its shard's master on a cluster).
    async fn track(&self, key: &str, check: redis::Cmd) -> Result<Value, redis::RedisError> {
        let conn = self.conn.get_or_try_init(|| self.connect()).await?;
        let mut pipe = redis::pipe();
        pipe.cmd("CLIENT").arg("TRACKING").arg("ON").add_command(check);
        let answers = conn.pipeline_at(key, pipe).await?;
        Ok(answers.into_iter().nth(1).unwrap_or(Value::Nil))
    }

    /// One RESP3 connection (to one server, or to every shard of a Redis
    /// Cluster through one cluster client: a registration goes to its
    /// key's master, whose invalidations come back the same way).
    async fn connect(&self) -> Result<RedisConn, redis::RedisError> {
        let waiting = self.waiting.clone();
        let on_push = move |push: PushInfo| -> Result<(), std::convert::Infallible> {
            waiting.lock().on_push(push);
            Ok(())
        };
        let on_push = Arc::new(on_push);
        self.endpoint.connect_any_resp3(self.config.clone(), RESPONSE_TIMEOUT, on_push).await.map_err(|e| {
            redis::RedisError::from((redis::ErrorKind::Io, "connecting the wait connection", e.to_string()))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn push(kind: PushKind, data: Vec<Value>) -> PushInfo {
        PushInfo { kind, data }
    }

    #[test]
    fn an_invalidation_wakes_the_waits_of_its_keys_only() {
        let mut waiting = Waiting::default();
        let (a, mut woken_a) = oneshot::channel();
        let (b, mut woken_b) = oneshot::channel();
        waiting.add("q1", a);
        waiting.add("q2", b);
        waiting.on_push(push(PushKind::Invalidate, vec![Value::Array(vec![Value::BulkString(b"q1".to_vec())])]));
        assert_eq!(woken_a.try_recv(), Ok(()));
        assert!(woken_b.try_recv().is_err(), "q2 was not written");
        assert_eq!(waiting.by_key.len(), 1);
    }

    #[test]
    fn a_lost_connection_or_a_flush_wakes_everyone() {
        for event in [push(PushKind::Disconnection, vec![]), push(PushKind::Invalidate, vec![Value::Nil])] {
            let mut waiting = Waiting::default();
            let (a, mut woken) = oneshot::channel();
            waiting.add("q1", a);
            waiting.on_push(event);
            assert_eq!(woken.try_recv(), Ok(()));
            assert!(waiting.by_key.is_empty());
        }
    }

    #[test]
    fn abandoned_waits_are_pruned_when_the_key_is_waited_on_again() {
        let mut waiting = Waiting::default();
        for _ in 0..100 {
            let (a, woken) = oneshot::channel();
            waiting.add("q1", a);
            drop(woken);
        }
        assert_eq!(waiting.by_key[b"q1".as_slice()].len(), 1);
    }
}
