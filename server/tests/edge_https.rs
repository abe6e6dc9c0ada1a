//! `tailrace serve` with `[edge.tls]`, as an operator runs it: HTTPS on
//! both of the edge's paths (a stream opened by a connection's first
//! request is written straight on the TLS session, anything later goes
//! through hyper), a client that does not trust the authority refused at
//! the handshake, plain HTTP on the HTTPS port answered with nothing,
//! `tailrace produce` and `tail` with `--ca-file`, and a start refused on
//! TLS files that cannot be used. Certificates are made with `openssl`.

use tailrace_testkit as common;

use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};

use common::certs::authority;
use common::logs::{Sse, text};

const FQN: &str = "svc.https";

fn tailrace() -> Command {
    Command::new(env!("CARGO_BIN_EXE_tailrace"))
}

use common::free_port;

/// A config with `[edge.tls]` naming `cert` and `key`.
fn tls_config(dir: &Path, cert: &Path, key: &Path) -> PathBuf {
    let path = dir.join("edge.toml");
    let text = format!(
        "[edge.tls]\ncert = \"{}\"\nkey = \"{}\"\n\n[edge.log_stream]\nfinish_grace_seconds = 0.3\n",
        cert.display(),
        key.display()
    );
    std::fs::write(&path, text).unwrap();
    path
}

/// `tailrace serve` until dropped.
struct Serve {
    child: Child,
    port: u16,
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Serve {
    /// Starts `serve` with `config`; returns it once it printed its
    /// `viewer:` line, and that line.
    fn start(config: &Path, data: &Path) -> (Self, String) {
        let port = free_port();
        let mut child = tailrace()
            .args(["serve", "--config"])
            .arg(config)
            .arg("--data-dir")
            .arg(data)
            .args(["--listen", &format!("127.0.0.1:{port}")])
            .env("RUST_LOG", "warn")
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let (found, found_rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if line.contains("viewer:") {
                    let _ = found.send(line.trim().to_string());
                }
            }
        });
        let viewer = found_rx.recv_timeout(Duration::from_secs(60)).expect("serve printed its viewer line");
        (Self { child, port }, viewer)
    }

    fn url(&self, path: &str) -> String {
        format!("https://127.0.0.1:{}{path}", self.port)
    }
}

/// A client that trusts only the authority in `ca`; `pool`: whether it
/// keeps connections for the next request.
fn client(ca: &Path, pool: bool) -> reqwest::Client {
    let certs = reqwest::Certificate::from_pem_bundle(&std::fs::read(ca).unwrap()).unwrap();
    let mut builder = common::http().tls_certs_only(certs);
    if !pool {
        builder = builder.pool_max_idle_per_host(0);
    }
    builder.build().unwrap()
}

fn stream_path(run: &str) -> String {
    format!("/api/v1/services/ingestionPipelines/logs/{FQN}/stream/{run}")
}

