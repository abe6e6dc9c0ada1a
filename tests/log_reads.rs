//! The JSON Lines reads for scripts and agents (`…/lines`, `…/failures`)
//! over real HTTP: ranges, tails, matches with context, group paths, every
//! bound, and `next` walking a run without losing or repeating a line.

use tailrace_testkit as common;

use common::logs::*;
use serde_json::{Value, json};
use tailrace::config::EdgeOptions;

/// A build log: setup, a `Build` group holding a `Test` group with two
/// errors, a passing `Lint` section, then a failure outside any group.
fn build_log() -> Vec<String> {
    let mut lines = vec!["checkout".to_string(), "::group::Build".into(), "compiling".into()];
    lines.push("\x1b[36m::group::Test\x1b[0m".into());
    lines.extend((1..=10).map(|i| format!("test t{i} ... ok")));
    lines.push("test t11 ... \x1b[31mFAILED\x1b[0m".into()); // line 15
    lines.push("error: test failed, to rerun pass `--lib`".into()); // line 16
    lines.push("::endgroup::".into());
    lines.push("::endgroup::".into());
    lines.push("section_start:1700000000:lint\r\x1b[0KRun lint".into()); // line 19
    lines.push("lint ok".into());
    lines.push("section_end:1700000001:lint\r\x1b[0K".into());
    lines.push("Process exited with code 101".into()); // line 22
    lines
}

/// `GET path?query`: status, the records and the summary.
async fn read(server: &LogServer, path: &str, query: &str) -> (u16, Vec<Value>, Value) {
    let url = server.url(&format!("/api/v1/logs/svc.ci/runs/r-1/{path}?{query}"));
    let response = server.client.get(url).send().await.unwrap();
    let status = response.status().as_u16();
    if status != 200 {
        return (status, Vec::new(), response.json().await.unwrap_or(Value::Null));
    }
    assert_eq!(response.headers()["content-type"], "application/x-ndjson");
    let text = response.text().await.unwrap();
    assert!(text.ends_with('\n'), "every record ends its line");
    let mut records: Vec<Value> = text.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let summary = records.pop().unwrap();
    (status, records, summary)
}

fn numbers(records: &[Value]) -> Vec<u64> {
    records.iter().map(|r| r["line"].as_u64().unwrap()).collect()
}

