//! The SSE live tail over real HTTP: what viewers of a run see, how they
//! join, resume and end. Scenario numbers refer to OpenMetadata's tests
//! (docs/sse.md lists which apply).

use tailrace_testkit as common;

use std::time::Duration;

use common::logs::*;
use serde_json::Value;
use tailrace::archive::RunLogStore;
use tailrace::config::LogStreamSettings;

// The end frames' texts, as a client reads them (the edge's constants are
// private: these pin the text).
const IDLE_MESSAGE: &str = "No new logs for this run. Reconnect with the last cursor to resume.";
const DURATION_MESSAGE: &str = "Stream lifetime limit reached. Reconnect with the last cursor to resume.";
const BYTES_MESSAGE: &str = "Stream size limit reached. Download the full log to see the rest of this run.";

/// 1, 14: content produced while a viewer watches arrives in order, live,
/// each event carrying the cursor just past it and the run id.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn new_lines_arrive_live_in_order_with_their_cursor() {
    let server = LogServer::start(quick_settings()).await;
    server.lines("svc.etl", "r-1", "setup\n").await;
    let mut sse = server.open("svc.etl", "r-1", None).await;
    assert_eq!((sse.status, sse.content_type.as_str()), (200, "text/event-stream"));
    let first = sse.event().await.unwrap();
    assert_eq!(first["logs"], "setup");
    server.lines("svc.etl", "r-1", "first line\n").await;
    server.lines("svc.etl", "r-1", "second line\nthird line").await;
    let (a, b) = (sse.event().await.unwrap(), sse.event().await.unwrap());
    assert_eq!(
        (a["logs"].as_str(), a["after"].as_str(), a["replay"].as_bool()),
        (Some("first line"), Some("2"), Some(false))
    );
    assert_eq!((b["logs"].as_str(), b["after"].as_str()), (Some("second line\nthird line"), Some("4")));
    assert!([&first, &a, &b].iter().all(|e| e["runId"] == "r-1" && e["eventType"] == "logs"));
}

/// 2, 20: viewers of one run share one subscription, and each sees the
/// same content.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_viewer_of_a_run_shares_one_reader() {
    let server = LogServer::start(quick_settings()).await;
    server.lines("svc.etl", "r-1", "hello").await;
    let mut viewers = Vec::new();
    for _ in 0..3 {
        let mut sse = server.open("svc.etl", "r-1", None).await;
        assert_eq!(sse.event().await.unwrap()["logs"], "hello");
        viewers.push(sse);
    }
    assert_eq!(server.edge.active_runs(), 1);
    let explicit = server.node.subscriptions(&tailrace::archive::RunKey::new("svc.etl", "r-1").unwrap().stream()).await;
    assert_eq!(explicit.unwrap().iter().filter(|s| !s.id.is_implicit()).count(), 1, "one tailer subscription");
    server.lines("svc.etl", "r-1", "shared output").await;
    for sse in &mut viewers {
        let event = sse.event().await.unwrap();
        assert_eq!((event["logs"].as_str(), event["after"].as_str()), (Some("shared output"), Some("2")));
    }
}

/// 3: a late joiner without a cursor gets the whole log first, all of it
/// marked as replay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_joiner_gets_the_log_so_far_as_replay() {
    let server = LogServer::start(quick_settings()).await;
    // However the lines were split into frames (one replay page when the
    // store already holds all three, or a page plus live frames), the
    // first viewer sees all three in order.
    let mut first = server.open_after_lines("svc.etl", "r-1", &["a", "b", "c"]).await;
    assert_eq!(text(&first.lines(3).await), "a\nb\nc");
    let mut late = server.open("svc.etl", "r-1", None).await;
    let seen = late.lines(3).await;
    assert_eq!(text(&seen), "a\nb\nc");
    assert!(seen.iter().all(|e| e["replay"] == true));
}

