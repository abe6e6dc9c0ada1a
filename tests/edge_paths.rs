//! The edge serves a log stream on two paths: a connection's first request
//! is read by the direct path (written straight on the socket, which costs
//! a viewer far less memory), a later request of a kept-alive connection by
//! hyper and the router. This sends the same requests, good and bad,
//! through both and compares the answers: status line, headers (except
//! `date`, and `connection`, since the direct path always closes) and the
//! decoded body, byte for byte.

use tailrace_testkit as common;

use std::time::Duration;

use common::logs::*;
use tailrace::config::{AuthOptions, EdgeOptions, Scope, TokenEntry};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const READ: &str = "read-token-0123456789";
const WRITE: &str = "write-token-0123456789";

/// One HTTP/1.1 response, as read off the socket.
#[derive(Debug, PartialEq, Eq)]
struct Answer {
    status_line: String,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

/// Reads one response from `buffer` (refilled from `socket`), removing it.
async fn read_answer(socket: &mut TcpStream, buffer: &mut Vec<u8>) -> Answer {
    let head_end = loop {
        if let Some(at) = buffer.windows(4).position(|w| w == b"\r\n\r\n") {
            break at + 4;
        }
        fill(socket, buffer).await;
    };
    let head = String::from_utf8(buffer.drain(..head_end).collect()).unwrap();
    let mut lines = head.split("\r\n");
    let status_line = lines.next().unwrap().to_string();
    let mut headers: Vec<(String, String)> = lines
        .filter(|l| !l.is_empty())
        .map(|l| {
            let (name, value) = l.split_once(':').unwrap();
            (name.trim().to_ascii_lowercase(), value.trim().to_string())
        })
        .collect();
    let header = |name: &str| headers.iter().find(|(n, _)| n == name).map(|(_, v)| v.clone());
    let mut body = Vec::new();
    if let Some(length) = header("content-length") {
        let length: usize = length.parse().unwrap();
        while buffer.len() < length {
            fill(socket, buffer).await;
        }
        body.extend(buffer.drain(..length));
    } else if header("transfer-encoding").as_deref() == Some("chunked") {
        loop {
            let line_end = loop {
                if let Some(at) = buffer.windows(2).position(|w| w == b"\r\n") {
                    break at;
                }
                fill(socket, buffer).await;
            };
            let size = usize::from_str_radix(std::str::from_utf8(&buffer[..line_end]).unwrap().trim(), 16).unwrap();
            buffer.drain(..line_end + 2);
            while buffer.len() < size + 2 {
                fill(socket, buffer).await;
            }
            body.extend(buffer.drain(..size));
            buffer.drain(..2);
            if size == 0 {
                break;
            }
        }
    }
    headers.retain(|(name, _)| name != "date" && name != "connection");
    headers.sort();
    Answer { status_line, headers, body }
}

async fn fill(socket: &mut TcpStream, buffer: &mut Vec<u8>) {
    let mut chunk = [0u8; 16 * 1024];
    let n = tokio::time::timeout(Duration::from_secs(10), socket.read(&mut chunk)).await.unwrap().unwrap();
    assert!(n > 0, "the connection closed mid-answer: {:?}", String::from_utf8_lossy(buffer));
    buffer.extend_from_slice(&chunk[..n]);
}

fn request(address: &str, path: &str, token: Option<&str>) -> String {
    let auth = token.map(|t| format!("authorization: Bearer {t}\r\n")).unwrap_or_default();
    format!("GET {path} HTTP/1.1\r\nhost: {address}\r\n{auth}\r\n")
}

/// The answer as the connection's first request: the direct path.
async fn direct(address: &str, path: &str, token: Option<&str>) -> Answer {
    let mut socket = TcpStream::connect(address).await.unwrap();
    socket.write_all(request(address, path, token).as_bytes()).await.unwrap();
    read_answer(&mut socket, &mut Vec::new()).await
}

/// The answer as a kept-alive connection's second request: hyper and the
/// router.
async fn routed(address: &str, path: &str, token: Option<&str>) -> Answer {
    let mut socket = TcpStream::connect(address).await.unwrap();
    let first = request(address, "/api/v1/logs/pipelines", Some(READ));
    socket.write_all(first.as_bytes()).await.unwrap();
    let mut buffer = Vec::new();
    let listing = read_answer(&mut socket, &mut buffer).await;
    assert!(listing.status_line.starts_with("HTTP/1.1 200"), "{listing:?}");
    socket.write_all(request(address, path, token).as_bytes()).await.unwrap();
    read_answer(&mut socket, &mut buffer).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn both_http_paths_answer_every_stream_request_alike() {
    let tokens = vec![
        TokenEntry { token: READ.into(), scopes: vec![Scope::Read] },
        TokenEntry { token: WRITE.into(), scopes: vec![Scope::Write] },
    ];
    let options = EdgeOptions { auth: AuthOptions { tokens }, log_stream: quick_settings(), ..EdgeOptions::default() };
    let server = LogServer::start_with(options, common::quick_config()).await;
    let run = "scheduled__2026-08-10T00:00:00 é";
    let escaped = "scheduled__2026-08-10T00%3A00%3A00%20%C3%A9";
    for (path, body) in [("lines", "one\ntwo\nthree"), ("status", r#"{"state": "success"}"#)] {
        let request = match path {
            "lines" => server.client.post(server.url(&format!("/api/v1/logs/svc.etl/runs/{escaped}/{path}"))),
            _ => server.client.put(server.url(&format!("/api/v1/logs/svc.etl/runs/{escaped}/{path}"))),
        };
        let content_type = if path == "lines" { "text/plain" } else { "application/json" };
        let response = request.bearer_auth(WRITE).header("content-type", content_type).body(body).send().await.unwrap();
        assert!(response.status().is_success(), "{:?}", response.text().await);
    }
    server.archived("svc.etl", run, 3).await;
    let address = server.base.trim_start_matches("http://").to_string();
    let stream =
        |run: &str, after: &str| format!("/api/v1/services/ingestionPipelines/logs/svc.etl/stream/{run}{after}");
    let cases = [
        ("a finished run, whole", stream(escaped, ""), Some(READ)),
        ("resumed from a cursor", stream(escaped, "?after=2"), Some(READ)),
        ("an unplaceable cursor", stream(escaped, "?after=garbage"), Some(READ)),
        ("no token", stream(escaped, ""), None),
        ("an unknown token", stream(escaped, ""), Some("not-a-token-at-all-000")),
        ("a token without read", stream(escaped, ""), Some(WRITE)),
        ("an unknown pipeline", "/api/v1/services/ingestionPipelines/logs/svc.nope/stream/r-1".into(), Some(READ)),
        ("an invalid run id", stream("..", ""), Some(READ)),
    ];
    for (what, path, token) in cases {
        let (first, second) = (direct(&address, &path, token).await, routed(&address, &path, token).await);
        assert_eq!(first, second, "{what}: {path}");
        assert!(!first.body.is_empty(), "{what}: an answer with a body");
    }
    // And the answers are what the protocol says.
    let whole = direct(&address, &stream(escaped, ""), Some(READ)).await;
    assert!(whole.headers.contains(&("content-type".into(), "text/event-stream".into())));
    let text = String::from_utf8(whole.body).unwrap();
    assert!(text.contains(r#""logs":"one\ntwo\nthree""#) && text.contains(r#""reason":"runFinished""#), "{text}");
    let refused = direct(&address, &stream(escaped, ""), None).await;
    assert_eq!(refused.status_line, "HTTP/1.1 401 Unauthorized");
    assert!(refused.headers.contains(&("www-authenticate".into(), "Bearer".into())));
    let problem: serde_json::Value = serde_json::from_slice(&refused.body).unwrap();
    assert_eq!(problem["code"], 401);
}
