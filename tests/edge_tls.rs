//! Log streams over HTTPS (`[edge.tls]`), as browsers see them: viewers at
//! the head are written by the run's fan-out like plain ones, without a
//! task each. Every viewer gets every line once, in order, through bursts
//! and frames larger than a TLS record, and ends on `complete`; one whose
//! client stops reading is cut while the others go on; a client that
//! leaves frees its connection at once; one that fell behind the window
//! catches up from the store; and frames that wait for a slow socket
//! share TLS records instead of taking one each.

use tailrace_testkit as common;

use std::sync::Arc;
use std::time::Duration;

use common::logs::*;
use common::tls_tap::{Seen, Tee};
use serde_json::Value;
use tailrace::config::{EdgeOptions, LogStreamSettings};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_rustls::client::TlsStream;

const FQN: &str = "svc.tls";

/// An HTTPS edge with `settings`.
async fn https_server(settings: LogStreamSettings) -> LogServer {
    let options = EdgeOptions { log_stream: settings, runs_stream: quick_runs_stream(), ..EdgeOptions::default() };
    LogServer::start_tls(options, common::quick_config()).await
}

/// A client of `server` that opens a connection per request, so that each
/// stream is its connection's first request (the direct path).
fn viewer_client(server: &LogServer) -> reqwest::Client {
    let certs = reqwest::Certificate::from_pem_bundle(&std::fs::read(server.ca()).unwrap()).unwrap();
    common::http().tls_certs_only(certs).pool_max_idle_per_host(0).build().unwrap()
}

/// `count` lines `line {i} {padding}` from line `from`, as one post's body.
fn numbered(from: usize, count: usize, pad: usize) -> String {
    let padding = "x".repeat(pad);
    (from..from + count).map(|i| format!("line {i} {padding}")).collect::<Vec<_>>().join("\n")
}

/// The line numbers in `lines` (`line {i} …`), in the order seen.
fn numbers<'a>(lines: impl IntoIterator<Item = &'a str>) -> Vec<usize> {
    lines.into_iter().filter_map(|line| line.split(' ').nth(1)?.parse().ok()).collect()
}

/// The line numbers of the `logs` events in `events`.
fn numbers_of(events: &[Value]) -> Vec<usize> {
    numbers(events.iter().filter(|e| e["eventType"] == "logs").flat_map(|e| e["logs"].as_str().unwrap_or("").lines()))
}

/// A viewer on a TLS session of its own making (its socket's receive
/// buffer set to `receive_buffer` when given), its request sent; reads
/// what the stream sends as raw bytes, and keeps a copy of what its socket
/// read.
struct RawViewer {
    tls: TlsStream<Tee>,
    seen: Seen,
    /// The decrypted bytes read so far (the response head, then chunks).
    plain: Vec<u8>,
}

impl RawViewer {
    async fn open(server: &LogServer, run: &str, receive_buffer: Option<u32>) -> Self {
        let roots = tailrace::tls::roots("ca", &server.ca()).unwrap();
        let config = rustls::ClientConfig::builder_with_provider(tailrace::tls::provider())
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        if let Some(size) = receive_buffer {
            socket.set_recv_buffer_size(size).unwrap();
        }
        let (tee, seen) = Tee::new(socket.connect(server.address()).await.unwrap());
        let name = rustls::pki_types::ServerName::try_from("127.0.0.1").unwrap();
        let mut tls = tokio_rustls::TlsConnector::from(Arc::new(config)).connect(name, tee).await.unwrap();
        let request = format!(
            "GET /api/v1/services/ingestionPipelines/logs/{FQN}/stream/{run} HTTP/1.1\r\nhost: {}\r\n\r\n",
            server.address()
        );
        tls.write_all(request.as_bytes()).await.unwrap();
        tls.flush().await.unwrap();
        Self { tls, seen, plain: Vec::new() }
    }

