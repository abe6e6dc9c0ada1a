//! Shared by the crash tests: child processes, the audit consumer whose
//! log survives a SIGKILL, and reading that log back.
#![allow(dead_code)]

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tailrace::pubsub::{ConsumerError, Delivery, DeliveryOutcome, ImplicitSubscriptions, StreamConsumer};
use tailrace::queue::{Checkpointer, QueueMapper};
use tailrace::{QueueId, SequenceToken, StreamId};

/// Runs this test binary again on the ignored entry `entry`.
pub fn child(entry: &str, env: &[(&str, String)]) -> Child {
    let mut command = Command::new(std::env::current_exe().unwrap());
    command.args(["--ignored", "--exact", entry, "--nocapture", "--test-threads", "1"]);
    for (key, value) in env {
        command.env(key, value);
    }
    // Closing its stdin asks a child that waits for it to stop gracefully.
    command.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::null()).spawn().unwrap()
}

/// In a child: returns once the parent closed our stdin (or died).
pub async fn until_told_to_stop() {
    let _ = tokio::task::spawn_blocking(|| std::io::copy(&mut std::io::stdin(), &mut std::io::sink())).await;
}

/// Asks `node` to stop gracefully (closes its stdin) and waits, at most
/// 30 s, for it to exit successfully.
pub fn stop_gracefully(node: &mut Child) {
    drop(node.stdin.take());
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(status) = node.try_wait().unwrap() {
            assert!(status.success(), "the node's graceful stop failed: {status}");
            return;
        }
        if std::time::Instant::now() > deadline {
            let _ = node.kill();
            panic!("the node did not stop within 30 s");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The directory a crash test hands its child.
pub fn crash_dir() -> PathBuf {
    PathBuf::from(std::env::var("TAILRACE_CRASH_DIR").expect("run by the crash tests"))
}

/// Records each delivery as `queue token stream id` lines in an append-only log,
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
            text.push_str(&format!("{} {token} {} {}\n", queue.0, delivery.stream, event.id));
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

/// One delivery, as the audit logged it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Delivered {
    pub queue: u32,
    pub token: SequenceToken,
    pub stream: String,
    pub id: String,
}

/// The deliveries the node logged, in order (`queue token stream id` lines).
pub fn deliveries(dir: &Path) -> Vec<Delivered> {
    let text = std::fs::read_to_string(dir.join("deliveries.log")).unwrap_or_default();
    text.lines()
        .filter_map(|line| {
            let mut parts = line.split(' ');
            Some(Delivered {
                queue: parts.next()?.parse().ok()?,
                token: parts.next()?.parse().ok()?,
                stream: parts.next()?.to_string(),
                id: parts.next()?.to_string(),
            })
        })
        .collect()
}

/// Every queue's stored checkpoint (a failing store is asked again for up
/// to 10 s: Redis may be restarting).
pub async fn stored_checkpoints(checkpointer: &dyn Checkpointer, queues: u32) -> BTreeMap<u32, Option<SequenceToken>> {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let mut stored = BTreeMap::new();
    for q in 0..queues {
        let token = loop {
            match checkpointer.load(QueueId(q)).await {
                Ok(token) => break token,
                Err(error) if std::time::Instant::now() < deadline => {
                    println!("loading the checkpoint of q{q}: {error}; again");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                Err(error) => panic!("loading the checkpoint of q{q}: {error}"),
            }
        };
        stored.insert(q, token);
    }
    stored
}

/// Polls (every 20 ms, for at most 30 s) until every queue has a stored
/// checkpoint past the one it had in `since`: this life saved progress on
/// every queue, so killing it now tests the bound on what is repeated.
pub async fn wait_for_checkpoints(
    checkpointer: &dyn Checkpointer,
    queues: u32,
    since: &BTreeMap<u32, Option<SequenceToken>>,
) -> BTreeMap<u32, Option<SequenceToken>> {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let stored = stored_checkpoints(checkpointer, queues).await;
        if stored.iter().all(|(q, now)| now.is_some() && *now > since.get(q).copied().flatten()) {
            return stored;
        }
        assert!(std::time::Instant::now() < deadline, "no checkpoint saved past {since:?} within 30 s: {stored:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// How a life of the node ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum End {
    /// SIGKILL.
    Killed,
    /// An ordered shutdown: the next life repeats nothing.
    Stopped,
}

/// A node's lives on one audit log: where each ended in the log, how, and
/// the checkpoints stored when it ended (where the next life resumes).
#[derive(Default)]
pub struct Lives {
    ends: Vec<(usize, BTreeMap<u32, SequenceToken>, End)>,
}

impl Lives {
    /// Records that the node just died or stopped. Refuses (panics) a life
    /// that delivered nothing or left a queue without a checkpoint: the
    /// bound on repeats would then hold by itself.
    pub async fn ended(&mut self, dir: &Path, checkpointer: &dyn Checkpointer, queues: u32, how: End) {
        let logged = deliveries(dir).len();
        let from = self.ends.last().map_or(0, |(at, ..)| *at);
        assert!(logged > from, "life {} delivered nothing", self.ends.len() + 1);
        let mut checkpoints = BTreeMap::new();
        for (q, token) in stored_checkpoints(checkpointer, queues).await {
            let token =
                token.unwrap_or_else(|| panic!("life {} ended without a checkpoint on queue {q}", self.ends.len() + 1));
            checkpoints.insert(q, token);
        }
        self.ends.push((logged, checkpoints, how));
    }

    /// How many lives ended so far.
    pub fn count(&self) -> usize {
        self.ends.len()
    }

    /// The checkpoints stored when the last life ended.
    pub fn last_checkpoints(&self) -> BTreeMap<u32, Option<SequenceToken>> {
        self.ends.last().map(|(_, c, _)| c.iter().map(|(q, t)| (*q, Some(*t))).collect()).unwrap_or_default()
    }

    /// Checks the whole log: within a life, each id once and each stream
    /// in token order; across lives, each stream's new ids in token order
    /// (nothing skipped and delivered later); an id an earlier life
    /// delivered comes again only from the unacknowledged window, past the
    /// checkpoint the life resumed from, and never after a graceful stop.
    /// Returns (repeats, window) summed over lives.
    pub fn check(&self, dir: &Path) -> (usize, usize) {
        let log = deliveries(dir);
        let mut before: BTreeMap<&str, &Delivered> = BTreeMap::new();
        let mut newest_per_stream: BTreeMap<&str, SequenceToken> = BTreeMap::new();
        let (mut repeats, mut windows) = (0, 0);
        let mut start = 0;
        let bounds = self.ends.iter().map(|(at, ..)| *at).chain(std::iter::once(log.len()));
        for (index, end) in bounds.enumerate() {
            let life = index + 1;
            let resumed = index.checked_sub(1).map(|previous| (&self.ends[previous].1, self.ends[previous].2));
            if let Some((checkpoints, _)) = resumed {
                windows += before.values().filter(|d| d.token > checkpoints[&d.queue]).count();
            }
            let mut this_life: BTreeMap<&str, &Delivered> = BTreeMap::new();
            let mut last_per_stream: BTreeMap<&str, SequenceToken> = BTreeMap::new();
            for delivered in &log[start..end] {
                if let Some(first) = this_life.insert(&delivered.id, delivered) {
                    panic!("life {life} delivered {} twice: {first:?} then {delivered:?}", delivered.id);
                }
                if let Some(last) = last_per_stream.insert(&delivered.stream, delivered.token) {
                    assert!(
                        last < delivered.token,
                        "life {life} delivered {} out of order: {delivered:?} after {last}",
                        delivered.stream
                    );
                }
                if before.contains_key(delivered.id.as_str()) {
                    let (checkpoint, how) = (resumed.map(|(c, _)| c[&delivered.queue]), resumed.map(|(_, how)| how));
                    assert!(
                        checkpoint.is_some_and(|c| delivered.token > c),
                        "life {life} repeated {delivered:?} though it resumed from checkpoint {checkpoint:?}"
                    );
                    assert_ne!(how, Some(End::Stopped), "life {life} repeated {delivered:?} after a graceful stop");
                    repeats += 1;
                } else if let Some(newest) = newest_per_stream.insert(&delivered.stream, delivered.token) {
                    assert!(
                        newest < delivered.token,
                        "life {life} delivered {delivered:?} for the first time after {newest} of its stream"
                    );
                }
            }
            before.extend(this_life);
            start = end;
        }
        assert!(repeats <= windows);
        (repeats, windows)
    }
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

/// The restarted node `node` delivers every event of `produced` (within a
/// minute), then is killed; the whole log then passes [`Lives::check`].
pub async fn restart_delivers_everything(mut node: Child, dir: &Path, produced: &BTreeSet<String>, lives: &Lives) {
    wait_ready(&mut node);
    let started = std::time::Instant::now();
    let delivered = || deliveries(dir).into_iter().map(|d| d.id).collect::<BTreeSet<_>>();
    while !delivered().is_superset(produced) {
        let missing: Vec<_> = produced.difference(&delivered()).take(10).cloned().collect();
        assert!(started.elapsed() < Duration::from_secs(60), "lost: {missing:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    node.kill().unwrap();
    node.wait().unwrap();
    let (repeats, window) = lives.check(dir);
    println!(
        "{} events over {} lives; {repeats} delivered again, of {window} in unacknowledged windows",
        produced.len(),
        lives.count() + 1
    );
}
