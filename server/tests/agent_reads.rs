//! Reading a stored run as scripts and coding agents do: `tailrace logs`
//! in a terminal, and `tailrace mcp` driven by a real MCP client (the
//! Python SDK from PyPI, not one written here), against a real edge.

use tailrace_testkit as common;

use std::process::{Command, Output};

use common::logs::*;
use serde_json::{Value, json};

fn tailrace(args: &[&str]) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_tailrace"));
    command.args(args);
    command
}

async fn output(mut command: Command) -> Output {
    tokio::task::spawn_blocking(move || command.output().unwrap()).await.unwrap()
}

/// A failed build: a `Test` group in a `Build` group with two errors, a
/// passing lint section, and a failure outside any group.
const BUILD_LOG: &str = "checkout\n::group::Build\ncompiling\n::group::Test\ntest a ... ok\ntest b ... \x1b[31mFAILED\x1b[0m\n\
error: test failed\n::endgroup::\n::endgroup::\nsection_start:1700000000:lint\r\x1b[0KRun lint\nlint ok\n\
section_end:1700000001:lint\r\x1b[0K\nProcess exited with code 101";

async fn failed_run() -> LogServer {
    let server = LogServer::start(quick_settings()).await;
    // The last success: the same build, passing.
    let passed = BUILD_LOG.replace("test b ... \x1b[31mFAILED\x1b[0m\nerror: test failed\n", "test b ... ok\n");
    let passed = passed.replace("code 101", "code 0");
    server.lines("svc.ci", "r-6", &passed).await;
    server.state("svc.ci", "r-6", "success").await;
    server.lines("svc.ci", "r-7", BUILD_LOG).await;
    server.state("svc.ci", "r-7", "failed").await;
    server.archived("svc.ci", "r-7", 13).await;
    server
}

