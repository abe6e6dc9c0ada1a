//! HTTPS on the edge (`[edge.tls]`): the acceptor built from the
//! configured certificate and key (read once, at start: a file that does
//! not read, or a key that does not match, fails the start naming the
//! setting and the file), and the handshake of each accepted connection,
//! bounded by [`HANDSHAKE_TIMEOUT`] so that a client that never finishes it
//! cannot hold its connection's task.

use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpStream;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;
use tokio_util::sync::CancellationToken;

use super::EdgeError;
use crate::config::EdgeOptions;

/// Longest time a client may take to finish its TLS handshake.
pub(crate) const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// The acceptor of an edge with `[edge.tls]`, `None` without it.
pub(crate) fn acceptor(options: &EdgeOptions) -> Result<Option<TlsAcceptor>, EdgeError> {
    let Some(tls) = &options.tls else { return Ok(None) };
    let server = crate::tls::http_server("edge.tls", &tls.cert, &tls.key)?;
    Ok(Some(TlsAcceptor::from(Arc::new(server))))
}

/// Reads `[edge.tls]`'s files as the edge will when it starts: to refuse
/// a config before anything else starts.
pub fn check_tls(options: &EdgeOptions) -> Result<(), EdgeError> {
    acceptor(options).map(|_| ())
}

/// The TLS session of `stream`, or `None` if the client did not finish its
/// handshake in time, failed it (a plain-HTTP request, a client that does
/// not trust the certificate), or `stop` fired first.
pub(crate) async fn handshake(
    acceptor: &TlsAcceptor,
    stream: TcpStream,
    stop: &CancellationToken,
) -> Option<TlsStream<TcpStream>> {
    let accepted = tokio::select! {
        accepted = tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream)) => accepted,
        _ = stop.cancelled() => return None,
    };
    match accepted {
        Ok(Ok(stream)) => Some(stream),
        Ok(Err(error)) => {
            tracing::debug!(%error, "TLS handshake failed");
            None
        }
        Err(_) => {
            tracing::debug!("TLS handshake timed out");
            None
        }
    }
}
