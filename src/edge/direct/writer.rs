//! A viewer's frames written by its connection's task: its first frames
//! and any catch-up, as its session gives them, coalesced into writes of
//! up to [`COALESCE_BYTES`], until the response ends or the session is at
//! the head of its tailer's window (the connection then goes to the
//! fan-out). A TLS session is handed each write in pieces of at most one
//! record (16 KiB), each encrypted and sent as far as the socket takes it
//! before the next goes in: a session whose socket keeps up holds one
//! record of the write, not all of it (one whose socket is slower holds up
//! to its buffer limit).

use std::future::Future;
use std::pin::Pin;

use bytes::Bytes;
use futures::FutureExt;
use tokio::io::{AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio_util::sync::CancellationToken;

use super::Connection;
use crate::edge::fanout::COALESCE_BYTES;
use crate::edge::sse::{Next, Session};

/// Writes `session`'s frames on `stream` until the response ends (`None`:
/// the connection is done with) or the session reaches the head of its
/// tailer's window (the stream is handed back). `stop` ends it without a
/// terminal frame.
pub(crate) async fn write_session<S: Connection>(
    stream: S,
    session: &mut Session,
    chunked: bool,
    stop: &CancellationToken,
) -> Option<S> {
    let cut = session.connection().clone();
    let piece = stream.write_piece();
    let (mut reader, mut writer) = tokio::io::split(stream);
    let ended = {
        // A viewer sends nothing after its request: a read that ends means
        // the client closed (or sent what it should not). These are kept
        // across frames, so each is registered once, not once per frame.
        let closed = async {
            let mut probe = [0u8; 1];
            let _ = reader.read(&mut probe).await;
        };
        tokio::pin!(closed);
        let cut_off = cut.cancelled();
        tokio::pin!(cut_off);
        let stopped = stop.cancelled();
        tokio::pin!(stopped);
        let framing = Framing { chunked, piece };
        write_frames_of(session, &mut writer, framing, &cut, (&mut closed, &mut cut_off, &mut stopped)).await
    };
    if ended {
        return None;
    }
    Some(reader.unsplit(writer))
}

/// How a connection's frames are written: as HTTP/1.1 chunks or not, and
/// at most `piece` bytes per write (see [`super::Connection::write_piece`]).
#[derive(Clone, Copy)]
struct Framing {
    chunked: bool,
    piece: usize,
}

/// The loop of [`write_session`]: whether the connection is done with
/// (else the session is at the head, to be handed over).
async fn write_frames_of<W: AsyncWrite + Unpin>(
    session: &mut Session,
    writer: &mut W,
    framing: Framing,
    cut: &CancellationToken,
    (closed, cut_off, stopped): (
        &mut Pin<&mut impl Future<Output = ()>>,
        &mut Pin<&mut impl Future<Output = ()>>,
        &mut Pin<&mut impl Future<Output = ()>>,
    ),
) -> bool {
    loop {
        // A ready frame first: the close probe and the cut are polled only
        // while the viewer waits (a write to a closed socket fails, one to a
        // stalled socket waits and sees the cut), and a cut (the node
        // stopping) is looked at once per write.
        let first = tokio::select! {
            biased;
            next = session.next() => next,
            () = closed.as_mut() => return true,
            // The viewer stalled: its tailer cut it.
            () = cut_off.as_mut() => return true,
            () = stopped.as_mut() => return true,
        };
        if cut.is_cancelled() {
            return true;
        }
        // Frames that are ready too go out in the same write: a viewer
        // that fell behind catches up with one system call, not one per
        // frame. `after` is what ended the batch.
        let mut frames = Vec::new();
        let mut after = None;
        let mut next = first;
        let mut bytes = 0;
        loop {
            match next {
                Next::Frame(frame) => {
                    bytes += frame.len();
                    frames.push(frame);
                }
                end => {
                    after = Some(end);
                    break;
                }
            }
            // (A catch-up's next frame is a store read: it is awaited
            // after this write, not started here and dropped.)
            if bytes >= COALESCE_BYTES || !session.answers_at_once() {
                break;
            }
            match session.next().now_or_never() {
                Some(more) => next = more,
                None => break,
            }
        }
        if !frames.is_empty() {
            let written = tokio::select! {
                biased;
                written = write_frames(writer, &frames, framing) => written.is_ok(),
                () = cut_off.as_mut() => false,
            };
            if !written {
                return true;
            }
        }
        match after {
            None | Some(Next::Frame(_)) => {}
            Some(Next::HandOver) => return false,
            // Dropped: cut the connection without ending the response.
            Some(Next::Cut) => return true,
            Some(Next::End) => {
                if framing.chunked {
                    let _ = writer.write_all(crate::edge::frames::LAST_CHUNK).await;
                }
                let _ = writer.shutdown().await;
                return true;
            }
        }
    }
}

/// Writes `frames` with one write (each its own chunk when chunked), in
/// pieces of at most `framing.piece` bytes.
async fn write_frames(
    writer: &mut (impl AsyncWrite + Unpin),
    frames: &[Bytes],
    framing: Framing,
) -> std::io::Result<()> {
    use std::io::Write as _;
    let Framing { chunked, piece } = framing;
    match (frames, chunked) {
        ([frame], false) => write_pieces(writer, frame, piece).await?,
        _ => {
            let size: usize = frames.iter().map(|f| f.len() + 20).sum();
            let mut out = Vec::with_capacity(size);
            for frame in frames {
                if chunked {
                    // (Into the buffer: no string per frame.)
                    let _ = write!(out, "{:x}\r\n", frame.len());
                    out.extend_from_slice(frame);
                    out.extend_from_slice(b"\r\n");
                } else {
                    out.extend_from_slice(frame);
                }
            }
            write_pieces(writer, &out, piece).await?;
        }
    }
    // A TLS session may hold written bytes until it is flushed (a plain
    // socket flushes for free): the frames go out now, not with the next.
    writer.flush().await
}

/// Writes `bytes` in pieces of at most `piece` bytes.
async fn write_pieces(writer: &mut (impl AsyncWrite + Unpin), bytes: &[u8], piece: usize) -> std::io::Result<()> {
    for part in bytes.chunks(piece.max(1)) {
        writer.write_all(part).await?;
    }
    Ok(())
}
