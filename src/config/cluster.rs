//! The settings of a multi-process cluster: `[cluster]` (how nodes reach
//! and trust each other) is owned here; `[membership]` (heartbeats in
//! Redis) and `[lease]` (queue leases) are the cluster module's own
//! settings, re-exported. `docs/operations.md` explains the trade-offs.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// The environment variable that overrides `cluster.cookie` and
/// `cluster.cookie_file`.
pub const COOKIE_ENV: &str = "TAILRACE_COOKIE";

/// The shortest cluster cookie accepted.
pub const MIN_COOKIE_LEN: usize = 32;

/// `[cluster]` (its `Debug` never shows the cookie)
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ClusterSection {
    /// Where this node accepts node-to-node connections (`ip:port`).
    pub listen: String,
    /// The `host:port` other nodes dial (default: `listen`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub advertise: Option<String>,
    /// The shared secret nodes authenticate with (at least 32 characters).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cookie: Option<String>,
    /// A file holding the cookie (instead of `cookie`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cookie_file: Option<PathBuf>,
    /// TLS between nodes (off unless set).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tls: Option<ClusterTls>,
    /// Limit of one node-to-node call.
    #[serde(with = "humantime_serde")]
    pub call_timeout: Duration,
    /// Largest node-to-node message, in bytes (a larger delivery is sent
    /// in parts).
    pub max_message_bytes: usize,
    /// Most calls in flight to one peer, and most calls a node serves at
    /// once; more wait (callers) or are refused as busy and retried.
    pub max_inflight_calls: usize,
    /// How long a node may be gone from membership before the others remove
    /// its consumers' subscriptions from the store.
    #[serde(with = "humantime_serde")]
    pub purge_after: Duration,
    /// Removed (every call between nodes goes over `listen` now); read so
    /// that an older config still starts, with a warning.
    #[serde(default, skip_serializing)]
    pub(crate) lane: Option<bool>,
    /// Removed, as `lane`.
    #[serde(default, skip_serializing)]
    pub(crate) lane_port: Option<u16>,
}

impl std::fmt::Debug for ClusterSection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClusterSection")
            .field("listen", &self.listen)
            .field("advertise", &self.advertise)
            .field("cookie", &self.cookie.as_ref().map(|_| "***"))
            .field("cookie_file", &self.cookie_file)
            .field("tls", &self.tls)
            .field("call_timeout", &self.call_timeout)
            .field("max_message_bytes", &self.max_message_bytes)
            .field("max_inflight_calls", &self.max_inflight_calls)
            .field("purge_after", &self.purge_after)
            .finish()
    }
}

impl Default for ClusterSection {
    fn default() -> Self {
        Self {
            listen: "127.0.0.1:8586".into(),
            advertise: None,
            cookie: None,
            cookie_file: None,
            tls: None,
            call_timeout: Duration::from_secs(5),
            max_message_bytes: 16 * 1024 * 1024,
            max_inflight_calls: 256,
            purge_after: Duration::from_secs(30),
            lane: None,
            lane_port: None,
        }
    }
}

/// `[cluster.tls]`: PEM files.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterTls {
    /// This node's certificate chain.
    pub cert: PathBuf,
    /// Its private key.
    pub key: PathBuf,
    /// The authority every node's certificate must chain to.
    pub ca: PathBuf,
}

impl ClusterSection {
    /// The address other nodes dial.
    pub fn advertised(&self) -> &str {
        self.advertise.as_deref().unwrap_or(&self.listen)
    }

    /// What an older config sets that this release ignores, each with what
    /// replaced it.
    pub fn removed_settings(&self) -> Vec<String> {
        let replaced = "every call between nodes now goes over cluster.listen, one port (see docs/upgrading.md); \
                        delete the line";
        let mut removed = Vec::new();
        if self.lane.is_some() {
            removed.push(format!("cluster.lane is ignored: {replaced}"));
        }
        if self.lane_port.is_some() {
            removed.push(format!("cluster.lane_port is ignored: {replaced}"));
        }
        removed
    }

    /// The cookie: `env` (the value of [`COOKIE_ENV`], if set) wins over
    /// `cookie`, which excludes `cookie_file`. `None`: no cookie configured.
    pub fn resolve_cookie(&self, env: Option<String>) -> Result<Option<String>, String> {
        if self.cookie.is_some() && self.cookie_file.is_some() {
            return Err("cluster.cookie and cluster.cookie_file exclude each other; set one".into());
        }
        let (cookie, key) = if let Some(value) = env.filter(|v| !v.is_empty()) {
            (value, COOKIE_ENV.to_string())
        } else if let Some(value) = &self.cookie {
            (value.clone(), "cluster.cookie".into())
        } else if let Some(path) = &self.cookie_file {
            let text = std::fs::read_to_string(path)
                .map_err(|e| format!("cluster.cookie_file: cannot read {}: {e}", path.display()))?;
            (text.trim().to_string(), format!("cluster.cookie_file ({})", path.display()))
        } else {
            return Ok(None);
        };
        if cookie.chars().count() < MIN_COOKIE_LEN {
            return Err(format!("{key} must be at least {MIN_COOKIE_LEN} characters (got {})", cookie.chars().count()));
        }
        Ok(Some(cookie))
    }