/// 15, 16, exact resume: a viewer resuming with its cursor gets exactly
/// what it missed; one already up to date gets nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resuming_from_a_cursor_is_exact() {
    let server = LogServer::start(quick_settings()).await;
    let mut watcher = server.open_after_lines("svc.etl", "r-1", &["one"]).await;
    let first = watcher.event().await.unwrap();
    server.lines("svc.etl", "r-1", "two\nthree").await;
    let second = watcher.event().await.unwrap();
    // Disconnect after the first chunk; resume from its cursor.
    let mut resumed = server.open("svc.etl", "r-1", first["after"].as_str()).await;
    let missed = resumed.event().await.unwrap();
    assert_eq!(
        (missed["logs"].as_str(), missed["after"].as_str(), missed["replay"].as_bool()),
        (Some("two\nthree"), Some("3"), Some(true))
    );
    // Up to date: nothing until the next line, which is live.
    let mut current = server.open("svc.etl", "r-1", second["after"].as_str()).await;
    assert!(current.quiet_for(Duration::from_millis(300)).await, "nothing to replay");
    server.lines("svc.etl", "r-1", "four").await;
    for sse in [&mut current, &mut resumed, &mut watcher] {
        let next = sse.event().await.unwrap();
        assert_eq!(
            (next["logs"].as_str(), next["after"].as_str(), next["replay"].as_bool()),
            (Some("four"), Some("4"), Some(false))
        );
    }
}

/// A producer retries a batch the queue already took (its reply was lost,
/// or a Redis master acknowledged it without a replica): the same event
/// ids twice. The store keeps it once; a viewer following live, and one
/// that joins after the store dropped the retry, see it once too, and
/// their cursors stay the store's offsets.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retried_batch_is_shown_once_as_the_store_keeps_it() {
    let server = LogServer::start(quick_settings()).await;
    let batch = |lines: &[&str], id: &str| -> String {
        let line =
            |(i, text): (usize, &&str)| serde_json::json!({ "line": text, "id": format!("{id}-{i}") }).to_string();
        lines.iter().enumerate().map(line).collect::<Vec<_>>().join("\n")
    };
    let post = |body: String| {
        server
            .client
            .post(server.url("/api/v1/logs/svc.etl/runs/r-1/lines"))
            .header("content-type", "application/x-ndjson")
            .body(body)
            .send()
    };
    assert_eq!(post(batch(&["one"], "a")).await.unwrap().status(), 202);
    let mut live = server.open("svc.etl", "r-1", None).await;
    assert_eq!(live.event().await.unwrap()["logs"], "one");
    for _ in 0..2 {
        assert_eq!(post(batch(&["two", "three"], "b")).await.unwrap().status(), 202);
    }
    assert_eq!(post(batch(&["four"], "c")).await.unwrap().status(), 202);
    server.archived("svc.etl", "r-1", 4).await;
    let mut joined = server.open("svc.etl", "r-1", None).await;
    assert_eq!(post(batch(&["two", "three"], "b")).await.unwrap().status(), 202, "once more, after the store saw it");
    assert_eq!(post(batch(&["five"], "d")).await.unwrap().status(), 202);
    let (b, c, d) = (live.event().await.unwrap(), live.event().await.unwrap(), live.event().await.unwrap());
    let seen: Vec<(&str, &str)> =
        [&b, &c, &d].iter().map(|e| (e["logs"].as_str().unwrap(), e["after"].as_str().unwrap())).collect();
    assert_eq!(seen, [("two\nthree", "3"), ("four", "4"), ("five", "5")]);
    let seen = joined.lines(5).await;
    assert_eq!(text(&seen), "one\ntwo\nthree\nfour\nfive");
    assert_eq!(seen.last().unwrap()["after"], "5");
    server.archived("svc.etl", "r-1", 5).await;
    let key = tailrace::archive::RunKey::new("svc.etl", "r-1").unwrap();
    let stored = server.store.read(&key, 0, 100, usize::MAX).await.unwrap();
    assert_eq!(stored, ["one", "two", "three", "four", "five"]);
}

