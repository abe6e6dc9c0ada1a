//! A cluster of real `tailrace node` processes on one private Redis, with
//! short leases and six queues, seen from outside: through each node's
//! `GET /api/v1/admin/cluster` and the Redis lease, fence and member keys.
//! Three nodes split the queues; one leaves with SIGTERM and the others
//! take its queues; another is killed with SIGKILL and the last takes
//! everything once its leases lapse; a second process under a live node's
//! name, and a `serve` next to the cluster, are refused and take nothing.

mod common;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::redis_server::RedisServer;
use serde_json::Value;

const QUEUES: u32 = 6;
/// Generous bounds for what is polled (never how long anything must take).
const START_WITHIN: Duration = Duration::from_secs(60);
const SETTLE_WITHIN: Duration = Duration::from_secs(60);

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

fn config(redis: &RedisServer, name: &str, port: u16) -> String {
    let url = redis.url();
    let cluster_port = free_port();
    format!(
        r#"[node]
name = "{name}"
[queues]
adapter = "redis"
count = {QUEUES}
[adapters.redis]
url = "{url}"
[archive]
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
[edge]
listen = "127.0.0.1:{port}"
"#
    )
}

/// The cookie every node of these tests shares.
const COOKIE: &str = "a-test-cookie-of-at-least-32-characters";

/// One `tailrace` process and its log.
struct Proc {
    name: String,
    port: u16,
    child: Option<Child>,
    log: PathBuf,
    _dir: tempfile::TempDir,
}

