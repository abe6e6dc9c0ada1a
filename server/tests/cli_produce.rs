//! `tailrace produce -- COMMAND` as a CI job runs it, against a real edge:
//! the command's standard output and error reach the run in the order it
//! wrote them (and are echoed), the run's state follows its exit (`failed`
//! for a non-zero code, `stopped` for a signal, `success` for 0), and
//! `produce` exits with the command's code. A line that is not UTF-8 is
//! stored with its bad bytes replaced, and counted; the rest is kept.

use tailrace_testkit as common;

use std::process::Command;

use common::logs::*;

/// Runs `produce` for `run` with `script` as the command (`sh -c`); its
/// output.
async fn produce(server: &LogServer, run: &str, script: &str) -> std::process::Output {
    let (base, run, script) = (server.base.clone(), run.to_string(), script.to_string());
    tokio::task::spawn_blocking(move || {
        Command::new(env!("CARGO_BIN_EXE_tailrace"))
            .args(["produce", "--url", &base, "--fqn", "ci.build", "--run", &run, "--flush-ms", "1", "--"])
            .args(["sh", "-c", &script])
            .output()
            .unwrap()
    })
    .await
    .unwrap()
}

async fn run_facts(server: &LogServer, run: &str) -> serde_json::Value {
    let url = server.url(&format!("/api/v1/logs/ci.build/runs/{run}"));
    server.client.get(url).send().await.unwrap().json().await.unwrap()
}

async fn stored(server: &LogServer, run: &str) -> String {
    let url = server.url(&format!("/api/v1/services/ingestionPipelines/logs/ci.build/last/download?runId={run}"));
    server.client.get(url).send().await.unwrap().text().await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_command_fails_its_run_and_produce_exits_with_its_code() {
    let server = LogServer::start(quick_settings()).await;
    // Output and error interleaved, with pauses so each is its own batch,
    // and one line that is not UTF-8.
    let script =
        r#"echo out-1; echo err-1 >&2; sleep 0.05; echo out-2; printf 'bad \377 byte\n' >&2; echo err-2 >&2; exit 3"#;
    let output = produce(&server, "b-1", script).await;
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(3), "{stderr}");
    assert_eq!(String::from_utf8_lossy(&output.stdout), "out-1\nerr-1\nout-2\nbad \u{fffd} byte\nerr-2\n", "echoed");
    assert!(stderr.contains("5 lines sent (1 with invalid UTF-8, replaced)"), "{stderr}");
    server.archived("ci.build", "b-1", 5).await;
    assert_eq!(stored(&server, "b-1").await, "out-1\nerr-1\nout-2\nbad \u{fffd} byte\nerr-2\n");
    assert_eq!(run_facts(&server, "b-1").await["state"], "failed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_that_succeeds_succeeds_and_one_killed_by_a_signal_is_stopped() {
    let server = LogServer::start(quick_settings()).await;
    let output = produce(&server, "ok", "echo built").await;
    assert_eq!(output.status.code(), Some(0), "{}", String::from_utf8_lossy(&output.stderr));
    assert_eq!(run_facts(&server, "ok").await["state"], "success");
    let output = produce(&server, "killed", "echo started; kill -TERM $$").await;
    assert_eq!(output.status.code(), Some(128 + 15), "{}", String::from_utf8_lossy(&output.stderr));
    assert_eq!(run_facts(&server, "killed").await["state"], "stopped");
    server.archived("ci.build", "killed", 1).await;
    assert_eq!(stored(&server, "killed").await, "started\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standard_input_with_a_bad_byte_keeps_every_line_and_the_status() {
    let server = LogServer::start(quick_settings()).await;
    let base = server.base.clone();
    let output = tokio::task::spawn_blocking(move || {
        use std::io::Write;
        let mut child = Command::new(env!("CARGO_BIN_EXE_tailrace"))
            .args(["produce", "--url", &base, "--fqn", "ci.build", "--run", "piped", "--status", "success"])
            .stdin(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        child.stdin.take().unwrap().write_all(b"one\ntw\xffo\nthree\n").unwrap();
        child.wait_with_output().unwrap()
    })
    .await
    .unwrap();
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    server.archived("ci.build", "piped", 3).await;
    assert_eq!(stored(&server, "piped").await, "one\ntw\u{fffd}o\nthree\n");
    assert_eq!(run_facts(&server, "piped").await["state"], "success");
}