/// A cursor older than the in-memory replay still resumes exactly, from
/// the run log store, in pages (A7: at most `lines_per_read` per frame).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cursor_older_than_the_replay_buffer_resumes_exactly_from_the_store() {
    let settings = LogStreamSettings { max_replay_bytes: 16, lines_per_read: 4, ..quick_settings() };
    let server = LogServer::start(settings).await;
    let mut watcher = server.open_after_lines("svc.etl", "r-1", &["line-0"]).await;
    watcher.event().await.unwrap();
    for i in 1..30 {
        server.lines("svc.etl", "r-1", &format!("line-{i}")).await;
    }
    // Whether it reads them live or, behind the tiny window, from the store.
    let live = watcher.lines(29).await;
    let expected: Vec<String> = (1..30).map(|i| format!("line-{i}")).collect();
    assert_eq!(text(&live), expected.join("\n"));
    server.archived("svc.etl", "r-1", 30).await;
    let mut resumed = server.open("svc.etl", "r-1", Some("3")).await;
    let mut seen = Vec::new();
    while seen.last().is_none_or(|e: &Value| e["after"] != "30") {
        seen.push(resumed.event().await.unwrap());
    }
    let expected: Vec<String> = (3..30).map(|i| format!("line-{i}")).collect();
    assert_eq!(text(&seen), expected.join("\n"), "no gap, no duplicate");
    assert!(seen.iter().all(|e| e["truncated"] == false && e["replay"] == true));
    assert!(seen.iter().all(|e| e["logs"].as_str().unwrap().lines().count() <= 4), "pages of lines_per_read");
    assert!(server.store.reads.load(std::sync::atomic::Ordering::SeqCst) >= 6, "served from the store");
}

/// 4, A3, A9: a cursor beyond the log, once `resume_wait_seconds` passed,
/// gets the truncation notice first, without a cursor, then the replay the
/// tailer holds; never a 400.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cursor_beyond_the_log_gets_the_truncation_notice_then_the_replay() {
    let settings = LogStreamSettings { max_replay_bytes: 8, ..quick_settings() };
    let server = LogServer::start(settings).await;
    server.state("svc.etl", "r-1", "running").await;
    let mut watcher = server.open_after_lines("svc.etl", "r-1", &["a"]).await;
    watcher.event().await.unwrap();
    server.lines("svc.etl", "r-1", "a very long line beyond the replay bytes").await;
    watcher.event().await.unwrap();
    let mut sse = server.open("svc.etl", "r-1", Some("999")).await;
    assert_eq!(sse.status, 200);
    assert_eq!(sse.event().await.unwrap(), notice("r-1"));
    let replay = sse.event().await.unwrap();
    assert_eq!(replay["logs"], "a very long line beyond the replay bytes", "the newest chunk is always kept");
    assert_eq!((replay["after"].as_str(), replay["replay"].as_bool()), (Some("2"), Some(true)));
}

/// The truncation notice: no cursor, no lines.
fn notice(run: &str) -> Value {
    serde_json::json!({"eventType": "logs", "runId": run, "logs": "", "replay": true, "truncated": true})
}

/// 17, 42: on a finished run, a cursor the server cannot read (garbage,
/// another server's) restarts from the beginning: the truncation notice,
/// then every line of the log once, in order, as replay, then `complete`.
/// Never a 400, never an empty log.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreadable_cursor_on_a_finished_run_replays_the_whole_log() {
    let settings = LogStreamSettings { max_replay_bytes: 16, lines_per_read: 3, ..quick_settings() };
    let server = LogServer::start(settings).await;
    let expected: Vec<String> = (0..8).map(|i| format!("line-{i}")).collect();
    for line in &expected {
        server.lines("svc.etl", "r-1", line).await;
    }
    server.state("svc.etl", "r-1", "success").await;
    server.archived("svc.etl", "r-1", 8).await;
    for cursor in ["not-a-cursor", "garbage", "0:17"] {
        let mut sse = server.open("svc.etl", "r-1", Some(cursor)).await;
        assert_eq!(sse.status, 200, "{cursor}");
        let events = sse.rest().await;
        assert_eq!(events[0], notice("r-1"), "{cursor}: the notice comes first");
        let (last, logs) = events[1..].split_last().unwrap();
        assert_eq!(text(logs), expected.join("\n"), "{cursor}: the whole log, once, in order");
        assert!(logs.iter().all(|e| e["replay"] == true && e["truncated"] == false), "{cursor}: {logs:?}");
        assert_eq!(
            *last,
            serde_json::json!({"eventType": "complete", "runId": "r-1", "after": "8", "reason": "runFinished"})
        );
    }
}

