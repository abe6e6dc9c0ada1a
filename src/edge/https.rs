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

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// An acceptor with no certificate: these clients never get that far.
    fn acceptor() -> TlsAcceptor {
        #[derive(Debug)]
        struct NoCertificate;
        impl rustls::server::ResolvesServerCert for NoCertificate {
            fn resolve(&self, _: rustls::server::ClientHello<'_>) -> Option<Arc<rustls::sign::CertifiedKey>> {
                None
            }
        }
        let config = rustls::ServerConfig::builder_with_provider(crate::tls::provider())
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_cert_resolver(Arc::new(NoCertificate));
        TlsAcceptor::from(Arc::new(config))
    }

    async fn connected() -> (TcpStream, TcpStream) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let client = TcpStream::connect(listener.local_addr().unwrap()).await.unwrap();
        let (server, _) = listener.accept().await.unwrap();
        (client, server)
    }

    #[tokio::test(start_paused = true)]
    async fn a_client_that_never_finishes_its_handshake_is_closed() {
        let (mut client, server) = connected().await;
        // The start of a handshake record, never finished.
        client.write_all(&[0x16, 0x03, 0x01]).await.unwrap();
        assert!(handshake(&acceptor(), server, &CancellationToken::new()).await.is_none());
        let mut answer = Vec::new();
        let _ = client.read_to_end(&mut answer).await;
        assert!(answer.is_empty(), "closed without an answer: {answer:?}");
    }

    #[tokio::test]
    async fn a_handshake_in_progress_ends_when_the_edge_stops() {
        let (_client, server) = connected().await;
        let stop = CancellationToken::new();
        stop.cancel();
        assert!(handshake(&acceptor(), server, &stop).await.is_none());
    }

    #[tokio::test]
    async fn plain_http_fails_the_handshake() {
        let (mut client, server) = connected().await;
        client.write_all(b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n").await.unwrap();
        assert!(handshake(&acceptor(), server, &CancellationToken::new()).await.is_none());
    }
}
