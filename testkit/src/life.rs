//! A node's whole life, from outside: `tailrace serve` as a child process
//! on one data directory, started, stopped with SIGINT, killed with
//! SIGKILL and started again; producers posting over HTTP; a model of what
//! each run's log must hold, checked against the download endpoint.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// How long a node may take to start or to stop gracefully.
const START_WITHIN: Duration = Duration::from_secs(60);
const STOP_WITHIN: Duration = Duration::from_secs(60);
/// How long acknowledged lines may take to reach the run log.
pub const DRAIN_WITHIN: Duration = Duration::from_secs(90);

use super::free_port;

/// One `tailrace serve` on one data directory, over its lives.
pub struct ServeNode {
    data: tempfile::TempDir,
    /// Where the node keeps its data (`--data-dir`).
    data_dir: PathBuf,
    config: PathBuf,
    port: u16,
    child: Option<Child>,
    /// Lives started so far.
    pub lives: u32,
    /// The log of every life (stderr), for a failure's message.
    log: PathBuf,
}

impl ServeNode {
    /// A node whose config file holds `config` (TOML).
    pub fn new(config: &str) -> Self {
        let data = tempfile::tempdir().unwrap();
        let path = data.path().join("tailrace.toml");
        std::fs::write(&path, config).unwrap();
        let log = data.path().join("serve.log");
        let data_dir = data.path().join("data");
        Self { config: path, data, data_dir, port: free_port(), child: None, lives: 0, log }
    }

    /// A node whose data directory is `data_dir` (say, on a power-cut
    /// file system); its config and log stay outside it.
    pub fn with_data_dir(config: &str, data_dir: PathBuf) -> Self {
        let mut node = Self::new(config);
        node.data_dir = data_dir;
        node
    }

    pub fn data_dir(&self) -> PathBuf {
        self.data_dir.clone()
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }

    /// Starts a life and waits until it serves; panics with its log if it
    /// does not (a start that needs an operator fails the test here).
    pub fn start(&mut self) {
        assert!(self.child.is_none(), "already running");
        self.lives += 1;
        let log = std::fs::OpenOptions::new().create(true).append(true).open(&self.log).unwrap();
        let mut child = Command::new(super::tailrace_bin())
            .arg("serve")
            .arg("--config")
            .arg(&self.config)
            .arg("--data-dir")
            .arg(self.data_dir())
            .args(["--listen", &format!("127.0.0.1:{}", self.port)])
            .env("RUST_LOG", "warn")
            .stdout(Stdio::piped())
            .stderr(Stdio::from(log))
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let started = serving_within(stdout, START_WITHIN);
        self.child = Some(child);
        assert!(started, "life {} did not start within {START_WITHIN:?}:\n{}", self.lives, self.log_tail());
    }

    /// SIGKILL: no handoff, no flush, no unlock.
    pub fn kill9(&mut self) {
        let mut child = self.child.take().expect("running");
        child.kill().unwrap();
        child.wait().unwrap();
    }

    /// SIGINT (Ctrl-C) and a clean exit.
    pub fn stop(&mut self) {
        self.stop_with("INT");
    }

