//! The binary, as a user runs it.

use std::process::Command;

fn tailrace() -> Command {
    Command::new(env!("CARGO_BIN_EXE_tailrace"))
}

/// The README's main job: events flow, then every node hands over and
/// every event produced was delivered, in order.
#[test]
fn the_demo_runs_and_delivers_everything_it_produced() {
    let out = tailrace()
        .args(["demo", "--seconds", "2", "--listen", "127.0.0.1:0", "--rate", "2000"])
        .output()
        .expect("the binary runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "stdout:\n{stdout}\nstderr:\n{}", String::from_utf8_lossy(&out.stderr));
    let done = stdout.lines().find(|l| l.starts_with("done:")).expect("a summary line");
    let numbers: Vec<u64> = done.split(|c: char| !c.is_ascii_digit()).filter_map(|n| n.parse().ok()).collect();
    assert!(numbers[0] > 0, "{done}");
    assert_eq!(numbers[0], numbers[1], "produced = delivered: {done}");
    assert_eq!(&numbers[2..], [0, 0], "no duplicates, nothing out of order: {done}");
}

#[test]
fn an_unknown_bench_scenario_is_a_clear_error() {
    let out = tailrace().args(["bench", "nope", "--quick"]).output().unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown bench scenario `nope` (known: pipeline)"));
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
