//! `tailrace produce`, `tailrace tail` and `tailrace diff` as a user runs
//! them, against a real edge (and a scripted one for reconnects).

use tailrace_testkit as common;

use std::io::Write;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::{Query, State};
use axum::routing::get;
use common::logs::*;
use tailrace::config::LogStreamSettings;

fn tailrace() -> Command {
    Command::new(env!("CARGO_BIN_EXE_tailrace"))
}

/// `produce` sends stdin's lines and the final status; `tail` prints the
/// run and stops when it finished.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn produce_then_tail_a_run() {
    let server = LogServer::start(quick_settings()).await;
    let base = server.base.clone();
    let produced = tokio::task::spawn_blocking(move || {
        let mut child = tailrace()
            .args(["produce", "--url", &base, "--fqn", "svc.etl", "--run", "run 1", "--status", "success"])
            .stdin(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut stdin = child.stdin.take().unwrap();
        for i in 0..2_500 {
            writeln!(stdin, "line {i}").unwrap();
        }
        drop(stdin);
        child.wait_with_output().unwrap()
    })
    .await
    .unwrap();
    assert!(produced.status.success(), "{}", String::from_utf8_lossy(&produced.stderr));
    assert!(String::from_utf8_lossy(&produced.stderr).contains("2500 lines sent"));
    let base = server.base.clone();
    let tailed = tokio::task::spawn_blocking(move || {
        tailrace().args(["tail", "--url", &base, "--fqn", "svc.etl", "--run", "run 1"]).output().unwrap()
    })
    .await
    .unwrap();
    assert!(tailed.status.success(), "{}", String::from_utf8_lossy(&tailed.stderr));
    let expected: String = (0..2_500).map(|i| format!("line {i}\n")).collect();
    assert_eq!(String::from_utf8(tailed.stdout).unwrap(), expected);
    assert!(String::from_utf8_lossy(&tailed.stderr).contains("run finished"));
}

/// `tail` of a run that finished longer than the grace ago prints its log
/// and exits at once, not after `finish_grace_seconds`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tail_of_a_finished_run_exits_as_soon_as_it_printed_the_log() {
    use tailrace::archive::RunLogStore;
    let settings = LogStreamSettings { finish_grace_seconds: 1.0, poll_seconds: 2.0, ..quick_settings() };
    let server = LogServer::start(settings).await;
    server.lines("svc.etl", "done", "first\nsecond").await;
    server.archived("svc.etl", "done", 2).await;
    server.state("svc.etl", "done", "success").await;
    let key = tailrace::archive::RunKey::new("svc.etl", "done").unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while !server.store.info(&key).await.unwrap().and_then(|i| i.state).is_some_and(|s| s.is_finished()) {
        assert!(tokio::time::Instant::now() < deadline, "the status was never stored");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // The scenario: finished for longer than the grace.
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    let base = server.base.clone();
    let started = std::time::Instant::now();
    let tailed = tokio::task::spawn_blocking(move || {
        tailrace().args(["tail", "--url", &base, "--fqn", "svc.etl", "--run", "done"]).output().unwrap()
    })
    .await
    .unwrap();
    let took = started.elapsed();
    assert!(tailed.status.success(), "{}", String::from_utf8_lossy(&tailed.stderr));
    assert_eq!(String::from_utf8(tailed.stdout).unwrap(), "first\nsecond\n");
    assert!(took < Duration::from_secs(1), "tail took {took:?}");
}

#[derive(Default)]
struct Script {
    /// The `after` of each request, in order.
    seen: Mutex<Vec<Option<String>>>,
}

#[derive(serde::Deserialize)]
struct After {
    after: Option<String>,
}

