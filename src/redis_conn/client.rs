//! Turning an endpoint's settings into a connected client: the password's
//! source, TLS files, a probe that names the setting Redis refused, and the
//! standard reconnecting configuration.

use std::path::{Path, PathBuf};
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{ConnectionAddr, IntoConnectionInfo};

use super::{CONNECT_TIMEOUT, PASSWORD_ENV, RedisConnError, RedisEndpoint};

/// Where the password came from, to name it when Redis refuses it.
enum Source {
    Env,
    File(PathBuf),
    Key,
    Url,
}

impl RedisEndpoint {
    fn setting(&self, key: &str) -> String {
        format!("{} {key}", self.access.section)
    }

    fn invalid(&self, key: &str, message: impl Into<String>) -> RedisConnError {
        RedisConnError::Setting { setting: self.setting(key), message: message.into() }
    }

    fn read(&self, key: &str, path: &Path) -> Result<Vec<u8>, RedisConnError> {
        std::fs::read(path).map_err(|e| self.invalid(key, format!("cannot read {}: {e}", path.display())))
    }

    /// The password to send and where it came from.
    fn password(&self, from_url: Option<&str>) -> Result<Option<(String, Source)>, RedisConnError> {
        let access = &self.access;
        if access.password.is_some() && access.password_file.is_some() {
            return Err(self.invalid("password", "password and password_file exclude each other; set one"));
        }
        if let Some(env) = std::env::var(PASSWORD_ENV).ok().filter(|v| !v.is_empty()) {
            return Ok(Some((env, Source::Env)));
        }
        if let Some(path) = &access.password_file {
            let text = String::from_utf8(self.read("password_file", path)?)
                .map_err(|_| self.invalid("password_file", format!("{} is not UTF-8", path.display())))?;
            return Ok(Some((text.trim_end_matches(['\r', '\n']).to_string(), Source::File(path.clone()))));
        }
        if let Some(password) = &access.password {
            return Ok(Some((password.clone(), Source::Key)));
        }
        Ok(from_url.map(|p| (p.to_string(), Source::Url)))
    }

    fn password_setting(&self, source: Option<&Source>) -> String {
        match source {
            Some(Source::Env) => format!("{PASSWORD_ENV} (the {} password)", self.access.section),
            Some(Source::File(path)) => format!("{} ({})", self.setting("password_file"), path.display()),
            Some(Source::Key) | None => self.setting("password"),
            Some(Source::Url) => format!("{} (its password)", self.url_setting),
        }
    }

    /// The client these settings describe (nothing is dialled yet), for
    /// connections of other kinds than [`RedisEndpoint::connect`]'s.
    pub fn client(&self) -> Result<redis::Client, RedisConnError> {
        self.build(redis::ProtocolVersion::RESP2).map(|(client, _)| client)
    }

    /// The client, and the setting to name if Redis refuses the password.
    pub(super) fn build(&self, protocol: redis::ProtocolVersion) -> Result<(redis::Client, String), RedisConnError> {
        let (info, tls, password_setting) = self.parts(protocol)?;
        let client = match tls {
            None => redis::Client::open(info).map_err(|e| self.url_error(e))?,
            Some(certificates) => {
                crate::tls::use_ring_by_default();
                redis::Client::build_with_tls(info, certificates)
                    .map_err(|e| self.invalid("tls_ca_file", e.to_string()))?
            }
        };
        Ok((client, password_setting))
    }

    pub(super) fn url_error(&self, e: redis::RedisError) -> RedisConnError {
        RedisConnError::Setting {
            setting: self.url_setting.clone(),
            message: format!("`{}` is not a Redis URL: {e}", self.shown()),
        }
    }

    /// The connection info (user and password applied), the TLS material
    /// of a `rediss://` URL, and the setting the password came from.
    pub(super) fn parts(
        &self,
        protocol: redis::ProtocolVersion,
    ) -> Result<(redis::ConnectionInfo, Option<redis::TlsCertificates>, String), RedisConnError> {
        let info = self.url.as_str().into_connection_info().map_err(|e| self.url_error(e))?;
        let mut settings = info.redis_settings().clone().set_protocol(protocol);
        if let Some(user) = &self.access.username {
            settings = settings.set_username(user);
        }
        let password = self.password(info.redis_settings().password())?;
        let password_setting = self.password_setting(password.as_ref().map(|(_, source)| source));
        if let Some((password, _)) = password {
            settings = settings.set_password(password);
        }
        let tls = matches!(info.addr(), ConnectionAddr::TcpTls { .. });
        let info = info.set_redis_settings(settings);
        let access = &self.access;
        let files = [("tls_ca_file", &access.tls_ca_file), ("tls_cert_file", &access.tls_cert_file)];
        if !tls {
            if let Some((key, _)) =
                files.iter().chain([&("tls_key_file", &access.tls_key_file)]).find(|f| f.1.is_some())
            {
                return Err(self.invalid(
                    key,
                    format!("set, but {} `{}` is not a rediss:// (TLS) URL", self.url_setting, self.shown()),
                ));
            }
            return Ok((info, None, password_setting));
        }
        let client_tls = match (&access.tls_cert_file, &access.tls_key_file) {
            (Some(cert), Some(key)) => Some(redis::ClientTlsConfig {
                client_cert: self.certificates("tls_cert_file", cert)?,
                client_key: self.private_key(key)?,
            }),
            (None, None) => None,
            (Some(_), None) => return Err(self.invalid("tls_key_file", "tls_cert_file needs tls_key_file")),
            (None, Some(_)) => return Err(self.invalid("tls_cert_file", "tls_key_file needs tls_cert_file")),
        };
        let root_cert = access.tls_ca_file.as_ref().map(|ca| self.certificates("tls_ca_file", ca)).transpose()?;
        Ok((info, Some(redis::TlsCertificates { client_tls, root_cert }), password_setting))
    }

