//! A cluster of real `tailrace node` processes on one private Redis (or a
//! private Redis Cluster), for the process tests: configs on free ports, a
//! process with its log, and ownership read from the admin API and the
//! Redis lease keys.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::Value;

use super::redis_cluster::RedisCluster;
use super::redis_server::RedisServer;

pub const QUEUES: u32 = 6;
/// Generous bounds for what is polled (never how long anything must take).
pub const START_WITHIN: Duration = Duration::from_secs(60);
pub const SETTLE_WITHIN: Duration = Duration::from_secs(60);

pub use super::free_port;

/// Where the nodes keep queues, leases, membership and run logs: one
/// private Redis, or a private Redis Cluster.
pub trait Backing {
    /// Its URL (a seed, for a cluster).
    fn url(&self) -> String;
    /// `[adapters.redis]` settings besides the URL.
    fn redis_settings(&self) -> String {
        String::new()
    }
    /// `kill -9` of the Redis master that serves the most queues, waited
    /// for until its replica took over, then the killed server started
    /// again (it comes back as the new master's replica: until then, with
    /// `wait_replicas = 1`, that shard acknowledges no write); what was
    /// killed. One server has no replica to fail over to: nothing.
    fn fail_over_busiest(&mut self) -> Option<String> {
        None
    }
    /// How the nodes reach it.
    fn endpoint(&self) -> tailrace::redis_conn::RedisEndpoint;
}

impl Backing for RedisServer {
    fn url(&self) -> String {
        RedisServer::url(self)
    }

    fn endpoint(&self) -> tailrace::redis_conn::RedisEndpoint {
        tailrace::redis_conn::RedisEndpoint::from_url(&self.url(), "url")
    }
}

/// Each queue's fencing counter and checkpoint (as the nodes wrote them).
pub async fn queue_marks(backing: &impl Backing) -> Vec<(Option<u64>, Option<tailrace::SequenceToken>)> {
    let config = tailrace::redis_conn::reconnecting(Duration::from_secs(5));
    let conn = backing.endpoint().connect_any(config, Duration::from_secs(5)).await.unwrap();
    let mut marks = Vec::new();
    for queue in 0..QUEUES {
        let mut c = conn.clone();
        let fence: Option<u64> =
            redis::cmd("GET").arg(format!("tailrace:{{q{queue}}}:fence")).query_async(&mut c).await.unwrap();
        let checkpoint: Option<String> =
            redis::cmd("GET").arg(format!("tailrace:{{q{queue}}}:checkpoint")).query_async(&mut c).await.unwrap();
        marks.push((fence, checkpoint.map(|c| c.parse().unwrap())));
    }
    marks
}

/// A Redis Cluster, with every write confirmed by a replica so that a
/// master's failover loses nothing acknowledged.
impl Backing for RedisCluster {
    fn url(&self) -> String {
        self.seeds()[0].clone()
    }

    fn redis_settings(&self) -> String {
        "cluster = true\nwait_replicas = 1\n".into()
    }

    fn endpoint(&self) -> tailrace::redis_conn::RedisEndpoint {
        RedisCluster::endpoint(self)
    }

    fn fail_over_busiest(&mut self) -> Option<String> {
        let mut served: BTreeMap<u16, usize> = BTreeMap::new();
        for queue in 0..QUEUES {
            *served.entry(self.master_of(&format!("tailrace:{{q{queue}}}:stream"))).or_default() += 1;
        }
        let (&port, &queues) = served.iter().max_by_key(|(_, n)| **n)?;
        self.kill(port);
        self.restart(port);
        Some(format!("master {port} ({queues} of {QUEUES} queues)"))
    }
}

/// How a node listens for the others and proves it belongs.
pub struct Link {
    /// Its `cluster.listen` port.
    pub listen: u16,
    /// Its `cluster.advertise` (default: the listen address).
    pub advertise: Option<String>,
    /// Its cookie.
    pub cookie: &'static str,
}

impl Default for Link {
    fn default() -> Self {
        Self { listen: free_port(), advertise: None, cookie: COOKIE }
    }
}

