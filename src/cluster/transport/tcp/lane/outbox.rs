//! What one side of a lane has to write: frames appended to one buffer by
//! whichever task has them, written by the lane's writer task as one write
//! per wake-up.
//!
//! Measured against a channel of frames to the writer (`docs/benchmarks.md`,
//! `transport`): each frame was allocated by the caller's worker and freed
//! by the writer's, and the allocator's cross-thread frees were the
//! largest cost the lane added to plain TCP. Here a frame is copied into
//! the buffer and freed where it was made; the writer swaps the buffer for
//! its spare, so neither is reallocated once grown.

use bytes::{BufMut, BytesMut};
use parking_lot::Mutex;
use tokio::io::{AsyncWrite, AsyncWriteExt};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use super::ID_BYTES;

/// Frames waiting to be written, as their bytes on the wire.
pub(super) struct Outbox {
    state: Mutex<State>,
    /// Frames arrived in an empty buffer (for the writer).
    filled: Notify,
    /// The writer took the buffer (for a side that waits for room).
    drained: Notify,
    /// Bytes held at most before [`Outbox::room`] waits.
    limit: usize,
}

#[derive(Default)]
struct State {
    frames: BytesMut,
    closed: bool,
}

impl Outbox {
    pub(super) fn new(limit: usize) -> Self {
        Self { state: Mutex::default(), filled: Notify::new(), drained: Notify::new(), limit }
    }

    /// Appends the frame of call `id` with `body` (whose first [`ID_BYTES`]
    /// are left for the id). `false`: the lane closed.
    pub(super) fn push(&self, id: u64, body: &[u8]) -> bool {
        let Some(envelope) = body.get(ID_BYTES..) else { return false };
        let Ok(length) = u32::try_from(ID_BYTES + envelope.len()) else { return false };
        let was_empty = {
            let mut state = self.state.lock();
            if state.closed {
                return false;
            }
            let was_empty = state.frames.is_empty();
            // The frame as `LengthDelimitedCodec` reads it: a big-endian
            // u32 length, then the bytes.
            state.frames.reserve(4 + length as usize);
            state.frames.put_u32(length);
            state.frames.put_u64(id);
            state.frames.put_slice(envelope);
            was_empty
        };
        if was_empty {
            self.filled.notify_one();
        }
        true
    }

    /// Waits until the buffer holds less than its limit (or the lane
    /// closed): a side that writes whatever it reads waits here, so a peer
    /// that does not read its replies stops being read.
    pub(super) async fn room(&self) {
        loop {
            let drained = self.drained.notified();
            {
                let state = self.state.lock();
                if state.closed || state.frames.len() < self.limit {
                    return;
                }
            }
            drained.await;
        }
    }

    /// Closes the outbox: later pushes fail.
    pub(super) fn close(&self) {
        self.state.lock().closed = true;
        self.drained.notify_waiters();
    }

    /// Writes what is pushed until the connection fails or `stop`; then
    /// closes the outbox and cancels `stop`.
    pub(super) async fn write_to<W: AsyncWrite + Unpin>(&self, mut out: W, stop: &CancellationToken) {
        let mut spare = BytesMut::new();
        loop {
            {
                let mut state = self.state.lock();
                std::mem::swap(&mut state.frames, &mut spare);
            }
            if spare.is_empty() {
                tokio::select! {
                    _ = stop.cancelled() => break,
                    _ = self.filled.notified() => continue,
                }
            }
            self.drained.notify_waiters();
            // Flushed too: TLS may keep what the socket did not take.
            let written = tokio::select! {
                _ = stop.cancelled() => break,
                written = async {
                    out.write_all(&spare).await?;
                    out.flush().await
                } => written,
            };
            if written.is_err() {
                break;
            }
            spare.clear();
        }
        self.close();
        stop.cancel();
    }
}
