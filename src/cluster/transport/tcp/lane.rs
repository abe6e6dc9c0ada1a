//! The lane: this node's connections to one peer, which carry its calls to
//! that peer. A lane has a connection (a strand) per core, taken in turn: a
//! peer answers each strand's calls in its reader, so it decodes as many
//! calls at once as there are strands. Calls pass one writer task and one
//! reader task on each side.
//!
//! A node opens a lane to every live member (the dialer's rounds): each
//! strand connects to the peer's advertised address (over TLS when
//! `[cluster.tls]` is set) and runs the [`super::handshake`], in which both
//! sides prove they hold the cluster cookie; the peer serves calls from
//! then on. A lane closes when one of its connections breaks (the peer is
//! told lost, for the failure detector) or the peer leaves the membership,
//! and is opened again on the dialer's next round.
//!
//! Frames are length-delimited (read with `tokio_util`'s codec, written in
//! its format by [`outbox`]): the handshake's, then calls and replies, each
//! an 8-byte call id and a wire envelope.

mod listener;
mod outbox;

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use arc_swap::ArcSwapOption;
use bytes::{Buf, Bytes, BytesMut};
use futures::StreamExt;
use parking_lot::Mutex;
use tokio::io::{AsyncRead, AsyncWrite, ReadHalf};
use tokio::sync::{Notify, oneshot};
use tokio::time::Instant;
use tokio_util::codec::{FramedRead, FramedWrite, LengthDelimitedCodec};
use tokio_util::sync::CancellationToken;

use super::handshake::{Credentials, Failed};
use crate::retry::Backoff;
use crate::stream::NodeId;
use crate::tasks::Tasks;
pub(super) use listener::{Limits, Listener};
use outbox::Outbox;

/// The bytes of a call id, before each call's and reply's envelope.
pub(super) const ID_BYTES: usize = 8;

/// How long after a failed attempt a lane is tried again: soon, as a
/// restarted peer is called again only once its lane is open.
const REOPEN: Backoff = Backoff::new(Duration::from_millis(200), Duration::from_secs(5), Duration::from_millis(200));

/// Frames of a lane, at most `max_frame` bytes.
pub(super) fn codec(max_frame: usize) -> LengthDelimitedCodec {
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
    /// Runs the handshake on `stream` as the dialer of `peer` and, once
    /// it proved itself, runs the strand's reader and writer as tasks of
    /// `tasks`; `closed` runs once the connection ends. The calls waiting
    /// at once are bounded by the caller.
    pub(super) async fn open<S>(
        stream: S,
        credentials: &Credentials<'_>,
        peer: &NodeId,
        max_frame: usize,
        tasks: &Tasks,
        closed: Box<dyn FnOnce() + Send>,
    ) -> Result<Self, Failed>
    where
        S: AsyncRead + AsyncWrite + Send + 'static,
    {
        let (read, write) = tokio::io::split(stream);
        let mut reads = FramedRead::new(read, codec(max_frame));
        let mut writes = FramedWrite::new(write, codec(max_frame));
        credentials.dial(&mut reads, &mut writes, peer).await?;
        let stop = tasks.token().child_token();
        // Callers never wait for room: their calls in flight are bounded.
        let outbox = Arc::new(Outbox::new(usize::MAX));
        let waiting = Arc::new(Mutex::new(Waiting::default()));
        let writer = (outbox.clone(), stop.clone());
        tasks.spawn("lane writer", async move { writer.0.write_to(writes.into_inner(), &writer.1).await });
        let open = Arc::new(AtomicBool::new(true));
        let reader = read_replies(reads, waiting.clone(), open.clone(), stop.clone());
        tasks.spawn("lane reader", async move {
            reader.await;
            closed();
        });
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
    strands: Vec<Strand>,
    next: AtomicUsize,
    /// Which attempt opened it (see [`Slot::begin`]).
    attempt: u64,
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
        let at = self.next.fetch_add(1, Ordering::Relaxed) % self.strands.len().max(1);
        match self.strands.get(at) {
            Some(strand) => strand.call(frame, after).await,
            None => Err(Failure::Closed),
        }
    }

    fn is_open(&self) -> bool {
        !self.strands.is_empty() && self.strands.iter().all(Strand::is_open)
    }
}

