//! The accept loop, and the SSE route served straight on the socket.
//!
//! A general HTTP/1 connection costs about 25 KiB of memory for as long
//! as it is open (hyper keeps an 8 KiB read buffer and an 8 KiB header
//! buffer per connection, plus its state); a tailing viewer holds its
//! connection for minutes or hours. So the first request of a connection
//! is read here (`httparse`); if it opens a log stream, the stream is
//! written on the socket directly as chunked `text/event-stream` and the
//! connection closes with it. The connection's task writes the first
//! frames and any catch-up (`writer.rs`); once the viewer is at the head,
//! the connection goes to its run's fan-out (`fanout.rs`) and the task
//! ends. Every other request, and every later request of a kept-alive
//! connection, goes to the router through hyper (which serves the stream
//! route too, so nothing depends on this path).
//!
//! With `[edge.tls]` each accepted socket first completes its TLS handshake
//! in its connection's task (bounded, see `https.rs`); both paths then
//! serve the TLS session as they serve a plain socket, the direct path's
//! hand-over to the fan-out included (the socket with its session).

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime};

use axum::Router;
use axum::response::{IntoResponse, Response};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::TcpStream;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;
use tokio_util::either::Either;
use tokio_util::sync::CancellationToken;

use super::LogEdge;
use super::fanout::{Socket, Stream, TLS_RECORD_BYTES};
use super::https;
use super::sse::ConnectionCut;

mod writer;

use crate::tasks::Tasks;
pub(crate) use writer::write_session;

/// Longest request head read before the route is known (a longer one is
/// hyper's to read).
const MAX_HEAD: usize = 8 * 1024;
/// Longest request head hyper reads; past it, `431`.
const MAX_HEAD_HYPER: usize = 64 * 1024;
/// How long a client may take to send its request head.
const HEAD_TIMEOUT: Duration = Duration::from_secs(10);
const STREAM_PREFIX: &str = "/api/v1/services/ingestionPipelines/logs/";
/// Largest refusal body this path writes.
const MAX_ANSWER: usize = 64 * 1024;

/// What a connection is served over: a TCP socket, or a TLS session on one.
/// Either kind goes to the fan-out once its viewer is at the head.
pub(crate) trait Connection: AsyncRead + AsyncWrite + Unpin + Send + 'static {
    /// Most bytes handed to one write: a TLS session gets at most one
    /// record's worth at a time ([`TLS_RECORD_BYTES`]), a plain socket a
    /// buffer whole.
    fn write_piece(&self) -> usize;

    /// The connection as the fan-out holds it.
    fn into_socket(self) -> Socket;
}

impl Connection for TcpStream {
    fn write_piece(&self) -> usize {
        usize::MAX
    }

    fn into_socket(self) -> Socket {
        Socket::Plain(self)
    }
}

impl Connection for TlsStream<TcpStream> {
    fn write_piece(&self) -> usize {
        TLS_RECORD_BYTES
    }

    fn into_socket(self) -> Socket {
        Socket::tls(Box::new(self))
    }
}

/// A handed-over connection back with a task of its own (a catch-up).
impl Connection for Stream {
    fn write_piece(&self) -> usize {
        match self {
            Either::Left(socket) => socket.write_piece(),
            Either::Right(tls) => tls.write_piece(),
        }
    }

    fn into_socket(self) -> Socket {
        match self {
            Either::Left(socket) => Socket::Plain(socket),
            Either::Right(tls) => Socket::tls(tls),
        }
    }
}