/// The config of node `name` with its edge on `port`.
pub fn config(redis: &impl Backing, name: &str, port: u16) -> String {
    config_linked(redis, name, port, &Link::default())
}

/// The config of node `name` with its edge on `port`, linked as `link` says.
pub fn config_linked(redis: &impl Backing, name: &str, port: u16, link: &Link) -> String {
    let url = redis.url();
    let settings = redis.redis_settings();
    let cluster_port = link.listen;
    let advertise = link.advertise.as_ref().map(|a| format!("advertise = \"{a}\"\n")).unwrap_or_default();
    format!(
        r#"[node]
name = "{name}"
[queues]
adapter = "redis"
count = {QUEUES}
[adapters.redis]
url = "{url}"
{settings}[archive]
store = "redis"
redis_url = "{url}"
[lease]
ttl = "6s"
renew = "2s"
acquire = "1s"
[membership]
heartbeat = "500ms"
ttl = "2s"
[cluster]
listen = "127.0.0.1:{cluster_port}"
purge_after = "2s"
{advertise}[edge]
listen = "127.0.0.1:{port}"
"#
    )
}

/// Node `name`'s config on the defaults (leases, membership, purges, the
/// agents' backoffs: what a new user runs) but for where things listen and
/// the Redis at `redis` (a URL: a proxy's, say), plus `extra` sections.
pub fn config_on_defaults(redis: &str, name: &str, port: u16, extra: &str) -> String {
    config_on_defaults_linked(redis, name, port, &format!("listen = \"127.0.0.1:{}\"\n", free_port()), extra)
}

/// [`config_on_defaults`] with `cluster` as the body of its `[cluster]`
/// section (where it listens and what it advertises).
pub fn config_on_defaults_linked(redis: &str, name: &str, port: u16, cluster: &str, extra: &str) -> String {
    format!(
        r#"[node]
name = "{name}"
[queues]
adapter = "redis"
[adapters.redis]
url = "{redis}"
[archive]
store = "redis"
redis_url = "{redis}"
[cluster]
{cluster}[edge]
listen = "127.0.0.1:{port}"
{extra}"#
    )
}

/// `tailrace node` under `name` on [`config_on_defaults`], waited for until
/// it serves.
pub fn node_on_defaults(redis: &str, name: &str, extra: &str) -> Proc {
    let port = free_port();
    let mut node = Proc::spawn(name, port, &config_on_defaults(redis, name, port, extra), &["node"], &[]);
    node.wait_serving();
    node
}

/// `tailrace node` under `name` on [`config_on_defaults_linked`], waited for
/// until it serves.
pub fn node_on_defaults_linked(redis: &str, name: &str, cluster: &str, extra: &str) -> Proc {
    let port = free_port();
    let text = config_on_defaults_linked(redis, name, port, cluster, extra);
    let mut node = Proc::spawn(name, port, &text, &["node"], &[]);
    node.wait_serving();
    node
}

/// The cookie every node of these tests shares.
pub const COOKIE: &str = "a-test-cookie-of-at-least-32-characters";

/// One `tailrace` process and its log.
pub struct Proc {
    pub name: String,
    pub port: u16,
    child: Option<Child>,
    log: PathBuf,
    _dir: tempfile::TempDir,
}

impl Proc {
    /// Spawns `tailrace <args> --config <config>` (plus `extra`).
    pub fn spawn(name: &str, port: u16, text: &str, args: &[&str], extra: &[String]) -> Self {
        Self::spawn_with_cookie(name, port, text, args, extra, COOKIE)
    }

    /// As [`Proc::spawn`], with `cookie` in `TAILRACE_COOKIE`.
    pub fn spawn_with_cookie(name: &str, port: u16, text: &str, args: &[&str], extra: &[String], cookie: &str) -> Self {
        Self::spawn_with_env(name, port, text, args, extra, &[("TAILRACE_COOKIE", cookie)])
    }

