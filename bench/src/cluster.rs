//! What the cluster benches (`failover`, `scale`) share: a private
//! `redis-server` (the test kit's) and `tailrace node` processes on it,
//! with their config, start, signals and admin view.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use tailrace_testkit::cluster::Proc;
use tailrace_testkit::redis_server::RedisServer;

/// The audited namespace of the nodes' audit logs.
pub(super) const NAMESPACE: &str = "audit";

pub(super) fn free_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// A private `redis-server` for a bench (the test kit's, without
/// persistence and with room for many clients), and its URL.
pub(super) fn private_redis() -> (RedisServer, String) {
    let args = ["--appendonly", "no", "--maxclients", "20000"];
    let server = tokio::task::block_in_place(|| RedisServer::start_with(&args));
    let url = server.url();
    (server, url)
}

/// Sections added to every node's config, to measure a setting:
/// `TAILRACE_BENCH_NODE_CONFIG='[agent]
/// read_linger = "0s"' tailrace-bench scale --quick`.
pub(crate) const NODE_CONFIG_ENV: &str = "TAILRACE_BENCH_NODE_CONFIG";

/// One `tailrace node` process (the test kit's `Proc`) and its audit log.
pub(super) struct NodeProc {
    pub(super) name: String,
    node: Proc,
    pub(super) audit: PathBuf,
    pub(super) alive: bool,
}

impl NodeProc {
    /// Starts node `name` with `queues` queues on `redis_url`, and waits
    /// until it serves; its audit log goes to `dir`.
    pub(super) async fn spawn(
        dir: &Path,
        name: &str,
        redis_url: &str,
        cookie: &str,
        queues: u32,
    ) -> anyhow::Result<Self> {
        let port = free_port()?;
        let cluster_port = free_port()?;
        let audit = dir.join(format!("audit-{name}.jsonl"));
        let config = format!(
            r#"[node]
name = "{name}"
[queues]
adapter = "redis"
count = {queues}
[adapters.redis]
url = "{redis_url}"
[archive]
store = "redis"
redis_url = "{redis_url}"
[lease]
ttl = "8s"
renew = "2s"
acquire = "1s"
# The bench's Redis is private, has no persistence and is never restarted.
allow_volatile_redis = true
[cluster]
listen = "127.0.0.1:{cluster_port}"
[edge]
listen = "127.0.0.1:{port}"
[diagnostics]
audit_namespace = "{NAMESPACE}"
audit_path = "{}"
{}"#,
            audit.display(),
            std::env::var(NODE_CONFIG_ENV).unwrap_or_default()
        );
        let binary = tailrace_bin()?;
        let env = [(tailrace::config::COOKIE_ENV, cookie)];
        let node = tokio::task::block_in_place(|| {
            let mut node = Proc::spawn_program(&binary, name, port, &config, &["node"], &[], &env);
            node.wait_serving();
            node
        });
        Ok(Self { name: name.to_string(), node, audit, alive: true })
    }

    /// Queue → holder, from this node's admin API; `None` if unreachable.
    /// Every page of the admin view.
    pub(super) async fn holders(&self, http: &reqwest::Client) -> Option<BTreeMap<u32, Option<String>>> {
        let mut held = BTreeMap::new();
        let mut from = Some(0);
        while let Some(start) = from {
            let url = self.node.url(&format!("/api/v1/admin/cluster?from={start}&limit=10000"));
            let body: serde_json::Value =
                http.get(url).send().await.ok()?.error_for_status().ok()?.json().await.ok()?;
            for queue in body["queues"].as_array()? {
                held.insert(queue["queue"].as_u64()? as u32, queue["holder"].as_str().map(str::to_string));
            }
            from = body["next"].as_u64();
        }
        Some(held)
    }

    /// The sum of a metric's samples on this node; `None` if unreachable.
    pub(super) async fn metric_sum(&self, name: &str) -> Option<f64> {
        self.node.metric_sum(name, None).await
    }

    /// Sends `signal` (`TERM`, `KILL`).
    pub(super) fn signal(&self, signal: &str) {
        self.node.signal(signal);
    }

    /// Its process id, while it runs.
    pub(super) fn pid(&self) -> Option<u32> {
        self.node.pid()
    }

    /// Waits for the process to exit after a signal.
    pub(super) fn wait_exit(&mut self) {
        tokio::task::block_in_place(|| self.node.wait_exit());
    }

    /// SIGTERM, then waits for the exit (SIGKILL after `within`).
    pub(super) async fn stop(&mut self, within: Duration) -> bool {
        if !self.alive {
            return true;
        }
        self.alive = false;
        tokio::task::block_in_place(|| self.node.stop(within))
    }
}

/// The `tailrace` binary the node processes run: `TAILRACE_BIN`, or the one
/// built beside this bench (`cargo build --release --workspace` builds both).
pub fn tailrace_bin() -> anyhow::Result<std::path::PathBuf> {
    if let Some(path) = std::env::var_os("TAILRACE_BIN") {
        return Ok(path.into());
    }
    let bench = std::env::current_exe().context("finding this executable")?;
    let beside = bench.with_file_name(format!("tailrace{}", std::env::consts::EXE_SUFFIX));
    anyhow::ensure!(
        beside.exists(),
        "no tailrace binary at {}: build it (`cargo build --release -p tailrace-server`) or set TAILRACE_BIN",
        beside.display()
    );
    Ok(beside)
}