/// Serves `listener` until `shutdown` (over TLS with `tls`: a socket that
/// does not complete its handshake is closed); stream requests go straight
/// to `edge` when there is one. Each connection is a task of `tasks`. On
/// `shutdown` it cancels `tasks` (open streams end, a request head still
/// awaited is given up) and gives hyper's connections a graceful close;
/// the caller then waits for `tasks`. Meanwhile it does the metrics
/// recorder's upkeep.
pub(crate) async fn accept_loop(
    listener: tokio::net::TcpListener,
    tls: Option<TlsAcceptor>,
    router: Router,
    edge: Option<Arc<LogEdge>>,
    shutdown: CancellationToken,
    tasks: &Tasks,
) {
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    let mut builder = hyper::server::conn::http1::Builder::new();
    // A request head may be up to `MAX_HEAD_HYPER` (431 past it).
    builder
        .max_buf_size(MAX_HEAD_HYPER)
        .max_header_size(MAX_HEAD_HYPER)
        .header_read_timeout(HEAD_TIMEOUT)
        .timer(hyper_util::rt::TokioTimer::new());
    let builder = Arc::new(builder);
    let mut upkeep =
        tokio::time::interval_at(tokio::time::Instant::now() + super::METRICS_UPKEEP, super::METRICS_UPKEEP);
    upkeep.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(error) => {
                    tracing::warn!(%error, "accept failed");
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                }
            },
            _ = shutdown.cancelled() => break,
            _ = upkeep.tick() => {
                super::metrics_upkeep();
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let (router, edge, builder, watcher) = (router.clone(), edge.clone(), builder.clone(), graceful.watcher());
        let (stop, tls) = (tasks.token().clone(), tls.clone());
        tasks.spawn("connection", async move {
            match tls {
                None => serve_connection(stream, router, edge, &builder, watcher, stop).await,
                // Boxed: a TLS session is large, and a plain connection's
                // task should not be allocated at its size.
                Some(tls) => Box::pin(serve_tls(tls, stream, router, edge, builder, watcher, stop)).await,
            }
        });
    }
    tasks.token().cancel();
    let _ = tokio::time::timeout(Duration::from_secs(10), graceful.shutdown()).await;
}

/// Serves one connection over TLS, once its handshake completed.
async fn serve_tls(
    tls: TlsAcceptor,
    stream: tokio::net::TcpStream,
    router: Router,
    edge: Option<Arc<LogEdge>>,
    builder: Arc<hyper::server::conn::http1::Builder>,
    watcher: hyper_util::server::graceful::Watcher,
    stop: CancellationToken,
) {
    let Some(stream) = https::handshake(&tls, stream, &stop).await else { return };
    serve_connection(stream, router, edge, &builder, watcher, stop).await;
}

/// Serves one connection: its first request straight when it opens a log
/// stream, everything else through hyper.
async fn serve_connection(
    stream: impl Connection,
    router: Router,
    edge: Option<Arc<LogEdge>>,
    builder: &hyper::server::conn::http1::Builder,
    watcher: hyper_util::server::graceful::Watcher,
    stop: CancellationToken,
) {
    // Fired by a tailer when this connection's viewer stalled.
    let cut = CancellationToken::new();
    let (stream, head) = match &edge {
        Some(edge) => match direct(stream, edge, &stop, &cut).await {
            Some(handed_back) => handed_back,
            None => return,
        },
        None => (stream, Vec::new()),
    };
    // Boxed: a connection's task is allocated at the size of its
    // largest state, and hyper's (about 8 KiB) is twice the direct
    // path's; a direct viewer should not pay for it.
    Box::pin(through_hyper(stream, head, router, builder, watcher, cut)).await;
}

/// Serves a connection with hyper and the router (after `head`, the bytes
/// already read), until it closes or `cut` fires.
async fn through_hyper<S: Connection>(
    stream: S,
    head: Vec<u8>,
    router: Router,
    builder: &hyper::server::conn::http1::Builder,
    watcher: hyper_util::server::graceful::Watcher,
    cut: CancellationToken,
) {
    let extension = ConnectionCut(cut.clone());
    let router = tower::ServiceExt::map_request(router, move |mut request: hyper::Request<hyper::body::Incoming>| {
        request.extensions_mut().insert(extension.clone());
        request
    });
    let service = hyper_util::service::TowerToHyperService::new(router);
    let io = hyper_util::rt::TokioIo::new(Rewind { head, at: 0, inner: stream });
    tokio::select! {
        _ = watcher.watch(builder.serve_connection(io, service)) => {}
        // Dropping the connection closes the socket.
        _ = cut.cancelled() => {}
    }
}

