//! The TOML configuration of a node. Every setting is optional and has the
//! documented default; unknown keys are errors (a typo never passes
//! silently). `docs/configuration.md` describes every key.

mod cluster;
mod diagnostics;
mod edge;

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::adapters::file::FileOptions;
use crate::adapters::kafka::KafkaOptions;
use crate::adapters::memory::MemoryOptions;
use crate::adapters::redis::RedisOptions;
pub use crate::agent::AgentOptions;
pub use crate::balancer::BalancerKind;
use crate::checkpoint::CheckpointOptions;
use crate::cluster::{LeaseOptions, MembershipOptions};
pub use crate::manager::ManagerOptions;
use crate::pubsub::PubSubOptions;
use crate::queue::CacheOptions;
pub use crate::retry::Backoff;
pub use cluster::{COOKIE_ENV, ClusterSection, ClusterTls, MIN_COOKIE_LEN};
pub use diagnostics::DiagnosticsSection;
#[cfg(feature = "edge")]
pub(crate) use edge::secs;
pub use edge::{AuthOptions, EdgeOptions, EdgeTls, LogStreamSettings, RunsStreamSettings, Scope, TokenEntry};

/// A whole node configuration.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// This node.
    pub node: NodeSection,
    /// The queues and which adapter holds them.
    pub queues: QueuesSection,
    /// Per-adapter settings.
    pub adapters: AdaptersSection,
    /// Each queue's cache.
    pub cache: CacheOptions,
    /// Pulling agents.
    pub agent: AgentOptions,
    /// The pulling manager.
    pub manager: ManagerOptions,
    /// Checkpoints.
    pub checkpoint: CheckpointOptions,
    /// Subscriptions.
    pub pubsub: PubSubOptions,
    /// Which node pulls which queue; absent, the command's own
    /// ([`Config::balancer_kind`]: best-fit for one process, `lease` for
    /// `tailrace node`), so a copy of the defaults file changes nothing.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub balancer: Option<BalancerKind>,
    /// Delivery failures.
    pub failure: FailureSection,
    /// The HTTP edge and its log stream.
    pub edge: EdgeOptions,
    /// Where run logs are archived.
    pub archive: crate::archive::ArchiveOptions,
    /// How the nodes of a multi-process cluster reach each other.
    pub cluster: ClusterSection,
    /// Membership heartbeats (multi-process cluster).
    pub membership: MembershipOptions,
    /// Queue leases.
    pub lease: LeaseOptions,
    /// What the node records for outside checks (the audit log).
    pub diagnostics: DiagnosticsSection,
}

/// `[node]`
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct NodeSection {
    /// The node's name, unique in its cluster.
    pub name: String,
}

impl Default for NodeSection {
    fn default() -> Self {
        Self { name: "node-1".into() }
    }
}

/// `[queues]`
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct QueuesSection {
    /// The adapter's name: `file` (the embedded durable default), `redis`,
    /// `kafka` or `memory`.
    pub adapter: String,
    /// How many queues (every node and producer must agree).
    pub count: u32,
}

impl Default for QueuesSection {
    fn default() -> Self {
        Self { adapter: "file".into(), count: 8 }
    }
}

/// `[adapters.*]`
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AdaptersSection {
    /// `[adapters.memory]`
    pub memory: MemoryOptions,
    /// `[adapters.file]`
    pub file: FileOptions,
    /// `[adapters.redis]`
    pub redis: RedisOptions,
    /// `[adapters.kafka]`
    pub kafka: KafkaOptions,
}

/// `[failure]`
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct FailureSection {
    /// Fault an explicit subscription whose batch keeps failing, instead of
    /// skipping the batch to the dead-letter sink.
    pub fault_on_error: bool,
}

/// A configuration that cannot be used.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read config {path}: {source}")]
    Read {
        /// The file.
        path: String,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The file is not valid for tailrace.
    #[error("invalid config {path}: {message}")]
    Invalid {
        /// The file (or `<string>`).
        path: String,
        /// What is wrong, with the line.
        message: String,
    },
}

impl Config {
    /// The balancer: `[balancer]`'s, or best-fit without the section (what
    /// one process runs; `tailrace node` sets `lease` when it is absent).
    pub fn balancer_kind(&self) -> BalancerKind {
        self.balancer.unwrap_or_default()
    }