    /// Reads until the decrypted bytes hold `needle` (30 s at most).
    async fn read_until(&mut self, needle: &str) {
        let found = tokio::time::timeout(Duration::from_secs(30), async {
            let mut buffer = vec![0u8; 64 * 1024];
            while memchr::memmem::find(&self.plain, needle.as_bytes()).is_none() {
                let n = self.tls.read(&mut buffer).await.unwrap();
                assert!(n > 0, "the stream ended before {needle:?}");
                self.plain.extend_from_slice(&buffer[..n]);
            }
        });
        assert!(found.await.is_ok(), "no {needle:?} within 30 s");
    }

    /// The line numbers of the `logs` events read so far.
    fn numbers(&self) -> Vec<usize> {
        let text = String::from_utf8_lossy(&self.plain);
        let events = text.split("\n\n").filter_map(|frame| {
            let data = &frame[frame.find("data: ")? + 6..];
            serde_json::from_str::<Value>(data).ok()
        });
        numbers_of(&events.collect::<Vec<_>>())
    }
}

/// Viewers over HTTPS at the head of a run are the fan-out's, with no task
/// each (a connection's task per viewer before), and through small posts,
/// a line larger than a TLS record, a frame larger than one write (64 KiB)
/// and a burst of posts larger than that, each gets every line once, in
/// order, then `complete`, and its stream ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn https_viewers_at_the_head_get_every_line_in_order_then_complete_without_a_task_each() {
    const VIEWERS: usize = 16;
    let server = https_server(quick_settings()).await;
    server.lines(FQN, "r-1", "line 0 first").await;
    let (client, mut viewers) = (viewer_client(&server), Vec::new());
    for _ in 0..VIEWERS {
        let mut sse = Sse::open(&client, &server.stream_url(FQN, "r-1", None)).await;
        assert_eq!((sse.status, sse.connection.as_str()), (200, "close"), "the direct path");
        assert_eq!(sse.event().await.unwrap()["logs"], "line 0 first");
        viewers.push(sse);
    }
    // At the head, each went to the run's fan-out: what runs is the
    // tailer, its shards and the producer's connection, not a task per
    // viewer.
    assert!(
        common::eventually(Duration::from_secs(10), || server.edge.tracked_tasks() < VIEWERS / 2).await,
        "{} tasks for {VIEWERS} viewers",
        server.edge.tracked_tasks()
    );
    let mut next = 1;
    // Small posts, one after the other.
    for _ in 0..20 {
        server.lines(FQN, "r-1", &numbered(next, 3, 10)).await;
        next += 3;
    }
    // One line of 40 KiB: a frame of three TLS records.
    server.lines(FQN, "r-1", &numbered(next, 1, 40 * 1024)).await;
    next += 1;
    // A frame of 100 KiB, more than one write.
    server.lines(FQN, "r-1", &numbered(next, 1_000, 90)).await;
    next += 1_000;
    // A burst: 60 posts of 2 KiB at once.
    let posts = (0..60).map(|i| {
        let (client, url) = (server.client.clone(), server.url(&format!("/api/v1/logs/{FQN}/runs/r-1/lines")));
        let body = numbered(next + i * 20, 20, 90);
        async move { client.post(url).header("content-type", "text/plain").body(body).send().await.unwrap().status() }
    });
    // (Posted at once: stored in some order, each post's lines together.)
    let statuses = futures::future::join_all(posts).await;
    assert!(statuses.iter().all(|s| *s == 202), "{statuses:?}");
    next += 1_200;
    server.state(FQN, "r-1", "success").await;
    // What the store holds, in its order (the burst's posts in the order
    // they were stored, each one's lines together).
    let download = server.url(&format!("/api/v1/services/ingestionPipelines/logs/{FQN}/last/download?runId=r-1"));
    let stored = server.client.get(download).send().await.unwrap().text().await.unwrap();
    let stored = numbers(stored.lines());
    let mut sorted = stored.clone();
    sorted.sort_unstable();
    assert_eq!(sorted, (0..next).collect::<Vec<_>>(), "the store holds every line once");
    for (index, sse) in viewers.iter_mut().enumerate() {
        let rest = tokio::time::timeout(Duration::from_secs(30), sse.rest()).await;
        let rest = rest.unwrap_or_else(|_| panic!("viewer {index}: its stream did not end"));
        let seen: Vec<usize> = std::iter::once(0).chain(numbers_of(&rest)).collect();
        assert!(
            seen == stored,
            "viewer {index}: every stored line once, in order ({} of {})",
            seen.len(),
            stored.len()
        );
        let last = rest.last().unwrap();
        assert_eq!((last["eventType"].as_str(), last["reason"].as_str()), (Some("complete"), Some("runFinished")));
        assert_eq!(last["after"], next.to_string(), "viewer {index}");
    }
}