/// Reads the first request head. A log stream request is served here
/// (`None`); anything else is handed back with the bytes read so far.
/// Nothing is served once `stop` fired.
async fn direct<S: Connection>(
    mut stream: S,
    edge: &Arc<LogEdge>,
    stop: &CancellationToken,
    cut: &CancellationToken,
) -> Option<(S, Vec<u8>)> {
    let mut head = Vec::with_capacity(1024);
    let read_head = tokio::time::timeout(HEAD_TIMEOUT, async {
        loop {
            // A longer head is hyper's to read (up to its own limit, then
            // it answers 431).
            if head.len() >= MAX_HEAD {
                return Some(None);
            }
            if stream.read_buf(&mut head).await.ok()? == 0 {
                return None;
            }
            let mut headers = [httparse::EMPTY_HEADER; 32];
            let mut request = httparse::Request::new(&mut headers);
            match request.parse(&head) {
                Ok(httparse::Status::Complete(_)) => return Some(route(&request)),
                Ok(httparse::Status::Partial) => continue,
                // Let hyper answer malformed requests.
                Err(_) => return Some(None),
            }
        }
    });
    let parsed = tokio::select! {
        parsed = read_head => parsed,
        _ = stop.cancelled() => return None,
    };
    let route = match parsed {
        Ok(Some(route)) => route,
        // Closed or too slow: nothing to serve.
        Ok(None) | Err(_) => return None,
    };
    let Some(request) = route else { return Some((stream, head)) };
    drop(head);
    serve_stream(stream, edge, request, cut).await;
    None
}

/// A log stream request: path parts, cursor, credentials, HTTP version.
struct StreamRequest {
    fqn: String,
    run: String,
    after: Option<String>,
    authorization: Option<String>,
    http10: bool,
}

fn route(request: &httparse::Request<'_, '_>) -> Option<StreamRequest> {
    if request.method != Some("GET") {
        return None;
    }
    let (path, query) = request.path?.split_once('?').unwrap_or((request.path?, ""));
    let rest = path.strip_prefix(STREAM_PREFIX)?;
    let mut parts = rest.split('/');
    let (fqn, word, run) = (parts.next()?, parts.next()?, parts.next()?);
    if word != "stream" || parts.next().is_some() {
        return None;
    }
    let decode = |s: &str| percent_encoding::percent_decode_str(s).decode_utf8().ok().map(|c| c.into_owned());
    let after = form_urlencoded::parse(query.as_bytes()).find(|(k, _)| k == "after").map(|(_, v)| v.into_owned());
    let authorization = request
        .headers
        .iter()
        .find(|h| h.name.eq_ignore_ascii_case("authorization"))
        .and_then(|h| std::str::from_utf8(h.value).ok())
        .map(str::to_string);
    Some(StreamRequest {
        fqn: decode(fqn)?,
        run: decode(run)?,
        after,
        authorization,
        http10: request.version == Some(0),
    })
}

