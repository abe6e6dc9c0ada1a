//! A whole chaotic life of a cluster, as its viewers see it: three
//! `tailrace node` processes on one Redis, runs posted through random live
//! nodes, one viewer per run on a random live node that resumes with its
//! last cursor (half of them reload every few seconds, half stay until
//! their stream ends), and rounds of chaos: a node killed with
//! SIGKILL, a node leaving with SIGTERM, a node paused past its leases
//! (SIGSTOP, then SIGCONT), Redis killed and started again. Then every run
//! ends (`success`) and every viewer reads on to its `complete`.
//!
//! What must hold: every acknowledged line is stored once, in order; every
//! viewer saw exactly the stored log, line by line, and no cursor it was
//! handed skipped a line; no viewer got a truncation notice (the store
//! holds every line, so none is ever due); no request was answered `500`.
//!
//! `cargo test` runs a short life (each kind of chaos once). The same code
//! runs a long one with `TAILRACE_CHAOS_ROUNDS=N` (N rounds, the kinds in
//! turn in a random order), `TAILRACE_CHAOS_LIVES=M` times.

mod common;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::cluster::Proc;
use common::logs::Sse;
use common::redis_server::RedisServer;
use rand::RngExt;
use tailrace::archive::RunKey;
use tailrace::queue::QueueMapper;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

const FQN: &str = "svc.chaos";
const RUNS: usize = 8;
const NAMES: [&str; 3] = ["n1", "n2", "n3"];
/// `[queues] count`, the default.
const QUEUES: u32 = 8;
/// Lines per post, and the pause between one run's posts.
const LINES_PER_POST: usize = 40;
const POST_PAUSE: Duration = Duration::from_millis(60);
/// How long the life waits for what it polls (never how long anything takes).
const PATIENCE: Duration = Duration::from_secs(180);
/// A paused node stays stopped past its lease TTL (8 s, the default).
const PAUSE: Duration = Duration::from_secs(11);
/// How long Redis stays down: past the membership TTL (5 s, the
/// default), so every member's record lapses with it.
const REDIS_DOWN: Duration = Duration::from_secs(6);

#[derive(Clone, Copy, Debug)]
enum Chaos {
    Kill,
    Term,
    Pause,
    RedisKill,
}

const KINDS: [Chaos; 4] = [Chaos::Pause, Chaos::Kill, Chaos::RedisKill, Chaos::Term];

/// The edge port of each node, `None` while it is down or paused.
type Live = Arc<Mutex<Vec<Option<u16>>>>;

fn pick(live: &Live) -> Option<u16> {
    let ports: Vec<u16> = live.lock().unwrap().iter().flatten().copied().collect();
    (!ports.is_empty()).then(|| ports[rand::rng().random_range(0..ports.len())])
}

fn url(port: u16, path: &str) -> String {
    format!("http://127.0.0.1:{port}{path}")
}

fn run_id(run: usize) -> String {
    format!("run-{run}")
}

fn line(run: usize, i: usize) -> String {
    format!("run {run} line {i}")
}

/// Answers other than success, by status (`0`: no answer), with a sample.
#[derive(Default)]
struct Refusals(Mutex<BTreeMap<u16, (usize, String)>>);

impl Refusals {
    fn note(&self, status: u16, what: String) {
        let mut seen = self.0.lock().unwrap();
        let entry = seen.entry(status).or_insert((0, what));
        entry.0 += 1;
    }

    fn of(&self, status: u16) -> Option<(usize, String)> {
        self.0.lock().unwrap().get(&status).cloned()
    }
}