/// A viewer over HTTPS whose client stops reading (a 4 KiB receive
/// buffer) is cut by the stall rule (1 s here) once its socket takes
/// nothing, without a terminal event, while a viewer beside it gets every
/// line and goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_https_viewer_that_stops_reading_is_cut_while_the_others_go_on() {
    let server = https_server(LogStreamSettings { stall_timeout_seconds: 1.0, ..quick_settings() }).await;
    server.lines(FQN, "r-1", "line 0 first").await;
    let mut fast = Sse::open(&viewer_client(&server), &server.stream_url(FQN, "r-1", None)).await;
    assert_eq!(fast.event().await.unwrap()["logs"], "line 0 first");
    let mut stalled = RawViewer::open(&server, "r-1", Some(4096)).await;
    stalled.read_until("line 0 first").await;
    assert!(common::eventually(Duration::from_secs(5), || server.edge.active_connections() == 2).await);
    // The fast viewer reads all along; lines go in until the stalled
    // viewer's socket and session are full and it is cut.
    let reading = tokio::spawn(async move {
        let mut seen = vec![0];
        while !seen.contains(&usize::MAX) {
            let event = fast.event_within(Duration::from_secs(30)).await.expect("the fast viewer's stream went on");
            seen.extend(numbers_of(&[event]));
        }
        seen
    });
    let mut next = 1;
    while server.edge.active_connections() == 2 {
        assert!(next < 200_000, "the stalled viewer was never cut");
        server.lines(FQN, "r-1", &numbered(next, 1_000, 200)).await;
        next += 1_000;
    }
    server.lines(FQN, "r-1", &format!("line {} after the cut", usize::MAX)).await;
    let seen = tokio::time::timeout(Duration::from_secs(60), reading).await.unwrap().unwrap();
    let expected: Vec<usize> = (0..next).chain([usize::MAX]).collect();
    assert!(seen == expected, "the fast viewer: every line once, in order ({} of {})", seen.len(), expected.len());
    // The stalled viewer's connection was closed, without `complete`.
    let mut rest = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(30), stalled.tls.read_to_end(&mut rest)).await.unwrap();
    stalled.plain.extend_from_slice(&rest);
    let text = String::from_utf8_lossy(&stalled.plain);
    assert!(!text.contains("\"eventType\":\"complete\"") && !text.contains("\"eventType\":\"error\""));
}

/// A client over HTTPS that leaves, with `close_notify` or by closing its
/// socket, frees its connection slot at once (its viewer was the
/// fan-out's).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_https_client_that_leaves_frees_its_connection() {
    let server = https_server(quick_settings()).await;
    server.lines(FQN, "r-1", "line 0 first").await;
    for how in ["close_notify", "close"] {
        let mut viewer = RawViewer::open(&server, "r-1", None).await;
        viewer.read_until("line 0 first").await;
        assert!(common::eventually(Duration::from_secs(5), || server.edge.active_connections() == 1).await);
        server.lines(FQN, "r-1", &format!("line 1 while {how}")).await;
        viewer.read_until(&format!("line 1 while {how}")).await;
        match how {
            "close_notify" => viewer.tls.shutdown().await.unwrap(),
            _ => drop(viewer),
        }
        assert!(
            common::eventually(Duration::from_secs(5), || server.edge.active_connections() == 0).await,
            "{how}: the connection slot is still held"
        );
    }
}

