//! The log stream under real traffic, over loopback sockets: a burst of
//! large posts with one fast and one stalled viewer, a viewer that pauses
//! while many chunks arrive, a client that reconnects with the server's
//! own cursor while lines arrive, and large request heads.

use tailrace_testkit as common;

use std::time::Duration;

use common::logs::*;
use serde_json::Value;
use tailrace::config::{EdgeOptions, LogStreamSettings};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Lines `line {producer}-{i}` with a payload, `count` of them.
fn numbered(producer: usize, from: usize, count: usize, pad: usize) -> String {
    let padding = "x".repeat(pad);
    (from..from + count).map(|i| format!("line {producer}-{i} {padding}")).collect::<Vec<_>>().join("\n")
}

/// `(producer, i)` of each line, in the order seen.
fn parse_numbered(events: &[Value]) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    for event in events {
        for line in event["logs"].as_str().unwrap_or_default().lines() {
            let id = line.split(' ').nth(1).unwrap();
            let (producer, i) = id.split_once('-').unwrap();
            out.push((producer.parse().unwrap(), i.parse().unwrap()));
        }
    }
    out
}

/// Point 1 of the edge's traffic issue: four producers post 3.9 MB each at
/// the same moment. A viewer reading as fast as it can gets every line, in
/// order, on one connection; a viewer that never reads is cut once its
/// socket took nothing for `stall_timeout_seconds` (2 here; everything
/// else at its default).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_never_drops_a_fast_viewer_and_a_stalled_one_is_cut() {
    let settings = LogStreamSettings { stall_timeout_seconds: 2.0, ..LogStreamSettings::default() };
    let server = LogServer::start(settings).await;
    server.state("svc.etl", "r-1", "running").await;
    let mut fast = server.open("svc.etl", "r-1", None).await;
    assert_eq!(fast.status, 200);

    let mut stalled = server.stalled_viewer("svc.etl", "r-1").await;
    assert!(common::eventually(Duration::from_secs(5), || server.edge.active_connections() == 2).await);

    // 9 000 lines of ~430 bytes: 3.9 MB per post, under max_body_bytes.
    const LINES: usize = 9_000;
    let bodies: Vec<String> = (0..4).map(|p| numbered(p, 0, LINES, 420)).collect();
    assert!(bodies.iter().all(|b| b.len() > 3_800_000 && b.len() < 4 * 1024 * 1024));
    // The fast viewer reads all along, while the posts go in.
    let reading = tokio::spawn(async move {
        let events = fast.lines(4 * LINES).await;
        (fast, events)
    });
    let posts = bodies.into_iter().map(|body| {
        let (client, url) = (server.client.clone(), server.url("/api/v1/logs/svc.etl/runs/r-1/lines"));
        tokio::spawn(async move {
            let response = client.post(url).header("content-type", "text/plain").body(body).send().await.unwrap();
            assert_eq!(response.status(), 202);
        })
    });
    for post in futures::future::join_all(posts).await {
        post.unwrap();
    }

    let (mut fast, events) = reading.await.unwrap();
    let seen = parse_numbered(&events);
    assert_eq!(seen.len(), 4 * LINES, "every line, none twice");
    for producer in 0..4 {
        let mine: Vec<usize> = seen.iter().filter(|(p, _)| *p == producer).map(|(_, i)| *i).collect();
        assert_eq!(mine, (0..LINES).collect::<Vec<_>>(), "producer {producer}: in order, complete");
    }
    let odd: Vec<&Value> = events.iter().filter(|e| e["eventType"] != "logs" || e["truncated"] == true).collect();
    assert!(odd.is_empty(), "no reset, no end: {odd:?}");

    // The stalled viewer is cut, without a terminal event; the fast one
    // stays connected.
    assert!(
        common::eventually(Duration::from_secs(20), || server.edge.active_connections() == 1).await,
        "the stalled viewer was never cut"
    );
    let mut raw = Vec::new();
    tokio::time::timeout(Duration::from_secs(20), stalled.read_to_end(&mut raw)).await.unwrap().unwrap();
    let text = String::from_utf8_lossy(&raw);
    assert!(!text.contains("\"eventType\":\"complete\"") && !text.contains("\"eventType\":\"error\""));
    server.lines("svc.etl", "r-1", "after the burst").await;
    assert_eq!(fast.event().await.unwrap()["logs"], "after the burst");
}

