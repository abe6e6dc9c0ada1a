//! Links that fail without closing, on real `tailrace node` processes on
//! the defaults: a node's Redis behind the fault proxy of
//! `testkit/src/tcp_proxy.rs`.
//!
//! - A Redis that answers in 2 s instead of a fraction of a millisecond:
//!   producers wait (slower `202`s), not errors; no lease is lost while
//!   renewals still fit the TTL (no queue's fence moves); nothing is lost.
//! - A node whose packets to Redis are dropped (its peers still reach
//!   Redis): its queues move to the others once its leases lapse, viewers
//!   elsewhere keep every line, and once the path heals it takes its share
//!   back without a restart.
//! - Nodes whose links to each other drop every packet while Redis is
//!   reachable: nobody is evicted, no queue moves, and the viewers whose
//!   lines crossed the links get every line once, in order, once they heal.
//! - A live node whose peer port is refused (a firewall that rejects it):
//!   the others take it for dead and evict it (a false positive); it gives
//!   its queues up, joins again and takes its share back without a restart,
//!   and no viewer misses or repeats a line, though the subscriptions of
//!   its viewers were let go and served again by agents whose checkpoints
//!   had passed them.

use tailrace_testkit as common;

use std::time::Duration;

use std::collections::BTreeMap;

use common::cluster::{Proc, fences, node_on_defaults, node_on_defaults_linked, redis, settle};
use common::logs::Sse;
use common::redis_server::RedisServer;
use common::tcp_proxy::{Fault, PeerLink, TcpProxy};
use tokio::time::Instant;

const FQN: &str = "svc.links";
const LINES: usize = 20;
/// `[queues] count`, the default.
const QUEUES: u32 = 8;
/// A run without a status stays open however long a fault holds its lines.
const OPEN_RUNS: &str = "[edge.log_stream]\nunknown_run_grace_seconds = 600.0\nfinish_grace_seconds = 1.0\n";

