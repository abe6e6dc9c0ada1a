//! One handed-over viewer: its connection (`socket.rs`), its place in the
//! run (the next line offset, and bytes a write took only part of) and the
//! one non-blocking write that gives it what it lacks.

use std::io::IoSlice;
use std::sync::Arc;
use std::task::Context;

use bytes::Bytes;
use tokio::time::Instant;

use super::{COALESCE_BYTES, Handover, Member, Socket};
use crate::edge::frames;
use crate::edge::tailer::{Pull, SNAPSHOT_CHUNKS, Snapshot, Tailer};

/// Buffers of one write: what a write left, then the snapshot's chunks.
const MAX_BUFFERS: usize = SNAPSHOT_CHUNKS + 1;

/// See the module documentation.
pub(crate) struct Slot {
    socket: Socket,
    member: Member,
    /// The next line offset it needs (past the bytes in `owed`).
    at: u64,
    /// Lines below this offset are replay for it.
    replay_until: u64,
    pub(super) last_sent: Instant,
    /// Bytes it must get before anything else (the rest of a frame a
    /// write took only part of, a heartbeat, its last frame, frames pulled
    /// from behind the snapshot).
    owed: Bytes,
    chunked: bool,
    /// `owed` ends the response: close once it is written.
    closing: bool,
}

/// Where a slot goes after it was served.
pub(super) enum Served {
    /// It has everything: it waits for the next change.
    Waiting(Slot),
    /// It lacks more than its socket took: it waits until it is writable.
    Blocked(Slot),
    /// Lines up to `until` fell out of the window.
    Behind(Slot, u64),
    /// Its response ended, or its client left.
    Closed,
}

/// What a viewer behind the snapshot's shared chunks got from its tailer.
enum Pulled {
    /// Nothing new yet.
    Wait,
    /// Lines up to this offset fell out of the window.
    Behind(u64),
    /// Frames (or its end) are owed.
    Owed,
}

impl Slot {
    pub(crate) fn new(socket: Socket, handover: Handover, chunked: bool) -> Self {
        let Handover { member, at, replay_until, last_sent } = handover;
        Self { socket, member, at, replay_until, last_sent, owed: Bytes::new(), chunked, closing: false }
    }

    pub(crate) fn tailer(&self) -> &Arc<Tailer> {
        self.member.tailer()
    }

    pub(super) fn member(&self) -> &Member {
        &self.member
    }

    pub(super) fn socket(&self) -> &Socket {
        &self.socket
    }

    /// The connection, the viewer's place, the framing and the bytes owed.
    pub(super) fn into_parts(self) -> (Socket, Handover, bool, Bytes) {
        let handover =
            Handover { member: self.member, at: self.at, replay_until: self.replay_until, last_sent: self.last_sent };
        (self.socket, handover, self.chunked, self.owed)
    }

    /// Owes it a heartbeat, unless it is owed something already.
    pub(super) fn owe_heartbeat(&mut self) {
        if self.owed.is_empty() {
            self.owed = super::heartbeat(self.chunked);
        }
    }

    /// Whether its client left (see [`Socket::client_left`]); if not,
    /// `context`'s waker is woken when it does.
    pub(super) fn client_left(&mut self, context: &mut Context<'_>) -> bool {
        self.socket.client_left(context)
    }

    /// Whether its next line starts one of the snapshot's shared chunks.
    fn at_shared(&self, snapshot: &Snapshot) -> bool {
        self.at >= self.replay_until && snapshot.chunks.iter().any(|c| c.start == self.at)
    }

    /// Its socket took something: the stall clock starts again.
    fn progressed(&mut self, now: Instant) {
        self.last_sent = now;
        self.member.viewer().progressed_at(self.at, now);
    }

