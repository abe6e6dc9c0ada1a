//! A private Redis Cluster for a test: three masters and three replicas
//! (`redis-server --cluster-enabled yes`, joined with `redis-cli --cluster
//! create … --cluster-replicas 1`) on free 127.0.0.1 ports, each with its
//! own directory and an append-only file synced on every write. The nodes
//! time each other out after `NODE_TIMEOUT`, so a killed master's replica
//! takes over within a few seconds. Dropping it kills every node.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// How long a silent node counts as alive (`cluster-node-timeout`).
pub const NODE_TIMEOUT: Duration = Duration::from_millis(1_000);
/// How long forming the cluster, or a failover, may take.
const FORM_WAIT: Duration = Duration::from_secs(60);

pub struct RedisCluster {
    nodes: Vec<Node>,
    /// `requirepass` of every node (and `masterauth`), if any.
    password: Option<String>,
    /// Its nodes persist every write.
    durable: bool,
    _dir: tempfile::TempDir,
}

struct Node {
    port: u16,
    child: Option<Child>,
}

/// A free port whose cluster bus port (+10 000) is free too.
fn cluster_port() -> u16 {
    loop {
        let port = super::free_port();
        if port < 55_000 && std::net::TcpListener::bind(("127.0.0.1", port + 10_000)).is_ok() {
            return port;
        }
    }
}

/// A cluster node on `port`, its data in `dir/port` (its `nodes.conf`
/// keeps its identity across a restart).
/// What a cluster is made of.
#[derive(Clone, Copy)]
struct Shape {
    masters: usize,
    /// Replicas of each master.
    replicas: usize,
    /// Every write to the append-only file, fsynced (else no persistence).
    durable: bool,
}

/// Three masters, each with a replica, every write fsynced: what the tests
/// fail over and restart.
const TESTS: Shape = Shape { masters: 3, replicas: 1, durable: true };

fn spawn(dir: &std::path::Path, port: u16, password: Option<&str>, durable: bool) -> Child {
    let data = dir.join(port.to_string());
    std::fs::create_dir_all(&data).unwrap();
    let auth: Vec<&str> = password.map(|p| vec!["--requirepass", p, "--masterauth", p]).unwrap_or_default();
    Command::new("redis-server")
        .args(&auth)
        .args(["--bind", "127.0.0.1", "--port", &port.to_string(), "--cluster-enabled", "yes"])
        .args(["--cluster-config-file", "nodes.conf", "--cluster-node-timeout"])
        .arg(NODE_TIMEOUT.as_millis().to_string())
        .args(["--appendonly", if durable { "yes" } else { "no" }, "--appendfsync", "always", "--save", ""])
        .arg("--dir")
        .arg(&data)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("redis-server (apt-get install redis-server)")
}