    /// The PEM file `path` (setting `key`), checked to hold certificates.
    fn certificates(&self, key: &str, path: &Path) -> Result<Vec<u8>, RedisConnError> {
        use rustls::pki_types::CertificateDer;
        use rustls::pki_types::pem::PemObject;
        let pem = self.read(key, path)?;
        let certs = CertificateDer::pem_slice_iter(&pem)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| self.invalid(key, format!("{} is not PEM: {e}", path.display())))?;
        if certs.is_empty() {
            return Err(self.invalid(key, format!("{} holds no PEM certificate", path.display())));
        }
        Ok(pem)
    }

    /// The PEM private key `path` (`tls_key_file`), checked to hold one.
    fn private_key(&self, path: &Path) -> Result<Vec<u8>, RedisConnError> {
        use rustls::pki_types::PrivateKeyDer;
        use rustls::pki_types::pem::PemObject;
        let pem = self.read("tls_key_file", path)?;
        PrivateKeyDer::from_pem_slice(&pem)
            .map_err(|e| self.invalid("tls_key_file", format!("{} holds no PEM private key: {e}", path.display())))?;
        Ok(pem)
    }

    /// Connects: one connection is tried first, so that a refused password
    /// or certificate fails now (naming the setting); then the connection
    /// that reconnects with backoff (`config`) is made.
    pub async fn connect(&self, config: ConnectionManagerConfig) -> Result<ConnectionManager, RedisConnError> {
        self.connect_as(config, redis::ProtocolVersion::RESP2).await
    }

    /// As [`RedisEndpoint::connect`], speaking RESP3: the server may push
    /// (tracking invalidations) to `config`'s push sender.
    pub async fn connect_resp3(&self, config: ConnectionManagerConfig) -> Result<ConnectionManager, RedisConnError> {
        self.connect_as(config, redis::ProtocolVersion::RESP3).await
    }

    /// One connection, tried: a refused password or certificate is the
    /// error, naming the setting; anything else (unreachable) is left to
    /// the connection that follows, and its retries.
    pub(super) async fn probe(&self, client: &redis::Client, password_setting: &str) -> Result<(), RedisConnError> {
        let probe = redis::AsyncConnectionConfig::new()
            .set_connection_timeout(Some(CONNECT_TIMEOUT))
            .set_response_timeout(Some(CONNECT_TIMEOUT));
        let tried = match client.get_multiplexed_async_connection_with_config(&probe).await {
            Ok(mut conn) => redis::cmd("PING").query_async::<String>(&mut conn).await.map(drop),
            Err(error) => Err(error),
        };
        match tried {
            Err(error) => self.refusal(&error, password_setting).map_or(Ok(()), Err),
            Ok(()) => Ok(()),
        }
    }

    async fn connect_as(
        &self,
        config: ConnectionManagerConfig,
        protocol: redis::ProtocolVersion,
    ) -> Result<ConnectionManager, RedisConnError> {
        let (client, password_setting) = self.build(protocol)?;
        self.probe(&client, &password_setting).await?;
        client.get_connection_manager_with_config(config).await.map_err(|error| {
            self.refusal(&error, &password_setting).unwrap_or_else(|| {
                let hint = if error.is_timeout() && self.url.starts_with("rediss:") {
                    " (no TLS answer: does the server serve TLS on that port?)"
                } else {
                    ""
                };
                RedisConnError::Unreachable { url: self.shown(), message: format!("{error}{hint}") }
            })
        })
    }

    /// `error` as a refusal naming the setting to fix, if it is one.
    pub(super) fn refusal(&self, error: &redis::RedisError, password_setting: &str) -> Option<RedisConnError> {
        let refused = |setting: String, message: String| Some(RedisConnError::Refused { setting, message });
        let user = self.access.username.clone().or_else(|| {
            // The first seed's, when `url` lists a cluster's seeds.
            let info = self.url.split(',').next()?.trim().into_connection_info().ok()?;
            info.redis_settings().username().map(str::to_string)
        });
        let user = user.map_or_else(|| "`default`".to_string(), |u| format!("`{u}`"));
        match (error.kind(), error.code()) {
            (redis::ErrorKind::AuthenticationFailed, _) | (_, Some("WRONGPASS")) => refused(
                password_setting.to_string(),
                format!("Redis at {} refused the credentials of user {user} ({error})", self.shown()),
            ),
            (_, Some("NOAUTH")) => refused(
                self.setting("password"),
                format!(
                    "Redis at {} requires a password ({error}); set password, password_file or {PASSWORD_ENV}",
                    self.shown()
                ),
            ),
            (_, Some("NOPERM")) => refused(
                self.setting("username"),
                format!("Redis at {} does not let user {user} run what tailrace needs ({error})", self.shown()),
            ),
            _ => self.tls_refusal(error),
        }
    }

    fn tls_refusal(&self, error: &redis::RedisError) -> Option<RedisConnError> {
        let tls = tls_error(error)?;
        let (key, message) = match tls {
            rustls::Error::InvalidCertificate(rustls::CertificateError::NotValidForName)
            | rustls::Error::InvalidCertificate(rustls::CertificateError::NotValidForNameContext { .. }) => (
                self.url_setting.clone(),
                format!("the server's certificate is not valid for the host of `{}` ({tls})", self.shown()),
            ),
            rustls::Error::InvalidCertificate(
                rustls::CertificateError::UnknownIssuer
                | rustls::CertificateError::BadSignature
                | rustls::CertificateError::UnsupportedSignatureAlgorithmForPublicKeyContext { .. },
            ) => match &self.access.tls_ca_file {
                Some(ca) => (
                    self.setting("tls_ca_file"),
                    format!("the server's certificate is not signed by the authority in {} ({tls})", ca.display()),
                ),
                None => (
                    self.setting("tls_ca_file"),
                    format!(
                        "the server's certificate does not chain to the system's trust roots ({tls}); set tls_ca_file \
                         to the authority that signed it"
                    ),
                ),
            },
            rustls::Error::InvalidCertificate(_) => {
                (self.setting("tls_ca_file"), format!("the server's certificate is not acceptable ({tls})"))
            }
            rustls::Error::InvalidMessage(_) => (
                self.url_setting.clone(),
                format!("Redis at {} did not answer in TLS ({tls}); does it serve TLS on that port?", self.shown()),
            ),
            rustls::Error::AlertReceived(_) => (
                self.setting("tls_cert_file"),
                format!("the server refused the TLS handshake ({tls}); does it require a client certificate?"),
            ),
            other => (self.setting("tls_ca_file"), format!("TLS with Redis at {} failed: {other}", self.shown())),
        };
        Some(RedisConnError::Refused { setting: key, message })
    }
}