/// The most connections one lane has.
const MAX_STRANDS: usize = 8;

/// One peer's lane: the open one, or when to try again and why the last
/// attempt failed.
#[derive(Default)]
pub(super) struct Slot {
    open: ArcSwapOption<Lane>,
    attempts: Mutex<Attempts>,
    /// An attempt finished.
    finished: Notify,
}

#[derive(Default)]
struct Attempts {
    opening: bool,
    /// The last attempt begun.
    last: u64,
    failed: u32,
    next: Option<Instant>,
    /// Why the last attempt failed (none since one succeeded).
    failure: Option<Failed>,
}

impl Slot {
    /// The open lane, if any (every connection of it open).
    pub(super) fn lane(&self) -> Option<Arc<Lane>> {
        self.open.load_full().filter(|lane| lane.is_open())
    }

    /// If a lane is to be opened now (none open, none being opened, and
    /// the last failure's pause over), marks it being opened and returns
    /// the attempt's number, for [`Slot::finish`] and [`Slot::close`].
    pub(super) fn begin(&self, now: Instant) -> Option<u64> {
        if self.lane().is_some() {
            return None;
        }
        let mut attempts = self.attempts.lock();
        if attempts.opening || attempts.next.is_some_and(|next| now < next) {
            return None;
        }
        attempts.opening = true;
        attempts.last += 1;
        Some(attempts.last)
    }

    /// What `attempt` came to. Returns how many attempts in a row failed.
    pub(super) fn finish(&self, attempt: u64, opened: Result<Vec<Strand>, Failed>) -> u32 {
        let mut attempts = self.attempts.lock();
        attempts.opening = false;
        match opened {
            Ok(strands) => {
                attempts.failed = 0;
                attempts.next = None;
                attempts.failure = None;
                self.open.store(Some(Arc::new(Lane { strands, next: AtomicUsize::new(0), attempt })));
            }
            Err(failed) => {
                attempts.next = Some(Instant::now() + REOPEN.delay(attempts.failed));
                attempts.failed = attempts.failed.saturating_add(1);
                attempts.failure = Some(failed);
            }
        }
        let failed = attempts.failed;
        drop(attempts);
        self.finished.notify_waiters();
        failed
    }

    /// The open lane, once the attempt being made opens it (`None`: no
    /// attempt is being made, it failed, or `until` came first).
    pub(super) async fn wait_open(&self, until: Instant) -> Option<Arc<Lane>> {
        loop {
            // Registered before the check: a finish after it still wakes it.
            let finished = self.finished.notified();
            if let Some(lane) = self.lane() {
                return Some(lane);
            }
            if !self.attempts.lock().opening {
                return None;
            }
            tokio::time::timeout_at(until, finished).await.ok()?;
        }
    }

    /// Why the peer refused this node at the last attempt, if it did.
    pub(super) fn rejected(&self) -> Option<String> {
        match &self.attempts.lock().failure {
            Some(Failed::Rejected(reason)) => Some(reason.clone()),
            _ => None,
        }
    }

    /// Why the last attempt failed, if it did.
    pub(super) fn last_failure(&self) -> Option<String> {
        self.attempts.lock().failure.as_ref().map(ToString::to_string)
    }

    /// Closes the lane `attempt` opened, if it is the open one (a strand of
    /// an older lane ending closes nothing). Returns whether it was.
    pub(super) fn close(&self, attempt: u64) -> bool {
        // Under the lock `finish` stores a lane with.
        let _attempts = self.attempts.lock();
        if self.open.load().as_ref().is_none_or(|lane| lane.attempt != attempt) {
            return false;
        }
        self.open.store(None);
        true
    }

    /// Closes whatever lane is open (the peer left).
    pub(super) fn close_any(&self) {
        self.open.store(None);
    }
}

#[cfg(test)]
mod tests;
