//! What the cluster benches (`failover`, `scale`) share: a private
//! `redis-server` and `tailrace node` processes (this executable) on it,
//! with their config, start, signals and admin view.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use tokio::io::AsyncBufReadExt;
use tokio::process::{Child, Command};

/// The audited namespace of the nodes' audit logs.
pub(super) const NAMESPACE: &str = "audit";

pub(super) fn free_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// Starts a `redis-server` on a free loopback port with no persistence,
/// in `dir`; its URL once it answers. `bench` names the caller in errors.
///
/// A free port can be taken by another process between the probe and the
/// server's bind; the server then exits, and whatever holds the port could
/// pass for it. So the server counts as up only when the Redis answering
/// on the port has the child's process id, and one that exited is started
/// again on a fresh port.
pub(super) async fn private_redis(dir: &Path, bench: &str) -> anyhow::Result<(Child, String)> {
    for _ in 0..5 {
        let port = free_port()?;
        let redis = Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .args(["--daemonize", "no", "--maxclients", "20000", "--dir"])
            .arg(dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn();
        let mut redis = match redis {
            Ok(redis) => redis,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => bail!(
                "`bench {bench}` starts its own Redis, and `redis-server` is not installed (not on PATH); \
                 install it (e.g. apt-get install redis-server) and run again"
            ),
            Err(error) => return Err(error).context("starting redis-server"),
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if redis.try_wait()?.is_some() {
                break;
            }
            if let Some(pid) = redis_pid(port).await {
                if Some(pid) == redis.id() {
                    return Ok((redis, format!("redis://127.0.0.1:{port}")));
                }
                break;
            }
            anyhow::ensure!(Instant::now() < deadline, "redis-server did not start on port {port}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    bail!("`bench {bench}`: redis-server exited at start five times (ports taken as it bound them?)")
}

/// The process id of the Redis answering on a loopback `port`, if one does.
pub(super) async fn redis_pid(port: u16) -> Option<u32> {
    let client = redis::Client::open(format!("redis://127.0.0.1:{port}")).ok()?;
    let info = async {
        let mut connection = client.get_multiplexed_async_connection().await?;
        redis::cmd("INFO").arg("server").query_async::<String>(&mut connection).await
    };
    let info = tokio::time::timeout(Duration::from_secs(1), info).await.ok()?.ok()?;
    info.lines().find_map(|line| line.trim().strip_prefix("process_id:")?.parse().ok())
}

/// Sections added to every node's config, to measure a setting:
/// `TAILRACE_BENCH_NODE_CONFIG='[agent]
/// read_linger = "0s"' tailrace bench scale --quick`.
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
        let exe = std::env::current_exe().context("finding this executable")?;
        let mut child = Command::new(exe)
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
