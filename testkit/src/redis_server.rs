//! A private redis-server for a test: a free loopback port, its own
//! directory, append-only file with `fsync always` (a restart loses no
//! acknowledged write). `start_secure` serves TLS only, with an ACL user
//! and the `default` user on but with no password to log in with (off,
//! Redis would drop transactions when it replays its append-only file);
//! `start_with` adds flags (later flags win).
#![allow(dead_code)]

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub struct RedisServer {
    child: Option<Child>,
    pub port: u16,
    dir: tempfile::TempDir,
    /// Flags after the defaults.
    args: Vec<String>,
    secure: Option<Secure>,
}

/// The ACL user the secure server has (the default user is on, locked: no password logs in as it).
pub const USER: &str = "tailrace";
/// Its password.
pub const PASSWORD: &str = "redis-acl-password-for-tests";

/// TLS material of a secure server: the authority `ca` signed `redis`
/// (the server, for 127.0.0.1) and `client`; `other` is an authority
/// that signed nothing of the server's.
pub struct Secure {
    pub certs: tempfile::TempDir,
}

impl Secure {
    pub fn file(&self, name: &str) -> PathBuf {
        self.certs.path().join(name)
    }
}

use super::free_port;

impl RedisServer {
    pub fn start() -> Self {
        Self::start_with(&[])
    }

    /// With `args` after the default flags (e.g. `--appendonly no`).
    pub fn start_with(args: &[&str]) -> Self {
        let args = args.iter().map(|a| a.to_string()).collect();
        let mut server = Self { child: None, port: free_port(), dir: tempfile::tempdir().unwrap(), args, secure: None };
        server.spawn();
        server
    }

    /// TLS only (`--port 0`), clients' certificates `auth_clients` (`no`,
    /// `optional`, `yes`), the ACL user [`USER`] with [`PASSWORD`] and the
    /// `default` user on, all commands, and no password to log in with.
    pub fn start_secure(auth_clients: &str) -> Self {
        Self::start_secure_with(auth_clients, &["on", "resetpass", "~*", "&*", "+@all"])
    }

    /// As [`RedisServer::start_secure`], with the `default` user's ACL
    /// rules `default_user` (e.g. `["off"]`).
    pub fn start_secure_with(auth_clients: &str, default_user: &[&str]) -> Self {
        let certs = tempfile::tempdir().unwrap();
        super::certs::authority(certs.path(), "ca", &["redis", "client"]);
        super::certs::authority(certs.path(), "other", &[]);
        let secure = Secure { certs };
        let mut args: Vec<String> = vec!["--port".into(), "0".into(), "--tls-port".into(), free_port().to_string()];
        for (flag, file) in
            [("--tls-cert-file", "redis.pem"), ("--tls-key-file", "redis.key"), ("--tls-ca-cert-file", "ca.pem")]
        {
            args.extend([flag.to_string(), secure.file(file).display().to_string()]);
        }
        args.extend(["--tls-auth-clients", auth_clients, "--user", "default"].map(String::from));
        args.extend(default_user.iter().map(|rule| rule.to_string()));
        args.extend(["--user", USER, "on"].map(String::from));
        args.extend([format!(">{PASSWORD}"), "~*".into(), "&*".into(), "+@all".into()]);
        let port = args[3].parse().unwrap();
        let mut server = Self { child: None, port, dir: tempfile::tempdir().unwrap(), args, secure: Some(secure) };
        server.spawn();
        server
    }

    /// `redis://127.0.0.1:P`, or `rediss://127.0.0.1:P` for a secure
    /// server (no credentials: they are the tests' to give).
    pub fn url(&self) -> String {
        let scheme = if self.secure.is_some() { "rediss" } else { "redis" };
        format!("{scheme}://127.0.0.1:{}", self.port)
    }