impl Proc {
    /// Spawns `tailrace <args> --config <config>` (plus `extra`).
    fn spawn(name: &str, port: u16, text: &str, args: &[&str], extra: &[String]) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(format!("{name}.toml"));
        std::fs::write(&path, text).unwrap();
        let log = dir.path().join(format!("{name}.log"));
        let child = Command::new(env!("CARGO_BIN_EXE_tailrace"))
            .args(args)
            .arg("--config")
            .arg(&path)
            .args(extra)
            .env("RUST_LOG", "warn")
            .env("TAILRACE_COOKIE", COOKIE)
            .stdout(Stdio::piped())
            .stderr(Stdio::from(std::fs::File::create(&log).unwrap()))
            .spawn()
            .unwrap();
        Self { name: name.into(), port, child: Some(child), log, _dir: dir }
    }

    /// `tailrace node` under `name`, waited for until it serves.
    fn node(redis: &RedisServer, name: &str) -> Self {
        let port = free_port();
        let mut node = Self::spawn(name, port, &config(redis, name, port), &["node"], &[]);
        node.wait_serving();
        node
    }

    fn wait_serving(&mut self) {
        let stdout = self.child.as_mut().unwrap().stdout.take().unwrap();
        let started = common::life::serving_within(stdout, START_WITHIN);
        assert!(started, "{} did not serve within {START_WITHIN:?}:\n{}", self.name, self.log_text());
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Waits for the process to exit on its own; its status.
    fn wait_exit(&mut self) -> std::process::ExitStatus {
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
    fn signal(&self, signal: &str) {
        let pid = self.child.as_ref().expect("running").id().to_string();
        assert!(Command::new("kill").args([&format!("-{signal}"), &pid]).status().unwrap().success());
    }

    async fn cluster(&self) -> Option<Value> {
        let url = format!("http://127.0.0.1:{}/api/v1/admin/cluster", self.port);
        let response = reqwest::get(url).await.ok()?;
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
fn holders(cluster: &Value) -> Option<BTreeMap<u64, (String, u64)>> {
    let queues = cluster["queues"].as_array()?;
    let mut held = BTreeMap::new();
    for queue in queues {
        let holder = queue["holder"].as_str()?.to_string();
        held.insert(queue["queue"].as_u64()?, (holder, queue["token"].as_u64()?));
    }
    (held.len() == QUEUES as usize).then_some(held)
}

fn counts(held: &BTreeMap<u64, (String, u64)>) -> BTreeMap<String, usize> {
    let mut counts = BTreeMap::new();
    for (holder, _) in held.values() {
        *counts.entry(holder.clone()).or_insert(0) += 1;
    }
    counts
}

/// Polls `node`'s admin API until every queue is held and the holders'
/// counts are `want`; the holders then.
async fn settle(node: &Proc, want: &[(&str, usize)]) -> BTreeMap<u64, (String, u64)> {
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

async fn redis(server: &RedisServer) -> redis::aio::MultiplexedConnection {
    redis::Client::open(server.url()).unwrap().get_multiplexed_async_connection().await.unwrap()
}

/// Every lease key agrees with what the admin API reported.
async fn leases_in_redis_match(conn: &mut redis::aio::MultiplexedConnection, held: &BTreeMap<u64, (String, u64)>) {
    for (queue, (holder, token)) in held {
        let key = format!("tailrace:{{q{queue}}}:lease");
        let (h, t): (Option<String>, Option<u64>) =
            redis::cmd("HMGET").arg(&key).arg("holder").arg("token").query_async(conn).await.unwrap();
        assert_eq!((h.as_deref(), t), (Some(holder.as_str()), Some(*token)), "{key}");
    }
}

async fn fences(conn: &mut redis::aio::MultiplexedConnection) -> Vec<Option<u64>> {
    let mut fences = Vec::new();
    for queue in 0..QUEUES {
        let fence: Option<u64> =
            redis::cmd("GET").arg(format!("tailrace:{{q{queue}}}:fence")).query_async(conn).await.unwrap();
        fences.push(fence);
    }
    fences
}

async fn member_exists(conn: &mut redis::aio::MultiplexedConnection, name: &str) -> bool {
    redis::cmd("EXISTS").arg(format!("tailrace:member:{name}")).query_async::<i64>(conn).await.unwrap() == 1
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_node_processes_split_hand_over_and_survive_a_kill() {
    let server = RedisServer::start();
    let mut conn = redis(&server).await;
    let n1 = Proc::node(&server, "n1");
    let mut n2 = Proc::node(&server, "n2");
    let mut n3 = Proc::node(&server, "n3");

    // (a) Three nodes: two queues each, one holder per queue, as in Redis.
    let held = settle(&n1, &[("n1", 2), ("n2", 2), ("n3", 2)]).await;
    leases_in_redis_match(&mut conn, &held).await;
    let members = n2.cluster().await.unwrap()["members"].as_array().unwrap().len();
    assert_eq!(members, 3);

    // (b) SIGTERM: a clean exit, its queues handed to the two others, its
    // member key gone.
    n3.signal("TERM");
    let status = n3.wait_exit();
    assert!(status.success(), "n3 exited with {status}:\n{}", n3.log_text());
    assert!(!member_exists(&mut conn, "n3").await, "a graceful leave deletes the member key");
    let held = settle(&n1, &[("n1", 3), ("n2", 3)]).await;
    leases_in_redis_match(&mut conn, &held).await;

    // (c) kill -9: the last node owns everything once the leases lapse.
    n2.signal("KILL");
    n2.wait_exit();
    let held = settle(&n1, &[("n1", 6)]).await;
    leases_in_redis_match(&mut conn, &held).await;

    // (d) A second process under a live node's name is refused and takes
    // no lease: no grant happened (a grant raises its queue's fence).
    let before = fences(&mut conn).await;
    let port = free_port();
    let mut twin = Proc::spawn("n1-twin", port, &config(&server, "n1", port), &["node"], &[]);
    let status = twin.wait_exit();
    let log = twin.log_text();
    assert!(!status.success(), "a second n1 must be refused:\n{log}");
    assert!(log.contains("`n1` is held by a live process"), "{log}");
    assert_eq!(fences(&mut conn).await, before, "the refused process took a lease");
    assert!(member_exists(&mut conn, "n1").await, "the refusal must not touch the live node's key");

    // A `serve` on the same Redis is refused too, naming the live node.
    let port = free_port();
    let data = tempfile::tempdir().unwrap();
    let extra = ["--data-dir".to_string(), data.path().display().to_string()];
    let mut serve = Proc::spawn("lone", port, &config(&server, "lone", port), &["serve"], &extra);
    let status = serve.wait_exit();
    let log = serve.log_text();
    assert!(!status.success(), "serve next to a live node must be refused:\n{log}");
    assert!(log.contains("`n1`") && log.contains("tailrace node"), "{log}");
    assert_eq!(fences(&mut conn).await, before, "the refused serve took a lease");
    assert!(!member_exists(&mut conn, "lone").await, "the refused serve left its member key behind");
    let held = settle(&n1, &[("n1", 6)]).await;
    leases_in_redis_match(&mut conn, &held).await;
}

#[test]
fn node_refuses_queues_or_an_archive_that_are_not_in_redis() {
    for (text, needs) in [
        ("[queues]\nadapter = \"file\"\n", "adapter = \"redis\""),
        ("[queues]\nadapter = \"redis\"\n[archive]\nstore = \"file\"\n", "store = \"redis\""),
    ] {
        let mut node = Proc::spawn("misfit", free_port(), text, &["node"], &[]);
        let status = node.wait_exit();
        let log = node.log_text();
        assert!(!status.success(), "{log}");
        assert!(log.contains(needs), "{log}");
    }
}

/// `tailrace agents …` against a node's edge; its exit status and output.
fn agents(node: &Proc, args: &[&str]) -> (bool, String) {
    let url = format!("http://127.0.0.1:{}", node.port);
    let out =
        Command::new(env!("CARGO_BIN_EXE_tailrace")).arg("agents").args(args).args(["--url", &url]).output().unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    (out.status.success(), text)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stopping_a_nodes_agents_hands_its_queues_to_the_others_until_they_start_again() {
    let server = RedisServer::start();
    let mut conn = redis(&server).await;
    let n1 = Proc::node(&server, "n1");
    let n2 = Proc::node(&server, "n2");
    settle(&n1, &[("n1", 3), ("n2", 3)]).await;

    let (ok, out) = agents(&n2, &["stop"]);
    assert!(ok && out.contains("agents_stopped"), "{out}");
    let held = settle(&n1, &[("n1", 6)]).await;
    leases_in_redis_match(&mut conn, &held).await;
    let cluster = n1.cluster().await.unwrap();
    let n2_member = cluster["members"].as_array().unwrap().iter().find(|m| m["name"] == "n2").cloned();
    assert_eq!(n2_member.map(|m| m["agents"].clone()), Some(Value::from("stopped")), "{cluster}");
    let (ok, out) = agents(&n2, &["state"]);
    assert!(ok && out.contains("agents_stopped") && out.contains("0 agent"), "{out}");

    // Another node's agents, through this node's edge and the transport.
    let (ok, out) = agents(&n2, &["state", "--node", "n1"]);
    assert!(ok && out.contains("node n1") && out.contains("6 agent"), "n1 answers through n2: {out}");
    let (ok, out) = agents(&n2, &["state", "--node", "n9"]);
    assert!(!ok && out.contains("n9") && out.contains("not a live member"), "{out}");
    let (ok, out) = agents(&n2, &["start"]);
    assert!(ok && out.contains("agents_started"), "{out}");
    let held = settle(&n2, &[("n1", 3), ("n2", 3)]).await;
    leases_in_redis_match(&mut conn, &held).await;
}
