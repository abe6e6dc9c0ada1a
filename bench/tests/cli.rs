//! The bench binary, as a developer runs it: one subcommand per scenario,
//! each ending with its `RESULT` line.

use std::collections::BTreeMap;
use std::process::Command;

fn bench() -> Command {
    Command::new(env!("CARGO_BIN_EXE_tailrace-bench"))
}

#[test]
fn an_unknown_scenario_is_a_clear_error_listing_the_known_ones() {
    let out = bench().args(["nope", "--quick"]).output().unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("unrecognized subcommand 'nope'"), "{stderr}");
    let help = bench().arg("--help").output().unwrap();
    let help = String::from_utf8_lossy(&help.stdout);
    for scenario in ["pipeline", "file", "redis", "kafka", "sse", "transport", "failover", "scale", "viewer", "diff"] {
        assert!(help.contains(&format!("  {scenario} ")), "{scenario} missing from:\n{help}");
    }
}

/// The transport bench delivers every event it sends across two linked
/// transports (it fails otherwise) and reports its ratio to plain TCP.
#[test]
fn transport_quick_delivers_everything_and_reports_a_ratio() {
    let out = bench().args(["transport", "--quick"]).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", String::from_utf8_lossy(&out.stderr));
    let result = stdout.lines().find(|l| l.starts_with("RESULT scenario=transport ")).expect("a RESULT line");
    let ratio: f64 = result
        .split(' ')
        .find_map(|kv| kv.strip_prefix("ratio="))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no ratio in {result}"));
    assert!(ratio > 0.0, "{result}");
}

/// `redis --cluster` runs the node on a private Redis Cluster of three
/// masters and on one Redis, and reports both rates, their ratio and how
/// busy Redis was on each side; `--cluster` is refused elsewhere.
#[test]
fn redis_cluster_quick_reports_three_masters_against_one() {
    let out = bench().args(["redis", "--cluster", "--quick"]).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", String::from_utf8_lossy(&out.stderr));
    let result = stdout.lines().find(|l| l.starts_with("RESULT scenario=redis-cluster ")).expect("a RESULT line");
    let field = |name: &str| -> f64 {
        let prefix = format!("{name}=");
        result.split(' ').find_map(|kv| kv.strip_prefix(prefix.as_str())).and_then(|v| v.parse().ok()).unwrap_or(-1.0)
    };
    for name in ["tailrace_eps", "baseline_eps", "ratio", "redis_cores_1", "redis_cores_3"] {
        assert!(field(name) > 0.0, "{name} in {result}");
    }
    assert_eq!(field("masters"), 3.0, "{result}");
    let refused = bench().args(["file", "--cluster", "--quick"]).output().unwrap();
    assert!(String::from_utf8_lossy(&refused.stderr).contains("unexpected argument '--cluster'"));
}

/// A node of three killed under load (the `tailrace` binary built beside
/// the bench, as `cargo test --workspace` builds it): its queues re-owned,
/// nothing lost.
#[test]
fn failover_quick_reports_no_loss() {
    let out = bench().args(["failover", "--quick"]).env("RUST_LOG", "warn").output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "bench failover failed:\n{stdout}\n{stderr}");
    let results: Vec<&str> = stdout.lines().filter(|l| l.starts_with("RESULT ")).collect();
    assert_eq!(results.len(), 1, "exactly one RESULT line:\n{stdout}");
    let fields: BTreeMap<&str, &str> =
        results[0].split_whitespace().skip(1).filter_map(|f| f.split_once('=')).collect();
    let number = |key: &str| -> f64 {
        fields.get(key).and_then(|v| v.parse().ok()).unwrap_or_else(|| panic!("no number `{key}` in {}", results[0]))
    };
    assert_eq!(fields.get("scenario"), Some(&"failover"));
    assert_eq!(fields.get("mode"), Some(&"kill"));
    assert_eq!(number("lease_ttl_ms"), 8000.0);
    assert!(number("produced") > 0.0, "{}", results[0]);
    assert_eq!(number("lost"), 0.0, "{}", results[0]);
    assert!(number("reown_ms") > 0.0 && number("first_delivery_ms") > 0.0, "{}", results[0]);
    assert!(number("duplicates") >= 0.0);
    let ratio = number("reown_over_ttl");
    assert!((ratio - number("reown_ms") / 8000.0).abs() < 0.01, "{}", results[0]);
}

/// `sse` runs one case at a time: its default, `--sweep`, `--burst` or
/// `--stalled`, each listed in its help; two at once are refused.
#[test]
fn sse_lists_its_cases_and_runs_one_at_a_time() {
    let help = bench().args(["sse", "--help"]).output().unwrap();
    let help = String::from_utf8_lossy(&help.stdout);
    for flag in ["--sweep", "--burst", "--stalled", "--quick"] {
        assert!(help.contains(flag), "{flag} missing from:\n{help}");
    }
    let refused = bench().args(["sse", "--sweep", "--burst"]).output().unwrap();
    assert!(!refused.status.success());
    assert!(String::from_utf8_lossy(&refused.stderr).contains("cannot be used with"));
}
