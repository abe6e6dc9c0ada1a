//! The lane: direct connections to one peer that carry calls beside the
//! `ractor_cluster` session. Through the session a call passes six actors
//! each way and a task for its reply (`docs/benchmarks.md`, `transport`);
//! through a lane it passes one writer task and one reader task on each
//! side. A lane has a connection (a strand) per core, taken in turn: a
//! peer answers each strand's calls in its reader, so it decodes as many
//! calls at once as there are strands.
//!
//! A node opens a lane to a peer once their session is ready: for each
//! strand it asks the peer's gateway, over the authenticated session, for
//! an offer (the lane listener's port and a one-time ticket), connects to
//! the peer's advertised host on that port (over TLS when `[cluster.tls]`
//! is set), and presents the ticket; the peer answers with an empty frame
//! and serves calls from then on. So a lane is trusted exactly as far as the
//! session that issued its ticket. Calls take the lane while it is open
//! and the session otherwise (a peer that offers no lane, an older build,
//! a port that cannot be reached); a lane closes with its session, with its
//! peer's membership, or when its connection breaks, and is opened again
//! on the dialer's next round.
//!
//! Frames are length-delimited (read with `tokio_util`'s codec, written in
//! its format by [`outbox`]): the ticket, the acknowledgement, then calls
//! and replies, each an 8-byte call id and a wire envelope.

mod listener;
mod outbox;

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use arc_swap::ArcSwapOption;
use bytes::{Buf, Bytes, BytesMut};
use futures::{SinkExt, StreamExt};
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncRead, AsyncWrite, ReadHalf};
use tokio::sync::oneshot;
use tokio::time::Instant;
use tokio_util::codec::{FramedRead, FramedWrite, LengthDelimitedCodec};
use tokio_util::sync::CancellationToken;

use crate::retry::Backoff;
use crate::tasks::Tasks;
pub(super) use listener::{Limits, Listener};
use outbox::Outbox;

/// The bytes of a call id, before each call's and reply's envelope.
pub(super) const ID_BYTES: usize = 8;

/// How long after a failed attempt a lane is tried again.
const REOPEN: Backoff = Backoff::new(Duration::from_secs(1), Duration::from_secs(60), Duration::from_millis(500));

/// What a peer's gateway answers a request for a lane.
#[derive(Debug, Serialize, Deserialize)]
pub(super) struct Offer {
    /// The lane listener's port (on the peer's advertised host).
    pub(super) port: u16,
    /// The one-time ticket to present.
    pub(super) ticket: String,
}

/// Frames of a lane, at most `max_frame` bytes.
fn codec(max_frame: usize) -> LengthDelimitedCodec {
    LengthDelimitedCodec::builder().max_frame_length(max_frame).new_codec()
}

/// Why a call on a lane failed.
#[derive(Debug)]
pub(super) enum Failure {
    /// The lane closed (before or during the call).
    Closed,
    /// No reply within the call's limit.
    Timeout,
}

/// The calls waiting for a reply on one lane.
#[derive(Default)]
struct Waiting {
    next: u64,
    replies: HashMap<u64, oneshot::Sender<Bytes>>,
    closed: bool,
}

/// One connection of a lane. Dropping it closes the connection.
pub(super) struct Strand {
    outbox: Arc<Outbox>,
    waiting: Arc<Mutex<Waiting>>,
    /// `false` once the reader ended: read by every call without the lock
    /// (a call checks `Waiting::closed` again under it).
    open: Arc<AtomicBool>,
    stop: CancellationToken,
}

impl Drop for Strand {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

impl Strand {
    /// Presents `ticket` on `stream` and, once the peer accepts it within
    /// `within`, runs the lane's reader and writer as tasks of `tasks`.
    /// The calls waiting at once are bounded by the caller.
    pub(super) async fn open<S>(
        stream: S,
        ticket: &str,
        within: Duration,
        max_frame: usize,
        tasks: &Tasks,
    ) -> Result<Self, String>
    where
        S: AsyncRead + AsyncWrite + Send + 'static,
    {
        let (read, write) = tokio::io::split(stream);
        let mut reads = FramedRead::new(read, codec(max_frame));
        let mut writes = FramedWrite::new(write, codec(max_frame));
        let accepted = tokio::time::timeout(within, async {
            writes.send(Bytes::copy_from_slice(ticket.as_bytes())).await.map_err(|e| e.to_string())?;
            match reads.next().await {
                Some(Ok(frame)) if frame.is_empty() => Ok(()),
                Some(Ok(_)) => Err("the peer answered the ticket with something else".to_string()),
                Some(Err(error)) => Err(error.to_string()),
                None => Err("the peer closed the lane (the ticket was refused)".to_string()),
            }
        })
        .await
        .map_err(|_| format!("the peer did not accept the ticket within {within:?}"))?;
        accepted?;
        let stop = tasks.token().child_token();
        // Callers never wait for room: their calls in flight are bounded.
        let outbox = Arc::new(Outbox::new(usize::MAX));
        let waiting = Arc::new(Mutex::new(Waiting::default()));
        let writer = (outbox.clone(), stop.clone());
        tasks.spawn("lane writer", async move { writer.0.write_to(writes.into_inner(), &writer.1).await });
        let open = Arc::new(AtomicBool::new(true));
        tasks.spawn("lane reader", read_replies(reads, waiting.clone(), open.clone(), stop.clone()));
        Ok(Self { outbox, waiting, open, stop })
    }

    /// Whether the strand still carries calls.
    pub(super) fn is_open(&self) -> bool {
        self.open.load(Ordering::Acquire)
    }

