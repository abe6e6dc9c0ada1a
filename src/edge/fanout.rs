//! The fan-out: a run's live frames written to its viewers' sockets
//! without a task per viewer.
//!
//! A viewer's session (`sse.rs`) sets it up and catches it up on its
//! connection's task; once it is at the head of its tailer's window, its
//! connection (a plain socket, or a TLS session on one: `socket.rs`) is
//! handed over here and that task ends. Each tailer then has up to one
//! **shard** per runtime worker (`shard.rs`), a task that owns a share of
//! the run's viewers as [`Slot`]s (`slot.rs`): at every change of the
//! tailer it makes one pass over its viewers and writes each the frames it
//! lacks with one non-blocking write of the shared bytes (each frame
//! encoded once per run, as an HTTP/1.1 chunk too). A viewer whose socket
//! takes less is parked until it is writable, and then gets what it lacks
//! in one write of at most [`COALESCE_BYTES`]; it never holds up the
//! others. One whose socket takes nothing for `stall_timeout_seconds` is
//! cut (it resumes by cursor), and one that fell behind the window goes
//! back to a task of its own that reads the store as a session does, then
//! comes back.
//!
//! Over TLS the same write goes to the session's rustls connection, which
//! fills records of up to 16 KiB across the frames it is given (small
//! frames share one) before they go to the socket; what the socket did not
//! take stays in the session, bounded, and goes out before anything new
//! goes in. A TLS viewer's response ends with `close_notify` after its
//! last bytes.

mod shard;
mod slot;
mod socket;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use bytes::Bytes;
use parking_lot::Mutex;
use tokio::io::AsyncWriteExt;
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::LogEdge;
use super::direct::Connection;
use super::sse::Session;
use super::tailer::Tailer;
use super::viewer::Viewer;

pub(crate) use slot::Slot;
pub(crate) use socket::{Socket, Stream, TLS_RECORD_BYTES};

/// Most bytes written to one viewer with one write.
pub(crate) const COALESCE_BYTES: usize = 64 * 1024;
/// Most shards per tailer (fewer when the runtime has fewer workers).
const MAX_SHARDS: usize = 16;

/// A viewer's place in its run, from its session to the fan-out.
pub(crate) struct Handover {
    pub(crate) member: Member,
    /// The next line offset it needs.
    pub(crate) at: u64,
    /// Lines below this offset are replay for it.
    pub(crate) replay_until: u64,
    /// When it was last sent something (for its heartbeats).
    pub(crate) last_sent: Instant,
}

/// A viewer attached to its tailer and registered: dropping it leaves
/// both (the connection slot is free at once).
pub(crate) struct Member {
    edge: Arc<LogEdge>,
    tailer: Arc<Tailer>,
    viewer: Arc<Viewer>,
    /// Whether dropping it still has to leave.
    attached: bool,
}

impl Member {
    pub(crate) fn new(edge: Arc<LogEdge>, tailer: Arc<Tailer>, viewer: Arc<Viewer>) -> Self {
        Self { edge, tailer, viewer, attached: true }
    }

    pub(crate) fn tailer(&self) -> &Arc<Tailer> {
        &self.tailer
    }

    pub(crate) fn viewer(&self) -> &Arc<Viewer> {
        &self.viewer
    }

    /// Its parts, still attached and registered (a session takes them).
    pub(crate) fn into_parts(mut self) -> (Arc<LogEdge>, Arc<Tailer>, Arc<Viewer>) {
        self.attached = false;
        (self.edge.clone(), self.tailer.clone(), self.viewer.clone())
    }
}

impl Drop for Member {
    fn drop(&mut self) {
        if self.attached {
            self.tailer.leave(Some(self.viewer.id()), true);
            self.edge.registry.unregister(self.viewer.id());
        }
    }
}

/// A tailer's shards: where its handed-over viewers go, spread evenly.
#[derive(Default)]
pub(crate) struct Shards {
    senders: Mutex<Vec<Option<mpsc::UnboundedSender<Slot>>>>,
    next: AtomicUsize,
}

/// Shards per tailer: one per runtime worker, so that the writes of one
/// busy run use every core.
fn shard_count() -> usize {
    let workers = tokio::runtime::Handle::try_current().map_or(1, |h| h.metrics().num_workers());
    workers.clamp(1, MAX_SHARDS)
}

/// Hands `slot` over to a shard of its tailer (started if it has none, or
/// if that one ended). Dropped, and so closed, once the edge stops.
pub(crate) fn hand_over(edge: &Arc<LogEdge>, slot: Slot) {
    let tailer = slot.tailer().clone();
    let count = shard_count();
    let index = tailer.fanout.next.fetch_add(1, Ordering::Relaxed) % count;
    let mut senders = tailer.fanout.senders.lock();
    if senders.len() < count {
        senders.resize_with(count, || None);
    }
    let slot = match &senders[index] {
        Some(sender) => match sender.send(slot) {
            Ok(()) => return,
            Err(mpsc::error::SendError(slot)) => slot,
        },
        None => slot,
    };
    if edge.tasks.token().is_cancelled() {
        return;
    }
    let (sender, receiver) = mpsc::unbounded_channel();
    // A new channel's receiver is alive: the send does not fail.
    let _ = sender.send(slot);
    senders[index] = Some(sender);
    drop(senders);
    let span = tracing::debug_span!("fanout", run = %tailer.key(), shard = index);
    let shard = shard::Shard::new(edge.clone(), tailer, receiver);
    edge.tasks.spawn("fanout shard", tracing::Instrument::instrument(shard.run(), span));
}

/// A handed-over viewer that fell behind the window (lines up to `until`
/// are only in the store): its own task writes what a write left
/// (`owed`, and what its TLS session holds), catches it up as a session
/// does, then hands it over again.
fn catch_up(edge: &Arc<LogEdge>, slot: Slot, until: u64) {
    let (socket, handover, chunked, owed) = slot.into_parts();
    let task_edge = edge.clone();
    let span = tracing::debug_span!("viewer catch-up", run = %handover.member.tailer().key(), until);
    let task = async move {
        let edge = task_edge;
        let cut = handover.member.viewer().connection().clone();
        let mut stream = socket.into_stream();
        let written = tokio::select! {
            written = async { stream.write_all(&owed).await?; stream.flush().await } => written.is_ok(),
            () = cut.cancelled() => false,
        };
        if !written {
            return;
        }
        drop(owed);
        let mut session = Box::new(Session::resumed(handover, until));
        let stop = edge.tasks.token().child_token();
        if let Some(stream) = super::direct::write_session(stream, &mut session, chunked, &stop).await
            && let Some(handover) = session.into_handover()
        {
            hand_over(&edge, Slot::new(stream.into_socket(), handover, chunked));
        }
    };
    edge.tasks.spawn("viewer catch-up", tracing::Instrument::instrument(task, span));
}

/// The heartbeat comment, as a chunk and as it is.
fn heartbeat(chunked: bool) -> Bytes {
    const CHUNKED: &[u8] = b"d\r\n: heartbeat\n\n\r\n";
    Bytes::from_static(if chunked { CHUNKED } else { super::viewer::HEARTBEAT })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_chunked_heartbeat_is_the_heartbeat_as_a_chunk() {
        assert_eq!(&heartbeat(true)[..], &super::super::frames::chunk(super::super::viewer::HEARTBEAT)[..]);
        assert_eq!(&heartbeat(false)[..], super::super::viewer::HEARTBEAT);
    }
}