/// The rustls error under `error`, if it is one. The crate keeps an I/O
/// error as an `Arc<dyn Error>`, and an I/O error's `source` skips the
/// error it wraps, so each level is unwrapped by type.
fn tls_error(error: &redis::RedisError) -> Option<&rustls::Error> {
    type Shared = std::sync::Arc<dyn std::error::Error + Send + Sync>;
    fn inner<'a>(error: &'a (dyn std::error::Error + 'static)) -> Option<&'a rustls::Error> {
        if let Some(tls) = error.downcast_ref::<rustls::Error>() {
            return Some(tls);
        }
        if let Some(shared) = error.downcast_ref::<Shared>() {
            let shared: &(dyn std::error::Error + 'static) = shared.as_ref();
            return inner(shared);
        }
        if let Some(io) = error.downcast_ref::<std::io::Error>() {
            let wrapped: &(dyn std::error::Error + 'static) = io.get_ref()?;
            return inner(wrapped);
        }
        inner(error.source()?)
    }
    inner(std::error::Error::source(error)?)
}

/// The standard reconnecting connection: every command bounded by
/// `response_timeout`, reconnects backing off up to 200 ms,
/// 6 attempts (then the next command starts again).
pub fn reconnecting(response_timeout: Duration) -> ConnectionManagerConfig {
    ConnectionManagerConfig::new()
        .set_response_timeout(Some(response_timeout))
        .set_connection_timeout(Some(CONNECT_TIMEOUT))
        .set_max_delay(RECONNECT_MAX_DELAY)
        .set_number_of_retries(6)
}

/// The longest wait between two reconnect attempts: a Redis that is back
/// is found within this (a dial a few times a second per connection while
/// it is down costs nothing; waits of seconds left queues unread that long
/// after Redis answered again).
const RECONNECT_MAX_DELAY: Duration = Duration::from_millis(200);

/// Whether a call that failed with `error` may succeed if made again: the
/// link (refused, dropped, timed out) or a server that is not ready yet
/// (loading its data after a restart, a cluster failing over, a replica
/// promoted), as opposed to a refusal that a retry meets again (a script
/// error, a wrong type, no permission).
pub(crate) fn is_transient(error: &redis::RedisError) -> bool {
    error.is_io_error()
        || error.is_timeout()
        || error.is_connection_dropped()
        || error.is_connection_refusal()
        || !matches!(error.retry_method(), redis::RetryMethod::NoRetry)
}