    /// Writes it what it lacks (at most [`COALESCE_BYTES`], one write).
    pub(super) fn serve(mut self, snapshot: &Snapshot, now: Instant) -> Served {
        // What its TLS session holds goes out before anything new goes in.
        if self.socket.holds() {
            match self.socket.send_held() {
                Ok(0) => {}
                Ok(_) => self.progressed(now),
                Err(_) => return Served::Closed,
            }
            if self.socket.holds() {
                return Served::Blocked(self);
            }
        }
        if self.owed.is_empty() && !self.closing && !self.at_shared(snapshot) {
            if self.at >= snapshot.head && snapshot.ended.is_none() {
                return Served::Waiting(self);
            }
            match self.pull(snapshot) {
                Pulled::Wait => return Served::Waiting(self),
                Pulled::Behind(until) => return Served::Behind(self, until),
                Pulled::Owed => {}
            }
        }
        // One pass's buffers: the owed bytes, then the shared chunks from
        // its cursor, each cut to what is left of the socket's pass limit
        // (`lengths` keeps their whole length: a cut one is written in part).
        let limit = self.socket.pass_limit();
        let owed = std::mem::take(&mut self.owed);
        let mut sources: [&[u8]; MAX_BUFFERS] = [&[]; MAX_BUFFERS];
        let mut lengths = [0usize; MAX_BUFFERS];
        let mut ends = [0u64; MAX_BUFFERS];
        let mut count = 0;
        let mut total = 0;
        if !owed.is_empty() {
            let taken = owed.len().min(limit);
            (sources[0], lengths[0], ends[0], count, total) = (&owed[..taken], owed.len(), self.at, 1, taken);
        }
        let mut shared_from = None;
        if !self.closing
            && self.at >= self.replay_until
            && let Some(first) = snapshot.chunks.iter().position(|c| c.start == self.at)
        {
            shared_from = Some(first);
            for chunk in &snapshot.chunks[first..] {
                if total >= COALESCE_BYTES || total >= limit || count == MAX_BUFFERS {
                    break;
                }
                let bytes = if self.chunked { &chunk.chunked } else { &chunk.frame };
                let taken = bytes.len().min(limit - total);
                (sources[count], lengths[count], ends[count]) = (&bytes[..taken], bytes.len(), chunk.end);
                count += 1;
                total += taken;
            }
        }
        if count == 0 {
            return if self.closing { self.close(now) } else { Served::Waiting(self) };
        }
        let buffers: [IoSlice<'_>; MAX_BUFFERS] = sources.map(IoSlice::new);
        let written = match self.socket.write(&buffers[..count]) {
            Ok(written) => written,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                self.owed = owed;
                return Served::Blocked(self);
            }
            Err(_) => return Served::Closed,
        };
        // What the socket (or the TLS session) took: whole buffers move the
        // cursor; the rest of one it took part of is owed.
        let mut left = written;
        let mut rest = None;
        for (index, length) in lengths[..count].iter().enumerate() {
            if left < *length {
                rest = Some((index, left));
                break;
            }
            left -= length;
            self.at = self.at.max(ends[index]);
        }
        if let Some((index, taken)) = rest {
            self.owed = match (index, shared_from) {
                (0, _) if !owed.is_empty() => owed.slice(taken..),
                (index, Some(first)) => {
                    let chunk = &snapshot.chunks[first + index - usize::from(!owed.is_empty())];
                    self.at = chunk.end;
                    if self.chunked { chunk.chunked.slice(taken..) } else { chunk.frame.slice(taken..) }
                }
                // (Every buffer is the owed bytes or a shared chunk.)
                (_, None) => return Served::Closed,
            };
        }
        if written > 0 {
            self.progressed(now);
        }
        // Still short of the head (the write was full, or it came from
        // further back than the snapshot), or at the head of a run that
        // ended (its end is owed): served again as soon as its socket is
        // writable, not at the next change, which will not come. So is
        // one whose TLS session holds what its socket did not take.
        let more = self.at < snapshot.head || snapshot.ended.is_some();
        if !self.owed.is_empty() || total >= COALESCE_BYTES || (!self.closing && more) || self.socket.holds() {
            Served::Blocked(self)
        } else if self.closing {
            self.close(now)
        } else {
            Served::Waiting(self)
        }
    }

    /// Pulls what it lacks from behind the snapshot's shared chunks into
    /// `owed`: one frame, or over TLS as many as one pass writes (small
    /// frames then share a record instead of taking one each), up to the
    /// shared chunks; or its end.
    fn pull(&mut self, snapshot: &Snapshot) -> Pulled {
        // The frames after the first, appended to it.
        let mut gathered: Option<Vec<u8>> = None;
        loop {
            // (Nothing pulled yet while nothing is owed: `gathered` only
            // holds frames after the first.)
            let first = self.owed.is_empty();
            match self.tailer().pull(self.at, self.replay_until) {
                Pull::Frame(frame, next) => {
                    // Mid-chunk, or replay: a frame of its own.
                    let frame = if self.chunked { frames::chunk(&frame) } else { frame };
                    self.at = next;
                    match &mut gathered {
                        None if first => self.owed = frame,
                        None => {
                            let mut both = self.owed.to_vec();
                            both.extend_from_slice(&frame);
                            gathered = Some(both);
                        }
                        Some(gathered) => gathered.extend_from_slice(&frame),
                    }
                }
                Pull::Wait if first => return Pulled::Wait,
                Pull::Behind { until } if first => return Pulled::Behind(until),
                Pull::End(terminal) if first => {
                    self.owe_end(terminal);
                    return Pulled::Owed;
                }
                // What comes next (the lines behind the window, its end)
                // is for the next pass.
                Pull::Wait | Pull::Behind { .. } | Pull::End(_) => break,
            }
            let size = gathered.as_ref().map_or(self.owed.len(), Vec::len);
            if !self.socket.gathers_pulls() || size >= COALESCE_BYTES || self.at_shared(snapshot) {
                break;
            }
        }
        if let Some(gathered) = gathered {
            self.owed = Bytes::from(gathered);
        }
        Pulled::Owed
    }

    /// Its response ended and every byte of it was handed over: over TLS
    /// the session's `close_notify` follows them, and the slot stays until
    /// its socket took everything (or it stalls); then it closes.
    fn close(mut self, now: Instant) -> Served {
        self.socket.close();
        match self.socket.send_held() {
            Ok(0) => {}
            Ok(_) => self.progressed(now),
            Err(_) => return Served::Closed,
        }
        if self.socket.holds() { Served::Blocked(self) } else { Served::Closed }
    }

    /// The tailer ended and it has every line: its last frame (if any) and
    /// the end of the response are owed, then it closes.
    fn owe_end(&mut self, terminal: Option<Bytes>) {
        let tailer = self.tailer();
        // A viewer waiting past the head keeps its own cursor.
        let ended = (self.at > tailer.head()).then(|| tailer.completed()).flatten();
        let last = match ended {
            Some(reason) => Some(frames::complete(tailer.key().run(), Some(self.at), reason)),
            None => terminal,
        };
        let mut out = Vec::new();
        if let Some(frame) = last {
            out.extend_from_slice(&if self.chunked { frames::chunk(&frame) } else { frame });
        }
        if self.chunked {
            out.extend_from_slice(frames::LAST_CHUNK);
        }
        self.owed = Bytes::from(out);
        self.closing = true;
    }
}
