//! The log path's request/response endpoints over real HTTP: ingest and
//! its validation, run states, the paginated and download endpoints,
//! listings and the runs stream (resumed by cursor, across two nodes),
//! bearer-token auth, the viewer page, search and run diffs.

use tailrace_testkit as common;

use common::logs::*;
use serde_json::{Value, json};
use tailrace::config::{AuthOptions, EdgeOptions, LogStreamSettings, RunsStreamSettings, Scope, TokenEntry};

async fn body(response: reqwest::Response) -> (u16, Value) {
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or(Value::Null))
}

async fn last(server: &LogServer, query: &str) -> (u16, Value) {
    let url = server.url(&format!("/api/v1/services/ingestionPipelines/logs/svc.etl/last?{query}"));
    body(server.client.get(url).send().await.unwrap()).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn text_lines_are_accepted_whole_and_archived_in_order() {
    let server = LogServer::start(quick_settings()).await;
    let response = server.post("svc.etl", "r-1", "one\r\ntwo\nthree\n").await;
    assert_eq!(body(response).await, (202, json!({ "accepted": 3 })));
    server.archived("svc.etl", "r-1", 3).await;
    let (status, page) = last(&server, "runId=r-1").await;
    assert_eq!((status, page), (200, json!({ "logs": "one\ntwo\nthree", "total": "3" })));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ndjson_lines_keep_their_producer_ids() {
    let server = LogServer::start(quick_settings()).await;
    let payload = "{\"line\": \"a\", \"id\": \"evt-1\"}\n\n{\"line\": \"b\"}\n";
    let response = server
        .client
        .post(server.url("/api/v1/logs/svc.etl/runs/r-1/lines"))
        .header("content-type", "application/x-ndjson")
        .body(payload)
        .send()
        .await
        .unwrap();
    assert_eq!(body(response).await, (202, json!({ "accepted": 2 })));
    server.archived("svc.etl", "r-1", 2).await;
    assert_eq!(last(&server, "runId=r-1").await.1["logs"], "a\nb");
    let bad = server
        .client
        .post(server.url("/api/v1/logs/svc.etl/runs/r-1/lines"))
        .header("content-type", "application/x-ndjson")
        .body("{\"line\": \"c\"}\nnot json\n")
        .send()
        .await
        .unwrap();
    let (status, problem) = body(bad).await;
    assert_eq!(status, 400);
    assert!(problem["message"].as_str().unwrap().starts_with("line 2: "), "{problem}");
    assert_eq!(last(&server, "runId=r-1").await.1["total"], "2", "a refused request enqueues nothing");
}

/// A producer that did not hear the answer posts again with the same ids:
/// the run log holds its lines once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retried_ndjson_post_with_producer_ids_is_stored_once() {
    let server = LogServer::start(quick_settings()).await;
    let post = |payload: &'static str| {
        server
            .client
            .post(server.url("/api/v1/logs/svc.etl/runs/r-9/lines"))
            .header("content-type", "application/x-ndjson")
            .body(payload)
            .send()
    };
    let first = "{\"line\": \"a\", \"id\": \"p-1\"}\n{\"line\": \"b\", \"id\": \"p-2\"}\n";
    assert_eq!(body(post(first).await.unwrap()).await.0, 202);
    assert_eq!(body(post(first).await.unwrap()).await.0, 202, "the retry is accepted too");
    assert_eq!(body(post("{\"line\": \"c\", \"id\": \"p-3\"}\n").await.unwrap()).await.0, 202);
    server.archived("svc.etl", "r-9", 3).await;
    assert_eq!(last(&server, "runId=r-9").await.1["logs"], "a\nb\nc");
    // Plain text has no ids: the same body twice is two batches.
    for _ in 0..2 {
        let response =
            server.client.post(server.url("/api/v1/logs/svc.etl/runs/r-10/lines")).body("x\n").send().await.unwrap();
        assert_eq!(body(response).await.0, 202);
    }
    server.archived("svc.etl", "r-10", 2).await;
    assert_eq!(last(&server, "runId=r-10").await.1["logs"], "x\nx");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_ingest_requests_get_clear_4xx_errors() {
    let options = EdgeOptions {
        max_body_bytes: 1024,
        max_lines_per_request: 3,
        log_stream: quick_settings(),
        ..EdgeOptions::default()
    };
    let server = LogServer::start_with(options, common::quick_config()).await;
    let cases: [(&str, Vec<u8>, u16, &str); 5] = [
        ("/api/v1/logs/svc.etl/runs/r-1/lines", Vec::new(), 400, "no lines in the body"),
        ("/api/v1/logs/svc.etl/runs/r-1/lines", vec![0xff, 0xfe], 400, "the body is not UTF-8"),
        (
            "/api/v1/logs/svc.etl/runs/r-1/lines",
            b"1\n2\n3\n4".to_vec(),
            413,
            "at most 3 (setting edge.max_lines_per_request)",
        ),
        ("/api/v1/logs/a%2Fb/runs/r-1/lines", b"x".to_vec(), 400, "invalid pipeline fqn `a/b`: it contains a slash"),
        ("/api/v1/logs/svc.etl/runs/r%0A1/lines", b"x".to_vec(), 400, "control character"),
    ];
    for (path, payload, status, text) in cases {
        let response = server.client.post(server.url(path)).body(payload).send().await.unwrap();
        let (got, problem) = body(response).await;
        assert_eq!(got, status, "{path}: {problem}");
        assert!(problem["message"].as_str().unwrap().contains(text), "{path}: {problem}");
    }
    // A client that does not normalise `..` (HTTP clients do) still cannot
    // climb out of the store.
    let raw = raw_post(&server.base, "/api/v1/logs/svc.etl/runs/%2E%2E/lines", "x").await;
    assert!(raw.starts_with("HTTP/1.1 400") && raw.contains("invalid run id `..`"), "{raw}");
    let huge = server.post("svc.etl", "r-1", &"x".repeat(2048)).await;
    assert_eq!(huge.status(), 413, "body past edge.max_body_bytes");
    assert!(!server.store_has_pipeline("a").await && !server.store_has_pipeline("svc.etl").await, "nothing stored");
}

async fn raw_post(base: &str, path: &str, body: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let address = base.trim_start_matches("http://");
    let mut socket = tokio::net::TcpStream::connect(address).await.unwrap();
    let request = format!(
        "POST {path} HTTP/1.1\r\nhost: {address}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    socket.write_all(request.as_bytes()).await.unwrap();
    let mut response = Vec::new();
    socket.read_to_end(&mut response).await.unwrap();
    String::from_utf8_lossy(&response).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_states_are_accepted_in_any_case_and_unknown_ones_refused() {
    let server = LogServer::start(quick_settings()).await;
    for state in ["queued", "RUNNING", "partialSuccess", "Success", "failed", "stopped"] {
        server.state("svc.etl", "r-1", state).await;
    }
    let response = server
        .client
        .put(server.url("/api/v1/logs/svc.etl/runs/r-1/status"))
        .json(&json!({ "state": "done" }))
        .send()
        .await
        .unwrap();
    let (status, problem) = body(response).await;
    assert_eq!(status, 400);
    assert_eq!(
        problem["message"],
        "unknown state `done` (one of queued, running, success, failed, partialSuccess, stopped)"
    );
    let runs = body(server.client.get(server.url("/api/v1/logs/svc.etl/runs")).send().await.unwrap()).await.1;
    assert_eq!(runs["runs"][0]["state"], "stopped");
}

/// 38-42: pages walk forward without repeating a line, pick up appended
/// lines, resume from a previous cursor, and read garbage as the start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_paginated_endpoint_walks_the_log() {
    let server = LogServer::start(quick_settings()).await;
    server.lines("svc.etl", "r-1", "one\ntwo\nthree\nfour\nfive").await;
    server.archived("svc.etl", "r-1", 5).await;
    let (_, first) = last(&server, "runId=r-1&limit=3").await;
    assert_eq!(first, json!({ "logs": "one\ntwo\nthree", "after": "3", "total": "5" }));
    let (_, second) = last(&server, "runId=r-1&limit=3&after=3").await;
    assert_eq!(second, json!({ "logs": "four\nfive", "total": "5" }));
    let (_, empty) = last(&server, "runId=r-1&after=5").await;
    assert_eq!(empty, json!({ "logs": "", "total": "5" }));
    server.lines("svc.etl", "r-1", "six").await;
    server.archived("svc.etl", "r-1", 6).await;
    assert_eq!(last(&server, "runId=r-1&after=5").await.1["logs"], "six");
    assert_eq!(last(&server, "runId=r-1&after=not-a-number&limit=1").await.1["logs"], "one");
    // Without runId: the newest run.
    server.lines("svc.etl", "r-2", "newer").await;
    server.archived("svc.etl", "r-2", 1).await;
    assert_eq!(last(&server, "").await.1["logs"], "newer");
    assert_eq!(last(&server, "runId=nope").await.0, 404);
    let unknown = server.client.get(server.url("/api/v1/services/ingestionPipelines/logs/nope/last")).send().await;
    assert_eq!(unknown.unwrap().status(), 404);
}

/// The download endpoint returns the whole log, byte for byte.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_download_is_the_whole_log_byte_for_byte() {
    let options = EdgeOptions { max_page_lines: 7, log_stream: quick_settings(), ..EdgeOptions::default() };
    let server = LogServer::start_with(options, common::quick_config()).await;
    let mut expected = String::new();
    for batch in 0..5 {
        let lines: Vec<String> = (0..9).map(|i| format!("batch {batch} line {i} ✓ \"quoted\"")).collect();
        server.lines("svc.etl", "r-1", &lines.join("\n")).await;
        for line in lines {
            expected.push_str(&line);
            expected.push('\n');
        }
    }
    server.archived("svc.etl", "r-1", 45).await;
    let url = server.url("/api/v1/services/ingestionPipelines/logs/svc.etl/last/download?runId=r-1");
    let response = server.client.get(url).send().await.unwrap();
    assert_eq!(response.headers()["content-type"], "text/plain; charset=utf-8");
    assert!(response.headers()["content-disposition"].to_str().unwrap().contains("svc.etl_r-1.log"));
    assert_eq!(response.text().await.unwrap(), expected);
}

/// The largest offset a client can send is read as past the end, by every
/// endpoint that takes one: an empty answer, never a failed request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_largest_offset_reads_past_the_end() {
    let server = LogServer::start(quick_settings()).await;
    server.lines("svc.edge", "r-1", "only").await;
    let after = u64::MAX;
    for path in [
        format!("/api/v1/services/ingestionPipelines/logs/svc.edge/last?runId=r-1&after={after}"),
        format!("/api/v1/logs/svc.edge/runs/r-1/times?after={after}"),
        format!("/api/v1/logs/svc.edge/runs/r-1/search?q=only&after={after}"),
    ] {
        let (status, answer) = body(server.client.get(server.url(&path)).send().await.unwrap()).await;
        assert_eq!(status, 200, "{path}: {answer}");
        let empty = answer["logs"] == "" || answer["marks"] == json!([]) || answer["matches"] == json!([]);
        assert!(empty, "{path}: {answer}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listings_name_pipelines_and_runs_newest_first() {
    let server = LogServer::start(quick_settings()).await;
    // A listing shows a run once the archiver stored its first line.
    for (fqn, run) in [("b.pipe", "r-1"), ("a.pipe", "old"), ("a.pipe", "new")] {
        server.lines(fqn, run, "x").await;
        server.archived(fqn, run, 1).await;
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    let pipelines = body(server.client.get(server.url("/api/v1/logs/pipelines")).send().await.unwrap()).await.1;
    assert_eq!(pipelines, json!({ "pipelines": ["a.pipe", "b.pipe"] }));
    let runs = body(server.client.get(server.url("/api/v1/logs/a.pipe/runs")).send().await.unwrap()).await.1;
    let ids: Vec<&str> = runs["runs"].as_array().unwrap().iter().map(|r| r["runId"].as_str().unwrap()).collect();
    assert_eq!(ids, ["new", "old"]);
}

/// Reads the runs stream until a `run` event of `run` in `state`; the
/// events read, that one last.
async fn until_run(stream: &mut Sse, run: &str, state: &str) -> Vec<Value> {
    let mut seen = Vec::new();
    loop {
        let event = stream.event().await.unwrap_or_else(|| panic!("the stream ended after {seen:?}"));
        let found = event["eventType"] == "run" && event["runId"] == run && event["state"] == state;
        seen.push(event);
        if found {
            return seen;
        }
    }
}

/// The runs the events name, each once, in the order first named.
fn run_ids(events: &[Value]) -> Vec<&str> {
    let mut ids: Vec<&str> = Vec::new();
    for id in events.iter().map(|e| e["runId"].as_str().unwrap()) {
        if !ids.contains(&id) {
            ids.push(id);
        }
    }
    ids
}

/// `…/runs/stream`: the pipeline's runs as they start and change state;
/// resumed with a cursor, the runs active since it (and only those); an
/// unreadable cursor gets them all; past `max_pipelines` an `error`; the
/// store is read only while someone watches.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_runs_stream_follows_a_pipelines_runs_and_resumes_by_cursor() {
    let runs_stream = RunsStreamSettings { resume_overlap_seconds: 0.0, max_pipelines: 1, ..quick_runs_stream() };
    let options = EdgeOptions { log_stream: quick_settings(), runs_stream, ..EdgeOptions::default() };
    let server = LogServer::start_with(options, common::quick_config()).await;
    server.lines("svc.live", "r-1", "one").await;
    server.state("svc.live", "r-1", "success").await;
    let url = server.url("/api/v1/logs/svc.live/runs/stream");
    let mut stream = Sse::open(&server.client, &url).await;
    assert_eq!((stream.status, stream.content_type.as_str()), (200, "text/event-stream"));
    let first = stream.event().await.unwrap();
    assert_eq!(
        (&first["eventType"], &first["pipeline"], &first["runId"], &first["state"], &first["lines"]),
        (&json!("run"), &json!("svc.live"), &json!("r-1"), &json!("success"), &json!(1)),
        "{first}"
    );
    let other = Sse::open(&server.client, &server.url("/api/v1/logs/svc.other/runs/stream")).await.rest().await;
    assert_eq!(other.len(), 1, "{other:?}");
    assert_eq!(other[0]["eventType"], "error");
    assert!(other[0]["message"].as_str().unwrap().contains("maximum number of pipelines"), "{other:?}");

    // A run that starts, then fails, while the stream is open.
    server.lines("svc.live", "r-2", "two").await;
    server.state("svc.live", "r-2", "running").await;
    until_run(&mut stream, "r-2", "running").await;
    server.state("svc.live", "r-2", "failed").await;
    let failed = until_run(&mut stream, "r-2", "failed").await.pop().unwrap();
    drop(stream);

    // Resumed: what changed since the cursor, oldest first, nothing older
    // (a run seen while it changes may come once per state).
    server.lines("svc.live", "r-3", "three").await;
    server.state("svc.live", "r-3", "running").await;
    let cursor = failed["after"].as_str().unwrap();
    let mut resumed = Sse::open(&server.client, &format!("{url}?after={cursor}")).await;
    let events = until_run(&mut resumed, "r-3", "running").await;
    assert_eq!(run_ids(&events), ["r-2", "r-3"], "{events:?}");
    assert_eq!(events[0], failed, "the run at the cursor, again (as it is)");
    assert!(resumed.quiet_for(std::time::Duration::from_millis(300)).await, "nothing else changed");
    drop(resumed);
    let mut all = Sse::open(&server.client, &format!("{url}?after=not-a-cursor")).await;
    let events = until_run(&mut all, "r-3", "running").await;
    assert_eq!(run_ids(&events), ["r-1", "r-2", "r-3"], "an unreadable cursor: every run");
    drop(all);

    // Nobody watches: the store is not read any more.
    let unwatched = async {
        while server.edge.watched_pipelines() > 0 {
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
    };
    tokio::time::timeout(std::time::Duration::from_secs(5), unwatched).await.expect("the feed ends");
    let reads = server.store.listings.load(std::sync::atomic::Ordering::SeqCst);
    tokio::time::sleep(std::time::Duration::from_millis(250)).await;
    assert_eq!(server.store.listings.load(std::sync::atomic::Ordering::SeqCst), reads, "5 polls' time, no read");
    let bad = server.client.get(server.url("/api/v1/logs/svc%0Alive/runs/stream")).send().await.unwrap();
    let (status, problem) = body(bad).await;
    assert_eq!(status, 400);
    assert!(problem["message"].as_str().unwrap().contains("control character"), "{problem}");
}

/// A quiet runs stream gets heartbeats, and ends after
/// `max_stream_seconds` with `complete` and its cursor, as a log stream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_runs_stream_ends_at_its_lifetime_with_its_cursor() {
    let server =
        LogServer::start(LogStreamSettings { max_stream_seconds: 0.5, heartbeat_seconds: 0.1, ..quick_settings() })
            .await;
    server.lines("svc.life", "r-1", "x").await;
    server.archived("svc.life", "r-1", 1).await;
    let mut stream = Sse::open(&server.client, &server.url("/api/v1/logs/svc.life/runs/stream")).await;
    let run = stream.event().await.unwrap();
    assert_eq!((&run["runId"], &run["state"]), (&json!("r-1"), &Value::Null), "{run}");
    assert_eq!(stream.frame_within(FRAME_WAIT).await.as_deref(), Some(": heartbeat"));
    let message = "Stream lifetime limit reached. Reconnect with the last cursor to resume.";
    let end = json!({ "eventType": "complete", "after": run["after"], "reason": "maxDuration", "message": message });
    assert_eq!(stream.rest().await, [end]);
}

/// The runs stream reads the run log store, so a node sees the runs any
/// node of the cluster stored: here two nodes share one store, the stream
/// is open on the second before the pipeline has a run, and the run is
/// started and finished through the first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_node_streams_the_runs_started_through_the_first() {
    let first = LogServer::start(quick_settings()).await;
    let options =
        EdgeOptions { log_stream: quick_settings(), runs_stream: quick_runs_stream(), ..EdgeOptions::default() };
    let second = first.beside(options).await;
    let mut stream = Sse::open(&second.client, &second.url("/api/v1/logs/svc.shared/runs/stream")).await;
    assert_eq!(stream.status, 200);
    first.lines("svc.shared", "r-1", "started on the first node").await;
    first.state("svc.shared", "r-1", "running").await;
    until_run(&mut stream, "r-1", "running").await;
    first.state("svc.shared", "r-1", "success").await;
    let done = until_run(&mut stream, "r-1", "success").await.pop().unwrap();
    assert_eq!(done["lines"], 1, "{done}");
    assert_eq!((first.edge.watched_pipelines(), second.edge.watched_pipelines()), (0, 1));
}

/// Media types are read case-insensitively, anything but text/plain and
/// NDJSON is refused with 415, an NDJSON line must be an object, and every
/// refusal is a JSON body, the body limit's and a bad `limit` included.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn content_types_limits_and_pages_get_their_documented_answers() {
    let options = EdgeOptions { max_body_bytes: 1024, log_stream: quick_settings(), ..EdgeOptions::default() };
    let server = LogServer::start_with(options, common::quick_config()).await;
    let post = |content_type: &'static str, payload: String| {
        server
            .client
            .post(server.url("/api/v1/logs/svc.etl/runs/r-1/lines"))
            .header("content-type", content_type)
            .body(payload)
            .send()
    };
    let upper = post("Application/X-NDJSON; charset=utf-8", "{\"line\": \"framed\"}\n".into()).await.unwrap();
    assert_eq!(body(upper).await, (202, json!({ "accepted": 1 })));
    server.archived("svc.etl", "r-1", 1).await;
    assert_eq!(last(&server, "runId=r-1").await.1["logs"], "framed", "stored as NDJSON, not as raw text");
    for refused in ["application/json", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x"] {
        let (status, problem) = body(post(refused, "x".into()).await.unwrap()).await;
        assert_eq!(status, 415, "{refused}: {problem}");
        assert!(problem["message"].as_str().unwrap().contains("text/plain or application/x-ndjson"), "{problem}");
    }
    let (status, problem) = body(post("application/x-ndjson", "[\"a\"]\n".into()).await.unwrap()).await;
    assert_eq!(status, 400, "{problem}");
    assert!(problem["message"].as_str().unwrap().contains("line 1"), "{problem}");
    let (status, problem) = body(post("text/plain", "x".repeat(2048)).await.unwrap()).await;
    assert_eq!((status, problem["code"].as_u64()), (413, Some(413)), "{problem}");
    assert!(problem["message"].as_str().unwrap().contains("edge.max_body_bytes"), "{problem}");
    for bad in ["limit=0", "limit=-1"] {
        let (status, problem) = last(&server, &format!("runId=r-1&{bad}")).await;
        assert_eq!((status, problem["code"].as_u64()), (400, Some(400)), "{bad}: {problem}");
    }
    assert_eq!(last(&server, "runId=r-1&limit=1").await.1["logs"], "framed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bearer_tokens_guard_reads_and_writes() {
    let token = |t: &str, scopes: Vec<Scope>| TokenEntry { token: t.into(), scopes };
    let auth = AuthOptions {
        tokens: vec![
            token("reader-token-0123456789", vec![Scope::Read]),
            token("writer-token-0123456789", vec![Scope::Read, Scope::Write]),
        ],
    };
    let options = EdgeOptions { auth, log_stream: quick_settings(), ..EdgeOptions::default() };
    let server = LogServer::start_with(options, common::quick_config()).await;
    let post = |token: Option<&'static str>| {
        let mut request = server.client.post(server.url("/api/v1/logs/svc.etl/runs/r-1/lines")).body("x");
        if let Some(token) = token {
            request = request.bearer_auth(token);
        }
        request.send()
    };
    let missing = post(None).await.unwrap();
    assert_eq!((missing.status().as_u16(), missing.headers()["www-authenticate"].to_str().unwrap()), (401, "Bearer"));
    assert_eq!(post(Some("wrong-token-0123456789")).await.unwrap().status(), 401);
    let forbidden = post(Some("reader-token-0123456789")).await.unwrap();
    assert_eq!(forbidden.status(), 403);
    assert!(forbidden.text().await.unwrap().contains("lacks the `write` scope"));
    assert_eq!(post(Some("writer-token-0123456789")).await.unwrap().status(), 202);
    // The scheme is case-insensitive.
    let lower = server
        .client
        .post(server.url("/api/v1/logs/svc.etl/runs/r-1/lines"))
        .header("authorization", "bearer writer-token-0123456789")
        .body("y")
        .send()
        .await
        .unwrap();
    assert_eq!(lower.status(), 202);
    let stream = server.stream_url("svc.etl", "r-1", None);
    assert_eq!(server.client.get(&stream).send().await.unwrap().status(), 401, "before the stream opens");
    let mut sse = Sse::open_with(&server.client, &stream, "reader-token-0123456789").await;
    assert_eq!(sse.status, 200);
    // One replay page ("x\ny") when the store already holds both lines, or
    // "x" first.
    let first = sse.event().await.unwrap();
    assert!(first["logs"].as_str().unwrap().starts_with('x'), "{first}");
    // The page and the probes stay open.
    assert_eq!(server.client.get(server.url("/")).send().await.unwrap().status(), 200);
}