    /// Sends `frame` (an envelope after [`ID_BYTES`] bytes that this
    /// writes the call's id into) and waits at most `after` for the reply's
    /// envelope.
    pub(super) async fn call(&self, frame: Vec<u8>, after: Duration) -> Result<Bytes, Failure> {
        let (reply, replied) = oneshot::channel();
        let id = {
            let mut waiting = self.waiting.lock();
            if waiting.closed {
                return Err(Failure::Closed);
            }
            let id = waiting.next;
            waiting.next = id.wrapping_add(1);
            waiting.replies.insert(id, reply);
            id
        };
        let pushed = self.outbox.push(id, &frame);
        drop(frame);
        let result = match pushed {
            false => Err(Failure::Closed),
            true => match tokio::time::timeout(after, replied).await {
                Ok(Ok(reply)) => Ok(reply),
                Ok(Err(_)) => Err(Failure::Closed),
                Err(_) => Err(Failure::Timeout),
            },
        };
        if result.is_err() {
            self.waiting.lock().replies.remove(&id);
        }
        result
    }
}

/// Hands each reply to the call waiting for it; when the connection ends,
/// closes the lane and fails every call still waiting.
async fn read_replies<R: AsyncRead>(
    mut reads: FramedRead<ReadHalf<R>, LengthDelimitedCodec>,
    waiting: Arc<Mutex<Waiting>>,
    open: Arc<AtomicBool>,
    stop: CancellationToken,
) {
    let stopped = stop.cancelled();
    tokio::pin!(stopped);
    loop {
        let frame = tokio::select! {
            _ = &mut stopped => break,
            frame = reads.next() => frame,
        };
        let Some(Ok(mut frame)) = frame else { break };
        if frame.len() < ID_BYTES {
            tracing::warn!(bytes = frame.len(), "a lane reply without a call id; closing the lane");
            break;
        }
        let id = frame.get_u64();
        let reply = waiting.lock().replies.remove(&id);
        if let Some(reply) = reply {
            let _ = reply.send(frame.freeze());
        }
    }
    open.store(false, Ordering::Release);
    let failed = {
        let mut waiting = waiting.lock();
        waiting.closed = true;
        std::mem::take(&mut waiting.replies)
    };
    drop(failed);
    stop.cancel();
}

/// A frame's call id and what follows it.
fn split_id(mut frame: BytesMut) -> Option<(u64, BytesMut)> {
    (frame.len() >= ID_BYTES).then(|| (frame.get_u64(), frame))
}

/// A peer's lane: its strands, taken in turn.
pub(super) struct Lane {
    lanes: Vec<Strand>,
    next: AtomicUsize,
}

impl Lane {
    /// How many strands a lane has: one per core, at most
    /// [`MAX_STRANDS`]. A peer answers each connection's calls in the order
    /// they come, so its cores decode as many calls at once as there are
    /// connections (a task per call instead cost a spawn and a cold cache
    /// for each; measured in `docs/benchmarks.md`).
    pub(super) fn wanted() -> usize {
        std::thread::available_parallelism().map_or(2, |n| n.get()).clamp(1, MAX_STRANDS)
    }

    /// Sends a call (see [`Strand::call`]) on the next strand.
    pub(super) async fn call(&self, frame: Vec<u8>, after: Duration) -> Result<Bytes, Failure> {
        let at = self.next.fetch_add(1, Ordering::Relaxed) % self.lanes.len().max(1);
        match self.lanes.get(at) {
            Some(lane) => lane.call(frame, after).await,
            None => Err(Failure::Closed),
        }
    }

    fn is_open(&self) -> bool {
        !self.lanes.is_empty() && self.lanes.iter().all(Strand::is_open)
    }
}

/// The most connections one lane has.
const MAX_STRANDS: usize = 8;

/// One peer's lane: the open one, or when to try again.
#[derive(Default)]
pub(super) struct Slot {
    open: ArcSwapOption<Lane>,
    attempts: Mutex<Attempts>,
}

#[derive(Default)]
struct Attempts {
    opening: bool,
    failed: u32,
    next: Option<Instant>,
}

impl Slot {
    /// The open lane, if any (every connection of it open).
    pub(super) fn lane(&self) -> Option<Arc<Lane>> {
        self.open.load_full().filter(|lane| lane.is_open())
    }

    /// Whether to open a lane now (no lane open, none being opened, and
    /// the last failure's pause over); if so, marks it being opened.
    pub(super) fn begin(&self, now: Instant) -> bool {
        if self.lane().is_some() {
            return false;
        }
        let mut attempts = self.attempts.lock();
        if attempts.opening || attempts.next.is_some_and(|next| now < next) {
            return false;
        }
        attempts.opening = true;
        true
    }

    /// What the attempt `begin` allowed came to. Returns how many attempts
    /// in a row failed.
    pub(super) fn finish(&self, opened: Option<Vec<Strand>>) -> u32 {
        let mut attempts = self.attempts.lock();
        attempts.opening = false;
        match opened {
            Some(lanes) => {
                attempts.failed = 0;
                attempts.next = None;
                self.open.store(Some(Arc::new(Lane { lanes, next: AtomicUsize::new(0) })));
            }
            None => {
                attempts.next = Some(Instant::now() + REOPEN.delay(attempts.failed));
                attempts.failed = attempts.failed.saturating_add(1);
            }
        }
        attempts.failed
    }

    /// Attempts in a row that failed.
    pub(super) fn failures(&self) -> u32 {
        self.attempts.lock().failed
    }

    /// Closes the open lane (its session went down).
    pub(super) fn close(&self) {
        self.open.store(None);
    }
}

#[cfg(test)]
mod tests;