/// 42 on a running run: a viewer joining with an unreadable cursor gets
/// the notice, the log so far as replay, then the lines that arrive after
/// it joined, live: each line once, in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreadable_cursor_on_a_running_run_replays_then_follows() {
    let settings = LogStreamSettings { max_replay_bytes: 16, lines_per_read: 2, ..quick_settings() };
    let server = LogServer::start(settings).await;
    server.state("svc.etl", "r-1", "running").await;
    let expected: Vec<String> = (0..10).map(|i| format!("line-{i}")).collect();
    for line in &expected[..5] {
        server.lines("svc.etl", "r-1", line).await;
    }
    server.archived("svc.etl", "r-1", 5).await;
    let mut sse = server.open("svc.etl", "r-1", Some("garbage")).await;
    assert_eq!(sse.status, 200);
    assert_eq!(sse.event().await.unwrap(), notice("r-1"), "the notice comes first");
    for line in &expected[5..] {
        server.lines("svc.etl", "r-1", line).await;
    }
    let events = sse.lines(10).await;
    assert_eq!(text(&events), expected.join("\n"), "every line once, in order");
    for event in &events {
        let after: u64 = event["after"].as_str().unwrap().parse().unwrap();
        assert_eq!(event["replay"], after <= 5, "lines before the join are replay, later ones live: {event}");
    }
    assert!(sse.quiet_for(std::time::Duration::from_millis(300)).await, "nothing twice");
}

/// A viewer waiting on a cursor past the head when the stream completes
/// gets `complete` with its own cursor, not the tailer's: resuming from
/// it must not repeat lines it already has.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_viewer_waiting_past_the_head_completes_with_its_own_cursor() {
    let settings = LogStreamSettings { resume_wait_seconds: 30.0, ..quick_settings() };
    let server = LogServer::start(settings).await;
    let mut watcher = server.open_after_lines("svc.etl", "r-1", &["a\nb\nc"]).await;
    assert_eq!(watcher.lines(3).await.last().unwrap()["after"], "3");
    let mut ahead = server.open("svc.etl", "r-1", Some("5")).await;
    // No status: the unknown grace (1 s) ends the stream while it waits.
    let end = ahead.event().await.unwrap();
    assert_eq!(
        end,
        serde_json::json!({"eventType": "complete", "runId": "r-1", "after": "5", "reason": "runFinished"})
    );
    let end = watcher.event().await.unwrap();
    assert_eq!((end["eventType"].as_str(), end["after"].as_str()), (Some("complete"), Some("3")));
}

/// 5, 23, A3, A6: a finished run that went quiet ends with `runFinished`
/// (no message, the last cursor), and frees its run slot at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_finished_run_that_went_quiet_completes() {
    for state in ["success", "FAILED", "partialSuccess", "stopped"] {
        let server = LogServer::start(quick_settings()).await;
        let mut sse = server.open_after_lines("svc.etl", "r-1", &["done soon"]).await;
        sse.event().await.unwrap();
        server.state("svc.etl", "r-1", state).await;
        let rest = sse.rest().await;
        assert_eq!(
            rest,
            [serde_json::json!({"eventType": "complete", "runId": "r-1", "after": "1", "reason": "runFinished"})],
            "{state}"
        );
        assert_eq!(server.edge.active_runs(), 0);
        assert!(common::eventually(Duration::from_secs(5), || server.edge.active_connections() == 0).await);
    }
}