/// A node answering on a port of its own. A free port can be taken by
/// another test's server before this one binds it: a server that exits
/// instead of answering is started again on another port.
fn start_node(dir: &std::path::Path, password: Option<&str>, durable: bool) -> Node {
    let deadline = Instant::now() + FORM_WAIT;
    loop {
        let port = cluster_port();
        let mut child = spawn(dir, port, password, durable);
        loop {
            if cli_as(password, port, &["PING"]).is_ok_and(|r| r.trim() == "PONG") {
                return Node { port, child: Some(child) };
            }
            if child.try_wait().is_ok_and(|exited| exited.is_some()) {
                break;
            }
            assert!(Instant::now() < deadline, "the Redis Cluster: node {port} answering not within {FORM_WAIT:?}");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// `redis-cli` against `port`, with the cluster's password if it has one.
fn cli_as(password: Option<&str>, port: u16, args: &[&str]) -> std::io::Result<String> {
    let mut command = Command::new("redis-cli");
    if let Some(password) = password {
        command.env("REDISCLI_AUTH", password);
    }
    let out = command.arg("-p").arg(port.to_string()).args(args).stderr(Stdio::null()).output()?;
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

impl RedisCluster {
    fn cli(&self, port: u16, args: &[&str]) -> std::io::Result<String> {
        cli_as(self.password.as_deref(), port, args)
    }

    /// Three masters, each with one replica, every slot served.
    pub fn start() -> Self {
        Self::start_as(None, TESTS)
    }

    /// As [`RedisCluster::start`], every node asking for `password`.
    pub fn start_with_password(password: &str) -> Self {
        Self::start_as(Some(password.to_string()), TESTS)
    }

    /// `masters` masters and no replicas, nothing persisted: the shape a
    /// benchmark measures sharding with.
    pub fn start_masters(masters: usize) -> Self {
        Self::start_as(None, Shape { masters, replicas: 0, durable: false })
    }

    fn start_as(password: Option<String>, shape: Shape) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let nodes = (0..shape.masters * (1 + shape.replicas))
            .map(|_| start_node(dir.path(), password.as_deref(), shape.durable))
            .collect();
        let cluster = Self { nodes, password, durable: shape.durable, _dir: dir };
        let addresses: Vec<String> = cluster.nodes.iter().map(|n| format!("127.0.0.1:{}", n.port)).collect();
        let mut create = Command::new("redis-cli");
        if let Some(password) = &cluster.password {
            create.env("REDISCLI_AUTH", password);
        }
        let created = create
            .args(["--cluster", "create"])
            .args(&addresses)
            .args(["--cluster-replicas", &shape.replicas.to_string(), "--cluster-yes"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .expect("redis-cli (apt-get install redis-tools)");
        assert!(created.success(), "redis-cli --cluster create failed");
        cluster.wait_healthy();
        if shape.replicas == 0 {
            return cluster;
        }
        // Every replica has its master's data and follows it.
        cluster.wait("every replica in sync", || {
            cluster.nodes.iter().all(|n| {
                cluster.cli(n.port, &["INFO", "replication"]).is_ok_and(|info| {
                    info.contains("role:master")
                        && info.contains("connected_slaves:1")
                        && info.contains(",state=online,")
                        || info.contains("role:slave") && info.contains("master_link_status:up")
                })
            })
        });
        cluster
    }

    fn wait(&self, what: &str, ready: impl Fn() -> bool) {
        let deadline = Instant::now() + FORM_WAIT;
        while !ready() {
            assert!(Instant::now() < deadline, "the Redis Cluster: {what} not within {FORM_WAIT:?}");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Waits until every live node says the cluster is `ok` (every slot
    /// served by a reachable master).
    pub fn wait_healthy(&self) {
        self.wait("cluster_state:ok on every live node", || {
            self.nodes
                .iter()
                .filter(|n| n.child.is_some())
                .all(|n| self.cli(n.port, &["CLUSTER", "INFO"]).is_ok_and(|info| info.contains("cluster_state:ok")))
        });
    }

    /// `redis://` URLs of every node, for a client's seed list.
    pub fn seeds(&self) -> Vec<String> {
        self.nodes.iter().filter(|n| n.child.is_some()).map(|n| format!("redis://127.0.0.1:{}", n.port)).collect()
    }

    /// Moves `key`'s slot (and every key in it) to the master on `to`, as
    /// a reshard does: `IMPORTING`/`MIGRATING`, `MIGRATE` in small
    /// batches (clients meanwhile get `ASK` or `TRYAGAIN`), then the slot's
    /// new owner is told to every master.
    pub fn move_slot_of(&self, key: &str, to: u16) {
        let from = self.master_of(key);
        assert_ne!(from, to, "the slot is on {to} already");
        let slot = self.cli(from, &["CLUSTER", "KEYSLOT", key]).unwrap().trim().to_string();
        let id = |port: u16| self.cli(port, &["CLUSTER", "MYID"]).unwrap().trim().to_string();
        let (from_id, to_id) = (id(from), id(to));
        self.cli(to, &["CLUSTER", "SETSLOT", &slot, "IMPORTING", &from_id]).unwrap();
        self.cli(from, &["CLUSTER", "SETSLOT", &slot, "MIGRATING", &to_id]).unwrap();
        loop {
            let keys = self.cli(from, &["CLUSTER", "GETKEYSINSLOT", &slot, "2"]).unwrap();
            let keys: Vec<&str> = keys.lines().map(str::trim).filter(|k| !k.is_empty()).collect();
            if keys.is_empty() {
                break;
            }
            let port = to.to_string();
            let mut args = vec!["MIGRATE", "127.0.0.1", port.as_str(), "", "0", "5000"];
            if let Some(password) = &self.password {
                args.extend(["AUTH", password.as_str()]);
            }
            args.push("KEYS");
            args.extend(keys);
            let answer = self.cli(from, &args).unwrap();
            assert!(answer.contains("OK") || answer.contains("NOKEY"), "MIGRATE answered {answer}");
            std::thread::sleep(Duration::from_millis(50));
        }
        for master in self.masters() {
            let port: u16 = master.rsplit(':').next().unwrap().parse().unwrap();
            self.cli(port, &["CLUSTER", "SETSLOT", &slot, "NODE", &to_id]).unwrap();
        }
        self.wait(&format!("slot {slot} served by {to}"), || self.master_of(key) == to);
    }

    /// `[adapters.redis]` for this cluster, as `adapter_options` gives for
    /// one server (trims at once): its first live seed, `cluster = true`.
    pub fn adapter_options(&self) -> tailrace::adapters::redis::RedisOptions {
        tailrace::adapters::redis::RedisOptions {
            url: self.seeds()[0].clone(),
            cluster: true,
            trim_every: Duration::ZERO,
            ..Default::default()
        }
    }

    /// The cluster as a store, the leases or membership reach it: its
    /// first live seed, with `cluster` access.
    pub fn endpoint(&self) -> tailrace::redis_conn::RedisEndpoint {
        tailrace::redis_conn::RedisEndpoint {
            url: self.seeds()[0].clone(),
            url_setting: "url".into(),
            access: tailrace::redis_conn::RedisAccess { cluster: true, ..Default::default() },
        }
    }

    /// `redis://` URLs of the masters now.
    pub fn masters(&self) -> Vec<String> {
        let live = self.nodes.iter().find(|n| n.child.is_some()).expect("a live node").port;
        let table = self.cli(live, &["CLUSTER", "NODES"]).unwrap();
        table
            .lines()
            .filter_map(|line| {
                let fields: Vec<&str> = line.split_whitespace().collect();
                let master = fields.get(2).is_some_and(|f| f.contains("master") && !f.contains("fail"));
                let address = fields.get(1)?.split('@').next()?;
                master.then(|| format!("redis://{address}"))
            })
            .collect()
    }

    /// The port of the master serving `key`'s slot now.
    pub fn master_of(&self, key: &str) -> u16 {
        let live = self.nodes.iter().find(|n| n.child.is_some()).expect("a live node").port;
        let slot: u16 = self.cli(live, &["CLUSTER", "KEYSLOT", key]).unwrap().trim().parse().unwrap();
        // `id addr flags master ping pong epoch state slots...`
        let table = self.cli(live, &["CLUSTER", "NODES"]).unwrap();
        for line in table.lines() {
            let fields: Vec<&str> = line.split_whitespace().collect();
            if fields.len() < 9 || !fields[2].contains("master") || fields[2].contains("fail") {
                continue;
            }
            let port: u16 = fields[1].split(['@', ':']).nth(1).and_then(|p| p.parse().ok()).unwrap_or(0);
            for range in &fields[8..] {
                let (a, b) = range.split_once('-').unwrap_or((range, range));
                if let (Ok(a), Ok(b)) = (a.parse::<u16>(), b.parse::<u16>())
                    && (a..=b).contains(&slot)
                {
                    return port;
                }
            }
        }
        panic!("no master serves slot {slot}:\n{table}");
    }

    /// `kill -9` of the node on `port`; its replica (if it was a master)
    /// takes over after [`NODE_TIMEOUT`] and the cluster is `ok` again.
    pub fn kill(&mut self, port: u16) {
        let node = self.nodes.iter_mut().find(|n| n.port == port).expect("a node of this cluster");
        if let Some(mut child) = node.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        let live = self.nodes.iter().find(|n| n.child.is_some()).expect("a live node").port;
        let needle = format!("127.0.0.1:{port}@");
        self.wait(&format!("node {port} marked failed"), || {
            self.cli(live, &["CLUSTER", "NODES"]).is_ok_and(|table| {
                table.lines().any(|l| l.contains(&needle) && l.contains("fail") && !l.contains("fail?"))
            })
        });
        self.wait_healthy();
    }
}

impl RedisCluster {
    /// Starts the node on `port` again (killed before): it rejoins as a
    /// replica of the master that took its slots, and is waited for until
    /// that master counts it as an online replica.
    pub fn restart(&mut self, port: u16) {
        let dir = self._dir.path().to_path_buf();
        let node = self.nodes.iter_mut().find(|n| n.port == port).expect("a node of this cluster");
        assert!(node.child.is_none(), "node {port} is running");
        node.child = Some(spawn(&dir, port, self.password.as_deref(), self.durable));
        self.wait(&format!("node {port} back as an online replica"), || {
            self.cli(port, &["INFO", "replication"])
                .is_ok_and(|info| info.contains("role:slave") && info.contains("master_link_status:up"))
        });
        self.wait_healthy();
    }
}

impl Drop for RedisCluster {
    fn drop(&mut self) {
        for node in &mut self.nodes {
            if let Some(mut child) = node.child.take() {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
    }
}
