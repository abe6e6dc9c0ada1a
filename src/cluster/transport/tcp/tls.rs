//! TLS between nodes (`[cluster.tls]`): every node presents a certificate
//! chained to the cluster's authority and accepts only peers that do (both
//! ways: a node is a server to the nodes that dial it and a client to those
//! it dials). The cookie is still checked inside the encrypted session.
//! The files are read by `crate::tls`, as the edge's are.

use std::path::PathBuf;
use std::sync::Arc;

use rustls::pki_types::ServerName;
use rustls::server::WebPkiClientVerifier;
use tokio_rustls::{TlsAcceptor, TlsConnector};

use crate::tls;

/// The PEM files of `[cluster.tls]`.
#[derive(Clone, Debug)]
pub struct TlsFiles {
    /// This node's certificate chain.
    pub cert: PathBuf,
    /// Its private key.
    pub key: PathBuf,
    /// The authority every node's certificate chains to.
    pub ca: PathBuf,
}

impl TlsFiles {
    /// Reads the files as the transport will: errors name the key and the
    /// file (to refuse a config before anything starts).
    pub fn check(&self) -> Result<(), String> {
        Tls::load(self).map(|_| ())
    }
}

/// Both sides of a node's TLS.
#[derive(Clone)]
pub(super) struct Tls {
    pub(super) acceptor: TlsAcceptor,
    pub(super) connector: TlsConnector,
}

impl Tls {
    /// Loads the files; errors name the key and the file.
    pub(super) fn load(files: &TlsFiles) -> Result<Self, String> {
        let chain = tls::cert_chain("cluster.tls.cert", &files.cert).map_err(|e| e.to_string())?;
        let key = tls::private_key("cluster.tls.key", &files.key).map_err(|e| e.to_string())?;
        let roots = Arc::new(tls::roots("cluster.tls.ca", &files.ca).map_err(|e| e.to_string())?);
        let verifier = WebPkiClientVerifier::builder_with_provider(roots.clone(), tls::provider())
            .build()
            .map_err(|e| format!("cluster.tls.ca: {e}"))?;
        let server = rustls::ServerConfig::builder_with_provider(tls::provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| e.to_string())?
            .with_client_cert_verifier(verifier)
            .with_single_cert(chain.clone(), key.clone_key())
            .map_err(|e| format!("cluster.tls.cert and cluster.tls.key: {e}"))?;
        let client = rustls::ClientConfig::builder_with_provider(tls::provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| e.to_string())?
            .with_root_certificates(roots)
            .with_client_auth_cert(chain, key)
            .map_err(|e| format!("cluster.tls.cert and cluster.tls.key: {e}"))?;
        Ok(Self { acceptor: TlsAcceptor::from(Arc::new(server)), connector: TlsConnector::from(Arc::new(client)) })
    }
}

/// The name a peer's certificate must carry: the host of its `advertise`
/// address (a DNS name or an IP address).
pub(super) fn server_name(advertise: &str) -> Result<ServerName<'static>, String> {
    let host = advertise.rsplit_once(':').map_or(advertise, |(host, _)| host);
    let host = host.trim_start_matches('[').trim_end_matches(']');
    ServerName::try_from(host.to_string()).map_err(|e| format!("`{advertise}` names no TLS server: {e}"))
}