    /// Problems with these settings, if any (the cookie is checked with
    /// `env`, the value of [`COOKIE_ENV`]).
    pub fn check(&self, env: Option<String>) -> Result<(), String> {
        self.listen
            .parse::<SocketAddr>()
            .map_err(|e| format!("cluster.listen must be ip:port (got `{}`: {e})", self.listen))?;
        if let Some(advertise) = &self.advertise {
            let port = advertise.rsplit_once(':').and_then(|(host, port)| (!host.is_empty()).then_some(port));
            if port.and_then(|p| p.parse::<u16>().ok()).is_none_or(|p| p == 0) {
                return Err(format!("cluster.advertise must be host:port (got `{advertise}`)"));
            }
        }
        if self.call_timeout.is_zero() {
            return Err("cluster.call_timeout must be more than 0".into());
        }
        if self.max_message_bytes < 1024 {
            return Err(format!("cluster.max_message_bytes must be at least 1024 (got {})", self.max_message_bytes));
        }
        if self.max_inflight_calls == 0 {
            return Err("cluster.max_inflight_calls must be at least 1".into());
        }
        if let Some(tls) = &self.tls {
            for (key, path) in [("cert", &tls.cert), ("key", &tls.key), ("ca", &tls.ca)] {
                if path.as_os_str().is_empty() {
                    return Err(format!("cluster.tls.{key} must name a file"));
                }
            }
        }
        self.resolve_cookie(env).map(|_| ())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::{LeaseOptions, MembershipOptions};

    #[test]
    fn defaults_pass_and_bad_values_name_their_key() {
        assert_eq!(ClusterSection::default().check(None), Ok(()));
        assert_eq!(MembershipOptions::default().check(), Ok(()));
        assert_eq!(LeaseOptions::default().check(), Ok(()));
        let bad = |c: ClusterSection| c.check(None).unwrap_err();
        assert!(bad(ClusterSection { listen: "nowhere".into(), ..Default::default() }).contains("cluster.listen"));
        assert!(
            bad(ClusterSection { advertise: Some("host".into()), ..Default::default() }).contains("cluster.advertise")
        );
        assert!(bad(ClusterSection { cookie: Some("short".into()), ..Default::default() }).contains("cluster.cookie"));
        let both = ClusterSection { cookie: Some("x".repeat(32)), cookie_file: Some("f".into()), ..Default::default() };
        assert!(bad(both).contains("exclude"));
        let lease = LeaseOptions { ttl: Duration::from_secs(5), ..Default::default() };
        assert!(lease.check().unwrap_err().contains("lease.ttl"));
        let membership = MembershipOptions { ttl: Duration::from_secs(1), ..Default::default() };
        assert!(membership.check().unwrap_err().contains("membership.ttl"));
    }

    #[test]
    fn the_sections_parse_from_toml_and_errors_name_the_file_and_key() {
        let text = r#"
            [balancer]
            kind = "lease"
            [cluster]
            listen = "0.0.0.0:9000"
            advertise = "node-a.internal:9000"
            call_timeout = "2s"
            [cluster.tls]
            cert = "a.pem"
            key = "a.key"
            ca = "ca.pem"
            [membership]
            heartbeat = "500ms"
            ttl = "3s"
            [lease]
            ttl = "30s"
            renew = "10s"
            acquire = "5s"
        "#;
        let config = crate::config::Config::from_toml(text, "<test>").unwrap();
        assert_eq!(config.balancer, Some(crate::balancer::BalancerKind::Lease));
        assert_eq!(config.cluster.advertised(), "node-a.internal:9000");
        assert_eq!(config.membership.heartbeat, Duration::from_millis(500));
        assert_eq!(config.lease.ttl, Duration::from_secs(30));
        let err = crate::config::Config::from_toml("[lease]\nttl = \"3s\"\n", "x.toml").unwrap_err().to_string();
        assert!(err.contains("x.toml") && err.contains("lease.ttl"), "{err}");
        let err = crate::config::Config::from_toml("[lease]\nttl_ms = 3\n", "x.toml").unwrap_err().to_string();
        assert!(err.contains("ttl_ms"), "{err}");
    }

    #[test]
    fn the_environment_wins_and_a_cookie_file_is_trimmed() {
        let long = "k".repeat(MIN_COOKIE_LEN);
        let config = ClusterSection { cookie: Some(long.clone()), ..Default::default() };
        assert_eq!(config.resolve_cookie(None), Ok(Some(long.clone())));
        let env = "e".repeat(40);
        assert_eq!(config.resolve_cookie(Some(env.clone())), Ok(Some(env)));
        assert!(config.resolve_cookie(Some("short".into())).unwrap_err().contains(COOKIE_ENV));
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("cookie");
        std::fs::write(&path, format!("{long}\n")).unwrap();
        let config = ClusterSection { cookie_file: Some(path), ..Default::default() };
        assert_eq!(config.resolve_cookie(None), Ok(Some(long)));
        let missing = ClusterSection { cookie_file: Some(dir.path().join("none")), ..Default::default() };
        assert!(missing.resolve_cookie(None).unwrap_err().contains("cluster.cookie_file"));
        assert_eq!(ClusterSection::default().resolve_cookie(None), Ok(None));
    }

    #[test]
    fn the_removed_lane_settings_still_parse_and_name_what_replaced_them() {
        let old = "[cluster]\nlane = true\nlane_port = 8588\n";
        let config = crate::config::Config::from_toml(old, "old.toml").unwrap();
        let removed = config.cluster.removed_settings();
        assert_eq!(removed.len(), 2, "{removed:?}");
        assert!(
            removed[0].starts_with("cluster.lane is ignored: every call between nodes now goes over cluster.listen")
        );
        assert!(removed[1].starts_with("cluster.lane_port is ignored"), "{removed:?}");
        assert!(ClusterSection::default().removed_settings().is_empty());
        let written = toml::to_string(&config.cluster).unwrap();
        assert!(!written.contains("lane"), "not written back: {written}");
    }
}