#[test]
fn without_tokens_the_edge_stays_on_loopback() {
    let open = AuthOptions::default();
    assert!(tailrace::edge::check_listen("127.0.0.1:8585".parse().unwrap(), &open).is_ok());
    let refused = tailrace::edge::check_listen("0.0.0.0:8585".parse().unwrap(), &open).unwrap_err();
    assert!(refused.contains("refusing to listen on 0.0.0.0:8585 without [edge.auth] tokens"), "{refused}");
    let short = AuthOptions { tokens: vec![TokenEntry { token: "short".into(), scopes: vec![Scope::Read] }] };
    assert!(tailrace::edge::check_listen("0.0.0.0:8585".parse().unwrap(), &short).is_err());
    let blank = AuthOptions { tokens: vec![TokenEntry { token: " ".repeat(20), scopes: vec![Scope::Read] }] };
    let refused = tailrace::edge::check_listen("0.0.0.0:8585".parse().unwrap(), &blank).unwrap_err();
    assert!(refused.contains("at least 16 characters"), "{refused}");
    let unscoped =
        AuthOptions { tokens: vec![TokenEntry { token: "a-long-enough-token-0123".into(), scopes: vec![] }] };
    let refused = tailrace::edge::check_listen("0.0.0.0:8585".parse().unwrap(), &unscoped).unwrap_err();
    assert!(refused.contains("at least one scope"), "{refused}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_viewer_page_is_served_by_the_binary() {
    let server = LogServer::start(quick_settings()).await;
    let page = server.client.get(server.url("/")).send().await.unwrap();
    assert!(page.headers()["content-type"].to_str().unwrap().starts_with("text/html"));
    let html = page.text().await.unwrap();
    assert!(html.contains("id=\"log\"") && html.contains("/stream/"), "the page follows the SSE stream");
}

/// The search endpoint: bounded per request (`edge.max_search_scan_lines`
/// scanned, `limit` matches), `next` continues where it stopped, and
/// following it finds every match once, in order; text is matched as a
/// viewer sees it (no escape sequences), case-insensitively unless asked;
/// the presets find errors and group markers; a bad query is a 400 that
/// says why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn search_is_bounded_per_request_and_its_cursor_finds_every_match_once() {
    let options = EdgeOptions { max_search_scan_lines: 250, log_stream: quick_settings(), ..EdgeOptions::default() };
    let server = LogServer::start_with(options, common::quick_config()).await;
    let lines: Vec<String> = (1..=1_000)
        .map(|i| match i {
            _ if i % 50 == 0 => format!("line {i} \x1b[31mNeedle\x1b[0m here"),
            701 => "error: the build broke".to_string(),
            301 => "::group::Tests".to_string(),
            _ => format!("line {i}"),
        })
        .collect();
    server.lines("svc.find", "r-1", &lines.join("\n")).await;
    server.archived("svc.find", "r-1", 1_000).await;
    let search = |query: String| {
        let url = server.url(&format!("/api/v1/logs/svc.find/runs/r-1/search?{query}"));
        let client = server.client.clone();
        async move { body(client.get(url).send().await.unwrap()).await }
    };

    // Four requests of at most 250 lines each find all 20 matches.
    let (mut found, mut after, mut requests) = (Vec::new(), 0u64, 0);
    loop {
        let (status, answer) = search(format!("q=needle&after={after}")).await;
        assert_eq!(status, 200, "{answer}");
        assert!(answer["scanned"].as_u64().unwrap() <= 250, "{answer}");
        assert_eq!(answer["total"], 1_000);
        requests += 1;
        for m in answer["matches"].as_array().unwrap() {
            found.push(m["line"].as_u64().unwrap());
            assert!(m["text"].as_str().unwrap().contains("Needle"), "the stored line: {m}");
        }
        match answer["next"].as_str() {
            Some(next) => after = next.parse().unwrap(),
            None => break,
        }
    }
    assert_eq!(found, (1..=20).map(|k| k * 50).collect::<Vec<u64>>(), "every match once, in order");
    assert_eq!(requests, 4);

    // `limit` caps the matches; `next` continues after the last one.
    let (_, answer) = search("q=needle&limit=3".into()).await;
    let lines: Vec<u64> = answer["matches"].as_array().unwrap().iter().map(|m| m["line"].as_u64().unwrap()).collect();
    assert_eq!(lines, [50, 100, 150]);
    let (_, rest) = search(format!("q=needle&limit=3&after={}", answer["next"].as_str().unwrap())).await;
    assert_eq!(rest["matches"][0]["line"], 200);

    // Case, escapes, regular expressions and the presets.
    assert_eq!(search("q=needle&case=1".into()).await.1["matches"], json!([]));
    assert_eq!(search("q=31mNeedle".into()).await.1["matches"], json!([]), "escape sequences are not text");
    let (_, answer) = search("q=line%20(49|51)%24&regex=1".into()).await;
    let lines: Vec<u64> = answer["matches"].as_array().unwrap().iter().map(|m| m["line"].as_u64().unwrap()).collect();
    assert_eq!(lines, [49, 51]);
    let error = search("level=error&after=500".into()).await.1;
    assert_eq!(error["matches"][0]["line"], 701);
    assert_eq!(search("groups=1&after=250".into()).await.1["matches"][0]["line"], 301);
    let (status, answer) = search("q=(&regex=1".into()).await;
    assert_eq!(status, 400);
    assert!(answer["message"].as_str().unwrap().contains("invalid regular expression"), "{answer}");
    let (status, answer) = search("q=a&level=error".into()).await;
    assert_eq!(status, 400, "{answer}");
}

