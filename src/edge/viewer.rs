//! One SSE connection's place in its run, and the registry of connections.
//!
//! A viewer holds no frames. Its session pulls them from the run's tailer
//! (the shared window of frames rendered once for every viewer) or, when
//! it fell behind the window, from the run log store, at the pace its
//! socket takes them. What a viewer costs is its cursor, whatever the
//! bursts: it is metered by lag, never dropped for being fast. Only a
//! viewer whose socket takes nothing for `stall_timeout_seconds` while it
//! has lines to send is cut ([`Viewer::cut`] closes the connection).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use parking_lot::Mutex;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::telemetry;

/// The heartbeat comment.
pub(crate) const HEARTBEAT: &[u8] = b": heartbeat\n\n";

/// See the module documentation.
pub(crate) struct Viewer {
    id: u64,
    /// The next line offset this viewer needs.
    cursor: AtomicU64,
    /// When its socket last took a frame.
    progress: Mutex<Instant>,
    /// Closes the viewer's connection.
    connection: CancellationToken,
}

impl Viewer {
    pub(crate) fn id(&self) -> u64 {
        self.id
    }

    /// The next line offset this viewer needs.
    pub(crate) fn cursor(&self) -> u64 {
        self.cursor.load(Ordering::Relaxed)
    }

    /// The socket took a frame; the viewer now needs line `cursor`.
    pub(crate) fn progressed(&self, cursor: u64) {
        self.progressed_at(cursor, Instant::now());
    }

    /// [`Viewer::progressed`] at `now` (a pass over many viewers reads the
    /// clock once).
    pub(crate) fn progressed_at(&self, cursor: u64, now: Instant) {
        self.cursor.store(cursor, Ordering::Relaxed);
        *self.progress.lock() = now;
    }

    /// How long since the socket last took a frame.
    pub(crate) fn stalled_for(&self) -> Duration {
        self.progress.lock().elapsed()
    }

    /// Cuts the connection, without a terminal frame (the client
    /// reconnects with its last cursor).
    pub(crate) fn cut(&self) {
        self.connection.cancel();
    }

    /// The token that closes its connection.
    pub(crate) fn connection(&self) -> &CancellationToken {
        &self.connection
    }

    /// Whether the connection was cut.
    pub(crate) fn is_cut(&self) -> bool {
        self.connection.is_cancelled()
    }
}

/// The node's SSE connections, bounded by `max_active_connections`.
pub(crate) struct Registry {
    max: usize,
    next_id: AtomicU64,
    viewers: Mutex<HashMap<u64, Weak<Viewer>>>,
}

impl Registry {
    pub(crate) fn new(max: usize) -> Arc<Self> {
        Arc::new(Self { max, next_id: AtomicU64::new(1), viewers: Mutex::new(HashMap::new()) })
    }

    /// A new viewer starting at `cursor`, whose connection `connection`
    /// closes, or `None` at the limit. A cut viewer's slot is free at once,
    /// even while its connection is being closed.
    pub(crate) fn register(&self, cursor: u64, connection: CancellationToken) -> Option<Arc<Viewer>> {
        let mut viewers = self.viewers.lock();
        if viewers.len() >= self.max {
            viewers.retain(|_, v| v.upgrade().is_some_and(|v| !v.is_cut()));
        }
        if viewers.len() >= self.max {
            return None;
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let viewer =
            Arc::new(Viewer { id, cursor: AtomicU64::new(cursor), progress: Mutex::new(Instant::now()), connection });
        viewers.insert(id, Arc::downgrade(&viewer));
        metrics::gauge!(telemetry::EDGE_CONNECTIONS).set(viewers.len() as f64);
        Some(viewer)
    }

    /// Frees the viewer's slot (at once, when its stream ends).
    pub(crate) fn unregister(&self, id: u64) {
        let mut viewers = self.viewers.lock();
        viewers.remove(&id);
        metrics::gauge!(telemetry::EDGE_CONNECTIONS).set(viewers.len() as f64);
    }

    /// Connections open now (cut ones not counted).
    pub(crate) fn len(&self) -> usize {
        self.viewers.lock().values().filter(|v| v.upgrade().is_some_and(|v| !v.is_cut())).count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connections_are_bounded_and_freed_at_once() {
        let registry = Registry::new(2);
        let (a, b) = (registry.register(0, CancellationToken::new()), registry.register(0, CancellationToken::new()));
        let (a, b) = (a.unwrap(), b.unwrap());
        assert!(registry.register(0, CancellationToken::new()).is_none());
        registry.unregister(a.id());
        let c = registry.register(0, CancellationToken::new()).unwrap();
        b.cut();
        assert_eq!(registry.len(), 1, "a cut viewer is not counted");
        assert!(!c.is_cut());
        assert!(registry.register(0, CancellationToken::new()).is_some(), "its slot is free at once");
    }

    #[tokio::test(start_paused = true)]
    async fn progress_moves_the_cursor_and_resets_the_stall_clock() {
        let registry = Registry::new(1);
        let viewer = registry.register(5, CancellationToken::new()).unwrap();
        tokio::time::advance(Duration::from_secs(3)).await;
        assert_eq!((viewer.cursor(), viewer.stalled_for()), (5, Duration::from_secs(3)));
        viewer.progressed(9);
        assert_eq!((viewer.cursor(), viewer.stalled_for()), (9, Duration::ZERO));
    }
}
