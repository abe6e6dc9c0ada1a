//! The clients of a cluster's life, shared by the lives that put a
//! cluster through faults (`server/tests/cluster_chaos.rs`, `server/tests/fault_life.rs`):
//! producers that post runs through random live nodes and retry what is
//! refused, viewers (browser tabs) that open a run's stream on a random live
//! node and resume with their last cursor, and the reckoning at the end:
//! every acknowledged line stored once, in order, and every viewer's lines
//! the store's, line by line, with no cursor jump, no truncation notice and
//! no `500`.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand::RngExt;
use tailrace::archive::RunKey;
use tailrace::queue::QueueMapper;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::cluster::Proc;
use super::logs::Sse;
use super::redis_server::RedisServer;

pub const FQN: &str = "svc.chaos";
pub const NAMES: [&str; 3] = ["n1", "n2", "n3"];
/// `[queues] count`, the default.
pub const QUEUES: u32 = 8;
/// Lines per post, and the pause between one run's posts.
pub const LINES_PER_POST: usize = 40;
pub const POST_PAUSE: Duration = Duration::from_millis(60);
/// How long the life waits for what it polls (never how long anything takes).
pub const PATIENCE: Duration = Duration::from_secs(180);

/// The edge port of each node, `None` while it is down or paused.
pub type Live = Arc<Mutex<Vec<Option<u16>>>>;

pub fn pick(live: &Live) -> Option<u16> {
    let ports: Vec<u16> = live.lock().unwrap().iter().flatten().copied().collect();
    (!ports.is_empty()).then(|| ports[rand::rng().random_range(0..ports.len())])
}

pub fn url(port: u16, path: &str) -> String {
    format!("http://127.0.0.1:{port}{path}")
}

pub fn run_id(run: usize) -> String {
    format!("run-{run}")
}

pub fn line(run: usize, i: usize) -> String {
    format!("run {run} line {i}")
}

/// Answers other than success, by status (`0`: no answer), with a sample.
#[derive(Default)]
pub struct Refusals(Mutex<BTreeMap<u16, (usize, String)>>);

impl Refusals {
    pub fn note(&self, status: u16, what: String) {
        let mut seen = self.0.lock().unwrap();
        let entry = seen.entry(status).or_insert((0, what));
        entry.0 += 1;
    }

    pub fn of(&self, status: u16) -> Option<(usize, String)> {
        self.0.lock().unwrap().get(&status).cloned()
    }
}

