//! The SSE edge's limits over real HTTP: run and connection caps with
//! their exact texts, heartbeats, a stalled viewer dropped while others go
//! on, slots freed at once, a persistent failure as an `error` event.

use tailrace_testkit as common;

use std::time::Duration;

use common::logs::*;
use tailrace::config::{EdgeOptions, LogStreamSettings};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

// The refusals' texts, OpenMetadata's, as a client reads them (the edge's
// constants are private: these pin the text).
const TOO_MANY_RUNS: &str = "The server is already streaming the maximum number of pipeline runs. Retry shortly or use the paginated log endpoint.";
const TOO_MANY_VIEWERS: &str = "The server is already serving the maximum number of log stream connections. Retry shortly or use the paginated log endpoint.";

/// 21: a run past `max_active_runs` is refused with one `error` frame and
/// the exact text, then EOF; the run already tailed goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_past_the_cap_is_refused_not_queued() {
    let server = LogServer::start(LogStreamSettings { max_active_runs: 1, ..quick_settings() }).await;
    server.lines("svc.etl", "a", "in a").await;
    server.lines("svc.etl", "b", "in b").await;
    let mut a = server.open("svc.etl", "a", None).await;
    assert_eq!(a.event().await.unwrap()["logs"], "in a");
    let mut b = server.open("svc.etl", "b", None).await;
    assert_eq!(b.status, 200);
    let refused = b.rest().await;
    assert_eq!(refused, [serde_json::json!({"eventType": "error", "runId": "b", "message": TOO_MANY_RUNS})]);
    assert_eq!(server.edge.active_runs(), 1);
    // Viewers of a run already tailed are still admitted.
    let mut second = server.open("svc.etl", "a", None).await;
    assert_eq!(second.event().await.unwrap()["logs"], "in a");
}

/// 22, A1: a viewer past `max_active_connections` gets the `error` as its
/// last frame and no heartbeat; admitted viewers get heartbeats.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_viewer_past_the_connection_cap_is_refused() {
    let settings = LogStreamSettings { max_active_connections: 2, heartbeat_seconds: 0.2, ..quick_settings() };
    let server = LogServer::start(settings).await;
    server.lines("svc.etl", "r-1", "x").await;
    let mut one = server.open("svc.etl", "r-1", None).await;
    let mut two = server.open("svc.etl", "r-1", None).await;
    one.event().await.unwrap();
    two.event().await.unwrap();
    let mut three = server.open("svc.etl", "r-1", None).await;
    let mut frames = Vec::new();
    while let Some(frame) = three.frame_within(FRAME_WAIT).await {
        frames.push(frame);
    }
    let expected = format!(r#"data: {{"eventType":"error","runId":"r-1","message":"{TOO_MANY_VIEWERS}"}}"#);
    assert_eq!(frames.last(), Some(&expected));
    assert!(frames.iter().all(|f| !f.starts_with(':')), "refused connections get no heartbeat");
    assert_eq!(one.frame_within(FRAME_WAIT).await.as_deref(), Some(": heartbeat"));
}

/// A run nobody watches any more keeps its tailer for `linger_seconds`,
/// but a new run past `max_active_runs` takes its slot at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lingering_tailer_gives_its_run_slot_to_a_new_run() {
    let settings = LogStreamSettings { max_active_runs: 1, linger_seconds: 3600.0, ..quick_settings() };
    let server = LogServer::start(settings).await;
    server.state("svc.etl", "r-1", "running").await;
    server.state("svc.etl", "r-2", "running").await;
    server.lines("svc.etl", "r-1", "one").await;
    server.lines("svc.etl", "r-2", "two").await;
    let mut first = server.open("svc.etl", "r-1", None).await;
    assert_eq!(first.event().await.unwrap()["logs"], "one");
    drop(first);
    assert!(common::eventually(Duration::from_secs(5), || server.edge.active_connections() == 0).await);
    assert_eq!(server.edge.active_runs(), 1, "r-1 lingers");
    let mut second = server.open("svc.etl", "r-2", None).await;
    assert_eq!(second.event().await.unwrap()["logs"], "two", "admitted, not refused");
    assert_eq!(server.edge.active_runs(), 1);
}