/// A TLS session with the edge on `port`, trusting only `ca`.
async fn tls_connect(ca: &Path, port: u16) -> tokio_rustls::client::TlsStream<tokio::net::TcpStream> {
    let roots = tailrace::tls::roots("ca", ca).unwrap();
    let config = rustls::ClientConfig::builder_with_provider(tailrace::tls::provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let socket = tokio::net::TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    let name = rustls::pki_types::ServerName::try_from("127.0.0.1").unwrap();
    tokio_rustls::TlsConnector::from(Arc::new(config)).connect(name, socket).await.unwrap()
}

/// Reads from `stream` into `seen` until it holds `needle`; panics after
/// 30 s.
async fn read_until(stream: &mut (impl AsyncRead + Unpin), seen: &mut Vec<u8>, needle: &str) {
    let found = tokio::time::timeout(Duration::from_secs(30), async {
        while !String::from_utf8_lossy(seen).contains(needle) {
            let mut chunk = [0u8; 4096];
            let n = stream.read(&mut chunk).await.unwrap();
            assert!(n > 0, "closed before {needle:?}: {}", String::from_utf8_lossy(seen));
            seen.extend_from_slice(&chunk[..n]);
        }
    });
    assert!(found.await.is_ok(), "no {needle:?} in {}", String::from_utf8_lossy(seen));
}

/// Events of `sse` until they carry `count` lines.
async fn lines_of(sse: &mut Sse, count: usize) -> String {
    text(&sse.lines(count).await)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_https_edge_serves_both_paths_and_refuses_what_does_not_trust_it() {
    let dir = tempfile::tempdir().unwrap();
    authority(dir.path(), "edge-ca", &["edge"]);
    authority(dir.path(), "other-ca", &[]);
    let ca = dir.path().join("edge-ca.pem");
    let config = tls_config(dir.path(), &dir.path().join("edge.pem"), &dir.path().join("edge.key"));
    let (serve, viewer) = Serve::start(&config, &dir.path().join("data"));
    assert_eq!(viewer, format!("viewer:  https://127.0.0.1:{}/", serve.port));
    // A client that never starts its handshake holds up nobody else.
    let _silent = std::net::TcpStream::connect(("127.0.0.1", serve.port)).unwrap();

    // Lines posted over HTTPS are read back over SSE on the direct path
    // (the stream is its connection's first request)...
    let trusting = client(&ca, true);
    let posted = trusting
        .post(serve.url(&format!("/api/v1/logs/{FQN}/runs/r-1/lines")))
        .header("content-type", "text/plain")
        .body("alpha\nbeta\ngamma\n")
        .send()
        .await
        .unwrap();
    assert_eq!(posted.status(), 202);
    let mut direct = Sse::open(&client(&ca, false), &serve.url(&stream_path("r-1"))).await;
    assert_eq!((direct.status, direct.connection.as_str()), (200, "close"), "served by the direct path");
    assert_eq!(lines_of(&mut direct, 3).await, "alpha\nbeta\ngamma");

    // ... and through hyper: a later request of a kept-alive connection.
    let mut kept = tls_connect(&ca, serve.port).await;
    let mut seen = Vec::new();
    kept.write_all(b"GET /healthz HTTP/1.1\r\nhost: 127.0.0.1\r\n\r\n").await.unwrap();
    read_until(&mut kept, &mut seen, "\r\n\r\n{\"live\":true}").await;
    let request = format!("GET {} HTTP/1.1\r\nhost: 127.0.0.1\r\n\r\n", stream_path("r-1"));
    kept.write_all(request.as_bytes()).await.unwrap();
    let healthz = seen.len();
    read_until(&mut kept, &mut seen, "gamma").await;
    let streamed = String::from_utf8_lossy(&seen[healthz..]).to_ascii_lowercase();
    assert!(streamed.starts_with("http/1.1 200 ok\r\n"), "{streamed}");
    assert!(streamed.contains("text/event-stream") && !streamed.contains("connection: close"), "hyper: {streamed}");
    assert!(streamed.contains(r#""logs":"alpha\nbeta\ngamma""#), "{streamed}");
    let more = trusting
        .post(serve.url(&format!("/api/v1/logs/{FQN}/runs/r-1/lines")))
        .header("content-type", "text/plain")
        .body("delta")
        .send()
        .await
        .unwrap();
    assert_eq!(more.status(), 202);
    assert_eq!(direct.event().await.unwrap()["logs"], "delta", "live over TLS");
    read_until(&mut kept, &mut seen, r#""logs":"delta""#).await;

    // A client that does not trust the edge's authority fails the handshake.
    let untrusting = client(&dir.path().join("other-ca.pem"), false);
    let refused = untrusting.get(serve.url(&stream_path("r-1"))).send().await.unwrap_err();
    assert!(refused.is_connect(), "refused at the handshake: {refused:?}");

    // Plain HTTP to the HTTPS port gets no log data (nor any HTTP answer).
    let port = serve.port;
    let answered = tokio::task::spawn_blocking(move || {
        let mut socket = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
        socket.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        let request = format!("GET {} HTTP/1.1\r\nhost: 127.0.0.1\r\n\r\n", stream_path("r-1"));
        socket.write_all(request.as_bytes()).unwrap();
        let mut answer = Vec::new();
        let _ = socket.read_to_end(&mut answer);
        answer
    })
    .await
    .unwrap();
    let answer = String::from_utf8_lossy(&answered);
    assert!(!answer.contains("alpha") && !answer.contains("HTTP/1.1"), "plain HTTP got: {answer:?}");

    // The edge still serves the clients that trust it.
    assert_eq!(trusting.get(serve.url("/healthz")).send().await.unwrap().status(), 200);
}

/// `tailrace produce --url base --fqn FQN --ca-file ca` with `args`,
/// `input` on its standard input; its output.
async fn produce(base: &str, ca: &Path, args: &[&str], input: String) -> std::process::Output {
    let mut command = tailrace();
    command.args(["produce", "--url", base, "--fqn", FQN, "--ca-file"]).arg(ca).args(args);
    tokio::task::spawn_blocking(move || {
        let mut child = command.stdin(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
        child.stdin.take().unwrap().write_all(input.as_bytes()).unwrap();
        child.wait_with_output().unwrap()
    })
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn produce_and_tail_talk_to_an_https_edge_with_ca_file() {
    let dir = tempfile::tempdir().unwrap();
    authority(dir.path(), "edge-ca", &["edge"]);
    let ca = dir.path().join("edge-ca.pem");
    let config = tls_config(dir.path(), &dir.path().join("edge.pem"), &dir.path().join("edge.key"));
    let (serve, _) = Serve::start(&config, &dir.path().join("data"));
    let base = serve.url("");
    let input: String = (0..100).map(|i| format!("line {i}\n")).collect();
    let produced = produce(&base, &ca, &["--run", "r-2", "--status", "success"], input).await;
    assert!(produced.status.success(), "{}", String::from_utf8_lossy(&produced.stderr));
    let tailed = tokio::task::spawn_blocking(move || {
        tailrace().args(["tail", "--url", &base, "--fqn", FQN, "--run", "r-2", "--ca-file"]).arg(&ca).output().unwrap()
    })
    .await
    .unwrap();
    assert!(tailed.status.success(), "{}", String::from_utf8_lossy(&tailed.stderr));
    let expected: String = (0..100).map(|i| format!("line {i}\n")).collect();
    assert_eq!(String::from_utf8(tailed.stdout).unwrap(), expected);
    assert!(String::from_utf8_lossy(&tailed.stderr).contains("run finished"));
}

/// A client that does not trust the edge's certificate says why, not only
/// that sending failed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn produce_to_an_edge_it_does_not_trust_names_the_certificate_problem() {
    let dir = tempfile::tempdir().unwrap();
    authority(dir.path(), "edge-ca", &["edge"]);
    authority(dir.path(), "other-ca", &["other"]);
    let config = tls_config(dir.path(), &dir.path().join("edge.pem"), &dir.path().join("edge.key"));
    let (serve, _) = Serve::start(&config, &dir.path().join("data"));
    let other = dir.path().join("other-ca.pem");
    let produced = produce(&serve.url(""), &other, &["--run", "r-3", "--attempts", "1"], "a line\n".into()).await;
    let stderr = String::from_utf8_lossy(&produced.stderr);
    assert!(!produced.status.success(), "{stderr}");
    assert!(stderr.contains("certificate"), "the error does not say why: {stderr}");
}

/// `tailrace serve` with `config`: it must refuse to start; its stderr.
fn refused_start(config: &Path, data: &Path, listen: &str) -> String {
    let out = tailrace()
        .args(["serve", "--config"])
        .arg(config)
        .arg("--data-dir")
        .arg(data)
        .args(["--listen", listen])
        .env("RUST_LOG", "warn")
        .output()
        .unwrap();
    assert!(!out.status.success(), "serve started: {}", String::from_utf8_lossy(&out.stdout));
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn a_start_with_tls_files_that_cannot_be_used_fails_naming_the_key_and_the_file() {
    let dir = tempfile::tempdir().unwrap();
    authority(dir.path(), "edge-ca", &["edge", "other"]);
    let (cert, key, data) = (dir.path().join("edge.pem"), dir.path().join("edge.key"), dir.path().join("data"));
    let listen = format!("127.0.0.1:{}", free_port());

    let missing = dir.path().join("missing.pem");
    let err = refused_start(&tls_config(dir.path(), &missing, &key), &data, &listen);
    assert!(err.contains(&format!("edge.tls.cert: cannot read {}", missing.display())), "{err}");

    let garbage = dir.path().join("garbage.key");
    std::fs::write(&garbage, "not a key\n").unwrap();
    let err = refused_start(&tls_config(dir.path(), &cert, &garbage), &data, &listen);
    assert!(err.contains(&format!("edge.tls.key: cannot read {}", garbage.display())), "{err}");

    let other_key = dir.path().join("other.key");
    let err = refused_start(&tls_config(dir.path(), &cert, &other_key), &data, &listen);
    let both = format!(
        "edge.tls.cert ({}) and edge.tls.key ({}): the key does not belong to the certificate",
        cert.display(),
        other_key.display()
    );
    assert!(err.contains(&both), "{err}");

    // TLS is no reason to listen beyond loopback without tokens.
    let err = refused_start(&tls_config(dir.path(), &cert, &key), &data, "0.0.0.0:0");
    assert!(err.contains("refusing to listen on 0.0.0.0:0 without [edge.auth] tokens"), "{err}");
}