/// Waits until the store holds the run's finished status.
async fn stored_finished(server: &LogServer, fqn: &str, run: &str) {
    let key = tailrace::archive::RunKey::new(fqn, run).unwrap();
    let finished =
        || async { server.store.info(&key).await.unwrap().and_then(|i| i.state).is_some_and(|s| s.is_finished()) };
    for _ in 0..1_000 {
        if finished().await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    panic!("{fqn}/{run} never stored a finished status");
}

/// A run that finished longer than `finish_grace_seconds` ago sends its
/// lines and `complete` at once: the grace counts from its last line in
/// the store, not from when the stream opened, and the timer's first tick
/// (`poll_seconds`) is not waited for either.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_that_finished_long_ago_ends_at_once() {
    let settings = LogStreamSettings { finish_grace_seconds: 1.0, poll_seconds: 2.0, ..quick_settings() };
    let server = LogServer::start(settings).await;
    server.lines("svc.etl", "r-1", "one\ntwo\nthree").await;
    server.archived("svc.etl", "r-1", 3).await;
    server.state("svc.etl", "r-1", "success").await;
    stored_finished(&server, "svc.etl", "r-1").await;
    // The scenario: the run has been finished for longer than the grace.
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    for after in [None, Some("3")] {
        let opened = tokio::time::Instant::now();
        let mut sse = server.open("svc.etl", "r-1", after).await;
        let events = tokio::time::timeout(Duration::from_secs(1), sse.rest()).await.expect("ended within 1 s");
        let (end, lines) = events.split_last().unwrap();
        assert_eq!(text(lines), if after.is_none() { "one\ntwo\nthree" } else { "" });
        assert_eq!(
            *end,
            serde_json::json!({"eventType": "complete", "runId": "r-1", "after": "3", "reason": "runFinished"})
        );
        assert!(opened.elapsed() < Duration::from_secs(1));
    }
}

/// A run that finished a moment ago keeps the grace: a line archived late
/// still reaches its viewer before `complete`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_that_just_finished_keeps_the_grace_for_late_lines() {
    let settings = LogStreamSettings { finish_grace_seconds: 3.0, poll_seconds: 0.1, ..quick_settings() };
    let server = LogServer::start(settings).await;
    let mut sse = server.open_after_lines("svc.etl", "r-1", &["one"]).await;
    assert_eq!(sse.event().await.unwrap()["logs"], "one");
    server.state("svc.etl", "r-1", "success").await;
    stored_finished(&server, "svc.etl", "r-1").await;
    let mut late = server.open("svc.etl", "r-1", Some("1")).await;
    server.lines("svc.etl", "r-1", "late").await;
    for viewer in [&mut sse, &mut late] {
        let rest = viewer.rest().await;
        assert_eq!(text(&rest[..rest.len() - 1]), "late");
        assert_eq!(
            (rest[rest.len() - 1]["eventType"].as_str(), rest[rest.len() - 1]["after"].as_str()),
            (Some("complete"), Some("2"))
        );
    }
}

