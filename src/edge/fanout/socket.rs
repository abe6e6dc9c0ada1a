//! A handed-over viewer's connection: a plain TCP socket, or a TLS session
//! on one. It owns the socket and, over TLS, the session (its keys and the
//! encrypted bytes the socket has not taken yet), and does a shard's I/O on
//! them without blocking: one write of what the viewer lacks, the sending
//! of what the session holds, the session's close, and the look for a
//! client that left.
//!
//! Over TLS, what a pass writes goes to rustls with one vectored write,
//! which fills each record with up to [`TLS_RECORD_BYTES`] of plaintext
//! across the buffers it is given (small frames share a record; none is
//! larger), then out to the socket. Encrypted bytes the socket did not
//! take stay in the session, at most [`TLS_HELD_BYTES`] and the records'
//! overhead (rustls' buffer limit), and are sent before anything new is
//! handed to it.

use std::io::{IoSlice, Read, Write};
use std::task::{Context, Poll};

use tokio::net::TcpStream;
use tokio_rustls::server::TlsStream;
use tokio_util::either::Either;

use super::COALESCE_BYTES;

/// Most plaintext one TLS record carries (2^14 bytes, TLS's own limit).
pub(crate) const TLS_RECORD_BYTES: usize = 16 * 1024;
/// Most bytes a viewer's TLS session holds that its socket has not taken
/// (rustls' buffer limit): one pass's worth.
pub(crate) const TLS_HELD_BYTES: usize = COALESCE_BYTES;
/// Reads of records that are not data (a key update) a client may cause
/// after its request before it counts as gone: a viewer sends nothing but
/// its close.
const MAX_READS_IN: usize = 8;

/// See the module documentation.
pub(crate) enum Socket {
    Plain(TcpStream),
    Tls(Box<TlsStream<TcpStream>>),
}

/// A connection as a task of its own writes it (a catch-up): either kind,
/// through `tokio`'s traits.
pub(crate) type Stream = Either<TcpStream, Box<TlsStream<TcpStream>>>;

impl Socket {
    /// A TLS session, its buffer limit set to [`TLS_HELD_BYTES`].
    pub(crate) fn tls(mut stream: Box<TlsStream<TcpStream>>) -> Self {
        stream.get_mut().1.set_buffer_limit(Some(TLS_HELD_BYTES));
        Self::Tls(stream)
    }

    /// The TCP socket (its readiness).
    pub(crate) fn tcp(&self) -> &TcpStream {
        match self {
            Self::Plain(socket) => socket,
            Self::Tls(stream) => stream.get_ref().0,
        }
    }

    /// Most bytes one pass hands to it: a plain socket takes whole frames
    /// (up to [`COALESCE_BYTES`] and the frame that crosses it), a TLS
    /// session [`COALESCE_BYTES`] (whole records, within
    /// [`TLS_HELD_BYTES`]; a frame that crosses it is cut there, and the
    /// rest is owed).
    pub(super) fn pass_limit(&self) -> usize {
        match self {
            Self::Plain(_) => usize::MAX,
            Self::Tls(_) => COALESCE_BYTES,
        }
    }

    /// Whether a pass gathers several frames it pulls one by one (from
    /// behind the tailer's newest chunks): over TLS, so that small frames
    /// share records; a plain socket gets one such frame per write.
    pub(super) fn gathers_pulls(&self) -> bool {
        matches!(self, Self::Tls(_))
    }

