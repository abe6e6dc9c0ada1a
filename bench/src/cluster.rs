//! What the cluster benches (`failover`, `scale`) share: a private
//! `redis-server` (the test kit's) and `tailrace node` processes on it,
//! with their config, start, signals and admin view.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use anyhow::Context;
use tailrace_testkit::redis_server::RedisServer;
use tokio::io::AsyncBufReadExt;
use tokio::process::{Child, Command};

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

/// One `tailrace node` process.
pub(super) struct NodeProc {
    pub(super) name: String,
    pub(super) port: u16,
    pub(super) child: Child,
    pub(super) audit: PathBuf,
    pub(super) alive: bool,
}

impl NodeProc {
    /// Starts node `name` with `queues` queues on `redis_url`, and waits
    /// until it serves.
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
        let path = dir.join(format!("{name}.toml"));
        std::fs::write(&path, config).with_context(|| format!("writing {}", path.display()))?;
        let log = std::fs::File::create(dir.join(format!("{name}.log")))?;
        let mut child = Command::new(tailrace_bin()?)
            .arg("node")
            .arg("--config")
            .arg(&path)
            .env("RUST_LOG", "warn")
            .env(tailrace::config::COOKIE_ENV, cookie)
            .stdout(Stdio::piped())
            .stderr(Stdio::from(log))
            .kill_on_drop(true)
            .spawn()
            .context("starting a node process")?;
        let stdout = child.stdout.take().context("the node's stdout")?;
        let (ready, serving) = tokio::sync::oneshot::channel();
        tokio::spawn(async move {
            let mut lines = tokio::io::BufReader::new(stdout).lines();
            let mut ready = Some(ready);
            while let Ok(Some(line)) = lines.next_line().await {
                if line.contains("viewer:")
                    && let Some(ready) = ready.take()
                {
                    let _ = ready.send(());
                }
            }
        });
        tokio::time::timeout(Duration::from_secs(60), serving)
            .await
            .ok()
            .and_then(Result::ok)
            .with_context(|| format!("node {name} did not start serving (see {name}.log)"))?;
        Ok(Self { name: name.to_string(), port, child, audit, alive: true })
    }

    /// Queue → holder, from this node's admin API; `None` if unreachable.
    /// Every page of the admin view.
    pub(super) async fn holders(&self, http: &reqwest::Client) -> Option<BTreeMap<u32, Option<String>>> {
        let mut held = BTreeMap::new();
        let mut from = Some(0);
        while let Some(start) = from {
            let url = format!("http://127.0.0.1:{}/api/v1/admin/cluster?from={start}&limit=10000", self.port);
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
    pub(super) async fn metric_sum(&self, http: &reqwest::Client, name: &str) -> Option<f64> {
        let url = format!("http://127.0.0.1:{}/metrics", self.port);
        let text = http.get(url).send().await.ok()?.error_for_status().ok()?.text().await.ok()?;
        Some(
            text.lines()
                .filter(|l| l.starts_with(name) && l[name.len()..].starts_with(['{', ' ']))
                .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
                .sum(),
        )
    }

    pub(super) fn signal(&self, signal: &str) -> anyhow::Result<()> {
        let pid = self.child.id().context("the node already exited")?;
        let status = std::process::Command::new("kill").arg(format!("-{signal}")).arg(pid.to_string()).status()?;
        anyhow::ensure!(status.success(), "kill -{signal} {pid} failed");
        Ok(())
    }

    /// SIGTERM, then waits for the exit (SIGKILL after `within`).
    pub(super) async fn stop(&mut self, within: Duration) -> bool {
        if !self.alive {
            return true;
        }
        self.alive = false;
        if self.signal("TERM").is_err() {
            return false;
        }
        match tokio::time::timeout(within, self.child.wait()).await {
            Ok(Ok(status)) => status.success(),
            _ => {
                let _ = self.child.kill().await;
                false
            }
        }
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
