//! One handed-over viewer: its socket, its place in the run (the next
//! line offset, and bytes a write took only part of) and the one
//! non-blocking write that gives it what it lacks.

use std::io::IoSlice;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use tokio::net::TcpStream;
use tokio::time::Instant;

use super::{COALESCE_BYTES, Handover, Member};
use crate::edge::frames;
use crate::edge::tailer::{Pull, SNAPSHOT_CHUNKS, Snapshot, Tailer};

/// Buffers of one write: what a write left, then the snapshot's chunks.
const MAX_BUFFERS: usize = SNAPSHOT_CHUNKS + 1;

/// See the module documentation.
pub(crate) struct Slot {
    socket: TcpStream,
    member: Member,
    /// The next line offset it needs (past the bytes in `owed`).
    at: u64,
    /// Lines below this offset are replay for it.
    replay_until: u64,
    pub(super) last_sent: Instant,
    /// Bytes it must get before anything else (the rest of a frame a
    /// write took only part of, a heartbeat, its last frame).
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

impl Slot {
    pub(crate) fn new(socket: TcpStream, handover: Handover, chunked: bool) -> Self {
        let Handover { member, at, replay_until, last_sent } = handover;
        Self { socket, member, at, replay_until, last_sent, owed: Bytes::new(), chunked, closing: false }
    }

    pub(crate) fn tailer(&self) -> &Arc<Tailer> {
        self.member.tailer()
    }

    pub(super) fn member(&self) -> &Member {
        &self.member
    }

    pub(super) fn socket(&self) -> &TcpStream {
        &self.socket
    }

    /// The socket, the viewer's place, the framing and the bytes owed.
    pub(super) fn into_parts(self) -> (TcpStream, Handover, bool, Bytes) {
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

    /// Whether its client closed the connection (or sent something, which
    /// a viewer must not). If not, `context`'s waker is woken when it
    /// does: the runtime holds it with the socket, so a shard learns of a
    /// client that left at once without a task or a future per viewer.
    pub(super) fn client_left(&self, context: &mut Context<'_>) -> bool {
        let mut probe = [0u8; 1];
        loop {
            match self.socket.poll_read_ready(context) {
                Poll::Pending => return false,
                Poll::Ready(Err(_)) => return true,
                // Readable: closed, or a readiness left from the request
                // (the read clears it, then the waker is registered).
                Poll::Ready(Ok(())) => match self.socket.try_read(&mut probe) {
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
                    _ => return true,
                },
            }
        }
    }

    /// Writes it what it lacks (at most [`COALESCE_BYTES`], one write).
    pub(super) fn serve(mut self, snapshot: &Snapshot, now: Instant) -> Served {
        if self.owed.is_empty() && !self.closing {
            let shared = self.at >= self.replay_until && snapshot.chunks.iter().any(|c| c.start == self.at);
            if !shared {
                if self.at >= snapshot.head && snapshot.ended.is_none() {
                    return Served::Waiting(self);
                }
                match self.tailer().pull(self.at, self.replay_until) {
                    Pull::Wait => return Served::Waiting(self),
                    Pull::Behind { until } => return Served::Behind(self, until),
                    // Mid-chunk, or replay: a frame of its own.
                    Pull::Frame(frame, next) => {
                        self.owed = if self.chunked { frames::chunk(&frame) } else { frame };
                        self.at = next;
                    }
                    Pull::End(terminal) => self.owe_end(terminal),
                }
            }
        }
        let owed = std::mem::take(&mut self.owed);
        let mut sources: [&[u8]; MAX_BUFFERS] = [&[]; MAX_BUFFERS];
        let mut ends = [0u64; MAX_BUFFERS];
        let mut count = 0;
        let mut total = 0;
        if !owed.is_empty() {
            (sources[0], ends[0], count, total) = (&owed[..], self.at, 1, owed.len());
        }
        let mut shared_from = None;
        if !self.closing
            && self.at >= self.replay_until
            && let Some(first) = snapshot.chunks.iter().position(|c| c.start == self.at)
        {
            shared_from = Some(first);
            for chunk in &snapshot.chunks[first..] {
                if total >= COALESCE_BYTES || count == MAX_BUFFERS {
                    break;
                }
                let bytes = if self.chunked { &chunk.chunked } else { &chunk.frame };
                (sources[count], ends[count]) = (&bytes[..], chunk.end);
                count += 1;
                total += bytes.len();
            }
        }
        if count == 0 {
            return if self.closing { Served::Closed } else { Served::Waiting(self) };
        }
        let buffers: [IoSlice<'_>; MAX_BUFFERS] = sources.map(IoSlice::new);
        let written = match self.socket.try_write_vectored(&buffers[..count]) {
            Ok(written) => written,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                self.owed = owed;
                return Served::Blocked(self);
            }
            Err(_) => return Served::Closed,
        };
        // What the socket took: whole buffers move the cursor; the rest of
        // one it took part of is owed.
        let mut left = written;
        let mut rest = None;
        for (index, source) in sources[..count].iter().enumerate() {
            if left < source.len() {
                rest = Some((index, left));
                break;
            }
            left -= source.len();
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
            self.last_sent = now;
            self.member.viewer().progressed_at(self.at, now);
        }
        // Still short of the head (the write was full, or it came from
        // further back than the snapshot), or at the head of a run that
        // ended (its end is owed): served again as soon as its socket is
        // writable, not at the next change, which will not come.
        let more = self.at < snapshot.head || snapshot.ended.is_some();
        if !self.owed.is_empty() || total >= COALESCE_BYTES || (!self.closing && more) {
            Served::Blocked(self)
        } else if self.closing {
            Served::Closed
        } else {
            Served::Waiting(self)
        }
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

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::task::Context;

    use tokio::io::AsyncWriteExt;

    struct Flag(AtomicBool);

    impl futures::task::ArcWake for Flag {
        fn wake_by_ref(flag: &Arc<Self>) {
            flag.0.store(true, Ordering::SeqCst);
        }
    }

    /// A client that leaves wakes the waker its socket holds, and is then
    /// seen; one that stays is not.
    #[tokio::test]
    async fn a_client_that_left_wakes_the_waker_and_is_seen() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let mut client = tokio::net::TcpStream::connect(listener.local_addr().unwrap()).await.unwrap();
        let (server, _) = listener.accept().await.unwrap();
        client.write_all(b"GET").await.unwrap();
        server.readable().await.unwrap();
        let flag = Arc::new(Flag(AtomicBool::new(false)));
        let waker = futures::task::waker(flag.clone());
        let probe = |context: &mut Context<'_>| {
            let mut one = [0u8; 1];
            loop {
                match server.poll_read_ready(context) {
                    std::task::Poll::Pending => return false,
                    std::task::Poll::Ready(Err(_)) => return true,
                    std::task::Poll::Ready(Ok(())) => match server.try_read(&mut one) {
                        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
                        Ok(n) if n > 0 => continue,
                        _ => return true,
                    },
                }
            }
        };
        assert!(!probe(&mut Context::from_waker(&waker)), "open");
        drop(client);
        tokio::time::timeout(std::time::Duration::from_secs(5), async {
            while !flag.0.load(Ordering::SeqCst) {
                tokio::time::sleep(std::time::Duration::from_millis(5)).await;
            }
        })
        .await
        .unwrap();
        assert!(probe(&mut Context::from_waker(&waker)), "closed: seen");
    }
}