/// Serves, per connection: two chunks then a close without `complete`; a
/// refusal (503); a truncation reset and its replay, then `complete`.
async fn scripted(State(script): State<Arc<Script>>, Query(query): Query<After>) -> axum::response::Response {
    use axum::response::IntoResponse;
    let n = {
        let mut seen = script.seen.lock().unwrap();
        seen.push(query.after);
        seen.len()
    };
    let frames = match n {
        1 => concat!(
            "data: {\"eventType\":\"logs\",\"runId\":\"r\",\"logs\":\"a\",\"after\":\"1\",\"replay\":false}\n\n",
            ": heartbeat\n\n",
            "data: {\"eventType\":\"logs\",\"runId\":\"r\",\"logs\":\"b\",\"after\":\"2\",\"replay\":false}\n\n",
        ),
        2 => return axum::http::StatusCode::SERVICE_UNAVAILABLE.into_response(),
        _ => concat!(
            "data: {\"eventType\":\"logs\",\"runId\":\"r\",\"logs\":\"\",\"replay\":true,\"truncated\":true}\n\n",
            "data: {\"eventType\":\"logs\",\"runId\":\"r\",\"logs\":\"b\\nc\",\"after\":\"3\",\"replay\":true}\n\n",
            "data: {\"eventType\":\"complete\",\"runId\":\"r\",\"after\":\"3\",\"reason\":\"runFinished\"}\n\n",
        ),
    };
    ([("content-type", "text/event-stream")], frames).into_response()
}

/// A close without `complete` reconnects with the cursor, after a failed
/// attempt; a truncation notice resets the view before the replay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tail_resumes_with_its_cursor_and_resets_on_truncation() {
    let script = Arc::new(Script::default());
    let router = axum::Router::new()
        .route("/api/v1/services/ingestionPipelines/logs/{fqn}/stream/{run}", get(scripted))
        .with_state(script.clone());
    let stop = tokio_util::sync::CancellationToken::new();
    let (bound, _task) = tailrace::edge::serve("127.0.0.1:0".parse().unwrap(), router, stop.clone()).await.unwrap();
    let url = format!("http://{bound}");
    let out = tokio::task::spawn_blocking(move || {
        tailrace()
            .args(["tail", "--url", &url, "--fqn", "p", "--run", "r", "--max-backoff-ms", "300"])
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    stop.cancel();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(
        String::from_utf8(out.stdout).unwrap(),
        "a\nb\n--- the view was reset: replaying what the server holds ---\nb\nc\n"
    );
    let seen = script.seen.lock().unwrap().clone();
    assert_eq!(seen, [None, Some("2".to_string()), Some("2".to_string())]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("reconnecting in"));
}

/// Against nothing, `tail` gives up after its failures, saying how to resume.
#[test]
fn tail_gives_up_after_repeated_failures() {
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let out = tailrace()
        .args(["tail", "--url", &format!("http://127.0.0.1:{port}"), "--fqn", "p", "--run", "r"])
        .args(["--max-failures", "3", "--max-backoff-ms", "250", "--after", "41"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("giving up after 3 failed attempts in a row") && stderr.contains("--after 41"), "{stderr}");
}

/// `diff` prints what changed in a run against the last success before it
/// as a unified diff (timestamps and durations compare equal) and exits 1;
/// 0 with nothing printed for runs that are the same; 2 with the edge's
/// reason for a run it does not know.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn diff_prints_a_unified_diff_against_the_last_success() {
    let server = LogServer::start(quick_settings()).await;
    let runs = [
        ("r-1", "12:00:01 start\nbuild took 1.2s\ntests passed\ndone", "success"),
        ("r-2", "13:10:07 start\nbuild took 980ms\nerror: test x failed\ndone\nexit code 1", "failed"),
    ];
    for (run, lines, state) in runs {
        server.lines("svc.etl", run, lines).await;
        server.archived("svc.etl", run, lines.lines().count() as u64).await;
        server.state("svc.etl", run, state).await;
    }
    let base = server.base.clone();
    let diffed = move |args: &'static [&'static str]| {
        let base = base.clone();
        tokio::task::spawn_blocking(move || {
            tailrace().args(["diff", "--url", &base, "--fqn", "svc.etl"]).args(args).output().unwrap()
        })
    };
    let out = diffed(&["--run", "r-2", "--context", "1"]).await.unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(
        String::from_utf8(out.stdout).unwrap(),
        "--- svc.etl/r-1\n+++ svc.etl/r-2\n@@ -2,3 +2,4 @@\n build took 980ms\n-tests passed\n+error: test x failed\n done\n+exit code 1\n"
    );
    let same = diffed(&["--run", "r-2", "--against", "r-2"]).await.unwrap();
    assert_eq!((same.status.code(), same.stdout.len()), (Some(0), 0), "{}", String::from_utf8_lossy(&same.stderr));
    let unknown = diffed(&["--run", "nope"]).await.unwrap();
    assert_eq!(unknown.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&unknown.stderr);
    assert!(stderr.contains("404") && stderr.contains("pipeline `svc.etl` has no run `nope`"), "{stderr}");
}