/// Sends `request` to random live nodes until one answers with success.
pub async fn until_accepted(
    live: &Live,
    refusals: &Refusals,
    request: impl Fn(u16) -> reqwest::RequestBuilder,
) -> reqwest::Response {
    let deadline = Instant::now() + PATIENCE;
    loop {
        assert!(Instant::now() < deadline, "no node accepted a request for {PATIENCE:?}");
        let Some(port) = pick(live) else {
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        match request(port).send().await {
            Ok(response) if response.status().is_success() => return response,
            Ok(response) => {
                let status = response.status().as_u16();
                refusals.note(status, response.text().await.unwrap_or_default());
            }
            Err(error) => refusals.note(0, error.to_string()),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Posts `run`'s lines from `from` on, a post at a time, until `stop`;
/// returns how many lines the run has then. A post that fails is sent
/// again as is (its ids make it stored once).
pub async fn produce(
    client: reqwest::Client,
    live: Live,
    refusals: Arc<Refusals>,
    run: usize,
    mut from: usize,
    stop: tokio_util::sync::CancellationToken,
) -> usize {
    let path = format!("/api/v1/logs/{FQN}/runs/{}/lines", run_id(run));
    while !stop.is_cancelled() {
        let body: String = (from..from + LINES_PER_POST)
            .map(|i| format!("{}\n", serde_json::json!({ "line": line(run, i), "id": format!("r{run}-l{i}") })))
            .collect();
        until_accepted(&live, &refusals, |port| {
            client.post(url(port, &path)).header("content-type", "application/x-ndjson").body(body.clone())
        })
        .await;
        from += LINES_PER_POST;
        tokio::time::sleep(POST_PAUSE).await;
    }
    from
}

/// What one viewer saw over its whole life.
#[derive(Debug, Default)]
pub struct Seen {
    pub lines: Vec<String>,
    /// Frames whose `after` was not the previous cursor plus their lines.
    pub jumps: Vec<String>,
    pub truncated: usize,
    pub errors: Vec<String>,
    pub sessions: usize,
    pub completed: bool,
}

/// Where a browser tab opens its stream.
#[derive(Clone, Copy)]
pub enum Tab {
    /// A random live node, reloaded after a second or a few.
    Roaming,
    /// A random live node, kept until its stream ends (a tab left open).
    Sticky,
    /// This edge port, for as long as the stream lasts.
    On(u16),
}

/// One browser tab on `run`: it opens the stream (with its last cursor)
/// where `tab` says, reads, reloads, and so on until its stream completes
/// or `deadline`.
pub async fn view(client: reqwest::Client, live: Live, run: usize, deadline: Instant, tab: Tab) -> Seen {
    let mut seen = Seen::default();
    let mut after: Option<u64> = None;
    let base = format!("/api/v1/services/ingestionPipelines/logs/{FQN}/stream/{}", run_id(run));
    while Instant::now() < deadline {
        let Some(port) = (match tab {
            Tab::Roaming | Tab::Sticky => pick(&live),
            Tab::On(port) => Some(port),
        }) else {
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        let query = after.map(|a| format!("?after={a}")).unwrap_or_default();
        let address = url(port, &format!("{base}{query}"));
        let mut sse = match tokio::time::timeout(Duration::from_secs(5), Sse::try_open(&client, &address)).await {
            Ok(Ok(sse)) if sse.status == 200 => sse,
            Ok(Ok(sse)) => {
                seen.errors.push(format!("open on :{port}: {}", sse.status));
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
            _ => continue,
        };
        seen.sessions += 1;
        let reload = match tab {
            Tab::Roaming => Instant::now() + Duration::from_millis(rand::rng().random_range(500..3_000)),
            Tab::Sticky | Tab::On(_) => deadline,
        };
        loop {
            // A frame cut short by the reload is dropped with the
            // connection; the cursor moves only with whole frames.
            let event = match tokio::time::timeout_at(reload.min(deadline), sse.event_within(PATIENCE)).await {
                Ok(Some(event)) => event,
                Ok(None) | Err(_) => break,
            };
            match event["eventType"].as_str() {
                Some("logs") if event["truncated"] == true => seen.truncated += 1,
                Some("logs") => {
                    let text = event["logs"].as_str().unwrap_or_default();
                    let count = if text.is_empty() { 0 } else { text.split('\n').count() };
                    seen.lines.extend(text.split('\n').filter(|_| count > 0).map(str::to_string));
                    let next: Option<u64> = event["after"].as_str().and_then(|a| a.parse().ok());
                    if let (Some(was), Some(next)) = (after, next)
                        && next != was + count as u64
                    {
                        seen.jumps.push(format!("on :{port}, after {was}: {count} lines then after {next}"));
                    }
                    after = next.or(after);
                }
                // Only a finished run's end is the end: the other reasons
                // ask the viewer to come back with its cursor.
                Some("complete") if event["reason"] == "runFinished" => {
                    seen.completed = true;
                    return seen;
                }
                Some("complete") => {
                    seen.errors.push(format!("on :{port}: {event}"));
                    after = event["after"].as_str().and_then(|a| a.parse().ok()).or(after);
                    break;
                }
                _ => {
                    seen.errors.push(format!("on :{port}: {event}"));
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    break;
                }
            }
        }
    }
    seen
}

/// The run's stored log, once it holds `lines` lines (the archive may
/// trail what was acknowledged a little).
pub async fn stored(client: &reqwest::Client, live: &Live, run: usize, lines: usize) -> Vec<String> {
    let path = format!("/api/v1/services/ingestionPipelines/logs/{FQN}/last/download?runId={}", run_id(run));
    let deadline = Instant::now() + PATIENCE;
    loop {
        let text = match pick(live) {
            Some(port) => match client.get(url(port, &path)).send().await {
                Ok(response) if response.status().is_success() => response.text().await.unwrap_or_default(),
                _ => String::new(),
            },
            None => String::new(),
        };
        let log: Vec<String> = text.lines().map(str::to_string).collect();
        if log.len() >= lines || Instant::now() >= deadline {
            return log;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Two end rules beside the defaults: a run without a status stays open
/// (chaos may hold a run's lines back for long), and a finished run
/// completes soon.
pub const END_RULES: &str = "[edge.log_stream]\nunknown_run_grace_seconds = 600.0\nfinish_grace_seconds = 2.0\n";

/// Redis, three nodes, and what the clients of a life share.
pub struct Cluster {
    pub client: reqwest::Client,
    pub server: RedisServer,
    pub nodes: Vec<Proc>,
    pub live: Live,
    pub refusals: Arc<Refusals>,
    /// The logs of the processes restarted nodes replaced.
    pub retired: Vec<String>,
    /// Starts node `name` (again), waited for until it serves.
    pub spawn: Box<dyn Fn(&str) -> Proc>,
}

impl Cluster {
    /// The nodes of [`NAMES`], each started by `spawn`, on `server`.
    pub fn start(server: RedisServer, spawn: Box<dyn Fn(&str) -> Proc>) -> Self {
        let client = super::http().connect_timeout(Duration::from_secs(2)).build().unwrap();
        let nodes: Vec<Proc> = NAMES.iter().map(|name| spawn(name)).collect();
        let live: Live = Arc::new(Mutex::new(nodes.iter().map(|n| Some(n.port)).collect()));
        Self { client, server, nodes, live, refusals: Arc::default(), retired: Vec::new(), spawn }
    }

    /// Posts `run`'s first lines, then keeps posting in a task until `stop`.
    pub async fn producer(&self, run: usize, stop: &CancellationToken) -> tokio::task::JoinHandle<usize> {
        let once = CancellationToken::new();
        once.cancel();
        let (client, live, refusals) = (self.client.clone(), self.live.clone(), self.refusals.clone());
        let first = produce(client.clone(), live.clone(), refusals.clone(), run, 0, once).await;
        tokio::spawn(produce(client, live, refusals, run, first, stop.clone()))
    }

    pub fn viewer(&self, run: usize, until: Instant, tab: Tab) -> tokio::task::JoinHandle<Seen> {
        tokio::spawn(view(self.client.clone(), self.live.clone(), run, until, tab))
    }

    /// Node `i` ends (`KILL` or `TERM`) and, after a moment, starts again.
    pub async fn bounce(&mut self, i: usize, signal: &str) {
        self.mark(i, false);
        self.nodes[i].signal(signal);
        tokio::task::block_in_place(|| self.nodes[i].wait_exit());
        tokio::time::sleep(Duration::from_millis(rand::rng().random_range(500..2_000))).await;
        let name = self.nodes[i].name.clone();
        let old = std::mem::replace(&mut self.nodes[i], (self.spawn)(&name));
        self.retired.push(format!("--- {name} (replaced):\n{}", old.log_text()));
        self.mark(i, true);
    }

    /// Node `i` is stopped (SIGSTOP) for `long`, then continues.
    pub async fn pause(&mut self, i: usize, long: Duration) {
        self.mark(i, false);
        self.nodes[i].signal("STOP");
        tokio::time::sleep(long).await;
        self.nodes[i].signal("CONT");
        self.mark(i, true);
    }

    /// Node `i` is down (or paused) for the clients, or back.
    pub fn mark(&self, i: usize, up: bool) {
        self.live.lock().unwrap()[i] = up.then_some(self.nodes[i].port);
    }

    /// Index of the node that holds `run`'s queue now.
    pub async fn holder_of(&self, run: usize) -> usize {
        let queue = u64::from(QueueMapper::new(QUEUES).queue_for(&RunKey::new(FQN, &run_id(run)).unwrap().stream()).0);
        let deadline = Instant::now() + PATIENCE;
        loop {
            let held = self.nodes[0].queue_holders().await.and_then(|h| h.get(&queue).cloned().flatten());
            if let Some(i) = held.and_then(|name| NAMES.iter().position(|n| *n == name)) {
                return i;
            }
            assert!(Instant::now() < deadline, "queue {queue} has no holder");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Stops the producers, ends every run (`success`), waits for the
    /// viewers, and compares what each saw with the store.
    pub async fn finish(
        mut self,
        stop: CancellationToken,
        producers: Vec<tokio::task::JoinHandle<usize>>,
        viewers: Vec<(usize, tokio::task::JoinHandle<Seen>)>,
    ) -> Result<String, String> {
        stop.cancel();
        let mut posted = Vec::new();
        for producer in producers {
            posted.push(producer.await.unwrap());
        }
        for run in 0..posted.len() {
            let path = format!("/api/v1/logs/{FQN}/runs/{}/status", run_id(run));
            until_accepted(&self.live, &self.refusals, |port| {
                self.client.put(url(port, &path)).json(&serde_json::json!({ "state": "success" }))
            })
            .await;
        }
        let mut problems = Vec::new();
        let (acked, mut missed) = (posted.iter().sum::<usize>(), 0);
        for (run, &lines) in posted.iter().enumerate() {
            let expected: Vec<String> = (0..lines).map(|i| line(run, i)).collect();
            let store = stored(&self.client, &self.live, run, lines).await;
            if store != expected {
                let differ = store.iter().zip(&expected).position(|(a, b)| a != b);
                problems.push(format!(
                    "run {run}: {} lines stored of {lines} acknowledged; first difference at {differ:?}",
                    store.len()
                ));
            }
        }
        for (run, viewer) in viewers {
            let seen = viewer.await.unwrap();
            let (lines, expected) = (posted[run], (0..posted[run]).map(|i| line(run, i)).collect::<Vec<_>>());
            let have: std::collections::HashSet<&String> = seen.lines.iter().collect();
            let lost: Vec<usize> = (0..lines).filter(|&i| !have.contains(&expected[i])).collect();
            missed += lost.len();
            if seen.lines != expected || !seen.completed || seen.truncated > 0 || !seen.jumps.is_empty() {
                problems.push(format!(
                    "run {run}: the viewer saw {} lines of {lines} stored ({} missed: {}), completed {}, \
                     {} truncation notices, {} sessions, cursor jumps {:?}, errors {:?}",
                    seen.lines.len(),
                    lost.len(),
                    blocks(&lost),
                    seen.completed,
                    seen.truncated,
                    seen.sessions,
                    seen.jumps,
                    seen.errors.iter().take(5).collect::<Vec<_>>(),
                ));
            }
        }
        if let Some((count, sample)) = self.refusals.of(500) {
            problems.push(format!("{count} requests answered 500, e.g. {sample}"));
        }
        let mut rebases = 0.0;
        for node in &self.nodes {
            rebases += node.metric_sum("tailrace_edge_rebases_total", None).await.unwrap_or(0.0);
        }
        let summary = format!(
            "{acked} lines acknowledged, viewers missed {missed}; tailers re-based {rebases}; refusals {:?}",
            self.refusals.0.lock().unwrap().iter().map(|(s, (n, _))| (*s, *n)).collect::<Vec<_>>()
        );
        self.retired.extend(self.nodes.iter().map(|n| format!("--- {}:\n{}", n.name, n.log_text())));
        // The whole logs go where TAILRACE_CHAOS_LOGS says; an error shows their tails.
        if let Ok(path) = std::env::var("TAILRACE_CHAOS_LOGS") {
            let mut file = std::fs::OpenOptions::new().create(true).append(true).open(&path).unwrap();
            std::io::Write::write_all(&mut file, self.retired.join("\n").as_bytes()).unwrap();
        }
        if problems.is_empty() {
            return Ok(summary);
        }
        let tails: Vec<String> = self.retired.iter().map(|log| tail(log)).collect();
        Err(format!("{summary}\n{}\n{}", problems.join("\n"), tails.join("\n")))
    }
}

/// `[a-b, …]` of consecutive numbers.
pub fn blocks(numbers: &[usize]) -> String {
    let mut out: Vec<String> = Vec::new();
    let mut i = 0;
    while i < numbers.len() {
        let start = numbers[i];
        while i + 1 < numbers.len() && numbers[i + 1] == numbers[i] + 1 {
            i += 1;
        }
        out.push(if start == numbers[i] { start.to_string() } else { format!("{start}-{}", numbers[i]) });
        i += 1;
    }
    format!("[{}]", out.join(", "))
}

/// A log's first line (which process it is) and its last 40.
pub fn tail(log: &str) -> String {
    let lines: Vec<&str> = log.lines().collect();
    let from = lines.len().saturating_sub(40).max(1);
    let head = lines.first().copied().unwrap_or_default();
    format!("{head}\n{}", lines.get(from..).unwrap_or_default().join("\n"))
}

pub fn from_env(name: &str) -> Option<usize> {
    std::env::var(name).ok().and_then(|v| v.parse().ok())
}