fn text(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logs_prints_matches_with_context_tails_and_failing_groups() {
    let server = failed_run().await;
    let run = ["logs", "--url", &server.base, "--fqn", "svc.ci", "--run", "r-7"];
    let with = |more: &[&str]| tailrace(&[&run[..], more].concat());

    let errors = output(with(&["--errors", "-B", "1"])).await;
    assert!(errors.status.success(), "{}", String::from_utf8_lossy(&errors.stderr));
    assert_eq!(
        text(&errors),
        "     5- test a ... ok\n     6: test b ... FAILED\n     7: error: test failed\n--\n\
         \x20   12- section_end:1700000001:lint\n    13: Process exited with code 101\n"
    );

    let failures = output(with(&["--failures"])).await;
    assert_eq!(
        text(&failures),
        "Build > Test (lines 4-8): 2 errors\n     6: test b ... FAILED\n     7: error: test failed\n\
         outside any group: 1 error\n    13: Process exited with code 101\n"
    );

    let tail = output(with(&["--tail", "2", "--json"])).await;
    let records: Vec<Value> = text(&tail).lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(
        records,
        [
            json!({"line": 12, "text": "section_end:1700000001:lint", "group": ["Run lint"]}),
            json!({"line": 13, "text": "Process exited with code 101"}),
            json!({"total": 13, "state": "failed"}),
        ]
    );

    // A bounded answer says how to go on; --all reads to the end.
    let first = output(with(&["--from", "1", "--max-bytes", "256"])).await;
    let more = String::from_utf8_lossy(&first.stderr);
    assert!(more.contains("more from line"), "{more}");
    let all = output(with(&["--max-bytes", "256", "--all"])).await;
    assert_eq!(text(&all).lines().count(), 13);

    // A filter that finds nothing exits 1, like grep; a refusal says why.
    let nothing = output(with(&["--grep", "no such text"])).await;
    assert_eq!((nothing.status.code(), text(&nothing)), (Some(1), String::new()));
    let unknown = output(tailrace(&["logs", "--url", &server.base, "--fqn", "svc.ci", "--run", "nope"])).await;
    assert!(!unknown.status.success());
    let said = String::from_utf8_lossy(&unknown.stderr);
    assert!(said.contains("the edge answered 404: pipeline `svc.ci` has no run `nope`"), "{said}");
}

/// The Python MCP SDK, or why it is missing (a skip, but not under CI
/// unless `.ci/run` could not install it).
fn python_mcp() -> bool {
    let found = Command::new("python3").args(["-c", "import mcp"]).output();
    if found.is_ok_and(|o| o.status.success()) {
        return true;
    }
    let excused = std::env::var_os("TAILRACE_MCP_PYTHON_UNAVAILABLE").is_some();
    assert!(std::env::var_os("CI").is_none() || excused, "no Python MCP SDK under CI: python3 -m pip install mcp");
    println!("skipped: no Python MCP SDK (python3 -m pip install mcp)");
    false
}

/// The MCP client: starts `tailrace mcp`, lists its tools, calls some,
/// and prints what it got as one JSON object.
const CLIENT: &str = r#"
import asyncio, json, sys
from mcp import Client, StdioServerParameters

async def main():
    binary, base = sys.argv[1], sys.argv[2]
    server = StdioServerParameters(command=binary, args=["mcp", "--url", base, "--max-bytes", "2048"])
    async with Client(server) as client:
        tools = await client.list_tools()
        out = {"tools": sorted(t.name for t in tools.tools)}
        for name, args in [
            ("tail", {"pipeline": "svc.ci", "run": "r-7", "lines": 3}),
            ("failing_groups", {"pipeline": "svc.ci", "run": "r-7"}),
            ("search", {"pipeline": "svc.ci", "run": "r-7", "query": "line", "from": 1}),
            ("run_status", {"pipeline": "svc.ci", "run": "nope"}),
            ("diff", {"pipeline": "svc.ci", "run": "r-7", "against": "r-6"}),
        ]:
            result = await client.call_tool(name, args)
            out[name] = {"error": bool(result.is_error), "text": "".join(c.text for c in result.content)}
        print(json.dumps(out))

asyncio.run(main())
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_reads_a_failed_run_through_mcp() {
    if !python_mcp() {
        return;
    }
    let server = failed_run().await;
    // Enough lines that a search must be cut by the byte bound.
    let many: String = (1..=200).map(|i| format!("line {i} {}\n", "x".repeat(40))).collect();
    server.lines("svc.ci", "r-7", &many).await;
    server.archived("svc.ci", "r-7", 213).await;
    let mut client = Command::new("python3");
    client.args(["-c", CLIENT, env!("CARGO_BIN_EXE_tailrace"), &server.base]);
    let ran = output(client).await;
    assert!(ran.status.success(), "{}", String::from_utf8_lossy(&ran.stderr));
    let got: Value = serde_json::from_str(text(&ran).trim()).unwrap();
    assert_eq!(
        got["tools"],
        json!(["diff", "failing_groups", "list_pipelines", "list_runs", "read_range", "run_status", "search", "tail"])
    );
    let records = |tool: &str| -> Vec<Value> {
        got[tool]["text"].as_str().unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect()
    };
    let tail = records("tail");
    assert_eq!(tail.iter().filter_map(|r| r["line"].as_u64()).collect::<Vec<_>>(), [211, 212, 213]);
    assert_eq!(tail.last().unwrap()["total"], 213);
    let failing = records("failing_groups");
    assert_eq!(failing[0]["title"], "Test");
    assert_eq!(
        failing[0]["errors"],
        json!([{"line": 6, "text": "test b ... FAILED"}, {"line": 7, "text": "error: test failed"}])
    );
    // Bounded: 2 KiB of records, and a `next` to go on.
    let search = got["search"]["text"].as_str().unwrap();
    let summary = records("search").pop().unwrap();
    assert!(search.len() <= 2048 + summary.to_string().len() + 1, "{} bytes", search.len());
    assert!(summary["next"].as_str().is_some(), "{summary}");
    // The diff against the last success: the failure, as a unified diff.
    let diff = got["diff"]["text"].as_str().unwrap();
    assert!(diff.starts_with("--- r-6\n+++ r-7\n@@ -3,10 +3,211 @@\n compiling\n"), "{diff}");
    assert!(diff.contains("\n-test b ... ok\n+test b ... \x1b[31mFAILED\x1b[0m\n+error: test failed\n"), "{diff}");
    assert!(diff.contains("\n-Process exited with code 0\n+Process exited with code 101\n"), "{diff}");
    // One hunk larger than the bound: cut, saying where the rest is.
    let (shown, note) =
        diff.rsplit_once("\n(this hunk is cut here: read the rest with read_range: r-7 from line ").unwrap();
    assert!(shown.len() <= 2048 && note.ends_with(")\n"), "{} bytes: {note}", shown.len());
    assert_eq!(got["run_status"]["error"], true);
    assert!(got["run_status"]["text"].as_str().unwrap().contains("has no run `nope`"), "{}", got["run_status"]);
}
