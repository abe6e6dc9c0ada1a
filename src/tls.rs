//! TLS material shared by every hop that encrypts: the one crypto provider
//! (ring), and the PEM files a setting names (a certificate chain, its
//! private key, an authority's certificates), read with errors that name the
//! setting and the file. The cluster transport (`[cluster.tls]`), the HTTP
//! edge (`[edge.tls]`) and the command line's clients (`--ca-file`) all load
//! their files here.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::RootCertStore;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::CertificateDer;
#[cfg(any(feature = "kafka", feature = "edge", feature = "cluster"))]
use rustls::pki_types::PrivateKeyDer;
use rustls::pki_types::pem::PemObject;

/// A TLS file or setting that cannot be used.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TlsError {
    /// The file could not be read or parsed as PEM.
    #[error("{setting}: cannot read {}: {reason}", path.display())]
    Read {
        /// The setting that names the file (`edge.tls.cert`).
        setting: String,
        /// The file.
        path: PathBuf,
        /// Why (the OS or PEM error).
        reason: String,
    },
    /// The file holds no certificate.
    #[error("{setting}: {} holds no certificate", path.display())]
    Empty {
        /// The setting that names the file.
        setting: String,
        /// The file.
        path: PathBuf,
    },
    /// The files read, but do not make a TLS configuration (a key that
    /// does not match its certificate, say).
    #[error("{settings}: {reason}")]
    Config {
        /// The settings involved (`edge.tls.cert and edge.tls.key`).
        settings: String,
        /// What rustls said.
        reason: String,
    },
}

fn read_error(setting: &str, path: &Path, reason: impl std::fmt::Display) -> TlsError {
    TlsError::Read { setting: setting.to_string(), path: path.to_path_buf(), reason: reason.to_string() }
}

/// The crypto provider of every TLS configuration tailrace builds.
pub fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Makes ring the process's default provider, unless one is installed
/// already. HTTP clients (`reqwest`) build their TLS from the process
/// default, so a process that makes any must call this first; calling it
/// again does nothing.
pub fn use_ring_by_default() {
    if CryptoProvider::get_default().is_none() {
        // Lost a race with another caller: a provider is installed either way.
        let _ = rustls::crypto::ring::default_provider().install_default();
    }
}

/// The certificate chain in the PEM file `path`, which `setting` names.
pub fn cert_chain(setting: &str, path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(path)
        .map_err(|e| read_error(setting, path, e))?
        .collect::<Result<_, _>>()
        .map_err(|e| read_error(setting, path, e))?;
    if chain.is_empty() {
        return Err(TlsError::Empty { setting: setting.to_string(), path: path.to_path_buf() });
    }
    Ok(chain)
}

/// The private key in the PEM file `path`, which `setting` names.
#[cfg(any(feature = "kafka", feature = "edge", feature = "cluster"))]
pub(crate) fn private_key(setting: &str, path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    PrivateKeyDer::from_pem_file(path).map_err(|e| read_error(setting, path, e))
}

/// The authorities in the PEM file `path`, which `setting` names (at
/// least one).
pub fn roots(setting: &str, path: &Path) -> Result<RootCertStore, TlsError> {
    let mut roots = RootCertStore::empty();
    for ca in CertificateDer::pem_file_iter(path).map_err(|e| read_error(setting, path, e))? {
        let ca = ca.map_err(|e| read_error(setting, path, e))?;
        roots.add(ca).map_err(|e| read_error(setting, path, e))?;
    }
    if roots.is_empty() {
        return Err(TlsError::Empty { setting: setting.to_string(), path: path.to_path_buf() });
    }
    Ok(roots)
}

/// A server configuration that presents the chain and key the settings
/// `{prefix}.cert` and `{prefix}.key` name, and asks clients for no
/// certificate; it speaks HTTP/1.1 (ALPN). Fails, naming the setting and
/// the file, on a file that does not read or a key that does not match.
#[cfg(feature = "edge")]
pub(crate) fn http_server(prefix: &str, cert: &Path, key: &Path) -> Result<rustls::ServerConfig, TlsError> {
    let chain = cert_chain(&format!("{prefix}.cert"), cert)?;
    let key_der = private_key(&format!("{prefix}.key"), key)?;
    let config_error = |reason: rustls::Error| TlsError::Config {
        settings: format!("{prefix}.cert ({}) and {prefix}.key ({})", cert.display(), key.display()),
        reason: match reason {
            rustls::Error::InconsistentKeys(_) => "the key does not belong to the certificate".to_string(),
            other => other.to_string(),
        },
    };
    let mut server = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(config_error)?
        .with_no_client_auth()
        .with_single_cert(chain, key_der)
        .map_err(config_error)?;
    server.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(server)
}