/// A6: when a stream ends, its connection slot is free at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slots_are_freed_as_soon_as_a_stream_ends() {
    let settings = LogStreamSettings { max_active_connections: 1, max_active_runs: 1, ..quick_settings() };
    let server = LogServer::start(settings).await;
    server.lines("svc.etl", "r-1", "x").await;
    server.state("svc.etl", "r-1", "success").await;
    for round in 0..3 {
        let mut sse = server.open("svc.etl", "r-1", None).await;
        let events = sse.rest().await;
        assert_eq!(events.last().unwrap()["reason"], "runFinished", "round {round}: admitted, not refused");
        drop(sse);
    }
}

/// 44: a viewer whose socket takes nothing for `stall_timeout_seconds`
/// while it has lines to send is cut without `complete`, while another
/// viewer of the same run receives everything.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_viewer_is_dropped_while_another_keeps_streaming() {
    let settings = LogStreamSettings { stall_timeout_seconds: 1.0, ..quick_settings() };
    let server = LogServer::start(settings).await;
    server.lines("svc.etl", "r-1", "start").await;
    let mut reader = server.open("svc.etl", "r-1", None).await;
    reader.event().await.unwrap();
    // The reading viewer reads all along, counting lines.
    let (counts, mut counted) = tokio::sync::watch::channel(0usize);
    let reading = tokio::spawn(async move {
        let mut lines = 0;
        while let Some(event) = reader.event().await {
            assert_eq!(event["replay"], false);
            lines += event["logs"].as_str().unwrap().lines().count();
            counts.send_replace(lines);
        }
    });
    // A client that sends its request and never reads, with a tiny window.
    let mut stalled = server.stalled_viewer("svc.etl", "r-1").await;
    assert!(common::eventually(Duration::from_secs(5), || server.edge.active_connections() == 2).await);
    let line = "y".repeat(100);
    let chunk: Vec<&str> = std::iter::repeat_n(line.as_str(), 100).collect();
    let body = chunk.join("\n");
    let mut sent = 0;
    while server.edge.active_connections() > 1 {
        assert!(sent < 4_000, "the stalled viewer was never dropped");
        server.lines("svc.etl", "r-1", &body).await;
        sent += 1;
    }
    // The reading viewer gets every chunk, in order.
    let all = tokio::time::timeout(FRAME_WAIT, counted.wait_for(|n| *n >= sent * 100)).await;
    assert_eq!(all.ok().and_then(|r| r.ok()).map(|n| *n), Some(sent * 100), "the other viewer kept streaming");
    assert!(!reading.is_finished(), "and is still connected");
    // The stalled one, read at last, ends without a terminal event.
    let mut raw = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), stalled.read_to_end(&mut raw)).await.unwrap().unwrap();
    let text = String::from_utf8_lossy(&raw);
    assert!(!text.contains("\"eventType\":\"complete\"") && !text.contains("\"eventType\":\"error\""));
}

/// 11: a failure that does not go away (no agent will attach the tailer)
/// ends the stream with an `error` event carrying the cause.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_persistent_failure_ends_the_stream_with_an_error_event() {
    let mut config = common::quick_config();
    config.pubsub.attach_timeout = Duration::from_millis(300);
    let options = EdgeOptions { log_stream: quick_settings(), ..EdgeOptions::default() };
    let server = LogServer::start_with(options, config).await;
    server.lines("svc.etl", "r-1", "x").await;
    server.archived("svc.etl", "r-1", 1).await;
    server.node.stop_agents().await.unwrap();
    let mut sse = server.open("svc.etl", "r-1", None).await;
    let events = sse.rest().await;
    let last = events.last().unwrap();
    assert_eq!(last["eventType"], "error");
    assert!(last["message"].as_str().unwrap().contains("no pulling agent attached"), "{last}");
    assert_eq!(server.edge.active_runs(), 0, "the run slot is released");
}