    /// `signal` (`INT`, `TERM`) and a clean exit; how long the exit took.
    pub fn stop_with(&mut self, signal: &str) -> Duration {
        let mut child = self.child.take().expect("running");
        let sent = Instant::now();
        let status = Command::new("kill").args([&format!("-{signal}"), &child.id().to_string()]).status().unwrap();
        assert!(status.success());
        let deadline = Instant::now() + STOP_WITHIN;
        loop {
            if let Some(status) = child.try_wait().unwrap() {
                assert!(status.success(), "life {} exited with {status}:\n{}", self.lives, self.log_tail());
                return sent.elapsed();
            }
            if Instant::now() >= deadline {
                let _ = child.kill();
                panic!("life {} did not stop within {STOP_WITHIN:?}:\n{}", self.lives, self.log_tail());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Writer locks and `.open` files in the queue directories: what a
    /// start would have to recover.
    pub fn leftovers(&self) -> Vec<String> {
        let mut left = Vec::new();
        let Ok(queues) = std::fs::read_dir(self.data_dir().join("queues")) else { return left };
        for queue in queues.flatten() {
            for file in std::fs::read_dir(queue.path()).into_iter().flatten().flatten() {
                let name = file.file_name().to_string_lossy().into_owned();
                if name.ends_with(".lock") || name.ends_with(".open") {
                    left.push(format!("{}/{name}", queue.file_name().to_string_lossy()));
                }
            }
        }
        left
    }

    /// Waits until every queue directory is empty of event files (every
    /// file consumed, checkpointed past and deleted).
    pub fn wait_queues_empty(&self) -> Result<(), String> {
        let queues = self.data_dir().join("queues");
        let deadline = Instant::now() + DRAIN_WITHIN;
        loop {
            let mut left = Vec::new();
            for queue in std::fs::read_dir(&queues).map_err(|e| e.to_string())? {
                let queue = queue.map_err(|e| e.to_string())?.path();
                if !queue.file_name().is_some_and(|n| n.to_string_lossy().starts_with('q')) {
                    continue;
                }
                for file in std::fs::read_dir(&queue).map_err(|e| e.to_string())? {
                    let name = file.map_err(|e| e.to_string())?.file_name().to_string_lossy().into_owned();
                    if name.ends_with(".jsonl") || name.ends_with(".open") {
                        left.push(name);
                    }
                }
            }
            if left.is_empty() {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(format!("queue files never consumed and deleted: {left:?}"));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    pub fn is_running(&self) -> bool {
        self.child.is_some()
    }

    /// The running life's process id.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// The last lines the node logged.
    pub fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(30)..].join("\n")
    }

    pub fn path(&self) -> &Path {
        self.data.path()
    }
}

impl Drop for ServeNode {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// What became of a posted batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Answered 202: it must be in the log, once.
    Acked,
    /// Sent, with no 202 (the node died, or refused): in the log at most once.
    Maybe,
}

/// One batch: `lines` lines `r{run} b{batch} l{i}/{lines}`.
#[derive(Clone, Debug)]
pub struct Batch {
    pub lines: u32,
    pub outcome: Outcome,
}

/// What each run's log must hold: its batches in the order posted.
#[derive(Default, Debug)]
pub struct Model {
    pub runs: BTreeMap<u32, Vec<Batch>>,
}

/// Whether a `serve` or `node` process whose standard output is `stdout`
/// printed where it serves (its `viewer:` line) within `wait`; the rest of
/// its output is read and dropped, so it never blocks on a full pipe.
pub fn serving_within(stdout: std::process::ChildStdout, wait: Duration) -> bool {
    let (ready, ready_rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut sent = false;
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if !sent && line.contains("viewer:") {
                let _ = ready.send(());
                sent = true;
            }
        }
    });
    ready_rx.recv_timeout(wait).is_ok()
}

pub fn line(run: u32, batch: usize, i: u32, lines: u32) -> String {
    format!("r{run} b{batch} l{i}/{lines}")
}

impl Model {
    /// The next batch of `run`: its number and body.
    pub fn next(&self, run: u32, lines: u32) -> (usize, String) {
        let batch = self.runs.get(&run).map_or(0, Vec::len);
        // NDJSON with producer ids: a retried batch is stored once.
        let body: String = (0..lines)
            .map(|i| format!("{{\"line\":\"{}\",\"id\":\"r{run}-b{batch}-l{i}\"}}\n", line(run, batch, i, lines)))
            .collect();
        (batch, body)
    }

    pub fn record(&mut self, run: u32, lines: u32, outcome: Outcome) {
        self.runs.entry(run).or_default().push(Batch { lines, outcome });
    }

    /// Takes in the runs of `other` (runs produced by another task).
    pub fn merge(&mut self, other: Model) {
        for (run, batches) in other.runs {
            self.runs.entry(run).or_default().extend(batches);
        }
    }

    pub fn acked_lines(&self) -> u64 {
        self.runs.values().flatten().filter(|b| b.outcome == Outcome::Acked).map(|b| u64::from(b.lines)).sum()
    }

    /// Checks one run's log: batches whole and in order, every acknowledged
    /// batch once, a maybe-batch at most once, nothing else.
    pub fn check(&self, run: u32, log: &[String]) -> Result<(), String> {
        let batches = self.runs.get(&run).map(Vec::as_slice).unwrap_or_default();
        let mut at = 0;
        let mut next_batch = 0;
        while at < log.len() {
            let first = &log[at];
            let batch = (next_batch..batches.len())
                .find(|&b| *first == line(run, b, 0, batches[b].lines))
                .ok_or_else(|| format!("run {run}: line {at} `{first}` is not the start of a later batch"))?;
            if let Some(skipped) = (next_batch..batch).find(|&b| batches[b].outcome == Outcome::Acked) {
                return Err(format!("run {run}: acknowledged batch {skipped} is missing before line {at}"));
            }
            let lines = batches[batch].lines;
            for i in 0..lines {
                let expected = line(run, batch, i, lines);
                match log.get(at + i as usize) {
                    Some(got) if *got == expected => {}
                    got => {
                        return Err(format!("run {run}: line {} is {got:?}, expected `{expected}`", at + i as usize));
                    }
                }
            }
            at += lines as usize;
            next_batch = batch + 1;
        }
        if let Some(missing) = (next_batch..batches.len()).find(|&b| batches[b].outcome == Outcome::Acked) {
            return Err(format!("run {run}: acknowledged batch {missing} is missing at the end ({} lines)", log.len()));
        }
        Ok(())
    }
}

/// The producer side: posts batches and reads logs back.
pub struct Client {
    http: reqwest::Client,
    base: String,
}

/// How a post ended.
pub enum Posted {
    Acked,
    /// Never reached the node (connection refused): not sent.
    NotSent,
    /// Anything else: maybe accepted.
    Maybe(String),
}

impl Client {
    pub fn new(node: &ServeNode) -> Self {
        let http = super::http().timeout(Duration::from_secs(30)).build().unwrap();
        Self { http, base: node.url("") }
    }

    pub async fn post(&self, run: u32, body: String) -> Posted {
        let url = format!("{}/api/v1/logs/life/runs/run-{run}/lines", self.base);
        match self.http.post(url).header("content-type", "application/x-ndjson").body(body).send().await {
            Ok(response) if response.status() == 202 => Posted::Acked,
            Ok(response) => {
                Posted::Maybe(format!("{}: {}", response.status(), response.text().await.unwrap_or_default()))
            }
            Err(e) if e.is_connect() => Posted::NotSent,
            Err(e) => Posted::Maybe(e.to_string()),
        }
    }

    /// The run's whole log, as the download endpoint serves it.
    pub async fn log(&self, run: u32) -> Vec<String> {
        let url = format!("{}/api/v1/services/ingestionPipelines/logs/life/last/download?runId=run-{run}", self.base);
        match self.http.get(url).send().await {
            Ok(response) if response.status() == 200 => {
                response.text().await.unwrap_or_default().lines().map(str::to_string).collect()
            }
            _ => Vec::new(),
        }
    }

    /// Waits until every run's log passes the model's check; the last
    /// failure if it never does.
    pub async fn drained(&self, model: &Model) -> Result<(), String> {
        let deadline = Instant::now() + DRAIN_WITHIN;
        loop {
            let mut failure = None;
            for run in model.runs.keys() {
                if let Err(e) = model.check(*run, &self.log(*run).await) {
                    failure = Some(e);
                    break;
                }
            }
            match failure {
                None => return Ok(()),
                Some(e) if Instant::now() >= deadline => return Err(e),
                Some(_) => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        }
    }
}

/// A step of a node's life.
#[derive(Clone, Debug)]
pub enum Op {
    /// Posts `batches` batches of `lines` lines to run `run`, one after another.
    Produce { run: u32, batches: u32, lines: u32 },
    /// The same, and a `kill -9` after `after_ms`, then a restart.
    KillWhileProducing { run: u32, batches: u32, lines: u32, after_ms: u64 },
    /// Waits until every acknowledged line is in its run's log and, on the
    /// file adapter, every queue file was consumed and deleted.
    Drain,
    /// Ctrl-C, then a restart.
    Stop,
    /// `kill -9` while idle, then a restart.
    Kill,
    /// Redis killed and started again under the running node.
    RestartRedis,
    /// Redis down while `batches` one-line batches are posted to `run`
    /// (each may or may not be taken), then up again.
    ProduceWhileRedisDown { run: u32, batches: u32 },
    /// A power cut (`kill -9`, then everything not synced is lost; with
    /// `torn`, a random part of it survives), then a restart.
    PowerCut { torn: Option<u64> },
    /// The same while producers post, after `after_ms`.
    PowerCutWhileProducing { run: u32, batches: u32, lines: u32, after_ms: u64, torn: Option<u64> },
}

/// Posts `batches` batches of `lines` lines to `run` (as
/// [`produce_maybe`]) while `node` is killed (`kill -9`) after `after_ms`.
pub async fn kill_while_producing(
    client: &Client,
    model: &mut Model,
    node: &mut ServeNode,
    run: u32,
    batches: u32,
    lines: u32,
    after_ms: u64,
) {
    let producing = produce_maybe(client, model, run, batches, lines);
    let killing = async {
        tokio::time::sleep(Duration::from_millis(after_ms)).await;
        tokio::task::block_in_place(|| node.kill9());
    };
    tokio::join!(producing, killing);
}

/// Producers go on after the node came back: one batch to every run, so
/// appends meet what the cut left before anything reads it.
async fn post_to_every_run(client: &Client, model: &mut Model) -> Result<(), String> {
    let runs: Vec<u32> = model.runs.keys().copied().collect();
    for run in runs {
        produce(client, model, run, 1, 3).await?;
    }
    Ok(())
}

/// Cuts the power of `power` (the node is dead already).
fn cut(power: &mut Option<&mut crate::powercut::PowerCutFs>, torn: Option<u64>) -> Result<(), String> {
    use crate::powercut::Cut;
    let power = power.as_deref_mut().ok_or("a power cut needs the power-cut file system")?;
    power.cut(torn.map_or(Cut::Clean, Cut::Torn))
}

/// The life tests' proptest settings: `TAILRACE_LIFE_CASES` cases (a few
/// by default), little shrinking (each case runs processes).
pub fn proptest_config() -> proptest::test_runner::Config {
    let cases = std::env::var("TAILRACE_LIFE_CASES").ok().and_then(|n| n.parse().ok()).unwrap_or(3);
    proptest::test_runner::Config {
        cases,
        max_shrink_iters: 16,
        failure_persistence: None,
        ..proptest::test_runner::Config::default()
    }
}

/// The steps of a node's life any backend goes through.
pub fn node_ops() -> impl proptest::strategy::Strategy<Value = Op> {
    use proptest::prelude::*;
    prop_oneof![
        4 => (0u32..3, 1u32..12, 1u32..60).prop_map(|(run, batches, lines)| Op::Produce { run, batches, lines }),
        2 => (0u32..3, 5u32..40, 1u32..60, 0u64..400)
            .prop_map(|(run, batches, lines, after_ms)| Op::KillWhileProducing { run, batches, lines, after_ms }),
        2 => Just(Op::Drain),
        1 => Just(Op::Stop),
        1 => Just(Op::Kill),
    ]
}

/// Posts to a live node. A `503` (retry later: say, the first command
/// after Redis came back) is retried with the same ids, as a producer
/// would; the batch must then be in the log once.
async fn produce(client: &Client, model: &mut Model, run: u32, batches: u32, lines: u32) -> Result<(), String> {
    for _ in 0..batches {
        let (batch, body) = model.next(run, lines);
        let mut attempt = 0;
        loop {
            attempt += 1;
            match client.post(run, body.clone()).await {
                Posted::Acked => break,
                Posted::Maybe(why) if why.starts_with("503") && attempt < 20 => {
                    tokio::time::sleep(Duration::from_millis(250)).await;
                }
                Posted::Maybe(why) => return Err(format!("a live node refused batch {batch} of run {run}: {why}")),
                Posted::NotSent => return Err("a live node refused the connection".into()),
            }
        }
        model.record(run, lines, Outcome::Acked);
    }
    Ok(())
}

/// Posts while the node dies or a server is down: a batch counts as
/// acknowledged only on a 202; one that got no 202 may or may not be in
/// the log; one that never connected was not sent.
pub async fn produce_maybe(client: &Client, model: &mut Model, run: u32, batches: u32, lines: u32) {
    for _ in 0..batches {
        let (_, body) = model.next(run, lines);
        match client.post(run, body).await {
            Posted::Acked => model.record(run, lines, Outcome::Acked),
            Posted::Maybe(_) => model.record(run, lines, Outcome::Maybe),
            Posted::NotSent => return,
        }
    }
}

/// Runs `ops` on `node` (and its Redis, if it has one), checking every
/// run's log after each restart and at the end, then one more clean
/// restart. The error names the step and carries the node's log.
pub fn run_life(
    node: &mut ServeNode,
    ops: Vec<Op>,
    redis: Option<&mut crate::redis_server::RedisServer>,
) -> Result<(), String> {
    run_life_on(node, ops, redis, None)
}

/// [`run_life`] with the node's data directory on `power`, a power-cut
/// file system, so the power-cut steps can run.
pub fn run_life_on(
    node: &mut ServeNode,
    ops: Vec<Op>,
    mut redis: Option<&mut crate::redis_server::RedisServer>,
    mut power: Option<&mut crate::powercut::PowerCutFs>,
) -> Result<(), String> {
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    node.start();
    let client = Client::new(node);
    let mut model = Model::default();
    let check = |node: &ServeNode, model: &Model, when: &str| -> Result<(), String> {
        runtime.block_on(client.drained(model)).map_err(|e| format!("{when}: {e}\nnode log:\n{}", node.log_tail()))
    };
    for (step, op) in ops.into_iter().enumerate() {
        match op {
            Op::Produce { run, batches, lines } => runtime
                .block_on(produce(&client, &mut model, run, batches, lines))
                .map_err(|e| format!("step {step}: {e}\nnode log:\n{}", node.log_tail()))?,
            Op::KillWhileProducing { run, batches, lines, after_ms } => {
                runtime.block_on(kill_while_producing(&client, &mut model, node, run, batches, lines, after_ms));
                node.start();
                check(node, &model, &format!("step {step}: after a kill -9 while producing"))?;
            }
            Op::Drain => {
                check(node, &model, &format!("step {step}: drain"))?;
                if redis.is_none() {
                    node.wait_queues_empty()
                        .map_err(|e| format!("step {step}: {e}\nnode log:\n{}", node.log_tail()))?;
                }
            }
            Op::Stop => {
                node.stop();
                node.start();
                check(node, &model, &format!("step {step}: after Ctrl-C and a restart"))?;
            }
            Op::Kill => {
                node.kill9();
                node.start();
                check(node, &model, &format!("step {step}: after a kill -9 and a restart"))?;
            }
            Op::RestartRedis => {
                if let Some(redis) = redis.as_deref_mut() {
                    redis.restart();
                    check(node, &model, &format!("step {step}: after Redis restarted"))?;
                }
            }
            Op::PowerCut { torn } => {
                node.kill9();
                cut(&mut power, torn).map_err(|e| format!("step {step}: {e}"))?;
                node.start();
                runtime.block_on(post_to_every_run(&client, &mut model)).map_err(|e| format!("step {step}: {e}"))?;
                check(node, &model, &format!("step {step}: after a power cut ({torn:?}) and a restart"))?;
            }
            Op::PowerCutWhileProducing { run, batches, lines, after_ms, torn } => {
                runtime.block_on(kill_while_producing(&client, &mut model, node, run, batches, lines, after_ms));
                cut(&mut power, torn).map_err(|e| format!("step {step}: {e}"))?;
                node.start();
                runtime.block_on(post_to_every_run(&client, &mut model)).map_err(|e| format!("step {step}: {e}"))?;
                check(node, &model, &format!("step {step}: after a power cut ({torn:?}) while producing"))?;
            }
            Op::ProduceWhileRedisDown { run, batches } => {
                if let Some(redis) = redis.as_deref_mut() {
                    redis.stop();
                    runtime.block_on(produce_maybe(&client, &mut model, run, batches, 1));
                    redis.restart();
                    check(node, &model, &format!("step {step}: after Redis came back"))?;
                }
            }
        }
    }
    check(node, &model, "at the end")?;
    node.stop();
    // One more life after a clean stop: nothing to recover, nothing lost.
    node.start();
    check(node, &model, "after the last restart")?;
    node.stop();
    if model.acked_lines() == 0 {
        return Err("the life acknowledged no line: it checked nothing".into());
    }
    Ok(())
}
