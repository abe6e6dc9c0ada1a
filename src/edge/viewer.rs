//! One SSE connection's mailbox, the registry of connections and the
//! heartbeat sweep.
//!
//! A tailer hands each viewer frames that were rendered once for all of
//! them (`Bytes` are shared, not copied). A viewer's waiting frames are
//! bounded by `max_pending_bytes_per_client`: a push made while more than
//! that is waiting is refused and the tailer drops the viewer (OpenMetadata
//! checks before sending, so the frame that crosses the ceiling still goes
//! out). The HTTP body takes frames as the socket accepts them.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use crate::tasks::Tasks;
use crate::telemetry;
use bytes::Bytes;
use parking_lot::Mutex;
use tokio::sync::Notify;

/// The heartbeat comment.
pub(crate) const HEARTBEAT: &[u8] = b": heartbeat\n\n";

#[derive(Default)]
struct Mailbox {
    frames: VecDeque<Bytes>,
    pending: usize,
    /// Dropped: nothing more goes out, waiting frames included.
    closed: bool,
    /// Ended: the waiting frames go out, then the stream ends.
    ended: bool,
}

/// See the module documentation.
pub(crate) struct Viewer {
    id: u64,
    max_pending: usize,
    mailbox: Mutex<Mailbox>,
    wake: Notify,
}

/// What the body should do next.
pub(crate) enum Next {
    Frame(Bytes),
    Wait,
    /// The stream is over: end the response normally.
    End,
    /// The viewer was dropped: cut the connection (a stalled client must
    /// not keep it open waiting for the end of the response).
    Abort,
}

impl Viewer {
    pub(crate) fn id(&self) -> u64 {
        self.id
    }

    /// Queues a frame; false if the viewer is gone or too far behind (the
    /// caller drops it).
    pub(crate) fn push(&self, frame: Bytes) -> bool {
        let mut mailbox = self.mailbox.lock();
        if mailbox.closed || mailbox.ended || mailbox.pending > self.max_pending {
            return false;
        }
        mailbox.pending += frame.len();
        mailbox.frames.push_back(frame);
        drop(mailbox);
        self.wake.notify_one();
        true
    }

    /// Queues a last frame (if the viewer can still take it) and ends the
    /// stream after it.
    pub(crate) fn finish(&self, frame: Option<Bytes>) {
        let mut mailbox = self.mailbox.lock();
        if let Some(frame) = frame
            && !mailbox.closed
            && !mailbox.ended
            && mailbox.pending <= self.max_pending
        {
            mailbox.pending += frame.len();
            mailbox.frames.push_back(frame);
        }
        mailbox.ended = true;
        drop(mailbox);
        self.wake.notify_one();
    }

    /// Drops the viewer at once, without a terminal frame: it should
    /// reconnect with its last cursor.
    pub(crate) fn close(&self) {
        let mut mailbox = self.mailbox.lock();
        mailbox.closed = true;
        mailbox.frames.clear();
        mailbox.pending = 0;
        drop(mailbox);
        self.wake.notify_one();
    }

    pub(crate) fn next(&self) -> Next {
        let mut mailbox = self.mailbox.lock();
        if mailbox.closed {
            return Next::Abort;
        }
        match mailbox.frames.pop_front() {
            Some(frame) => {
                mailbox.pending -= frame.len();
                Next::Frame(frame)
            }
            None if mailbox.ended => Next::End,
            None => Next::Wait,
        }
    }

    fn is_closed(&self) -> bool {
        self.mailbox.lock().closed
    }

    /// Resolves when a frame may be waiting.
    pub(crate) async fn woken(&self) {
        self.wake.notified().await;
    }
}

/// The node's SSE connections, bounded by `max_active_connections`.
pub(crate) struct Registry {
    max: usize,
    max_pending: usize,
    next_id: AtomicU64,
    viewers: Mutex<HashMap<u64, Weak<Viewer>>>,
}

impl Registry {
    pub(crate) fn new(max: usize, max_pending: usize) -> Arc<Self> {
        Arc::new(Self { max, max_pending, next_id: AtomicU64::new(1), viewers: Mutex::new(HashMap::new()) })
    }

    /// A new viewer, or `None` at the limit. A dropped viewer's slot is
    /// free at once, even while its connection is being cut.
    pub(crate) fn register(&self) -> Option<Arc<Viewer>> {
        let mut viewers = self.viewers.lock();
        if viewers.len() >= self.max {
            viewers.retain(|_, v| v.upgrade().is_some_and(|v| !v.is_closed()));
        }
        if viewers.len() >= self.max {
            return None;
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let viewer =
            Arc::new(Viewer { id, max_pending: self.max_pending, mailbox: Mutex::default(), wake: Notify::new() });
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

    /// Connections open now (dropped viewers not counted).
    pub(crate) fn len(&self) -> usize {
        self.viewers.lock().values().filter(|v| v.upgrade().is_some_and(|v| !v.is_closed())).count()
    }

    /// Every `every`, queues a heartbeat to every connection; one that
    /// cannot take it (gone, or too far behind) is dropped. A task of
    /// `tasks`, until their token fires.
    pub(crate) fn spawn_heartbeats(self: &Arc<Self>, every: Duration, tasks: &Tasks) {
        let registry = Arc::downgrade(self);
        let stop = tasks.token().clone();
        tasks.spawn("heartbeats", async move {
            let mut ticks = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    _ = stop.cancelled() => return,
                    _ = ticks.tick() => {}
                }
                let Some(registry) = registry.upgrade() else { return };
                let viewers: Vec<Arc<Viewer>> = registry.viewers.lock().values().filter_map(Weak::upgrade).collect();
                for viewer in viewers {
                    if !viewer.push(Bytes::from_static(HEARTBEAT)) {
                        viewer.close();
                    }
                }
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_frame_that_crosses_the_ceiling_goes_out_the_next_is_refused() {
        let registry = Registry::new(2, 400);
        let viewer = registry.register().unwrap();
        assert!(viewer.push(Bytes::from(vec![b'a'; 300])));
        assert!(viewer.push(Bytes::from(vec![b'b'; 300])), "300 waiting is under the ceiling");
        assert!(!viewer.push(Bytes::from_static(b"c")), "600 waiting is over it");
        assert!(matches!(viewer.next(), Next::Frame(f) if f.len() == 300));
        assert!(viewer.push(Bytes::from_static(b"c")), "drained below the ceiling again");
    }

    #[test]
    fn connections_are_bounded_and_freed_at_once() {
        let registry = Registry::new(2, 10);
        let (a, _b) = (registry.register().unwrap(), registry.register().unwrap());
        assert!(registry.register().is_none());
        registry.unregister(a.id());
        assert!(registry.register().is_some());
    }

    #[test]
    fn a_finished_viewer_drains_then_ends_a_closed_one_ends_now() {
        let registry = Registry::new(2, 100);
        let viewer = registry.register().unwrap();
        viewer.push(Bytes::from_static(b"one"));
        viewer.finish(Some(Bytes::from_static(b"last")));
        assert!(!viewer.push(Bytes::from_static(b"late")));
        assert!(matches!(viewer.next(), Next::Frame(f) if &f[..] == b"one"));
        assert!(matches!(viewer.next(), Next::Frame(f) if &f[..] == b"last"));
        assert!(matches!(viewer.next(), Next::End));
        let dropped = registry.register().unwrap();
        dropped.push(Bytes::from_static(b"x"));
        dropped.close();
        assert!(matches!(dropped.next(), Next::Abort));
    }
}