    /// Parses TOML text; every key it does not set keeps its default, and
    /// an unknown key or a bad value is an error naming it.
    ///
    /// ```
    /// use tailrace::config::Config;
    ///
    /// let config = Config::from_toml("[queues]\ncount = 16\n", "node.toml").unwrap();
    /// assert_eq!(config.queues.count, 16);
    /// let error = Config::from_toml("[queues]\ncuont = 16\n", "node.toml").unwrap_err();
    /// assert!(error.to_string().contains("cuont"), "{error}");
    /// ```
    pub fn from_toml(text: &str, origin: &str) -> Result<Self, ConfigError> {
        let config: Config =
            toml::from_str(text).map_err(|e| ConfigError::Invalid { path: origin.into(), message: e.to_string() })?;
        config.validate(origin)?;
        for removed in config.cluster.removed_settings() {
            tracing::warn!(config = origin, "{removed}");
        }
        Ok(config)
    }

    /// Reads and parses a TOML file.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path)
            .map_err(|source| ConfigError::Read { path: path.display().to_string(), source })?;
        Self::from_toml(&text, &path.display().to_string())
    }

    fn validate(&self, origin: &str) -> Result<(), ConfigError> {
        let invalid = |message: String| ConfigError::Invalid { path: origin.into(), message };
        if self.queues.count == 0 {
            return Err(invalid("queues.count must be at least 1".into()));
        }
        if self.cache.cache_size < self.cache.buckets.max(1) {
            return Err(invalid(format!(
                "cache.cache_size ({}) must be at least cache.buckets ({})",
                self.cache.cache_size, self.cache.buckets
            )));
        }
        if let Some(BalancerKind::Ring { virtual_nodes }) = self.balancer
            && virtual_nodes < crate::balancer::MIN_VIRTUAL_NODES
        {
            return Err(invalid(format!(
                "balancer.virtual_nodes must be at least {} (got {virtual_nodes})",
                crate::balancer::MIN_VIRTUAL_NODES
            )));
        }
        self.edge.check().map_err(invalid)?;
        self.adapters.kafka.check().map_err(|e| invalid(e.to_string()))?;
        if self.node.name.is_empty() {
            return Err(invalid("node.name must not be empty".into()));
        }
        self.cluster.check(std::env::var(COOKIE_ENV).ok()).map_err(invalid)?;
        self.membership.check().map_err(invalid)?;
        self.lease.check().map_err(invalid)?;
        self.diagnostics.check().map_err(invalid)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn an_empty_file_is_all_defaults() {
        let config = Config::from_toml("", "<test>").unwrap();
        assert_eq!(config, Config::default());
        assert_eq!(config.agent.poll_period, Duration::from_millis(100));
        assert_eq!(config.cache.cache_size, 4096);
        assert_eq!(config.queues.count, 8);
    }

    #[test]
    fn settings_parse_with_human_durations() {
        let config = Config::from_toml(
            r#"
            [queues]
            count = 16
            [agent]
            poll_period = "250ms"
            max_delivery_time = "2m"
            [balancer]
            kind = "ring"
            virtual_nodes = 128
            "#,
            "<test>",
        )
        .unwrap();
        assert_eq!(config.queues.count, 16);
        assert_eq!(config.agent.poll_period, Duration::from_millis(250));
        assert_eq!(config.agent.max_delivery_time, Duration::from_secs(120));
        assert_eq!(config.balancer, Some(BalancerKind::Ring { virtual_nodes: 128 }));
    }

    #[test]
    fn typos_and_bad_values_are_clear_errors() {
        let err = Config::from_toml("[agent]\npoll_perod = \"1s\"\n", "x.toml").unwrap_err().to_string();
        assert!(err.contains("x.toml") && err.contains("poll_perod"), "{err}");
        let err = Config::from_toml("[queues]\ncount = 0\n", "x.toml").unwrap_err().to_string();
        assert!(err.contains("queues.count must be at least 1"), "{err}");
        let err =
            Config::from_toml("[balancer]\nkind = \"ring\"\nvirtual_nodes = 3\n", "x.toml").unwrap_err().to_string();
        assert!(err.contains("at least 64"), "{err}");
        // [balancer] refuses what it does not know, like every section.
        for text in ["kind = \"lease\"\nvirtual_node = 64\n", "kind = \"ring\"\nvirtual_nodes = 64\nvnodes = 1\n"] {
            let err = Config::from_toml(&format!("[balancer]\n{text}"), "x.toml").unwrap_err().to_string();
            assert!(err.contains("x.toml") && err.contains("unknown field"), "{text}: {err}");
        }
        let err = Config::from_toml("[agent]\npoll_period = \"soon\"\n", "x.toml").unwrap_err().to_string();
        assert!(err.contains("poll_period"), "{err}");
        let err = Config::from_toml("[edge]\nbody_timeout_seconds = 0\n", "x.toml").unwrap_err().to_string();
        assert!(err.contains("edge.body_timeout_seconds must be a positive"), "{err}");
        let err = Config::from_toml("[edge]\nmax_body_bytes = 2048\nmax_total_body_bytes = 1024\n", "x.toml")
            .unwrap_err()
            .to_string();
        assert!(err.contains("must not be more than edge.max_total_body_bytes"), "{err}");
        let err = Config::from_toml("[edge.tls]\ncert = \"\"\nkey = \"edge.key\"\n", "x.toml").unwrap_err().to_string();
        assert!(err.contains("edge.tls.cert must name a file"), "{err}");
        let err = Config::from_toml("[edge.tls]\ncert = \"edge.pem\"\n", "x.toml").unwrap_err().to_string();
        assert!(err.contains("key"), "{err}");
    }

    #[test]
    fn edge_tls_is_off_unless_set() {
        assert_eq!(Config::default().edge.tls, None);
        let config = Config::from_toml("[edge.tls]\ncert = \"edge.pem\"\nkey = \"edge.key\"\n", "x.toml").unwrap();
        let tls = config.edge.tls.unwrap();
        assert_eq!((tls.cert.to_str(), tls.key.to_str()), (Some("edge.pem"), Some("edge.key")));
    }

    #[test]
    fn the_defaults_and_a_toml_section() {
        let config = Config::from_toml("", "<test>").unwrap();
        let policy = &config.archive.retention;
        assert_eq!(policy.max_age, Duration::from_secs(30 * 24 * 3600));
        assert_eq!(policy.max_total_bytes, 10 * 1024 * 1024 * 1024);
        assert_eq!(policy.min_age, Duration::from_secs(600));
        assert_eq!(policy.abandoned_after, Duration::ZERO);
        assert_eq!(policy.interval, Duration::from_secs(60));
        assert!(policy.is_enabled());

        let config = Config::from_toml(
            r#"
            [archive.retention]
            max_age = "7days"
            max_total_bytes = 1048576
            min_age = "0s"
            abandoned_after = "90days"
            interval = "30s"
            "#,
            "<test>",
        )
        .unwrap();
        let policy = &config.archive.retention;
        assert_eq!(policy.max_age, Duration::from_secs(7 * 24 * 3600));
        assert_eq!(policy.max_total_bytes, 1 << 20);
        assert_eq!(policy.min_age, Duration::ZERO);
        assert_eq!(policy.abandoned_after, Duration::from_secs(90 * 24 * 3600));
        assert_eq!(policy.interval, Duration::from_secs(30));

        let off = Config::from_toml("[archive.retention]\nmax_age = \"0\"\nmax_total_bytes = 0\n", "<test>").unwrap();
        assert!(!off.archive.retention.is_enabled());
        let never = Config::from_toml("[archive.retention]\ninterval = \"0s\"\n", "<test>").unwrap();
        assert!(!never.archive.retention.is_enabled());
        let err = Config::from_toml("[archive.retention]\nmax_ages = \"1d\"\n", "x.toml").unwrap_err().to_string();
        assert!(err.contains("max_ages"), "{err}");
    }

    #[test]
    fn diagnostics_are_off_by_default_and_need_both_keys() {
        let config = Config::from_toml("", "<test>").unwrap();
        assert_eq!(config.diagnostics.audit(), None);
        let config =
            Config::from_toml("[diagnostics]\naudit_namespace = \"audit\"\naudit_path = \"a.jsonl\"\n", "<test>")
                .unwrap();
        assert_eq!(config.diagnostics.audit(), Some(("audit", std::path::Path::new("a.jsonl"))));
        let err = Config::from_toml("[diagnostics]\naudit_namespace = \"audit\"\n", "x.toml").unwrap_err().to_string();
        assert!(err.contains("diagnostics.audit_namespace needs diagnostics.audit_path"), "{err}");
        let err = Config::from_toml("[diagnostics]\naudit_path = \"a\"\n", "x.toml").unwrap_err().to_string();
        assert!(err.contains("diagnostics.audit_path needs"), "{err}");
        let err = Config::from_toml("[diagnostics]\naudit_nmespace = \"a\"\n", "x.toml").unwrap_err().to_string();
        assert!(err.contains("audit_nmespace"), "{err}");
    }
}