    /// As [`Proc::spawn`], with `env` set (after `RUST_LOG=warn`, or what
    /// `TAILRACE_TEST_NODE_LOG` says, and the
    /// test cookie, which it may override).
    pub fn spawn_with_env(
        name: &str,
        port: u16,
        text: &str,
        args: &[&str],
        extra: &[String],
        env: &[(&str, &str)],
    ) -> Self {
        // TAILRACE_TEST_BIN runs the processes of a test from another
        // build (an older commit, a mutant): what the test checks then
        // says whether that build has the bug.
        let binary = super::tailrace_bin();
        Self::spawn_program(std::path::Path::new(&binary), name, port, text, args, extra, env)
    }

    /// `program <args> --config <config> <extra>` (an example built beside
    /// `tailrace`, say), with `env`.
    pub fn spawn_program(
        program: &std::path::Path,
        name: &str,
        port: u16,
        text: &str,
        args: &[&str],
        extra: &[String],
        env: &[(&str, &str)],
    ) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(format!("{name}.toml"));
        std::fs::write(&path, text).unwrap();
        let log = dir.path().join(format!("{name}.log"));
        let child = Command::new(program)
            .args(args)
            .arg("--config")
            .arg(&path)
            .args(extra)
            .env("RUST_LOG", std::env::var("TAILRACE_TEST_NODE_LOG").unwrap_or_else(|_| "warn".into()))
            .env("TAILRACE_COOKIE", COOKIE)
            .envs(env.iter().copied())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(std::fs::File::create(&log).unwrap()))
            .spawn()
            .unwrap();
        Self { name: name.into(), port, child: Some(child), log, _dir: dir }
    }

    /// `tailrace node` under `name`, waited for until it serves.
    pub fn node(redis: &impl Backing, name: &str) -> Self {
        Self::node_linked(redis, name, &Link::default())
    }

    /// `tailrace node` under `name` with `extra` sections appended to its
    /// config, waited for until it serves.
    pub fn node_with(redis: &impl Backing, name: &str, extra: &str) -> Self {
        let port = free_port();
        let mut node = Self::spawn(name, port, &format!("{}{extra}", config(redis, name, port)), &["node"], &[]);
        node.wait_serving();
        node
    }

    /// `tailrace node` under `name` linked as `link` says, waited for until
    /// it serves.
    pub fn node_linked(redis: &impl Backing, name: &str, link: &Link) -> Self {
        let mut node = Self::start_linked(redis, name, link);
        node.wait_serving();
        node
    }

    /// `tailrace node` under `name` linked as `link` says, not waited for.
    pub fn start_linked(redis: &impl Backing, name: &str, link: &Link) -> Self {
        let port = free_port();
        let text = config_linked(redis, name, port, link);
        Self::spawn_with_cookie(name, port, &text, &["node"], &[], link.cookie)
    }

    pub fn wait_serving(&mut self) {
        let stdout = self.child.as_mut().unwrap().stdout.take().unwrap();
        let started = super::life::serving_within(stdout, START_WITHIN);
        assert!(started, "{} did not serve within {START_WITHIN:?}:\n{}", self.name, self.log_text());
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Waits for the process to exit on its own; its status.
    pub fn wait_exit(&mut self) -> std::process::ExitStatus {
        let mut child = self.child.take().expect("running");
        let deadline = std::time::Instant::now() + SETTLE_WITHIN;
        loop {
            if let Some(status) = child.try_wait().unwrap() {
                return status;
            }
            if std::time::Instant::now() >= deadline {
                let _ = child.kill();
                panic!("{} did not exit within {SETTLE_WITHIN:?}:\n{}", self.name, self.log_text());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Sends `signal` (`TERM`, `KILL`).
    pub fn signal(&self, signal: &str) {
        let pid = self.child.as_ref().expect("running").id().to_string();
        assert!(Command::new("kill").args([&format!("-{signal}"), &pid]).status().unwrap().success());
    }

    /// Its process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// `http://127.0.0.1:<edge port><path>`.
    pub fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }

    /// Queue → holder (`None`: free), from this node's admin API; `None`
    /// if it does not answer.
    pub async fn queue_holders(&self) -> Option<BTreeMap<u64, Option<String>>> {
        let body = self.cluster().await?;
        let mut held = BTreeMap::new();
        for queue in body["queues"].as_array()? {
            held.insert(queue["queue"].as_u64()?, queue["holder"].as_str().map(str::to_string));
        }
        Some(held)
    }

    /// The sum of the samples of `metric` on this node's `/metrics` whose
    /// labels contain `label` (all if `None`); `None` if it does not answer,
    /// 0 if the metric is not there yet.
    pub async fn metric_sum(&self, metric: &str, label: Option<&str>) -> Option<f64> {
        let client = super::http().timeout(Duration::from_secs(5)).build().ok()?;
        let text = client.get(self.url("/metrics")).send().await.ok()?.text().await.ok()?;
        let sum = text
            .lines()
            .filter(|l| l.starts_with(metric) && l[metric.len()..].starts_with(['{', ' ']))
            .filter(|l| label.is_none_or(|label| l.contains(label)))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum();
        Some(sum)
    }

    /// SIGTERM and wait for the exit (SIGKILL after `within`); whether it
    /// exited successfully.
    pub fn stop(&mut self, within: Duration) -> bool {
        let Some(mut child) = self.child.take() else { return false };
        let _ = Command::new("kill").args(["-TERM", &child.id().to_string()]).status();
        let deadline = std::time::Instant::now() + within;
        loop {
            if let Ok(Some(status)) = child.try_wait() {
                return status.success();
            }
            if std::time::Instant::now() >= deadline {
                let _ = child.kill();
                let _ = child.wait();
                return false;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Waits until this node's store shows `run` of `fqn` (the archiver of
    /// the run's owner stored its first container): a stream of a pipeline
    /// nothing was stored for answers `404` at once on a node that did not
    /// accept the write itself.
    pub async fn wait_stored(&self, fqn: &str, run: &str) {
        let url = self.url(&format!("/api/v1/services/ingestionPipelines/logs/{fqn}/last?runId={run}"));
        let deadline = std::time::Instant::now() + SETTLE_WITHIN;
        let client = super::http_client();
        while !client.get(&url).send().await.is_ok_and(|r| r.status().is_success()) {
            assert!(std::time::Instant::now() < deadline, "{}'s store never showed {fqn}/{run}", self.name);
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    pub async fn cluster(&self) -> Option<Value> {
        let url = format!("http://127.0.0.1:{}/api/v1/admin/cluster", self.port);
        let response = super::http_client().get(url).send().await.ok()?;
        if !response.status().is_success() {
            return None;
        }
        response.json().await.ok()
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Queue → holder, from an admin answer; `None` if a queue has no holder.
pub fn holders(cluster: &Value) -> Option<BTreeMap<u64, (String, u64)>> {
    let queues = cluster["queues"].as_array()?;
    let mut held = BTreeMap::new();
    for queue in queues {
        let holder = queue["holder"].as_str()?.to_string();
        held.insert(queue["queue"].as_u64()?, (holder, queue["token"].as_u64()?));
    }
    // Every queue the node counts (`[queues] count`, whatever the test's).
    (held.len() as u64 == cluster["summary"]["queues"].as_u64()?).then_some(held)
}

pub fn counts(held: &BTreeMap<u64, (String, u64)>) -> BTreeMap<String, usize> {
    let mut counts = BTreeMap::new();
    for (holder, _) in held.values() {
        *counts.entry(holder.clone()).or_insert(0) += 1;
    }
    counts
}

/// Polls `node`'s admin API until every queue is held and the holders'
/// counts are `want`; the holders then.
pub async fn settle(node: &Proc, want: &[(&str, usize)]) -> BTreeMap<u64, (String, u64)> {
    let want: BTreeMap<String, usize> = want.iter().map(|(n, c)| (n.to_string(), *c)).collect();
    let deadline = tokio::time::Instant::now() + SETTLE_WITHIN;
    let mut last = None;
    loop {
        if let Some(held) = node.cluster().await.as_ref().and_then(holders) {
            if counts(&held) == want {
                return held;
            }
            last = Some(held);
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "queues never split as {want:?}; last seen {last:?}\n{}",
            node.log_text()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Polls `node`'s admin API until every queue is held, only by `among`,
/// with the holders' counts (largest first) `shape`; the holders then.
pub async fn settle_shape(node: &Proc, among: &[&str], shape: &[usize]) -> BTreeMap<u64, (String, u64)> {
    let deadline = tokio::time::Instant::now() + SETTLE_WITHIN;
    let mut last = None;
    loop {
        if let Some(held) = node.cluster().await.as_ref().and_then(holders) {
            let counts = counts(&held);
            let mut sizes: Vec<usize> = counts.values().copied().collect();
            sizes.sort_unstable_by(|a, b| b.cmp(a));
            if sizes == shape && counts.keys().all(|n| among.contains(&n.as_str())) {
                return held;
            }
            last = Some(held);
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "queues never split as {shape:?} among {among:?}; last seen {last:?}\n{}",
            node.log_text()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

pub async fn redis(server: &RedisServer) -> redis::aio::MultiplexedConnection {
    redis::Client::open(server.url()).unwrap().get_multiplexed_async_connection().await.unwrap()
}

/// Every lease key agrees with what the admin API reported.
pub async fn leases_in_redis_match(conn: &mut redis::aio::MultiplexedConnection, held: &BTreeMap<u64, (String, u64)>) {
    for (queue, (holder, token)) in held {
        let key = format!("tailrace:{{q{queue}}}:lease");
        let (h, t): (Option<String>, Option<u64>) =
            redis::cmd("HMGET").arg(&key).arg("holder").arg("token").query_async(conn).await.unwrap();
        assert_eq!((h.as_deref(), t), (Some(holder.as_str()), Some(*token)), "{key}");
    }
}

pub async fn fences(conn: &mut redis::aio::MultiplexedConnection) -> Vec<Option<u64>> {
    let mut fences = Vec::new();
    for queue in 0..QUEUES {
        let fence: Option<u64> =
            redis::cmd("GET").arg(format!("tailrace:{{q{queue}}}:fence")).query_async(conn).await.unwrap();
        fences.push(fence);
    }
    fences
}

pub async fn member_exists(conn: &mut redis::aio::MultiplexedConnection, name: &str) -> bool {
    redis::cmd("HEXISTS").arg("{tailrace:membership}:records").arg(name).query_async::<i64>(conn).await.unwrap() == 1
}

/// How many queues `node` holds in `held`.
pub fn held_by(held: &BTreeMap<u64, Option<String>>, node: &str) -> usize {
    held.values().filter(|h| h.as_deref() == Some(node)).count()
}

/// Samples every lease key every 20 ms while a test runs: a grant (a
/// token) must never be seen with two holders, and a queue's token never
/// goes back.
pub struct LeaseWatch {
    task: tokio::task::JoinHandle<Result<usize, String>>,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl LeaseWatch {
    pub fn start(server: &super::redis_server::RedisServer) -> Self {
        let url = server.url();
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = stop.clone();
        let task = tokio::spawn(async move {
            let mut conn = redis::Client::open(url).unwrap().get_multiplexed_async_connection().await.unwrap();
            let mut grants: BTreeMap<(u32, u64), String> = BTreeMap::new();
            let mut newest: BTreeMap<u32, u64> = BTreeMap::new();
            let mut samples = 0;
            while !flag.load(std::sync::atomic::Ordering::SeqCst) {
                for queue in 0..QUEUES {
                    let key = format!("tailrace:{{q{queue}}}:lease");
                    let (holder, token): (Option<String>, Option<u64>) =
                        redis::cmd("HMGET").arg(&key).arg("holder").arg("token").query_async(&mut conn).await.unwrap();
                    let (Some(holder), Some(token)) = (holder, token) else { continue };
                    samples += 1;
                    if let Some(other) = grants.insert((queue, token), holder.clone())
                        && other != holder
                    {
                        return Err(format!("queue {queue}: token {token} held by {other} and by {holder}"));
                    }
                    let last = newest.entry(queue).or_insert(token);
                    if token < *last {
                        return Err(format!("queue {queue}: token {token} after {last}"));
                    }
                    *last = token;
                }
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            }
            Ok(samples)
        });
        Self { task, stop }
    }

    /// Stops sampling; fails on what it saw.
    pub async fn check(self) {
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
        let samples = self.task.await.unwrap().unwrap_or_else(|error| panic!("{error}"));
        assert!(samples > 0, "the lease keys were sampled");
    }
}
