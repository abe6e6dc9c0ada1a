//! Links that fail without closing, on real `tailrace node` processes on
//! the defaults: a node's Redis behind the fault proxy of
//! `tests/common/tcp_proxy.rs`.
//!
//! - A Redis that answers in 2 s instead of a fraction of a millisecond:
//!   producers wait (slower `202`s), not errors; no lease is lost while
//!   renewals still fit the TTL (no queue's fence moves); nothing is lost.
//! - A node whose packets to Redis are dropped (its peers still reach
//!   Redis): its queues move to the others once its leases lapse, viewers
//!   elsewhere keep every line, and once the path heals it takes its share
//!   back without a restart.

mod common;

use std::time::Duration;

use common::cluster::{Proc, fences, node_on_defaults, redis, settle};
use common::logs::Sse;
use common::redis_server::RedisServer;
use common::tcp_proxy::{Fault, TcpProxy};
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_redis_slows_producers_down_but_loses_no_lease_and_no_line() {
    let server = RedisServer::start();
    let proxy = TcpProxy::start(server.port).await;
    let node =
        tokio::task::block_in_place(|| node_on_defaults(&format!("redis://127.0.0.1:{}", proxy.port), "n1", OPEN_RUNS));
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
    let cut_off =
        tokio::task::block_in_place(|| node_on_defaults(&format!("redis://127.0.0.1:{}", proxy.port), "n1", OPEN_RUNS));
    let other = tokio::task::block_in_place(|| node_on_defaults(&server.url(), "n2", OPEN_RUNS));
    let half = QUEUES as usize / 2;
    let held = settle(&other, &[("n1", half), ("n2", half)]).await;
    // A run the node about to be cut off pulls, watched and written on the other.
    let mapper = tailrace::QueueMapper::new(QUEUES);
    let run = (0..100)
        .map(|i| format!("run-{i}"))
        .find(|run| {
            let queue = mapper.queue_for(&tailrace::RunKey::new(FQN, run).unwrap().stream());
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