/// A status reaches viewers after every line accepted before it, even
/// when the queue and the archiver lag far past `finish_grace_seconds`:
/// the change goes through the run's stream, behind the lines.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_status_never_overtakes_the_lines_before_it() {
    use tailrace::archive::RunLogStore;
    // An idle queue is read once a second (no long poll), and deliveries
    // may take as long as the slow archiver needs.
    let mut config = common::quick_config();
    config.agent.poll_period = Duration::from_secs(1);
    config.agent.min_poll_period = Duration::from_secs(1);
    config.agent.delivery_attempt_timeout = Duration::from_secs(30);
    config.agent.max_delivery_time = Duration::from_secs(60);
    // Until the status is stored the run has none; the queue, read once a
    // second, must not look quiet for the unknown-run grace meanwhile (it
    // did, under load, at 1 s): this test is about a known finish.
    let log_stream = LogStreamSettings { unknown_run_grace_seconds: 30.0, ..quick_settings() };
    let options = tailrace::config::EdgeOptions { log_stream, ..Default::default() };
    let memory = tailrace::adapters::memory::MemoryOptions { read_wait: Duration::ZERO, ..Default::default() };
    let server = LogServer::start_on(options, config, memory).await;
    let mut sse = server.open_after_lines("svc.etl", "r-1", &["line 0"]).await;
    assert_eq!(sse.event().await.unwrap()["logs"], "line 0");
    // Each archived container now takes 200 ms: 10 of them, 2 s, against a
    // finish grace of 0.3 s.
    server.store.append_delay_ms.store(200, std::sync::atomic::Ordering::SeqCst);
    for i in 1..=10 {
        server.lines("svc.etl", "r-1", &format!("line {i}")).await;
    }
    server.state("svc.etl", "r-1", "success").await;
    let rest = sse.rest().await;
    let (lines, last) = rest.split_at(rest.len() - 1);
    let expected: Vec<String> = (1..=10).map(|i| format!("line {i}")).collect();
    assert_eq!(text(lines), expected.join("\n"), "every line, in order, before the end: {rest:?}");
    assert_eq!(
        last[0],
        serde_json::json!({"eventType": "complete", "runId": "r-1", "after": "11", "reason": "runFinished"})
    );
    let info = server.store.info(&tailrace::archive::RunKey::new("svc.etl", "r-1").unwrap()).await.unwrap().unwrap();
    assert_eq!((info.lines, info.state), (11, Some(tailrace::archive::RunState::Success)), "stored after the lines");
}

/// 6, 24: a running (or queued) run stays open while quiet, past every
/// grace period.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_run_stays_open_while_quiet() {
    for state in ["running", "queued"] {
        let server = LogServer::start(quick_settings()).await;
        let mut sse = server.open_after_lines("svc.etl", "r-1", &["working"]).await;
        sse.event().await.unwrap();
        server.state("svc.etl", "r-1", state).await;
        assert!(sse.quiet_for(Duration::from_millis(1_500)).await, "{state}: open past the unknown-run grace");
        server.lines("svc.etl", "r-1", "still here").await;
        assert_eq!(sse.event().await.unwrap()["logs"], "still here");
    }
}

/// 7, A4: a run that never logs again ends with `idleTimeout` and the
/// exact message.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_run_ends_with_idle_timeout() {
    let server = LogServer::start(LogStreamSettings { max_idle_seconds: 0.4, ..quick_settings() }).await;
    let mut sse = server.open_after_lines("svc.etl", "r-1", &["x"]).await;
    sse.event().await.unwrap();
    server.state("svc.etl", "r-1", "running").await;
    let end = sse.event().await.unwrap();
    assert_eq!((end["eventType"].as_str(), end["reason"].as_str()), (Some("complete"), Some("idleTimeout")));
    assert_eq!((end["message"].as_str(), end["after"].as_str()), (Some(IDLE_MESSAGE), Some("1")));
    assert_eq!(sse.event().await, None);
}

/// 8: a chunk past `max_stream_bytes` is delivered, then `maxBytes`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tailer_past_its_byte_limit_completes_after_the_chunk() {
    let server = LogServer::start(LogStreamSettings { max_stream_bytes: 32, ..quick_settings() }).await;
    let mut sse = server.open_after_lines("svc.etl", "r-1", &["short"]).await;
    sse.event().await.unwrap();
    let big = "x".repeat(64);
    server.lines("svc.etl", "r-1", &big).await;
    assert_eq!(sse.event().await.unwrap()["logs"], big.as_str());
    let end = sse.event().await.unwrap();
    assert_eq!((end["reason"].as_str(), end["message"].as_str()), (Some("maxBytes"), Some(BYTES_MESSAGE)));
}