async fn server_with(log: &[String], options: EdgeOptions) -> LogServer {
    let server =
        LogServer::start_with(EdgeOptions { log_stream: quick_settings(), ..options }, common::quick_config()).await;
    server.lines("svc.ci", "r-1", &log.join("\n")).await;
    server.state("svc.ci", "r-1", "failed").await;
    server.archived("svc.ci", "r-1", log.len() as u64).await;
    server
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_range_a_tail_and_matches_carry_numbers_and_group_paths() {
    let server = server_with(&build_log(), EdgeOptions::default()).await;

    let (status, records, summary) = read(&server, "lines", "from=14&to=17").await;
    assert_eq!(status, 200);
    assert_eq!(
        records,
        vec![
            json!({"line": 14, "text": "test t10 ... ok", "group": ["Build", "Test"]}),
            json!({"line": 15, "text": "test t11 ... FAILED", "group": ["Build", "Test"]}),
            json!({"line": 16, "text": "error: test failed, to rerun pass `--lib`", "group": ["Build", "Test"]}),
            json!({"line": 17, "text": "::endgroup::", "group": ["Build", "Test"]}),
        ]
    );
    assert_eq!(summary, json!({"total": 22, "state": "failed"}), "all that was asked came");

    // The last lines; escapes kept with raw=1.
    let (_, records, summary) = read(&server, "lines", "tail=3").await;
    assert_eq!(numbers(&records), [20, 21, 22]);
    assert_eq!(records[0]["group"], json!(["Run lint"]));
    assert!(records[2].get("group").is_none(), "a line in no group has no path");
    assert_eq!(summary, json!({"total": 22, "state": "failed"}));
    let (_, records, _) = read(&server, "lines", "tail=1&to=15&raw=1").await;
    assert_eq!(
        records,
        vec![json!({"line": 15, "text": "test t11 ... \x1b[31mFAILED\x1b[0m", "group": ["Build", "Test"]})]
    );

    // Errors only, with context, each line once even where contexts meet.
    let (_, records, summary) = read(&server, "lines", "level=error&before=1&after=1").await;
    assert_eq!(numbers(&records), [14, 15, 16, 17, 21, 22]);
    let matched: Vec<bool> = records.iter().map(|r| r["match"] == json!(true)).collect();
    assert_eq!(matched, [false, true, true, false, false, true]);
    assert_eq!(summary["scanned"], 22);
    assert!(summary.get("next").is_none());
    let (_, records, _) = read(&server, "lines", "q=T1%5Cd&regex=1&case=1").await;
    assert_eq!(numbers(&records), [] as [u64; 0], "case=1: `T1` is not `t1`");
    let (_, records, _) = read(&server, "lines", "q=t1&from=10").await;
    assert_eq!(numbers(&records), [14, 15], "t10 and t11");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_failing_groups_are_folded_to_their_titles_and_errors() {
    let server = server_with(&build_log(), EdgeOptions::default()).await;
    let (status, records, summary) = read(&server, "failures", "").await;
    assert_eq!(status, 200);
    assert_eq!(
        records,
        vec![
            json!({"group": ["Build", "Test"], "title": "Test", "from": 4, "to": 17, "errorCount": 2,
                   "errors": [{"line": 15, "text": "test t11 ... FAILED"},
                              {"line": 16, "text": "error: test failed, to rerun pass `--lib`"}]}),
            json!({"group": [], "errorCount": 1, "errors": [{"line": 22, "text": "Process exited with code 101"}]}),
        ]
    );
    assert_eq!(summary, json!({"total": 22, "state": "failed"}));
    // From the middle of a group, its path is still known.
    let (_, records, _) = read(&server, "failures", "from=16").await;
    assert_eq!(records[0]["group"], json!(["Build", "Test"]));
    assert_eq!(records[0]["errorCount"], 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn following_next_returns_every_line_and_every_match_once_within_every_bound() {
    let log: Vec<String> =
        (1..=3_000)
            .map(|i| {
                if i % 97 == 0 {
                    format!("{i:05} error: unit {i} failed")
                } else {
                    format!("{i:05} {}", "x".repeat(60))
                }
            })
            .collect();
    let options = EdgeOptions {
        max_answer_bytes: 8 * 1024,
        max_page_lines: 500,
        max_search_scan_lines: 700,
        ..EdgeOptions::default()
    };
    let server = server_with(&log, options).await;

    // The whole log, page by page: every line once, in order; each answer
    // within the byte bound and the line bound.
    let (mut seen, mut from, mut pages) = (Vec::new(), 1u64, 0);
    loop {
        let (status, records, summary) = read(&server, "lines", &format!("from={from}")).await;
        assert_eq!(status, 200, "{summary}");
        let bytes: usize = records.iter().map(|r| r.to_string().len() + 1).sum();
        assert!(bytes <= 8 * 1024 && records.len() <= 500, "{bytes} bytes, {} lines", records.len());
        seen.extend(numbers(&records));
        pages += 1;
        match summary["next"].as_str() {
            Some(next) => from = next.parse().unwrap(),
            None => break,
        }
    }
    assert_eq!(seen, (1..=3_000).collect::<Vec<u64>>());
    assert!(pages >= 3_000 * 67 / 8192, "{pages} pages");

    // Matches with context, under a small maxBytes and the scan bound.
    let (mut matches, mut lines, mut from) = (Vec::new(), Vec::new(), 1u64);
    loop {
        let (_, records, summary) =
            read(&server, "lines", &format!("level=error&before=3&after=2&maxBytes=1000&from={from}")).await;
        assert!(summary["scanned"].as_u64().unwrap() <= 700, "{summary}");
        for record in &records {
            lines.push(record["line"].as_u64().unwrap());
            if record["match"] == json!(true) {
                matches.push(record["line"].as_u64().unwrap());
            }
        }
        match summary["next"].as_str() {
            Some(next) => from = next.parse().unwrap(),
            None => break,
        }
    }
    assert_eq!(matches, (1..=30).map(|k| k * 97).collect::<Vec<u64>>(), "every match once, in order");
    let mut sorted = lines.clone();
    sorted.dedup();
    assert_eq!(sorted, lines, "no line twice");
    assert_eq!(lines.len(), 30 * 6, "each match with its context");

    // Past the scan bound from the start, the group paths are not known,
    // and the answer says so.
    let (_, _, summary) = read(&server, "lines", "from=2000&to=2001").await;
    assert_eq!(summary["groupsKnown"], false, "{summary}");
    let (_, _, summary) = read(&server, "lines", "from=700&to=701").await;
    assert!(summary.get("groupsKnown").is_none(), "{summary}");

    // A tail bigger than the byte bound keeps the newest lines and says
    // where the rest ends.
    let (_, records, summary) = read(&server, "lines", "tail=400").await;
    assert_eq!(records.last().unwrap()["line"], 3_000);
    let first = records[0]["line"].as_u64().unwrap();
    assert!(first > 2_601, "{first}");
    assert_eq!(summary["prev"], json!((first - 1).to_string()));

    // Failures under a tiny byte bound: every error line once.
    let (mut errors, mut from) = (Vec::new(), 1u64);
    loop {
        let (_, records, summary) = read(&server, "failures", &format!("maxBytes=256&from={from}")).await;
        for record in &records {
            let listed = record["errors"].as_array().unwrap();
            assert_eq!(record["errorCount"].as_u64().unwrap() as usize, listed.len(), "{record}");
            errors.extend(listed.iter().map(|e| e["line"].as_u64().unwrap()));
        }
        match summary["next"].as_str() {
            Some(next) => from = next.parse().unwrap(),
            None => break,
        }
    }
    assert_eq!(errors, (1..=30).map(|k| k * 97).collect::<Vec<u64>>());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_reads_get_clear_errors() {
    let server = server_with(&build_log(), EdgeOptions::default()).await;
    for (query, message) in [
        ("from=0", "from and to are 1-based line numbers"),
        ("tail=5&from=3", "give from or tail, not both"),
        ("tail=5&q=x", "tail reads the last lines: give it without q or level"),
        ("q=x&before=101", "before and after are at most 100 lines"),
        ("before=2", "before and after are context for q or level"),
        ("level=fatal", "unknown level `fatal` (error or warning)"),
        ("q=(&regex=1", "invalid regular expression"),
        ("from=x", "from"),
    ] {
        let (status, _, answer) = read(&server, "lines", query).await;
        assert_eq!(status, 400, "{query}: {answer}");
        assert!(answer["message"].as_str().unwrap().contains(message), "{query}: {answer}");
    }
    let url = server.url("/api/v1/logs/svc.ci/runs/r-9/lines");
    let response = server.client.get(url).send().await.unwrap();
    assert_eq!(response.status(), 404);
    assert_eq!(response.json::<Value>().await.unwrap()["message"], "pipeline `svc.ci` has no run `r-9`");
}
