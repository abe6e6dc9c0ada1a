//! A private redis-server for a test: a free loopback port, its own
//! directory, append-only file with `fsync always` (a restart loses no
//! acknowledged write).
#![allow(dead_code)]

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub struct RedisServer {
    child: Option<Child>,
    pub port: u16,
    dir: tempfile::TempDir,
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

impl RedisServer {
    pub fn start() -> Self {
        let mut server = Self { child: None, port: free_port(), dir: tempfile::tempdir().unwrap() };
        server.spawn();
        server
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Sends `signal` (`STOP`, `CONT`) to the server: a stopped server
    /// holds every call until it continues.
    pub fn signal(&self, signal: &str) {
        let pid = self.child.as_ref().expect("running").id().to_string();
        assert!(Command::new("kill").args([&format!("-{signal}"), &pid]).status().unwrap().success());
    }

    pub fn dir(&self) -> PathBuf {
        self.dir.path().to_path_buf()
    }

    fn spawn(&mut self) {
        let child = Command::new("redis-server")
            .args(["--port", &self.port.to_string(), "--bind", "127.0.0.1", "--save", "", "--appendonly", "yes"])
            .args(["--appendfsync", "always", "--daemonize", "no", "--dir"])
            .arg(self.dir.path())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| {
                panic!("cannot start redis-server ({e}): install it (.ci/run does: apt-get install -y redis-server)")
            });
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            assert!(Instant::now() < deadline, "redis-server did not start on port {}", self.port);
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Stops the server (SIGKILL: the append-only file keeps every
    /// acknowledged write) and starts it again on the same port and data.
    pub fn restart(&mut self) {
        self.stop();
        self.spawn();
    }

    /// Stops the server, throws its data away and starts it again on the
    /// same port: a Redis restarted without persistence (or flushed).
    pub fn restart_empty(&mut self) {
        self.stop();
        self.wipe();
        self.spawn();
    }

    /// Kills the server, lets `damage` change its data directory, and
    /// starts it again on the same port.
    pub fn restart_with(&mut self, damage: impl FnOnce(&std::path::Path)) {
        self.stop();
        damage(self.dir.path());
        self.spawn();
    }

    /// The append-only file the server writes to now (Redis 7 keeps a base
    /// and increments in `appendonlydir/`).
    pub fn aof_tail(&self) -> PathBuf {
        let dir = self.dir.path().join("appendonlydir");
        let mut increments: Vec<(u64, PathBuf)> = std::fs::read_dir(&dir)
            .unwrap()
            .filter_map(|entry| {
                let path = entry.ok()?.path();
                let name = path.file_name()?.to_str()?.strip_suffix(".incr.aof")?.to_string();
                Some((name.rsplit('.').next()?.parse().ok()?, path))
            })
            .collect();
        increments.sort();
        increments.pop().map(|(_, path)| path).expect("redis-server 7 or newer writes an incremental append-only file")
    }

    /// A copy of the server's data as of now (every acknowledged write so
    /// far: the append-only file is synced before each reply).
    pub fn snapshot(&self) -> tempfile::TempDir {
        let copy = tempfile::tempdir().unwrap();
        copy_tree(self.dir.path(), copy.path());
        copy
    }

    /// Stops the server and starts it again on `snapshot`'s data: a Redis
    /// that lost its latest writes (`appendfsync everysec`, a lagging
    /// replica promoted).
    pub fn restart_from(&mut self, snapshot: &tempfile::TempDir) {
        self.stop();
        self.wipe();
        copy_tree(snapshot.path(), self.dir.path());
        self.spawn();
    }

    fn wipe(&self) {
        for entry in std::fs::read_dir(self.dir.path()).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                std::fs::remove_dir_all(&path).unwrap();
            } else {
                std::fs::remove_file(&path).unwrap();
            }
        }
    }

    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn copy_tree(from: &std::path::Path, to: &std::path::Path) {
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            std::fs::create_dir_all(&target).unwrap();
            copy_tree(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), &target).unwrap();
        }
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Redis adapter options for tests against `server`: short blocking reads,
/// no trimming timer.
pub fn adapter_options(server: &RedisServer) -> tailrace::adapters::redis::RedisOptions {
    tailrace::adapters::redis::RedisOptions {
        url: server.url(),
        block: Duration::from_millis(20),
        trim_every: Duration::ZERO,
        ..Default::default()
    }
}

/// A Redis adapter factory with 2 queues on `server`, as `consumer`.
pub async fn adapter_factory(
    server: &RedisServer,
    consumer: &str,
) -> std::sync::Arc<tailrace::adapters::redis::RedisAdapterFactory> {
    let options = adapter_options(server);
    std::sync::Arc::new(tailrace::adapters::redis::RedisAdapterFactory::connect(2, options, consumer).await.unwrap())
}
