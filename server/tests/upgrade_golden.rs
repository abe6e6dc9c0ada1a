//! The upgrade promise on what earlier releases left on disk and in Redis:
//! a copy of each data directory in `tests/golden/` (see its README) is
//! opened by today's `tailrace serve`, and a Redis restored from its
//! append-only files is served by today's `tailrace node`; each must serve
//! every line, the finished run as finished, and go on taking lines.
//!
//! A new golden folder is made with the release it records: `tailrace
//! serve --data-dir D` on the defaults; 300 text lines to
//! `golden.pipe/run-a` and its status `success`; three NDJSON lines to
//! `golden.pipe/run-b`; `kill -9` at once; D copied here as it is.

use tailrace_testkit as common;

use std::time::Duration;

use common::life::ServeNode;

const GOLDEN: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/golden");
const RUN_B: &str = "B one\nB two \u{1b}[31mred\u{1b}[0m\nB three\n";

fn run_a() -> String {
    (1..=300).map(|i| format!("A line {i}\n")).collect()
}

/// The whole log of `run`, as a user downloads it (none while the store
/// has no line of it: 404).
async fn download(base: &str, run: &str) -> Option<String> {
    let path = format!("/api/v1/services/ingestionPipelines/logs/golden.pipe/last/download?runId={run}");
    let answer = common::http_client().get(format!("{base}{path}")).send().await.unwrap();
    if answer.status() == 404 {
        return None;
    }
    assert_eq!(answer.status(), 200, "{run}");
    Some(answer.text().await.unwrap())
}

/// The lines of `run` a viewer's stream sent before `complete` (a run that
/// finished a moment ago keeps its grace for late lines: 10 s).
async fn streamed(base: &str, run: &str) -> String {
    let path = format!("/api/v1/services/ingestionPipelines/logs/golden.pipe/stream/{run}");
    let request = common::http_client().get(format!("{base}{path}")).send();
    let body = tokio::time::timeout(Duration::from_secs(30), async move { request.await.unwrap().text().await })
        .await
        .expect("the stream of a finished run ends")
        .unwrap();
    let (mut lines, mut last) = (String::new(), None);
    for data in body.lines().filter_map(|l| l.strip_prefix("data: ")) {
        let event: serde_json::Value = serde_json::from_str(data).unwrap();
        if let Some(logs) = event["logs"].as_str().filter(|l| !l.is_empty()) {
            lines.push_str(logs);
            lines.push('\n');
        }
        last = event["eventType"].as_str().map(str::to_string);
    }
    assert_eq!(last.as_deref(), Some("complete"), "{run}: {body}");
    lines
}

/// What a node of today's build on release 0.1.0's data must serve: run-a
/// (finished) and run-b whole, in order, once, and run-b goes on.
async fn served_whole(base: &str) {
    // run-a was archived and finished; run-b was only in a queue file the
    // crash left open: both whole, in order, once.
    assert_eq!(download(base, "run-a").await, Some(run_a()));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let got = download(base, "run-b").await.unwrap_or_default();
        if got == RUN_B {
            break;
        }
        assert!(RUN_B.starts_with(&got), "run-b so far: {got:?}");
        assert!(tokio::time::Instant::now() < deadline, "run-b was not recovered: {got:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(streamed(base, "run-a").await, run_a());

    // And the old run goes on: a line and a status from today's build.
    let client = common::http_client();
    let runs = format!("{base}/api/v1/logs/golden.pipe/runs/run-b");
    let added = client.post(format!("{runs}/lines")).body("B four").send().await.unwrap();
    assert_eq!(added.status(), 202);
    let status = client
        .put(format!("{runs}/status"))
        .header("content-type", "application/json")
        .body(r#"{"state":"success"}"#)
        .send()
        .await
        .unwrap();
    assert!(status.status().is_success(), "{}", status.status());
    assert_eq!(streamed(base, "run-b").await, format!("{RUN_B}B four\n"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_data_directory_of_release_0_1_0_is_served_whole() {
    let mut node = ServeNode::new("");
    std::fs::create_dir_all(node.data_dir()).unwrap();
    common::copy_tree(&std::path::Path::new(GOLDEN).join("0.1.0-file"), &node.data_dir());
    node.start();

    served_whole(&node.url("")).await;
    node.stop();
}

/// The same runs as release 0.1.0's `tailrace node` left them in Redis
/// (queue streams, fences, leases, checkpoints, membership, the Redis run
/// log store), killed with `kill -9`: a node of today's build on that Redis
/// serves them whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_of_release_0_1_0_is_served_whole() {
    let mut server = common::redis_server::RedisServer::start();
    let golden = std::path::Path::new(GOLDEN).join("0.1.0-redis");
    tokio::task::block_in_place(|| server.restart_with(|dir| common::copy_tree(&golden, dir)));
    let node = tokio::task::block_in_place(|| common::cluster::node_on_defaults(&server.url(), "n1", ""));
    served_whole(&node.url("")).await;
}