async fn diff(server: &LogServer, run: &str, query: &str) -> (u16, Value) {
    let url = server.url(&format!("/api/v1/logs/svc.diff/runs/{run}/diff?{query}"));
    body(server.client.get(url).send().await.unwrap()).await
}

/// Stores `lines` as run `run` of `svc.diff` and waits until they are
/// stored (so that runs are created in the order of the calls), then sets
/// its state.
async fn stored_run(server: &LogServer, run: &str, lines: &[String], state: &str) {
    server.lines("svc.diff", run, &lines.join("\n")).await;
    server.archived("svc.diff", run, lines.len() as u64).await;
    server.state("svc.diff", run, state).await;
}

fn owned(lines: &[&str]) -> Vec<String> {
    lines.iter().map(|l| l.to_string()).collect()
}

/// The run diff: what changes from run to run (each rule: timestamps,
/// durations, UUIDs, hex ids, ports, temporary paths; escape sequences)
/// compares equal, what else changed comes as a hunk with both runs' line
/// numbers and the stored text, `last-success` is the newest successful
/// run created before this one, and the refusals say why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn diff_compares_a_run_with_the_last_success_after_the_normalisation_rules() {
    let server = LogServer::start(quick_settings()).await;
    let good = owned(&[
        "2026-12-07T10:00:00.123Z build started",
        "[10:00:01] step 1 took 1.23s",
        "job 123e4567-e89b-12d3-a456-426614174000 queued",
        "checked out 9f86d08",
        "listening on 127.0.0.1:43521",
        "wrote /tmp/.tmpA1b2/out.log",
        "step 2 ok",
        "step 3 ok",
        "done",
    ]);
    let bad = owned(&[
        "2026-12-08T11:22:33.456Z build started",
        "[11:22:34] step 1 took 450ms",
        "job 00000000-1111-2222-3333-444444444444 queued",
        "checked out 0c1d2e3",
        "listening on 127.0.0.1:51234",
        "\x1b[2mwrote /tmp/.tmpZz99/out.log\x1b[0m",
        "step 2 ok",
        "\x1b[31merror: step 3 failed\x1b[0m",
        "done",
        "exit code 1",
    ]);
    stored_run(&server, "r-0", &owned(&["an older success"]), "success").await;
    stored_run(&server, "r-1", &good, "success").await;
    stored_run(&server, "r-2", &bad, "failed").await;
    stored_run(&server, "r-3", &owned(&["a later success"]), "success").await;

    let (status, answer) = diff(&server, "r-2", "against=last-success&context=1").await;
    assert_eq!(status, 200, "{answer}");
    let expected = json!({
        "run": "r-2",
        "against": "r-1",
        "identical": false,
        "rules": ["timestamp", "uuid", "duration", "hex", "port", "temp-path"],
        "oldLines": 9,
        "newLines": 10,
        "hunks": [{
            "old": [7, 3],
            "new": [7, 4],
            "lines": [
                { "op": " ", "old": 7, "new": 7, "text": "step 2 ok" },
                { "op": "-", "old": 8, "text": "step 3 ok" },
                { "op": "+", "new": 8, "text": "\x1b[31merror: step 3 failed\x1b[0m" },
                { "op": " ", "old": 9, "new": 9, "text": "done" },
                { "op": "+", "new": 10, "text": "exit code 1" },
            ],
        }],
    });
    assert_eq!(answer, expected);
    // `last-success` is the default; three lines of context by default.
    let (_, default) = diff(&server, "r-2", "").await;
    assert_eq!((default["against"].clone(), default["hunks"][0]["old"].clone()), (json!("r-1"), json!([5, 5])));
    // A run against itself, or against a run of the same lines.
    let (_, same) = diff(&server, "r-2", "against=r-2").await;
    assert_eq!((same["identical"].clone(), same["hunks"].clone()), (json!(true), json!([])));

    for (run, query, status, message) in [
        ("r-0", "against=last-success", 404, "pipeline `svc.diff` has no successful run before `r-0`"),
        ("r-2", "against=nope", 404, "pipeline `svc.diff` has no run `nope`"),
        ("nope", "", 404, "pipeline `svc.diff` has no run `nope`"),
        ("r-2", "context=many", 400, "context"),
    ] {
        let (got, problem) = diff(&server, run, query).await;
        assert_eq!(got, status, "{run}?{query}: {problem}");
        assert!(problem["message"].as_str().unwrap().contains(message), "{run}?{query}: {problem}");
    }
}