/// Posts lines `from..from + LINES` of `run` through `node`, retrying what
/// is refused for now (the ids store a retry once); how long it took and
/// how many times it was refused.
async fn post(node: &Proc, run: &str, from: usize) -> (Duration, usize) {
    let body: String = (from..from + LINES)
        .map(|i| format!("{}\n", serde_json::json!({ "line": format!("line {i}"), "id": format!("l-{i}") })))
        .collect();
    let url = node.url(&format!("/api/v1/logs/{FQN}/runs/{run}/lines"));
    let client = common::http().timeout(Duration::from_secs(30)).build().unwrap();
    let (started, deadline) = (Instant::now(), Instant::now() + Duration::from_secs(90));
    let mut refused = 0;
    loop {
        let sent = client.post(&url).header("content-type", "application/x-ndjson").body(body.clone()).send().await;
        match sent {
            Ok(answer) if answer.status() == 202 => return (started.elapsed(), refused),
            Ok(answer) => {
                let status = answer.status();
                let text = answer.text().await.unwrap_or_default();
                assert_eq!(status, 503, "only a retryable refusal: {text}");
            }
            Err(error) => assert!(error.is_timeout() || error.is_connect(), "{error}"),
        }
        refused += 1;
        assert!(Instant::now() < deadline, "no post of {run} was accepted");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The run's stored log as `node` serves it, once it holds `lines` lines.
async fn stored(node: &Proc, run: &str, lines: usize) -> Vec<String> {
    let url = node.url(&format!("/api/v1/services/ingestionPipelines/logs/{FQN}/last/download?runId={run}"));
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let text = common::http_client().get(&url).send().await.unwrap().text().await.unwrap();
        let log: Vec<String> = text.lines().map(str::to_string).collect();
        if log.len() >= lines || Instant::now() >= deadline {
            return log;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn expected(lines: usize) -> Vec<String> {
    (0..lines).map(|i| format!("line {i}")).collect()
}

/// Node `name` on the defaults, reaching its Redis through `proxy`.
fn node_behind(proxy: &TcpProxy, name: &str) -> Proc {
    let redis = format!("redis://127.0.0.1:{}", proxy.port);
    tokio::task::block_in_place(|| node_on_defaults(&redis, name, OPEN_RUNS))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_redis_slows_producers_down_but_loses_no_lease_and_no_line() {
    let server = RedisServer::start();
    let proxy = TcpProxy::start(server.port).await;
    let node = node_behind(&proxy, "n1");
    settle(&node, &[("n1", QUEUES as usize)]).await;
    let mut conn = redis(&server).await;
    let before = fences(&mut conn).await;
    let mut posted = 0;
    for _ in 0..3 {
        post(&node, "slow", posted).await;
        posted += LINES;
    }
    // Each way 1 s: every command answers 2 s after it was sent.
    proxy.set(Fault::Delay(Duration::from_secs(1)));
    // Past a whole lease TTL (8 s) of renewals through the slow link.
    let slow_until = Instant::now() + Duration::from_secs(12);
    let (mut slowest, mut refusals) = (Duration::ZERO, 0);
    while Instant::now() < slow_until {
        let (took, refused) = post(&node, "slow", posted).await;
        (slowest, refusals) = (slowest.max(took), refusals + refused);
        posted += LINES;
    }
    proxy.set(Fault::Pass);
    assert!(slowest >= Duration::from_secs(2), "the producers waited for the slow Redis ({slowest:?})");
    assert_eq!(refusals, 0, "a slow Redis is back-pressure, not an error");
    for _ in 0..2 {
        post(&node, "slow", posted).await;
        posted += LINES;
    }
    assert_eq!(stored(&node, "slow", posted).await, expected(posted), "every acknowledged line, once");
    let after = fences(&mut conn).await;
    let warnings: Vec<String> = node.log_text().lines().filter(|l| l.contains("WARN")).map(str::to_string).collect();
    assert_eq!(before[..], after[..], "no lease was lost or granted again:\n{}", warnings.join("\n"));
    let held = settle(&node, &[("n1", QUEUES as usize)]).await;
    assert!(held.values().all(|(holder, _)| holder == "n1"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_cut_from_redis_gives_its_queues_up_and_takes_its_share_back_when_the_path_heals() {
    let server = RedisServer::start();
    let proxy = TcpProxy::start(server.port).await;
    let cut_off = node_behind(&proxy, "n1");
    let other = tokio::task::block_in_place(|| node_on_defaults(&server.url(), "n2", OPEN_RUNS));
    let half = QUEUES as usize / 2;
    let held = settle(&other, &[("n1", half), ("n2", half)]).await;
    // A run the node about to be cut off pulls, watched and written on the other.
    let mapper = tailrace::queue::QueueMapper::new(QUEUES);
    let run = (0..100)
        .map(|i| format!("run-{i}"))
        .find(|run| {
            let queue = mapper.queue_for(&tailrace::archive::RunKey::new(FQN, run).unwrap().stream());
            held[&u64::from(queue.0)].0 == "n1"
        })
        .unwrap();
    let mut posted = 0;
    post(&other, &run, posted).await;
    posted += LINES;
    other.wait_stored(FQN, &run).await;
    let stream = other.url(&format!("/api/v1/services/ingestionPipelines/logs/{FQN}/stream/{run}"));
    let mut viewer = Sse::open(&common::http_client(), &stream).await;
    let mut seen: Vec<String> = Vec::new();
    let mut read_to = async |seen: &mut Vec<String>, total: usize| {
        while seen.len() < total {
            let event = viewer.event_within(Duration::from_secs(90)).await.expect("the stream goes on");
            assert_eq!(event["eventType"], "logs", "{event}");
            assert_eq!(event["truncated"], false, "{event}");
            let text = event["logs"].as_str().unwrap();
            seen.extend(text.split('\n').filter(|l| !l.is_empty()).map(str::to_string));
        }
    };
    read_to(&mut seen, posted).await;

    proxy.set(Fault::Drop);
    // Its leases lapse and the other node takes every queue.
    settle(&other, &[("n2", QUEUES as usize)]).await;
    for _ in 0..3 {
        post(&other, &run, posted).await;
        posted += LINES;
    }
    read_to(&mut seen, posted).await;

    proxy.set(Fault::Pass);
    // Back without a restart: it takes its share again.
    settle(&other, &[("n1", half), ("n2", half)]).await;
    let live = common::http_client().get(cut_off.url("/healthz")).send().await.unwrap();
    assert_eq!(live.status(), 200, "the cut-off node kept running");
    for _ in 0..3 {
        post(&other, &run, posted).await;
        posted += LINES;
    }
    read_to(&mut seen, posted).await;
    assert_eq!(seen, expected(posted), "the viewer saw every line once, in order, through the cut");
    assert_eq!(stored(&other, &run, posted).await, expected(posted), "the store holds every line once");
}

/// A run whose queue `node` holds in `held`.
fn run_pulled_by(held: &BTreeMap<u64, (String, u64)>, node: &str) -> String {
    let mapper = tailrace::queue::QueueMapper::new(QUEUES);
    (0..1000)
        .map(|i| format!("run-{i}"))
        .find(|run| {
            let queue = mapper.queue_for(&tailrace::archive::RunKey::new(FQN, run).unwrap().stream());
            held[&u64::from(queue.0)].0 == node
        })
        .unwrap()
}

/// One viewer of one run and the lines it saw.
struct Viewer {
    run: String,
    sse: Sse,
    seen: Vec<String>,
}

impl Viewer {
    async fn open(node: &Proc, run: &str) -> Self {
        node.wait_stored(FQN, run).await;
        let stream = node.url(&format!("/api/v1/services/ingestionPipelines/logs/{FQN}/stream/{run}"));
        Self { run: run.to_string(), sse: Sse::open(&common::http_client(), &stream).await, seen: Vec::new() }
    }

    /// Reads until it saw `total` lines; none may be skipped.
    async fn read_to(&mut self, total: usize) {
        while self.seen.len() < total {
            let event = self.sse.event_within(Duration::from_secs(90)).await.expect("the stream goes on");
            assert_eq!(event["eventType"], "logs", "{}: {event}", self.run);
            assert_eq!(event["truncated"], false, "{}: {event}", self.run);
            let text = event["logs"].as_str().unwrap();
            self.seen.extend(text.split('\n').filter(|l| !l.is_empty()).map(str::to_string));
        }
        assert_eq!(self.seen, expected(total), "{}: every line once, in order", self.run);
    }
}

/// Two nodes on the defaults, each dialed by the other through `links`,
/// settled half and half; a run pulled by each, watched (and written) on
/// the other node, so that its lines cross the links.
async fn two_linked_nodes(server: &RedisServer, links: &[PeerLink; 2]) -> ([Proc; 2], Vec<(usize, Viewer)>) {
    let url = server.url();
    let nodes = tokio::task::block_in_place(|| {
        [
            node_on_defaults_linked(&url, "n1", &links[0].cluster, OPEN_RUNS),
            node_on_defaults_linked(&url, "n2", &links[1].cluster, OPEN_RUNS),
        ]
    });
    let half = QUEUES as usize / 2;
    let held = settle(&nodes[0], &[("n1", half), ("n2", half)]).await;
    let mut viewers = Vec::new();
    for (puller, watcher) in [(0, 1), (1, 0)] {
        let run = run_pulled_by(&held, &nodes[puller].name);
        post(&nodes[watcher], &run, 0).await;
        let mut viewer = Viewer::open(&nodes[watcher], &run).await;
        viewer.read_to(LINES).await;
        viewers.push((watcher, viewer));
    }
    (nodes, viewers)
}

/// Posts the next batch of every viewer's run through its watching node.
async fn post_all(nodes: &[Proc; 2], viewers: &[(usize, Viewer)], posted: &mut usize) {
    for (watcher, viewer) in viewers {
        post(&nodes[*watcher], &viewer.run, *posted).await;
    }
    *posted += LINES;
}

async fn evictions(nodes: &[Proc; 2]) -> f64 {
    let mut evicted = 0.0;
    for node in nodes {
        evicted += node.metric_sum("tailrace_nodes_evicted_total", None).await.expect("the node answers /metrics");
    }
    evicted
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_cut_from_each_other_but_not_from_redis_keep_their_queues_and_every_viewer_stays_exact() {
    let server = RedisServer::start();
    let links = [PeerLink::start().await, PeerLink::start().await];
    let (nodes, mut viewers) = two_linked_nodes(&server, &links).await;
    let held = settle(&nodes[0], &[("n1", QUEUES as usize / 2), ("n2", QUEUES as usize / 2)]).await;
    let mut posted = LINES;
    for link in &links {
        link.set(Fault::Drop);
    }
    // Past a whole lease TTL (8 s) without a byte between the nodes.
    let cut_until = Instant::now() + Duration::from_secs(12);
    while Instant::now() < cut_until {
        post_all(&nodes, &viewers, &mut posted).await;
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    for link in &links {
        link.mend();
    }
    post_all(&nodes, &viewers, &mut posted).await;
    for (_, viewer) in &mut viewers {
        viewer.read_to(posted).await;
    }
    assert_eq!(evictions(&nodes).await, 0.0, "a silent link proves nobody dead");
    let after = settle(&nodes[0], &[("n1", QUEUES as usize / 2), ("n2", QUEUES as usize / 2)]).await;
    assert_eq!(after, held, "no queue moved: both nodes kept their leases through Redis");
    for (watcher, viewer) in &viewers {
        assert_eq!(stored(&nodes[*watcher], &viewer.run, posted).await, expected(posted), "{}", viewer.run);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_live_node_whose_peer_port_is_refused_is_evicted_and_comes_back_without_a_lost_or_doubled_line() {
    let server = RedisServer::start();
    let links = [PeerLink::start().await, PeerLink::start().await];
    let (nodes, mut viewers) = two_linked_nodes(&server, &links).await;
    let mut posted = LINES;
    // n1's peer port now refuses every dial; n2's takes them again at once,
    // but what was open between them closes (as a firewall's reset does).
    assert!(links[0].reject().await + links[1].reset().await > 0, "the nodes were linked through the proxies");
    let deadline = Instant::now() + Duration::from_secs(30);
    while evictions(&nodes).await == 0.0 {
        assert!(Instant::now() < deadline, "a refused dial evicts the peer");
        post_all(&nodes, &viewers, &mut posted).await;
    }
    for _ in 0..10 {
        post_all(&nodes, &viewers, &mut posted).await;
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    links[0].mend();
    let half = QUEUES as usize / 2;
    settle(&nodes[0], &[("n1", half), ("n2", half)]).await;
    for node in &nodes {
        let live = common::http_client().get(node.url("/healthz")).send().await.unwrap();
        assert_eq!(live.status(), 200, "{} kept running", node.name);
    }
    for _ in 0..3 {
        post_all(&nodes, &viewers, &mut posted).await;
    }
    for (_, viewer) in &mut viewers {
        viewer.read_to(posted).await;
    }
    for (watcher, viewer) in &viewers {
        assert_eq!(stored(&nodes[*watcher], &viewer.run, posted).await, expected(posted), "{}", viewer.run);
    }
}
