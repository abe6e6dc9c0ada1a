//! The clients' HTTPS (`--ca-file`): a reqwest client for the pollers and
//! a TLS client for the viewers, both trusting one authority only, and a
//! viewer's connection, a socket or a TLS session on one.

use std::path::Path;
use std::sync::Arc;

use anyhow::Context;
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tokio_util::either::Either;

/// A viewer's connection: a socket, or a TLS session on one.
pub(super) type Connection = Either<TcpStream, tokio_rustls::client::TlsStream<TcpStream>>;

/// `client` trusting only the authority in `ca`, and a TLS client that does
/// the same.
pub(super) fn trusting(
    client: reqwest::ClientBuilder,
    ca: &Path,
) -> anyhow::Result<(reqwest::ClientBuilder, TlsConnector)> {
    let pem = std::fs::read(ca).with_context(|| format!("reading {}", ca.display()))?;
    let client = client.tls_certs_only(reqwest::Certificate::from_pem_bundle(&pem)?);
    let roots = tailrace::tls::roots("--ca-file", ca)?;
    let config = rustls::ClientConfig::builder_with_provider(tailrace::tls::provider())
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok((client, TlsConnector::from(Arc::new(config))))
}

/// A connection to `host:port`: over TLS with `tls`.
pub(super) async fn connect(tls: Option<&TlsConnector>, host: &str, port: u16) -> anyhow::Result<Connection> {
    let socket = TcpStream::connect((host, port)).await?;
    Ok(match tls {
        None => Either::Left(socket),
        Some(connector) => {
            let name = rustls::pki_types::ServerName::try_from(host.to_string())?;
            Either::Right(connector.connect(name, socket).await?)
        }
    })
}