    /// The secure server's TLS files.
    pub fn secure(&self) -> &Secure {
        self.secure.as_ref().expect("started with start_secure")
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
            .args(&self.args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| {
                panic!("cannot start redis-server ({e}): install it (.ci/run does: apt-get install -y redis-server)")
            });
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(10);
        // Until our own server answers: one that exits (its port taken)
        // must not leave the test talking to whoever holds the port.
        loop {
            let exited = self.child.as_mut().and_then(|child| child.try_wait().ok().flatten());
            assert!(exited.is_none(), "redis-server exited ({exited:?}) on port {}: is the port taken?", self.port);
            if let Ok(stream) = std::net::TcpStream::connect(("127.0.0.1", self.port))
                && !still_loading(stream)
            {
                break;
            }
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
        crate::copy_tree(self.dir.path(), copy.path());
        copy
    }

    /// Stops the server and starts it again on `snapshot`'s data: a Redis
    /// that lost its latest writes (`appendfsync everysec`, a lagging
    /// replica promoted).
    pub fn restart_from(&mut self, snapshot: &tempfile::TempDir) {
        self.stop();
        self.wipe();
        crate::copy_tree(snapshot.path(), self.dir.path());
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

/// Whether the server on `stream` answers a plain `PING` with `LOADING`
/// (it restarted and is still reading its data). A TLS port or one that
/// asks for a password answers otherwise: ready as far as this can tell.
fn still_loading(mut stream: std::net::TcpStream) -> bool {
    use std::io::{Read, Write};
    let _ = stream.set_read_timeout(Some(Duration::from_millis(500)));
    if stream.write_all(b"PING\r\n").is_err() {
        return false;
    }
    let mut reply = [0u8; 16];
    let read = stream.read(&mut reply).unwrap_or(0);
    reply[..read].starts_with(b"-LOADING")
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Redis adapter options for tests against `server`: no trimming timer.
pub fn adapter_options(server: &RedisServer) -> tailrace::adapters::redis::RedisOptions {
    tailrace::adapters::redis::RedisOptions { url: server.url(), trim_every: Duration::ZERO, ..Default::default() }
}

/// Redis adapter options for a secure server: its user and password, and
/// its authority.
pub fn secure_adapter_options(server: &RedisServer) -> tailrace::adapters::redis::RedisOptions {
    tailrace::adapters::redis::RedisOptions {
        username: Some(USER.into()),
        password: Some(PASSWORD.into()),
        tls_ca_file: Some(server.secure().file("ca.pem")),
        ..adapter_options(server)
    }
}

/// A Redis adapter factory with 2 queues on `server` (each call one of
/// its own, as a node has).
pub async fn adapter_factory(server: &RedisServer) -> std::sync::Arc<tailrace::adapters::redis::RedisAdapterFactory> {
    let options = adapter_options(server);
    std::sync::Arc::new(tailrace::adapters::redis::RedisAdapterFactory::connect(2, options).await.unwrap())
}

/// Calls per command Redis has served so far (`INFO commandstats`; the
/// commands a script runs count too).
pub async fn command_calls(conn: &mut redis::aio::ConnectionManager) -> std::collections::BTreeMap<String, u64> {
    let info: String = redis::cmd("INFO").arg("commandstats").query_async(conn).await.unwrap();
    info.lines()
        .filter_map(|line| {
            let (name, rest) = line.strip_prefix("cmdstat_")?.split_once(':')?;
            let calls = rest.strip_prefix("calls=")?.split(',').next()?.parse().ok()?;
            Some((name.to_string(), calls))
        })
        .collect()
}

/// The conformance kit's report on the Redis adapter with `options` (two
/// queues), with everything it claims: durable, rewindable with trimming
/// to the checkpoint, not bounded, receivers of one queue each read it all.
/// Panics with the failures.
pub async fn redis_kit(options: tailrace::adapters::redis::RedisOptions) -> tailrace::conformance::Report {
    use std::sync::Arc;
    use tailrace::adapters::redis::RedisAdapterFactory;
    use tailrace::queue::QueueAdapterFactory;
    let claims = tailrace::conformance::Claims {
        durable: true,
        rewindable: true,
        exclusive_receivers: false,
        bounded: None,
        trims: true,
    };
    tailrace::conformance::run(claims, move || {
        let options = options.clone();
        async move { Ok(Arc::new(RedisAdapterFactory::connect(2, options).await?) as Arc<dyn QueueAdapterFactory>) }
    })
    .await
    .unwrap_or_else(|failures| panic!("{failures}"))
}