/// Reads `total` lines of a run that is being written, reconnecting every
/// `every` lines with the `after` of the last event; returns what it read
/// and how many truncation notices it saw.
async fn read_with_reconnects(server: &LogServer, total: usize, every: usize) -> (Vec<Value>, usize) {
    let (mut events, mut truncated) = (Vec::new(), 0);
    let mut after: Option<String> = None;
    let mut reconnects = 0;
    while parse_numbered(&events).len() < total {
        let mut sse = server.open("svc.etl", "r-1", after.as_deref()).await;
        assert_eq!(sse.status, 200);
        let mut here = 0;
        while here < every && parse_numbered(&events).len() < total {
            let event = sse.event().await.expect("the stream went on");
            if event["truncated"] == true {
                truncated += 1;
            }
            if let Some(cursor) = event["after"].as_str() {
                after = Some(cursor.to_string());
            }
            here += event["logs"].as_str().map_or(0, |l| l.lines().count());
            events.push(event);
        }
        reconnects += 1;
    }
    assert!(reconnects >= total / every, "{reconnects} reconnects");
    (events, truncated)
}

/// Posts `requests` batches of `per_request` lines, one after the other.
async fn produce(server: &LogServer, requests: usize, per_request: usize) {
    for r in 0..requests {
        server.lines("svc.etl", "r-1", &numbered(0, r * per_request, per_request, 8)).await;
    }
}

async fn reconnecting_reader_gets_every_line_once(server: LogServer) {
    server.state("svc.etl", "r-1", "running").await;
    let (reading, _) = tokio::join!(read_with_reconnects(&server, 10_000, 1_000), produce(&server, 100, 100));
    let (events, truncated) = reading;
    assert_eq!(truncated, 0, "no truncation notice");
    let seen: Vec<usize> = parse_numbered(&events).into_iter().map(|(_, i)| i).collect();
    assert_eq!(seen, (0..10_000).collect::<Vec<_>>(), "0 missing, 0 duplicates");
}

/// Point 2: a client that drops its connection every ~1 000 lines and
/// reconnects at once with the server's cursor, while 10 000 lines arrive
/// live: nothing missing, nothing twice, no truncation notice (default
/// settings: the tailer lingers, so the reconnect finds it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reconnecting_with_the_servers_cursor_is_exact_while_lines_arrive() {
    let server = LogServer::start(LogStreamSettings::default()).await;
    reconnecting_reader_gets_every_line_once(server).await;
}

/// The same with no lingering and a slow archiver: each reconnect starts
/// a new tailer at what the store holds, behind the client's cursor; the
/// client waits for its lines instead of a reset.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_tailer_behind_a_slow_archiver_waits_for_the_cursor() {
    let settings = LogStreamSettings { linger_seconds: 0.0, ..LogStreamSettings::default() };
    let server = LogServer::start(settings).await;
    server.store.append_delay_ms.store(20, std::sync::atomic::Ordering::SeqCst);
    reconnecting_reader_gets_every_line_once(server).await;
}

/// A request head past 8 KiB (a large SSO cookie) is served; one past the
/// server's 64 KiB limit gets `431`, never a reset without an answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_request_heads_are_served_or_refused_with_431() {
    let options = EdgeOptions { log_stream: quick_settings(), ..EdgeOptions::default() };
    let server = LogServer::start_with(options, common::quick_config()).await;
    server.lines("svc.etl", "r-1", "hello").await;
    let address = server.base.trim_start_matches("http://").to_string();
    for (cookie, expected) in
        [(9 * 1024, "HTTP/1.1 200 OK"), (400 * 1024, "HTTP/1.1 431"), (100 * 1024, "HTTP/1.1 431")]
    {
        let mut socket = tokio::net::TcpStream::connect(&address).await.unwrap();
        let request = format!(
            "GET /api/v1/services/ingestionPipelines/logs/svc.etl/last?runId=r-1 HTTP/1.1\r\nhost: {address}\r\ncookie: sso={}\r\nconnection: close\r\n\r\n",
            "c".repeat(cookie)
        );
        socket.write_all(request.as_bytes()).await.unwrap();
        let mut answer = Vec::new();
        let _ = tokio::time::timeout(Duration::from_secs(10), socket.read_to_end(&mut answer)).await.unwrap();
        let answer = String::from_utf8_lossy(&answer);
        assert!(answer.starts_with(expected), "a {cookie}-byte cookie: {answer:?}");
    }
    // The stream route too, which the direct path reads first.
    let mut socket = tokio::net::TcpStream::connect(&address).await.unwrap();
    let request = format!(
        "GET /api/v1/services/ingestionPipelines/logs/svc.etl/stream/r-1 HTTP/1.1\r\nhost: {address}\r\ncookie: sso={}\r\n\r\n",
        "c".repeat(9 * 1024)
    );
    socket.write_all(request.as_bytes()).await.unwrap();
    let mut answer = vec![0u8; 4096];
    let n = tokio::time::timeout(Duration::from_secs(10), socket.read(&mut answer)).await.unwrap().unwrap();
    let answer = String::from_utf8_lossy(&answer[..n]);
    assert!(answer.starts_with("HTTP/1.1 200 OK"), "{answer:?}");
    assert!(answer.to_ascii_lowercase().contains("content-type: text/event-stream"), "{answer:?}");
}

