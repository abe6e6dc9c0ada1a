//! Shared by the crash tests: child processes, the audit consumer whose
//! log survives a SIGKILL, and reading that log back.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tailrace::pubsub::{ConsumerError, Delivery, DeliveryOutcome, ImplicitSubscriptions, StreamConsumer};
use tailrace::queue::QueueMapper;
use tailrace::stream::{SequenceToken, StreamId};

/// Runs this test binary again on the ignored entry `entry`.
pub fn child(entry: &str, env: &[(&str, String)]) -> Child {
    let mut command = Command::new(std::env::current_exe().unwrap());
    command.args(["--ignored", "--exact", entry, "--nocapture", "--test-threads", "1"]);
    for (key, value) in env {
        command.env(key, value);
    }
    command.stdout(Stdio::piped()).stderr(Stdio::null()).spawn().unwrap()
}

/// The directory a crash test hands its child.
pub fn crash_dir() -> PathBuf {
    PathBuf::from(std::env::var("TAILRACE_CRASH_DIR").expect("run by the crash tests"))
}

/// Records each delivery as `queue token id` lines in an append-only log,
/// slowly, so that the node is killed with deliveries in flight.
pub struct Audit {
    log: std::sync::Mutex<std::fs::File>,
    mapper: QueueMapper,
}

#[async_trait]
impl StreamConsumer for Audit {
    async fn deliver(&self, delivery: &Delivery) -> Result<DeliveryOutcome, ConsumerError> {
        tokio::time::sleep(Duration::from_millis(1)).await;
        let queue = self.mapper.queue_for(&delivery.stream);
        let mut text = String::new();
        for (event, token) in delivery.events() {
            text.push_str(&format!("{} {token} {}\n", queue.0, event.id));
        }
        let mut log = self.log.lock().unwrap();
        log.write_all(text.as_bytes()).map_err(ConsumerError::failed)?;
        Ok(DeliveryOutcome::Continue)
    }
}

pub struct AuditFactory(pub Arc<Audit>);

impl tailrace::pubsub::ConsumerFactory for AuditFactory {
    fn name(&self) -> &str {
        "audit"
    }

    fn create(&self, _: &StreamId) -> Arc<dyn StreamConsumer> {
        self.0.clone()
    }
}

impl Audit {
    /// Audits into `{dir}/deliveries.log`.
    pub fn open(dir: &Path, mapper: QueueMapper) -> Arc<Self> {
        let log = std::fs::OpenOptions::new().create(true).append(true).open(dir.join("deliveries.log")).unwrap();
        Arc::new(Audit { log: std::sync::Mutex::new(log), mapper })
    }

    /// Implicit subscriptions of namespace `ns` into this audit.
    pub fn implicit(self: &Arc<Self>, ns: &str) -> ImplicitSubscriptions {
        ImplicitSubscriptions::new().bind(ns, Arc::new(AuditFactory(self.clone())))
    }
}

/// `queue token id` lines the node logged.
pub fn deliveries(dir: &Path) -> Vec<(u32, SequenceToken, String)> {
    let text = std::fs::read_to_string(dir.join("deliveries.log")).unwrap_or_default();
    text.lines()
        .filter_map(|line| {
            let mut parts = line.split(' ');
            Some((parts.next()?.parse().ok()?, parts.next()?.parse().ok()?, parts.next()?.to_string()))
        })
        .collect()
}

pub fn wait_ready(node: &mut Child) {
    let mut lines = BufReader::new(node.stdout.as_mut().unwrap()).lines();
    while let Some(Ok(line)) = lines.next() {
        if line.ends_with(READY) {
            return;
        }
    }
    panic!("the node never became ready");
}

/// Printed by a child once it runs.
pub const READY: &str = "tailrace-child-ready";

/// Every id delivered per the log, with how many times.
pub fn check_duplicates_after(
    dir: &Path,
    checkpoints: &std::collections::BTreeMap<u32, Option<SequenceToken>>,
) -> usize {
    let mut seen = std::collections::BTreeSet::new();
    let mut duplicates = 0;
    for (queue, token, id) in deliveries(dir) {
        if !seen.insert(id.clone()) {
            duplicates += 1;
            let checkpoint = checkpoints[&queue];
            assert!(
                checkpoint.is_none_or(|c| token > c),
                "{id} at {token} repeated though queue {queue}'s checkpoint was {checkpoint:?}"
            );
        }
    }
    duplicates
}

/// The restarted node `node` delivers every event of `produced` (within a
/// minute), then is killed; duplicates are allowed only after the
/// checkpoints stored at the first kill.
pub async fn restart_delivers_everything(
    mut node: Child,
    dir: &Path,
    produced: &std::collections::BTreeSet<String>,
    at_kill: &std::collections::BTreeMap<u32, Option<SequenceToken>>,
) {
    wait_ready(&mut node);
    let started = std::time::Instant::now();
    let delivered = || deliveries(dir).into_iter().map(|(_, _, id)| id).collect::<std::collections::BTreeSet<_>>();
    while !delivered().is_superset(produced) {
        let missing: Vec<_> = produced.difference(&delivered()).take(10).cloned().collect();
        assert!(started.elapsed() < std::time::Duration::from_secs(60), "lost: {missing:?}");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    node.kill().unwrap();
    node.wait().unwrap();
    let duplicates = check_duplicates_after(dir, at_kill);
    println!("{} events, {duplicates} delivered again after the checkpoint", produced.len());
}
