//! A private `nats-server` with JetStream: a free loopback port and its own
//! store directory, stopped when dropped.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// How to get the server when it is missing.
pub const INSTALL_HINT: &str = "install it: `apt-get install nats-server` on Debian or Ubuntu, or see https://docs.nats.io/running-a-nats-service/introduction/installation";

/// A running `nats-server`.
pub struct NatsServer {
    child: Child,
    port: u16,
    _store: tempfile::TempDir,
}

/// Why the server could not be started.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// No `nats-server` on the PATH.
    #[error("nats-server was not found on the PATH ({0}); {INSTALL_HINT}")]
    Missing(std::io::Error),
    /// Anything else.
    #[error("starting nats-server: {0}")]
    Start(String),
}

/// Whether a `nats-server` binary can be run.
pub fn available() -> bool {
    Command::new("nats-server").arg("--version").stdout(Stdio::null()).stderr(Stdio::null()).status().is_ok()
}

impl NatsServer {
    /// Starts a server with JetStream on a free 127.0.0.1 port.
    pub fn start() -> Result<Self, ServerError> {
        let store = tempfile::tempdir().map_err(|e| ServerError::Start(format!("a store directory: {e}")))?;
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map_err(|e| ServerError::Start(format!("finding a free port: {e}")))?
            .port();
        let child = Command::new("nats-server")
            .args(["-a", "127.0.0.1", "-p", &port.to_string(), "-js", "-sd"])
            .arg(store.path())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| {
                if e.kind() == std::io::ErrorKind::NotFound {
                    ServerError::Missing(e)
                } else {
                    ServerError::Start(e.to_string())
                }
            })?;
        let mut server = Self { child, port, _store: store };
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            if let Ok(Some(status)) = server.child.try_wait() {
                return Err(ServerError::Start(format!("nats-server exited at start ({status})")));
            }
            if Instant::now() >= deadline {
                server.stop();
                return Err(ServerError::Start(format!("nats-server did not listen on port {port} within 10 s")));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(server)
    }

    /// The client URL.
    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    /// The store directory.
    #[allow(dead_code)]
    pub fn store(&self) -> PathBuf {
        self._store.path().to_path_buf()
    }

    fn stop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for NatsServer {
    fn drop(&mut self) {
        self.stop();
    }
}