/// A viewer whose socket stops taking frames for a while (a 4 KiB receive
/// buffer, not read for a second) while many chunks arrive falls behind
/// the newest frames, then reads again: it gets every line, in order,
/// with nothing posted after it started reading (no later change to wake
/// it up).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_viewer_that_pauses_gets_every_line_once_it_reads_again() {
    // Every line stays in the tailer's window: the viewer catches up from
    // it, not from the store.
    let settings = LogStreamSettings { max_replay_bytes: 64 << 20, ..LogStreamSettings::default() };
    let server = LogServer::start(settings).await;
    server.state("svc.etl", "r-1", "running").await;
    server.lines("svc.etl", "r-1", "line 9-0 start").await;
    let mut paused = server.stalled_viewer("svc.etl", "r-1").await;
    assert!(common::eventually(Duration::from_secs(5), || server.edge.active_connections() == 1).await);
    // 400 chunks of 200 lines of ~120 bytes (24 KB, under the 64 KiB one
    // write takes): 9.6 MB, far more than the socket's buffers hold, in
    // far more chunks than the newest the tailer shares without its lock.
    const POSTS: usize = 400;
    const LINES: usize = 200;
    for post in 0..POSTS {
        server.lines("svc.etl", "r-1", &numbered(0, post * LINES, LINES, 100)).await;
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let mut raw = Vec::new();
    let mut lines = Vec::new();
    let read_all = async {
        let mut buffer = vec![0u8; 64 * 1024];
        while lines.len() < POSTS * LINES + 1 {
            let n = paused.read(&mut buffer).await.unwrap();
            assert!(n > 0, "the stream ended after {} lines", lines.len());
            raw.extend_from_slice(&buffer[..n]);
            lines.extend(take_lines(&mut raw));
        }
    };
    tokio::time::timeout(Duration::from_secs(30), read_all).await.expect("every line within 30 s");
    let seen = parse_numbered(&[serde_json::json!({ "logs": lines.join("\n") })]);
    let expected: Vec<(usize, usize)> = std::iter::once((9, 0)).chain((0..POSTS * LINES).map(|i| (0, i))).collect();
    assert!(seen == expected, "every line once, in order ({} seen of {})", seen.len(), expected.len());
}

/// The log lines of the complete events in `raw` (a chunked SSE response,
/// its head first), which keeps what is not complete yet.
fn take_lines(raw: &mut Vec<u8>) -> Vec<String> {
    let mut lines = Vec::new();
    loop {
        let text = String::from_utf8_lossy(raw).into_owned();
        let Some(start) = text.find("data: ") else { return lines };
        let Some(end) = text[start..].find("\n\n") else { return lines };
        let event: Value = serde_json::from_str(&text[start + 6..start + end]).unwrap();
        lines.extend(event["logs"].as_str().unwrap_or_default().lines().map(str::to_string));
        raw.drain(..start + end + 2);
    }
}

/// Viewers handed over at the head of their run (to its fan-out) when a
/// chunk crosses `max_stream_bytes`: the chunk and the run's end come
/// together, and each viewer gets the chunk, then `complete` with
/// `maxBytes`, then the end of its stream (not heartbeats for ever).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn viewers_at_the_head_get_the_last_chunk_then_complete_when_the_stream_reaches_its_byte_limit() {
    let server = LogServer::start(LogStreamSettings { max_stream_bytes: 64, ..quick_settings() }).await;
    server.lines("svc.etl", "r-1", "first").await;
    let mut viewers = Vec::new();
    for _ in 0..20 {
        let mut sse = server.open("svc.etl", "r-1", None).await;
        assert_eq!(sse.event().await.unwrap()["logs"], "first");
        viewers.push(sse);
    }
    let big = "x".repeat(100);
    server.lines("svc.etl", "r-1", &big).await;
    for (index, sse) in viewers.iter_mut().enumerate() {
        let rest = tokio::time::timeout(Duration::from_secs(10), sse.rest()).await;
        let rest = rest.unwrap_or_else(|_| panic!("viewer {index}: its stream did not end"));
        assert_eq!(rest.len(), 2, "viewer {index}: {rest:?}");
        assert_eq!(rest[0]["logs"], big.as_str(), "viewer {index}");
        assert_eq!((rest[1]["eventType"].as_str(), rest[1]["reason"].as_str()), (Some("complete"), Some("maxBytes")));
        assert_eq!(rest[1]["message"], "Stream size limit reached. Download the full log to see the rest of this run.");
    }
}