async fn serve_stream<S: Connection>(
    mut stream: S,
    edge: &Arc<LogEdge>,
    request: StreamRequest,
    cut: &CancellationToken,
) {
    // The same decisions and answers as the router's: auth, then `open`.
    if let Err(refusal) = edge.auth.check(true, request.authorization.as_deref()) {
        return Box::pin(answer(&mut stream, refusal.into_response())).await;
    }
    let after = request.after.as_deref();
    let opened = super::sse::open_session(edge.clone(), &request.fqn, &request.run, after, cut.clone(), true);
    // The session is boxed as soon as it exists: moved between this
    // function's locals across awaits, a value this size (0.8 KiB) is
    // stored once per place it passed through, and this future lives as
    // long as the viewer (see docs/benchmarks.md).
    let opened = Box::pin(async move { opened.await.map(Box::new) }).await;
    let mut session = match opened {
        Ok(session) => session,
        Err(refusal) => return Box::pin(answer(&mut stream, refusal.into_response())).await,
    };
    let chunked = !request.http10;
    let framing = if chunked { "transfer-encoding: chunked\r\n" } else { "" };
    let response_head = head(&super::sse::response_head().into_parts().0, framing);
    if stream.write_all(response_head.as_bytes()).await.is_err() || stream.flush().await.is_err() {
        return;
    }
    drop(response_head);
    let stop = edge.tasks.token().child_token();
    // At the head, the connection goes to the fan-out, and this task ends.
    if let Some(stream) = write_session(stream, &mut session, chunked, &stop).await
        && let Some(handover) = session.into_handover()
    {
        super::fanout::hand_over(edge, super::fanout::Slot::new(stream.into_socket(), handover, chunked));
    }
}

/// Writes `response` (a refusal: small, fully buffered) and closes.
async fn answer(stream: &mut impl Connection, response: Response) {
    let (parts, body) = response.into_parts();
    let Ok(body) = axum::body::to_bytes(body, MAX_ANSWER).await else { return };
    let mut bytes = head(&parts, &format!("content-length: {}\r\n", body.len())).into_bytes();
    bytes.extend_from_slice(&body);
    let _ = stream.write_all(&bytes).await;
    let _ = stream.shutdown().await;
}

/// A response head as this path writes it: the status line, the
/// response's own headers, then `framing`, `date` and `connection: close`
/// (the connection ends with the response: a client must not pool it).
fn head(parts: &axum::http::response::Parts, framing: &str) -> String {
    let status = parts.status;
    let mut head = format!("HTTP/1.1 {} {}\r\n", status.as_u16(), status.canonical_reason().unwrap_or(""));
    for (name, value) in &parts.headers {
        head.push_str(&format!("{name}: {}\r\n", String::from_utf8_lossy(value.as_bytes())));
    }
    head.push_str(framing);
    head.push_str(&format!("date: {}\r\nconnection: close\r\n\r\n", httpdate::fmt_http_date(SystemTime::now())));
    head
}

/// A socket whose first bytes were already read: they are read again first.
struct Rewind<S> {
    head: Vec<u8>,
    at: usize,
    inner: S,
}

impl<S: Connection> AsyncRead for Rewind<S> {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        if this.at < this.head.len() {
            let n = (this.head.len() - this.at).min(buf.remaining());
            buf.put_slice(&this.head[this.at..this.at + n]);
            this.at += n;
            if this.at == this.head.len() {
                this.head = Vec::new();
                this.at = 0;
            }
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut this.inner).poll_read(cx, buf)
    }
}

impl<S: Connection> AsyncWrite for Rewind<S> {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A viewer's connection task lives while the viewer is set up and
    /// catches up (at the head the fan-out takes it), and a task is
    /// allocated at its future's largest state: this keeps that state small
    /// (it was 5.2 KiB, most of it the same values stored in several places
    /// across awaits, and a TLS session's room in a plain socket's task;
    /// docs/benchmarks.md).
    #[tokio::test]
    async fn a_plain_connection_task_stays_small() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let _client = tokio::net::TcpStream::connect(listener.local_addr().unwrap()).await.unwrap();
        let (stream, _) = listener.accept().await.unwrap();
        let graceful = hyper_util::server::graceful::GracefulShutdown::new();
        let builder = hyper::server::conn::http1::Builder::new();
        let task =
            serve_connection(stream, Router::new(), None, &builder, graceful.watcher(), CancellationToken::new());
        let size = std::mem::size_of_val(&task);
        eprintln!("a plain connection's future: {size} bytes");
        assert!(size <= 2048, "a plain connection's future is {size} bytes");
    }
}
