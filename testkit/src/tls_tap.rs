//! A client's socket that keeps a copy of the raw bytes it reads, to look
//! at the TLS records a server sent (their 5-byte headers: type, version,
//! length).

use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

/// The raw bytes a [`Tee`] read.
#[derive(Clone, Default)]
pub struct Seen(Arc<Mutex<Vec<u8>>>);

impl Seen {
    /// Bytes read so far.
    pub fn len(&self) -> usize {
        self.0.lock().unwrap().len()
    }

    /// Whether nothing was read.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The lengths of the TLS records from byte `from` on.
    pub fn records(&self, from: usize) -> Vec<usize> {
        let raw = self.0.lock().unwrap();
        let (mut lengths, mut at) = (Vec::new(), from);
        while at + 5 <= raw.len() {
            let length = u16::from_be_bytes([raw[at + 3], raw[at + 4]]) as usize;
            lengths.push(length);
            at += 5 + length;
        }
        lengths
    }
}

/// A client's socket that keeps a copy of what it reads in `seen`.
pub struct Tee {
    pub inner: TcpStream,
    pub seen: Seen,
}

impl Tee {
    /// `inner`, and what it will have read.
    pub fn new(inner: TcpStream) -> (Self, Seen) {
        let seen = Seen::default();
        (Self { inner, seen: seen.clone() }, seen)
    }
}

impl AsyncRead for Tee {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let read = Pin::new(&mut this.inner).poll_read(cx, buf);
        this.seen.0.lock().unwrap().extend_from_slice(&buf.filled()[before..]);
        read
    }
}

impl AsyncWrite for Tee {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}