/// A viewer over HTTPS that stops reading while far more than the window
/// is posted falls behind the window; once it reads again it catches up
/// from the store, comes back, and ends on `complete` with every line.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_https_viewer_that_fell_behind_the_window_catches_up_and_ends_on_complete() {
    let settings = LogStreamSettings { max_replay_bytes: 32 * 1024, ..quick_settings() };
    let server = https_server(settings).await;
    server.lines(FQN, "r-1", "line 0 first").await;
    let mut viewer = RawViewer::open(&server, "r-1", Some(4096)).await;
    viewer.read_until("line 0 first").await;
    assert!(common::eventually(Duration::from_secs(5), || server.edge.active_connections() == 1).await);
    let reads = server.edge.store_reads();
    // 6 MB: more than its socket's buffers and its session hold, and the
    // window (32 KiB) far behind.
    const POSTS: usize = 60;
    const LINES: usize = 500;
    for post in 0..POSTS {
        server.lines(FQN, "r-1", &numbered(1 + post * LINES, LINES, 200)).await;
    }
    server.state(FQN, "r-1", "success").await;
    viewer.read_until("\"eventType\":\"complete\"").await;
    assert_eq!(viewer.numbers(), (0..1 + POSTS * LINES).collect::<Vec<_>>(), "every line once, in order");
    assert!(server.edge.store_reads() > reads, "it read what fell out of the window from the store");
    let text = String::from_utf8_lossy(&viewer.plain);
    assert!(text.contains("\"reason\":\"runFinished\"") && text.ends_with("0\r\n\r\n"), "its stream ended");
}

/// Frames that wait for a slow socket go out together: once a viewer over
/// HTTPS reads again after a large frame filled its socket, the 300 small
/// frames posted meanwhile share TLS records (one record per frame would
/// be 300), and no record carries more than 16 KiB of them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn small_frames_waiting_for_an_https_viewer_share_tls_records() {
    // Every line stays in the window: the fan-out writes them all.
    let server = https_server(LogStreamSettings { max_replay_bytes: 64 << 20, ..quick_settings() }).await;
    server.lines(FQN, "r-1", "line 0 first").await;
    let mut slow = RawViewer::open(&server, "r-1", Some(4096)).await;
    slow.read_until("line 0 first").await;
    let mut reference = Sse::open(&viewer_client(&server), &server.stream_url(FQN, "r-1", None)).await;
    assert_eq!(reference.event().await.unwrap()["logs"], "line 0 first");
    let from = slow.seen.len();
    // 3 MB in one frame, then 300 frames of one short line.
    server.lines(FQN, "r-1", &numbered(1, 10_000, 300)).await;
    for i in 0..300 {
        server.lines(FQN, "r-1", &numbered(10_001 + i, 1, 100)).await;
    }
    // Every frame is in the tailer's window once the other viewer has them.
    reference.lines(10_300).await;
    slow.read_until("line 10300 ").await;
    assert_eq!(slow.numbers(), (0..10_301).collect::<Vec<_>>(), "every line once, in order");
    let records = slow.seen.records(from);
    let small = records.iter().filter(|r| **r < 4096).count();
    eprintln!("{} records after the head, {small} of them under 4 KiB", records.len());
    assert!(small < 30, "{small} records under 4 KiB of {}: {records:?}", records.len());
    // (2^14 bytes of plaintext and the cipher's overhead, at most.)
    assert!(records.iter().all(|r| *r <= 16 * 1024 + 256), "{records:?}");
}
