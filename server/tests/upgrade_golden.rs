//! The upgrade promise on what earlier releases left on disk: a copy of
//! each data directory in `tests/golden/` (see its README) is opened by
//! today's `tailrace serve`, which must serve every line, the finished run
//! as finished, and go on taking lines.
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
async fn download(node: &ServeNode, run: &str) -> Option<String> {
    let path = format!("/api/v1/services/ingestionPipelines/logs/golden.pipe/last/download?runId={run}");
    let answer = common::http_client().get(node.url(&path)).send().await.unwrap();
    if answer.status() == 404 {
        return None;
    }
    assert_eq!(answer.status(), 200, "{run}");
    Some(answer.text().await.unwrap())
}

/// The lines of `run` a viewer's stream sent before `complete` (a run that
/// finished a moment ago keeps its grace for late lines: 10 s).
async fn streamed(node: &ServeNode, run: &str) -> String {
    let path = format!("/api/v1/services/ingestionPipelines/logs/golden.pipe/stream/{run}");
    let request = common::http_client().get(node.url(&path)).send();
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_data_directory_of_release_0_1_0_is_served_whole() {
    let mut node = ServeNode::new("");
    std::fs::create_dir_all(node.data_dir()).unwrap();
    common::copy_tree(&std::path::Path::new(GOLDEN).join("0.1.0-file"), &node.data_dir());
    node.start();

    // run-a was archived and finished; run-b was only in a queue file the
    // crash left open: both whole, in order, once.
    assert_eq!(download(&node, "run-a").await, Some(run_a()));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let got = download(&node, "run-b").await.unwrap_or_default();
        if got == RUN_B {
            break;
        }
        assert!(RUN_B.starts_with(&got), "run-b so far: {got:?}");
        assert!(tokio::time::Instant::now() < deadline, "run-b was not recovered: {got:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(streamed(&node, "run-a").await, run_a());

    // And the old run goes on: a line and a status from today's build.
    let client = common::http_client();
    let runs = node.url("/api/v1/logs/golden.pipe/runs/run-b");
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
    assert_eq!(streamed(&node, "run-b").await, format!("{RUN_B}B four\n"));
    node.stop();
}