    /// Writes a prefix of `sources`, without blocking: the bytes taken, by
    /// the socket or (over TLS) by the session, which then sends what the
    /// socket takes. `WouldBlock` when it took nothing.
    pub(super) fn write(&mut self, sources: &[IoSlice<'_>]) -> std::io::Result<usize> {
        match self {
            Self::Plain(socket) => socket.try_write_vectored(sources),
            Self::Tls(stream) => {
                let taken = stream.get_mut().1.writer().write_vectored(sources)?;
                self.send_held()?;
                if taken == 0 {
                    return Err(std::io::ErrorKind::WouldBlock.into());
                }
                Ok(taken)
            }
        }
    }

    /// Whether its TLS session holds bytes its socket has not taken.
    pub(super) fn holds(&self) -> bool {
        match self {
            Self::Plain(_) => false,
            Self::Tls(stream) => stream.get_ref().1.wants_write(),
        }
    }

    /// Sends what its TLS session holds, as far as the socket takes it
    /// without blocking: the bytes sent (none for a plain socket).
    pub(super) fn send_held(&mut self) -> std::io::Result<usize> {
        let Self::Tls(stream) = self else { return Ok(0) };
        let (socket, session) = stream.get_mut();
        let mut sent = 0;
        while session.wants_write() {
            match session.write_tls(&mut Outgoing(socket)) {
                Ok(0) => return Err(std::io::ErrorKind::WriteZero.into()),
                Ok(n) => sent += n,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(e) => return Err(e),
            }
        }
        Ok(sent)
    }

    /// Ends its TLS session (`close_notify`, which [`Socket::send_held`]
    /// sends); nothing for a plain socket, which closes when dropped.
    pub(super) fn close(&mut self) {
        if let Self::Tls(stream) = self {
            stream.get_mut().1.send_close_notify();
        }
    }

    /// Whether its client closed the connection (or sent something, which
    /// a viewer must not; over TLS: a `close_notify`, an alert, a record
    /// that does not decrypt, or data). If not, `context`'s waker is woken
    /// when it does: the runtime holds it with the socket, so a shard
    /// learns of a client that left at once without a task or a future per
    /// viewer.
    pub(super) fn client_left(&mut self, context: &mut Context<'_>) -> bool {
        match self {
            Self::Plain(socket) => plain_client_left(socket, context),
            Self::Tls(stream) => tls_client_left(stream, context),
        }
    }

    /// The connection for a task of its own.
    pub(super) fn into_stream(self) -> Stream {
        match self {
            Self::Plain(socket) => Either::Left(socket),
            Self::Tls(stream) => Either::Right(stream),
        }
    }
}

fn plain_client_left(socket: &TcpStream, context: &mut Context<'_>) -> bool {
    let mut probe = [0u8; 1];
    loop {
        match socket.poll_read_ready(context) {
            Poll::Pending => return false,
            Poll::Ready(Err(_)) => return true,
            // Readable: closed, or a readiness left from the request
            // (the read clears it, then the waker is registered).
            Poll::Ready(Ok(())) => match socket.try_read(&mut probe) {
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
                _ => return true,
            },
        }
    }
}

/// As [`plain_client_left`], reading the records that came: a key update
/// is the session's own business (it answers it with the next write), a
/// `close_notify`, an alert, a bad record, data or the end of the socket
/// mean the client left.
fn tls_client_left(stream: &mut TlsStream<TcpStream>, context: &mut Context<'_>) -> bool {
    let (socket, session) = stream.get_mut();
    let mut reads = 0;
    loop {
        match socket.poll_read_ready(context) {
            Poll::Pending => return false,
            Poll::Ready(Err(_)) => return true,
            Poll::Ready(Ok(())) => {}
        }
        match session.read_tls(&mut Incoming(socket)) {
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
            Ok(0) | Err(_) => return true,
            Ok(_) => {}
        }
        match session.process_new_packets() {
            Ok(state) if !state.peer_has_closed() && state.plaintext_bytes_to_read() == 0 => {}
            _ => return true,
        }
        reads += 1;
        if reads >= MAX_READS_IN {
            return true;
        }
    }
}

/// A socket as rustls writes to it: without blocking (`WouldBlock` when
/// it takes nothing).
struct Outgoing<'a>(&'a TcpStream);

impl Write for Outgoing<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.try_write(buf)
    }

    fn write_vectored(&mut self, bufs: &[IoSlice<'_>]) -> std::io::Result<usize> {
        self.0.try_write_vectored(bufs)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// A socket as rustls reads from it: without blocking.
struct Incoming<'a>(&'a TcpStream);

impl Read for Incoming<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        self.0.try_read(buf)
    }
}

#[cfg(test)]
#[path = "socket/tests.rs"]
mod tests;