/// A diff answer holds at most `edge.max_diff_hunks` hunks and
/// `edge.max_page_lines` rows (a long change is cut into hunks of that
/// many rows); following `next` gives every hunk once, in order, every
/// removed and added line once; a row's text is cut at 1 KiB; a run longer
/// than `edge.max_diff_lines` is refused with a 422 naming the setting.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn diff_answers_are_bounded_and_next_walks_every_hunk_once() {
    let options = EdgeOptions {
        max_diff_hunks: 2,
        max_diff_lines: 100,
        max_page_lines: 20,
        log_stream: quick_settings(),
        ..EdgeOptions::default()
    };
    let server = LogServer::start_with(options, common::quick_config()).await;
    let base: Vec<String> = (1..=60).map(|i| format!("line {i}")).collect();
    let changed: Vec<String> =
        (1..=60).map(|i| if i % 10 == 0 { format!("line {i} changed") } else { format!("line {i}") }).collect();
    let other: Vec<String> = (1..=30).map(|i| format!("other {i}")).collect();
    let big: Vec<String> = (1..=101).map(|i| format!("big {i}")).collect();
    stored_run(&server, "r-1", &base, "success").await;
    stored_run(&server, "r-2", &changed, "failed").await;
    stored_run(&server, "r-3", &other, "failed").await;
    stored_run(&server, "r-4", &big, "failed").await;

    // Walks the diff of `run` against r-1: (answers, hunks, removed old
    // lines, added new lines), each answer checked against the bounds.
    let walk = |run: &'static str| {
        let server = &server;
        async move {
            let (mut after, mut answers, mut hunks) = (None::<String>, 0, 0);
            let (mut removed, mut added) = (Vec::new(), Vec::new());
            loop {
                let query = match &after {
                    Some(after) => format!("against=r-1&after={after}"),
                    None => "against=r-1".to_string(),
                };
                let (status, answer) = diff(server, run, &query).await;
                assert_eq!(status, 200, "{answer}");
                answers += 1;
                let page = answer["hunks"].as_array().unwrap();
                assert!(!page.is_empty() && page.len() <= 2, "{answer}");
                let rows: usize = page.iter().map(|h| h["lines"].as_array().unwrap().len()).sum();
                assert!(rows <= 20, "{rows} rows: {answer}");
                for line in page.iter().flat_map(|h| h["lines"].as_array().unwrap()) {
                    match line["op"].as_str().unwrap() {
                        "-" => removed.push(line["old"].as_u64().unwrap()),
                        "+" => added.push(line["new"].as_u64().unwrap()),
                        _ => {}
                    }
                }
                hunks += page.len();
                match answer["next"].as_str() {
                    Some(next) => after = Some(next.to_string()),
                    None => return (answers, hunks, removed, added),
                }
            }
        }
    };
    let tens: Vec<u64> = (1..=6).map(|k| k * 10).collect();
    assert_eq!(walk("r-2").await, (3, 6, tens.clone(), tens), "six hunks, two an answer");
    let (answers, hunks, removed, added) = walk("r-3").await;
    assert_eq!(removed, (1..=60).collect::<Vec<u64>>(), "every removed line once, in order");
    assert_eq!(added, (1..=30).collect::<Vec<u64>>(), "every added line once, in order");
    assert_eq!((answers, hunks), (5, 5), "90 rows in hunks of at most 20, one an answer");

    // A row's text is the stored line cut at 1 KiB, as a search match's.
    let long: Vec<String> = (1..=60).map(|i| if i == 30 { "é".repeat(1_500) } else { format!("line {i}") }).collect();
    stored_run(&server, "r-5", &long, "failed").await;
    let (_, answer) = diff(&server, "r-5", "against=r-1&context=0").await;
    let added = &answer["hunks"][0]["lines"][1];
    assert_eq!((added["op"].as_str(), added["new"].as_u64()), (Some("+"), Some(30)), "{answer}");
    assert_eq!(added["text"].as_str().unwrap(), "é".repeat(512));

    let (status, problem) = diff(&server, "r-4", "against=r-1").await;
    assert_eq!(status, 422, "{problem}");
    let message = problem["message"].as_str().unwrap();
    assert!(message.contains("run `r-4` has 101 lines") && message.contains("edge.max_diff_lines"), "{message}");
}