/// `maxDuration`: the tailer's age, inherited by late joiners.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tailer_past_its_lifetime_completes() {
    let server = LogServer::start(LogStreamSettings { max_stream_seconds: 0.5, ..quick_settings() }).await;
    let mut sse = server.open_after_lines("svc.etl", "r-1", &["x"]).await;
    server.state("svc.etl", "r-1", "running").await;
    let events = sse.rest().await;
    let end = events.last().unwrap();
    assert_eq!((end["reason"].as_str(), end["message"].as_str()), (Some("maxDuration"), Some(DURATION_MESSAGE)));
}

/// 12, 25: a run with no status gets the longer grace, then `runFinished`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_without_status_gets_the_unknown_grace() {
    let server = LogServer::start(quick_settings()).await;
    let mut sse = server.open_after_lines("svc.etl", "r-1", &["x"]).await;
    sse.event().await.unwrap();
    assert!(sse.quiet_for(Duration::from_millis(600)).await, "past the finish grace, within the unknown one");
    let end = sse.event().await.unwrap();
    assert_eq!(end["reason"], "runFinished");
}

/// 28: the run under stream is not confused with a newer one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_newer_running_run_does_not_keep_an_older_finished_one_open() {
    let server = LogServer::start(quick_settings()).await;
    server.lines("svc.etl", "r-new", "new").await;
    server.state("svc.etl", "r-new", "running").await;
    let mut sse = server.open_after_lines("svc.etl", "r-old", &["old"]).await;
    server.state("svc.etl", "r-old", "success").await;
    let events = sse.rest().await;
    assert_eq!(events.last().unwrap()["reason"], "runFinished");
}

/// 13, 18: the status is looked up sparingly, and a failing lookup never
/// ends a stream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_lookups_are_sparing_and_failures_count_as_running() {
    use std::sync::atomic::Ordering;
    let settings = LogStreamSettings { run_probe_seconds: 0.3, unknown_run_grace_seconds: 1.0, ..quick_settings() };
    let server = LogServer::start(settings).await;
    let mut sse = server.open_after_lines("svc.etl", "r-1", &["x"]).await;
    sse.event().await.unwrap();
    // The tailer's first lookup (its start, retried on failure) is done
    // before lookups fail: only its probes are counted.
    let opened = server.store.infos.load(Ordering::SeqCst);
    assert!(
        common::eventually(Duration::from_secs(10), || server.store.infos.load(Ordering::SeqCst) > opened).await,
        "the tailer never looked its run up"
    );
    server.store.fail_info.store(1_000, Ordering::SeqCst);
    let before = server.store.infos.load(Ordering::SeqCst);
    assert!(sse.quiet_for(Duration::from_millis(1_600)).await, "failed lookups count as running");
    let probes = server.store.infos.load(Ordering::SeqCst) - before;
    assert!((3..=7).contains(&probes), "about one lookup per 0.3 s over 1.6 s, not one per 50 ms poll: {probes}");
    server.store.fail_info.store(0, Ordering::SeqCst);
    assert_eq!(sse.event().await.unwrap()["reason"], "runFinished", "no status: the unknown grace applies");
}

/// 10: a store hiccup while a tailer starts does not end the stream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_hiccup_does_not_end_the_stream() {
    let server = LogServer::start(quick_settings()).await;
    server.lines("svc.etl", "r-1", "before").await;
    server.archived("svc.etl", "r-1", 1).await;
    server.store.fail_info.store(2, std::sync::atomic::Ordering::SeqCst);
    server.store.fail_reads.store(2, std::sync::atomic::Ordering::SeqCst);
    let mut sse = server.open("svc.etl", "r-1", None).await;
    assert_eq!(sse.event().await.unwrap()["logs"], "before");
    server.lines("svc.etl", "r-1", "after").await;
    assert_eq!(sse.event().await.unwrap()["logs"], "after");
}