/// A stream opened by a connection's first request is written straight on
/// the socket; one opened later on a kept-alive connection goes through
/// the general HTTP stack. Both carry the same frames.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_on_a_kept_alive_connection_is_served_the_same() {
    let server = LogServer::start(quick_settings()).await;
    server.lines("svc.etl", "r-1", "one").await;
    server.archived("svc.etl", "r-1", 1).await;
    server.state("svc.etl", "r-1", "running").await;
    let address = server.base.trim_start_matches("http://").to_string();
    let stream_request =
        format!("GET /api/v1/services/ingestionPipelines/logs/svc.etl/stream/r-1 HTTP/1.1\r\nhost: {address}\r\n\r\n");
    let mut first = tokio::net::TcpStream::connect(&address).await.unwrap();
    first.write_all(stream_request.as_bytes()).await.unwrap();
    let mut kept = tokio::net::TcpStream::connect(&address).await.unwrap();
    let listing = format!("GET /api/v1/logs/pipelines HTTP/1.1\r\nhost: {address}\r\n\r\n");
    kept.write_all(listing.as_bytes()).await.unwrap();
    let expected = "{\"pipelines\":[\"svc.etl\"]}";
    let mut listed = Vec::new();
    while !String::from_utf8_lossy(&listed).contains(expected) {
        let mut buffer = [0u8; 1024];
        let n = kept.read(&mut buffer).await.unwrap();
        assert!(n > 0, "the listing was answered on a kept-alive connection");
        listed.extend_from_slice(&buffer[..n]);
    }
    kept.write_all(stream_request.as_bytes()).await.unwrap();
    let frame = "data: {\"eventType\":\"logs\",\"runId\":\"r-1\",\"logs\":\"one\",\"after\":\"1\",\"replay\":";
    for socket in [&mut first, &mut kept] {
        let mut seen = Vec::new();
        while !String::from_utf8_lossy(&seen).contains(frame) {
            let mut buffer = [0u8; 1024];
            let n = tokio::time::timeout(FRAME_WAIT, socket.read(&mut buffer)).await.unwrap().unwrap();
            assert!(n > 0, "got {:?}", String::from_utf8_lossy(&seen));
            seen.extend_from_slice(&buffer[..n]);
        }
        let text = String::from_utf8_lossy(&seen);
        assert!(text.starts_with("HTTP/1.1 200 OK\r\n") || text.contains("HTTP/1.1 200 OK\r\n"));
        assert!(
            text.contains("content-type: text/event-stream\r\n") && text.contains("transfer-encoding: chunked\r\n")
        );
    }
}

/// A stream served on a connection's first request ends that connection,
/// and says so: a client that pooled it would send its next request into a
/// closed socket (seen as a reset on a client's second viewer).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_that_ends_its_connection_says_connection_close() {
    let server = LogServer::start(quick_settings()).await;
    server.lines("svc.etl", "done", "one").await;
    server.state("svc.etl", "done", "success").await;
    let address = server.url("").trim_start_matches("http://").trim_end_matches('/').to_string();
    let mut socket = tokio::net::TcpStream::connect(&address).await.unwrap();
    let request =
        format!("GET /api/v1/services/ingestionPipelines/logs/svc.etl/stream/done HTTP/1.1\r\nhost: {address}\r\n\r\n");
    socket.write_all(request.as_bytes()).await.unwrap();
    let mut seen = Vec::new();
    tokio::time::timeout(Duration::from_secs(30), socket.read_to_end(&mut seen)).await.unwrap().unwrap();
    let text = String::from_utf8_lossy(&seen);
    let head = text.split("\r\n\r\n").next().unwrap_or_default().to_ascii_lowercase();
    assert!(head.starts_with("http/1.1 200 ok") && head.contains("\r\nconnection: close"), "{text}");
    assert!(text.contains("runFinished") || text.contains("\"logs\":\"one\""), "{text}");
}