/// Sends `request` to random live nodes until one answers with success.
async fn until_accepted(
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
async fn produce(
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
struct Seen {
    lines: Vec<String>,
    /// Frames whose `after` was not the previous cursor plus their lines.
    jumps: Vec<String>,
    truncated: usize,
    errors: Vec<String>,
    sessions: usize,
    completed: bool,
}

/// Where a browser tab opens its stream.
#[derive(Clone, Copy)]
enum Tab {
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
async fn view(client: reqwest::Client, live: Live, run: usize, deadline: Instant, tab: Tab) -> Seen {
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
async fn stored(client: &reqwest::Client, live: &Live, run: usize, lines: usize) -> Vec<String> {
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
const END_RULES: &str = "[edge.log_stream]\nunknown_run_grace_seconds = 600.0\nfinish_grace_seconds = 2.0\n";

fn start(server: &RedisServer, name: &str) -> Proc {
    tokio::task::block_in_place(|| common::cluster::node_on_defaults(&server.url(), name, END_RULES))
}

/// Redis, three nodes, and what the clients of a life share.
struct Cluster {
    client: reqwest::Client,
    server: RedisServer,
    nodes: Vec<Proc>,
    live: Live,
    refusals: Arc<Refusals>,
    /// The logs of the processes restarted nodes replaced.
    retired: Vec<String>,
}

impl Cluster {
    fn start() -> Self {
        let client = common::http().connect_timeout(Duration::from_secs(2)).build().unwrap();
        let server = RedisServer::start();
        let nodes: Vec<Proc> = NAMES.iter().map(|name| start(&server, name)).collect();
        let live: Live = Arc::new(Mutex::new(nodes.iter().map(|n| Some(n.port)).collect()));
        Self { client, server, nodes, live, refusals: Arc::default(), retired: Vec::new() }
    }

    /// Posts `run`'s first lines, then keeps posting in a task until `stop`.
    async fn producer(&self, run: usize, stop: &CancellationToken) -> tokio::task::JoinHandle<usize> {
        let once = CancellationToken::new();
        once.cancel();
        let (client, live, refusals) = (self.client.clone(), self.live.clone(), self.refusals.clone());
        let first = produce(client.clone(), live.clone(), refusals.clone(), run, 0, once).await;
        tokio::spawn(produce(client, live, refusals, run, first, stop.clone()))
    }

    fn viewer(&self, run: usize, until: Instant, tab: Tab) -> tokio::task::JoinHandle<Seen> {
        tokio::spawn(view(self.client.clone(), self.live.clone(), run, until, tab))
    }

    /// Node `i` is down (or paused) for the clients, or back.
    fn mark(&self, i: usize, up: bool) {
        self.live.lock().unwrap()[i] = up.then_some(self.nodes[i].port);
    }

    /// Node `i` ends (`KILL` or `TERM`) and, after a moment, starts again.
    async fn bounce(&mut self, i: usize, signal: &str) {
        self.mark(i, false);
        self.nodes[i].signal(signal);
        tokio::task::block_in_place(|| self.nodes[i].wait_exit());
        tokio::time::sleep(Duration::from_millis(rand::rng().random_range(500..2_000))).await;
        let name = self.nodes[i].name.clone();
        let old = std::mem::replace(&mut self.nodes[i], start(&self.server, &name));
        self.retired.push(format!("--- {name} (replaced):\n{}", old.log_text()));
        self.mark(i, true);
    }

    /// Node `i` is stopped (SIGSTOP) past its leases, then continues.
    async fn pause(&mut self, i: usize) {
        self.mark(i, false);
        self.nodes[i].signal("STOP");
        tokio::time::sleep(PAUSE).await;
        self.nodes[i].signal("CONT");
        self.mark(i, true);
    }

    /// One round of chaos on a random node; it is back when this returns.
    async fn chaos(&mut self, kind: Chaos) {
        let i = rand::rng().random_range(0..self.nodes.len());
        let name = if matches!(kind, Chaos::RedisKill) { "redis" } else { &self.nodes[i].name };
        eprintln!("chaos: {kind:?} {name}");
        match kind {
            Chaos::Kill => self.bounce(i, "KILL").await,
            Chaos::Term => self.bounce(i, "TERM").await,
            Chaos::Pause => self.pause(i).await,
            Chaos::RedisKill => {
                self.server.stop();
                tokio::time::sleep(REDIS_DOWN).await;
                tokio::task::block_in_place(|| self.server.restart());
            }
        }
    }

    /// Index of the node that holds `run`'s queue now.
    async fn holder_of(&self, run: usize) -> usize {
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
    async fn finish(
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

/// One life of `rounds` rounds of chaos; what went wrong, if anything.
async fn life(rounds: usize) -> Result<String, String> {
    let mut cluster = Cluster::start();
    let stop = CancellationToken::new();
    let mut producers = Vec::new();
    for run in 0..RUNS {
        producers.push(cluster.producer(run, &stop).await);
    }
    let until = Instant::now() + PATIENCE + Duration::from_secs(60 * rounds as u64);
    // Half the tabs reload every few seconds, half stay where they are.
    let tab = |run: usize| if run.is_multiple_of(2) { Tab::Roaming } else { Tab::Sticky };
    let viewers = (0..RUNS).map(|run| (run, cluster.viewer(run, until, tab(run)))).collect();
    let mut kinds: Vec<Chaos> = Vec::new();
    while kinds.len() < rounds {
        let mut turn = KINDS.to_vec();
        if rounds > KINDS.len() {
            rand::seq::SliceRandom::shuffle(turn.as_mut_slice(), &mut rand::rng());
        }
        kinds.extend(turn);
    }
    kinds.truncate(rounds);
    for kind in kinds {
        tokio::time::sleep(Duration::from_millis(rand::rng().random_range(2_000..6_000))).await;
        cluster.chaos(kind).await;
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    cluster.finish(stop, producers, viewers).await
}

/// `[a-b, …]` of consecutive numbers.
fn blocks(numbers: &[usize]) -> String {
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
fn tail(log: &str) -> String {
    let lines: Vec<&str> = log.lines().collect();
    let from = lines.len().saturating_sub(40).max(1);
    let head = lines.first().copied().unwrap_or_default();
    format!("{head}\n{}", lines.get(from..).unwrap_or_default().join("\n"))
}

fn from_env(name: &str) -> Option<usize> {
    std::env::var(name).ok().and_then(|v| v.parse().ok())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_viewer_sees_every_stored_line_once_through_kills_pauses_handoffs_and_a_redis_restart() {
    let rounds = from_env("TAILRACE_CHAOS_ROUNDS").unwrap_or(KINDS.len());
    let lives = from_env("TAILRACE_CHAOS_LIVES").unwrap_or(1);
    let mut failed = Vec::new();
    for number in 0..lives {
        eprintln!("life {number}");
        match life(rounds).await {
            Ok(summary) => eprintln!("life {number} of {rounds} rounds: {summary}"),
            Err(problems) => {
                eprintln!("life {number} of {rounds} rounds failed: {problems}");
                failed.push(problems);
            }
        }
    }
    assert!(failed.is_empty(), "{} of {lives} lives failed; the first:\n{}", failed.len(), failed[0]);
}

/// The transition under the gap, on purpose: a viewer stays on a node that
/// is paused past its membership TTL (the run's owner lets its tailer's
/// subscription go: the node is not a member), lines keep coming while the
/// owner checkpoints and trims its stream past what the tailer had, and
/// then the owner dies (its successor attaches the stored subscription
/// again, from a position the queue no longer holds). The viewer must end
/// on `complete` with every stored line, once, in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_viewer_on_a_node_paused_past_its_membership_misses_no_line_when_the_owner_dies() {
    let mut cluster = Cluster::start();
    let stop = CancellationToken::new();
    let run = 0;
    let owner = cluster.holder_of(run).await;
    let watcher = (owner + 1) % NAMES.len();
    let producer = cluster.producer(run, &stop).await;
    let until = Instant::now() + 2 * PATIENCE;
    let viewer = cluster.viewer(run, until, Tab::On(cluster.nodes[watcher].port));
    let watching = async {
        while cluster.nodes[watcher].metric_sum("tailrace_edge_connections", None).await != Some(1.0) {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    tokio::time::timeout(PATIENCE, watching).await.expect("the viewer attached");
    tokio::time::sleep(Duration::from_secs(1)).await;
    cluster.pause(watcher).await;
    // Past a checkpoint write and a trim of the owner's stream.
    tokio::time::sleep(Duration::from_secs(16)).await;
    cluster.bounce(owner, "KILL").await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    let outcome = cluster.finish(stop, vec![producer], vec![(run, viewer)]).await;
    match outcome {
        Ok(summary) => eprintln!("{summary}"),
        Err(problems) => panic!("{problems}"),
    }
}
