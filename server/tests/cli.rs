//! The binary, as a user runs it.

use std::process::Command;

fn tailrace() -> Command {
    Command::new(env!("CARGO_BIN_EXE_tailrace"))
}

/// Runs the demo for `seconds` on `data`; returns (produced, delivered,
/// delivered from earlier lives, duplicates, lost) from its summary line.
fn demo(data: &std::path::Path, seconds: &str) -> [u64; 5] {
    let out = tailrace()
        .args(["demo", "--seconds", seconds, "--listen", "127.0.0.1:0", "--rate", "2000", "--data-dir"])
        .arg(data)
        .output()
        .expect("the binary runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "stdout:\n{stdout}\nstderr:\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains("(file adapter)"), "{stdout}");
    let done = stdout.lines().find(|l| l.starts_with("done:")).expect("a summary line");
    let numbers: Vec<u64> = done.split(|c: char| !c.is_ascii_digit()).filter_map(|n| n.parse().ok()).collect();
    [numbers[0], numbers[1], numbers[2], numbers[3], numbers[4]]
}

/// The README's main job: events flow through durable file queues, every
/// node hands over, and every event produced was delivered, in order. A
/// second run on the same data needs no recovery and replays nothing.
#[test]
fn the_demo_runs_on_the_file_adapter_and_restarts_cleanly() {
    let data = tempfile::tempdir().unwrap();
    for run in 0..2 {
        let [produced, delivered, earlier, duplicates, lost] = demo(data.path(), "2");
        assert!(produced > 0, "run {run}");
        assert_eq!(produced, delivered, "run {run}: produced = delivered");
        assert_eq!((earlier, duplicates, lost), (0, 0, 0), "run {run}: nothing replayed, twice or lost");
    }
}

/// The demo killed with SIGKILL mid-flight starts again on the same data
/// with no manual step, delivers what the dead one left, and counts
/// duplicates and losses across the two lives (none lost).
#[test]
fn the_demo_survives_its_own_kill_9() {
    use std::io::{BufRead, BufReader};
    let data = tempfile::tempdir().unwrap();
    let mut child = tailrace()
        .args(["demo", "--listen", "127.0.0.1:0", "--rate", "4000", "--data-dir"])
        .arg(data.path())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let mut progress = 0;
    for line in BufReader::new(stdout).lines() {
        let line = line.unwrap();
        // Two progress lines: events produced and delivered, some in flight.
        if line.contains(" produced ") {
            progress += 1;
            if progress == 2 {
                break;
            }
        }
    }
    assert_eq!(progress, 2, "the first life printed its progress");
    child.kill().unwrap();
    child.wait().unwrap();
    let [produced, delivered, earlier, duplicates, lost] = demo(data.path(), "3");
    assert!(produced > 0 && produced == delivered, "{produced} produced, {delivered} delivered");
    assert!(earlier + duplicates > 0, "the first life's undelivered or unacknowledged events came in the second");
    assert_eq!(lost, 0);
}

#[test]
fn handoff_recover_reports_and_quarantines_a_crashed_writers_files() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join(".events.lock"), "pid 1\n").unwrap();
    std::fs::write(
        dir.path().join("events-2.open"),
        "{\"id\":\"a\",\"stream\":{\"namespace\":\"logs\",\"key\":\"k\"},\"ts\":1,\"payload\":\"x\"}\n{\"id\":\"b\",\"str",
    )
    .unwrap();
    let out = tailrace().args(["handoff", "recover", "--prefix", "events", "--dir"]).arg(dir.path()).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains("stale lock removed"), "{stdout}");
    assert!(stdout.contains("1 complete lines (1 valid), truncated tail 14 bytes"), "{stdout}");
    assert!(stdout.contains("run again with --republish"), "{stdout}");
    assert!(dir.path().join("quarantine/events-2.open").exists());
    let again = tailrace().args(["handoff", "recover", "--prefix", "../x", "--dir"]).arg(dir.path()).output().unwrap();
    assert!(!again.status.success());
    assert!(String::from_utf8_lossy(&again.stderr).contains("invalid prefix"));
}

/// Benchmarks are not the shipped binary's: they are `tailrace-bench`'s.
#[test]
fn the_binary_has_no_benchmark_command() {
    let help = tailrace().arg("--help").output().unwrap();
    assert!(help.status.success());
    assert!(!String::from_utf8_lossy(&help.stdout).contains("bench"), "{}", String::from_utf8_lossy(&help.stdout));
    let bench = tailrace().args(["bench", "pipeline", "--quick"]).output().unwrap();
    assert!(!bench.status.success());
    assert!(String::from_utf8_lossy(&bench.stderr).contains("unrecognized subcommand 'bench'"));
}

#[test]
fn a_bad_config_file_names_the_file_and_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.toml");
    std::fs::write(&path, "[agent]\npoll_perod = \"1s\"\n").unwrap();
    let out =
        tailrace().args(["demo", "--seconds", "1", "--listen", "127.0.0.1:0", "--config"]).arg(&path).output().unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("bad.toml") && stderr.contains("poll_perod"), "{stderr}");
}
