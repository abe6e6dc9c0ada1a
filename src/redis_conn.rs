//! Reaching Redis: the one place that turns settings (a URL, an ACL user
//! and password, TLS files) into a connected client, for the Redis adapter,
//! the queue leases and membership, and the Redis run log store.
//!
//! - `rediss://` URLs go over TLS (rustls with ring): the server's
//!   certificate must chain to `tls_ca_file` (or, without it, to the
//!   system's roots); `tls_cert_file` and `tls_key_file` give a client
//!   certificate for mutual TLS.
//! - The ACL user is `username` or the URL's; the password is
//!   [`PASSWORD_ENV`] when set, else `password_file` or `password` (not
//!   both: that is an error), else the URL's `user:password@`.
//! - Before the reconnecting connection is made, one connection is tried:
//!   a refused password or a certificate that does not chain fails at once
//!   with a message naming the setting; an unreachable server is left to
//!   the connection's own retries.
//! - Passwords are never printed: [`redact`] is how a URL is shown.
//!
//! The settings' types (an endpoint, its access, replicas to wait for) and
//! [`redact`] are always here; connecting (`client`, `connection`) needs
//! the `redis` cargo feature. `durability` reads and states what Redis's
//! persistence guarantees; `tracking` waits for a key to change
//! (client-side tracking).

#[cfg(feature = "redis")]
mod client;
#[cfg(feature = "redis")]
mod connection;
// The server's (its persistence check).
#[cfg(all(feature = "edge", feature = "cluster"))]
pub(crate) mod durability;
#[cfg(feature = "redis")]
pub(crate) mod tracking;

#[cfg(feature = "redis")]
pub(crate) use client::is_transient;
#[cfg(feature = "redis")]
pub use client::reconnecting;
#[cfg(feature = "redis")]
pub use connection::RedisConn;

use std::path::PathBuf;
#[cfg(feature = "redis")]
use std::time::Duration;

/// The environment variable whose value, when set and not empty, is the
/// Redis password (it wins over `password_file`, `password` and the URL).
pub const PASSWORD_ENV: &str = "TAILRACE_REDIS_PASSWORD";

/// How long connecting (TCP, TLS and the handshake) may take.
#[cfg(feature = "redis")]
pub(crate) const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// How many replicas must have a write before it is acknowledged (`WAIT`),
/// and for how long to wait for them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WaitReplicas {
    /// Replicas that must confirm.
    pub replicas: u32,
    /// Longest wait.
    pub timeout: std::time::Duration,
}

/// Why Redis could not be reached. The message names the setting to fix.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RedisConnError {
    /// A setting is malformed or names a file that cannot be read.
    #[error("{setting}: {message}")]
    Setting {
        /// The setting, e.g. `[adapters.redis] tls_ca_file`.
        setting: String,
        /// What is wrong with it.
        message: String,
    },
    /// Redis (or its TLS) refused this client: retrying will not help.
    #[error("{setting}: {message}")]
    Refused {
        /// The setting that caused it.
        setting: String,
        /// What Redis or the TLS handshake said.
        message: String,
    },
    /// Redis could not be reached (down, or not answering in time).
    #[error("cannot reach Redis at {url}: {message}")]
    Unreachable {
        /// The server, password redacted.
        url: String,
        /// The last error.
        message: String,
    },
}

/// The ACL user, password and TLS files of a Redis connection, and the
/// section of the config they are set in (for messages).
#[derive(Clone, Default, PartialEq, Eq)]
pub struct RedisAccess {
    /// Where these keys are set, e.g. `[adapters.redis]`.
    pub section: String,
    /// The ACL user (instead of the URL's).
    pub username: Option<String>,
    /// The password (instead of the URL's).
    pub password: Option<String>,
    /// A file holding the password (excludes `password`).
    pub password_file: Option<PathBuf>,
    /// PEM authority the server's certificate must chain to.
    pub tls_ca_file: Option<PathBuf>,
    /// PEM client certificate chain, for mutual TLS.
    pub tls_cert_file: Option<PathBuf>,
    /// PEM private key of `tls_cert_file`.
    pub tls_key_file: Option<PathBuf>,
    /// The URL is a seed of a Redis Cluster (the client finds the others).
    pub cluster: bool,
}

impl std::fmt::Debug for RedisAccess {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisAccess")
            .field("section", &self.section)
            .field("username", &self.username)
            .field("password", &self.password.as_ref().map(|_| "***"))
            .field("password_file", &self.password_file)
            .field("tls_ca_file", &self.tls_ca_file)
            .field("tls_cert_file", &self.tls_cert_file)
            .field("tls_key_file", &self.tls_key_file)
            .field("cluster", &self.cluster)
            .finish()
    }
}

/// One Redis to connect to: its URL, the setting that holds the URL, and
/// how to authenticate.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RedisEndpoint {
    /// `redis://` or `rediss://` URL.
    pub url: String,
    /// The setting the URL comes from, e.g. `[archive] redis_url`.
    pub url_setting: String,
    /// User, password and TLS.
    pub access: RedisAccess,
}

impl RedisEndpoint {
    /// An endpoint with only a URL (its own credentials, if any).
    pub fn from_url(url: &str, url_setting: &str) -> Self {
        Self { url: url.to_string(), url_setting: url_setting.to_string(), access: RedisAccess::default() }
    }

    /// The URL with its password replaced by `***`.
    pub fn shown(&self) -> String {
        redact(&self.url)
    }
}

/// `url` as it may be printed: its password replaced by `***`
/// (`redis://user:***@host:6379`). A URL that does not parse is not
/// echoed, since it may hold a password.
pub fn redact(url: &str) -> String {
    // A Redis Cluster's seeds, comma-separated: each shown redacted.
    if url.contains(',') {
        return url.split(',').map(|seed| redact(seed.trim())).collect::<Vec<_>>().join(",");
    }
    match url::Url::parse(url) {
        Ok(mut parsed) => {
            if parsed.password().is_some() {
                let _ = parsed.set_password(Some("***"));
            }
            // `redis+unix:///sock?user=…&pass=…` carries it in the query.
            if parsed.query_pairs().any(|(key, _)| key == "pass") {
                let pairs: Vec<(String, String)> = parsed
                    .query_pairs()
                    .map(|(k, v)| {
                        let v = if k == "pass" { "***".to_string() } else { v.into_owned() };
                        (k.into_owned(), v)
                    })
                    .collect();
                parsed.query_pairs_mut().clear().extend_pairs(pairs);
            }
            parsed.to_string()
        }
        Err(_) if !url.contains('@') => url.to_string(),
        Err(_) => "(a URL that does not parse)".to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::redact;

    #[test]
    fn redaction_hides_the_password_and_keeps_the_rest() {
        assert_eq!(redact("redis://tailrace:s3cret@10.0.0.5:6380/2"), "redis://tailrace:***@10.0.0.5:6380/2");
        assert_eq!(redact("rediss://:s3cret@host:6379"), "rediss://:***@host:6379");
        assert_eq!(redact("redis://127.0.0.1:6379"), "redis://127.0.0.1:6379");
        assert!(!redact("redis://u:pa ss@[bad").contains("pa ss"));
        let unix = redact("redis+unix:///run/redis.sock?user=tailrace&pass=s3cret&db=1");
        assert!(!unix.contains("s3cret") && unix.contains("pass=***") && unix.contains("db=1"), "{unix}");
        let seeds = redact("redis://:s3cret@10.0.0.5:7000, redis://:s3cret@10.0.0.6:7000");
        assert_eq!(seeds, "redis://:***@10.0.0.5:7000,redis://:***@10.0.0.6:7000");
    }
}
