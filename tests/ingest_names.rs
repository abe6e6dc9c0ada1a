//! Names of any valid length go end to end (issue 9, item 4): ingest, run
//! status, the SSE stream, the download and the listings; and failures
//! inside the server reach clients as an incident id, never as its error
//! text.

use tailrace_testkit as common;

use std::sync::atomic::Ordering;

use common::logs::*;
use percent_encoding::{NON_ALPHANUMERIC, utf8_percent_encode};
use serde_json::Value;

fn escaped(name: &str) -> String {
    utf8_percent_encode(name, NON_ALPHANUMERIC).to_string()
}

async fn json(response: reqwest::Response) -> (u16, Value) {
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or(Value::Null))
}

/// A 29-character CJK pipeline name (261 bytes once percent-encoded), a
/// 300-character run id, and the longest run ids there are (1024 bytes,
/// one of them 3072 once percent-encoded).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_longest_names_round_trip_through_ingest_sse_and_download() {
    let server = LogServer::start(quick_settings()).await;
    let fqn = format!("{}甲", "数据管道".repeat(7));
    assert_eq!(fqn.chars().count(), 29);
    let colons = format!("scheduled__{}", ":".repeat(1013));
    let three_hundred = format!("run-{}", "é".repeat(148));
    assert_eq!(three_hundred.chars().count(), 152);
    let three_hundred = format!("{three_hundred}{}", "x".repeat(148));
    assert_eq!(three_hundred.chars().count(), 300);
    for run in [colons.as_str(), &"r".repeat(1024), &three_hundred] {
        assert!(run.len() == 1024 || run.chars().count() == 300);
        let (f, r) = (escaped(&fqn), escaped(run));
        server.lines(&f, &r, "one\ntwo\n").await;
        server.state(&f, &r, "success").await;
        server.archived(&fqn, run, 2).await;

        let mut sse = server.open(&f, &r, None).await;
        assert_eq!(sse.status, 200);
        let events = sse.rest().await;
        assert_eq!(text(&events), "one\ntwo");
        let end = events.last().unwrap();
        assert_eq!((end["eventType"].as_str(), end["reason"].as_str()), (Some("complete"), Some("runFinished")));
        assert!(events.iter().all(|e| e["runId"] == run), "{events:?}");

        let url = server.url(&format!("/api/v1/services/ingestionPipelines/logs/{f}/last/download"));
        let download = server.client.get(url).query(&[("runId", run)]).send().await.unwrap();
        assert_eq!(download.status(), 200);
        assert_eq!(download.text().await.unwrap(), "one\ntwo\n");
    }
    let (status, listing) = json(server.client.get(server.url("/api/v1/logs/pipelines")).send().await.unwrap()).await;
    assert_eq!((status, listing["pipelines"].clone()), (200, serde_json::json!([fqn])));
    let runs_url = server.url(&format!("/api/v1/logs/{}/runs", escaped(&fqn)));
    let (status, runs) = json(server.client.get(runs_url).send().await.unwrap()).await;
    assert_eq!(status, 200);
    let mut ids: Vec<&str> = runs["runs"].as_array().unwrap().iter().filter_map(|r| r["runId"].as_str()).collect();
    ids.sort();
    let mut expected = vec!["r".repeat(1024), colons.clone(), three_hundred.clone()];
    expected.sort();
    assert_eq!(ids, expected);
    // Past 1024 bytes a name is invalid: a clear 400, not a 503.
    let (status, problem) = json(server.post("svc.etl", &"r".repeat(1025), "x").await).await;
    assert_eq!(status, 400, "{problem}");
    assert!(problem["message"].as_str().unwrap().contains("longer than 1024 bytes"), "{problem}");
}

/// The store fails: the paginated endpoint answers 503 and the stream an
/// `error` event, both with an incident id and without the store's error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn store_failures_reach_clients_as_an_incident_id_only() {
    let server = LogServer::start(quick_settings()).await;
    server.lines("svc.etl", "r-1", "x").await;
    server.archived("svc.etl", "r-1", 1).await;
    server.store.fail_info.store(1_000_000, Ordering::SeqCst);
    let url = server.url("/api/v1/services/ingestionPipelines/logs/svc.etl/last?runId=r-1");
    let (status, problem) = json(server.client.get(url).send().await.unwrap()).await;
    assert_eq!(status, 503, "{problem}");
    let message = problem["message"].as_str().unwrap();
    assert!(message.contains("(incident ") && !message.contains("injected"), "{message}");

    let mut sse = server.open("svc.etl", "r-1", None).await;
    let events = sse.rest().await;
    let last = events.last().unwrap();
    assert_eq!(last["eventType"], "error", "{events:?}");
    let message = last["message"].as_str().unwrap();
    assert!(message.contains("(incident ") && !message.contains("injected"), "{message}");
}