/// 9, A5: the last viewer leaving ends the subscription; the next viewer
/// starts a fresh tailer from its own cursor, exactly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_last_viewer_leaving_ends_the_subscription() {
    let server = LogServer::start(quick_settings()).await;
    let stream = tailrace::archive::RunKey::new("svc.etl", "r-1").unwrap().stream();
    let mut sse = server.open_after_lines("svc.etl", "r-1", &["a"]).await;
    sse.event().await.unwrap();
    drop(sse);
    assert!(common::eventually(Duration::from_secs(5), || server.edge.active_runs() == 0).await);
    let explicit =
        || async { server.node.subscriptions(&stream).await.unwrap().iter().filter(|s| !s.id.is_implicit()).count() };
    for _ in 0..200 {
        if explicit().await == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(explicit().await, 0, "the tailer unsubscribed");
    server.lines("svc.etl", "r-1", "b").await;
    let mut again = server.open("svc.etl", "r-1", Some("1")).await;
    let next = again.event().await.unwrap();
    assert_eq!((next["logs"].as_str(), next["truncated"].as_bool()), (Some("b"), Some(false)));
}

/// 46, 49, A2, A10: every frame is one `data:` line of JSON naming its
/// type and run, no `id:`; run ids need not be UUIDs; chunks have no
/// trailing newline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn frames_carry_type_and_run_and_nothing_else() {
    let server = LogServer::start(quick_settings()).await;
    let run = "scheduled__2026-08-10T00:00:00";
    server.lines("svc.etl", run, "a\nb\n").await;
    let mut sse =
        Sse::open(&server.client, &server.stream_url("svc.etl", "scheduled__2026-08-10T00%3A00%3A00", None)).await;
    assert_eq!(sse.status, 200);
    let frame = sse.frame_within(FRAME_WAIT).await.unwrap();
    assert!(frame.starts_with("data: {") && !frame.contains("\nid:") && !frame.starts_with("id:"), "{frame}");
    let event: Value = serde_json::from_str(&frame["data: ".len()..]).unwrap();
    assert_eq!((event["runId"].as_str(), event["logs"].as_str()), (Some(run), Some("a\nb")));
}

/// 50: an unknown pipeline is a plain 404, at once: the resume wait (an
/// hour here) is for cursors past the head of a run that exists, never for
/// a name nothing was written to. The stream and the page alike.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_pipeline_is_404_without_waiting() {
    let settings = LogStreamSettings { resume_wait_seconds: 3600.0, ..quick_settings() };
    let server = LogServer::start(settings).await;
    server.lines("svc.known", "r-1", "a line").await;
    server.archived("svc.known", "r-1", 1).await;
    let within = Duration::from_secs(30);
    for after in [None, Some("5")] {
        let sse = tokio::time::timeout(within, server.open("non.existent.pipeline", "r-1", after)).await;
        assert_eq!(sse.expect("the 404 does not wait").status, 404, "after={after:?}");
    }
    let page = server.url("/api/v1/services/ingestionPipelines/logs/non.existent.pipeline/last?runId=r-1");
    let answer = tokio::time::timeout(within, server.client.get(page).send()).await;
    assert_eq!(answer.expect("the 404 does not wait").unwrap().status(), 404);
}

/// 45, 47: the stream commits before any content exists and ends on its
/// own; `?after=0` is accepted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_commits_at_once_and_ends_on_its_own() {
    let server = LogServer::start(quick_settings()).await;
    server.state("svc.etl", "r-1", "success").await;
    let mut sse = server.open("svc.etl", "r-1", Some("0")).await;
    assert_eq!(sse.status, 200, "headers before any content");
    let events = sse.rest().await;
    assert_eq!(
        events,
        [serde_json::json!({"eventType": "complete", "runId": "r-1", "after": "0", "reason": "runFinished"})]
    );
}

trait OpenAfter {
    async fn open_after_lines(&self, fqn: &str, run: &str, lines: &[&str]) -> Sse;
}

impl OpenAfter for LogServer {
    /// Posts `lines` (one request each), then opens a stream from the start.
    async fn open_after_lines(&self, fqn: &str, run: &str, lines: &[&str]) -> Sse {
        for line in lines {
            self.lines(fqn, run, line).await;
        }
        self.open(fqn, run, None).await
    }
}
