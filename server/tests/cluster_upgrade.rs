//! The upgrade promise in a cluster's life: three `tailrace node`
//! processes of a previous build on one Redis, producers posting and
//! viewers resuming by cursor, are rolled one by one to this build
//! (SIGTERM: each hands its queues over), then rolled back the same way.
//! What must hold is what the chaotic life asks: every acknowledged line
//! stored once, in order; every viewer saw exactly the stored log and ended
//! on `complete`; no request answered `500`; and while at least one node
//! served, no line was refused for good.
//!
//! It runs only when asked: `TAILRACE_UPGRADE_FROM` names the previous
//! build, either a `tailrace` binary or a git ref of this repository, which
//! is then checked out beside `target/` and built once (debug):
//!
//! ```text
//! TAILRACE_UPGRADE_FROM=v0.1.0 cargo test -p tailrace-server --test cluster_upgrade -- --nocapture
//! ```
//!
//! A release that cannot run beside the previous one says so in
//! `docs/upgrading.md`; this life is how that is found out.

use tailrace_testkit as common;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::chaos::{Cluster, END_RULES, NAMES, PATIENCE, Tab};
use common::cluster::{Proc, config_on_defaults};
use common::redis_server::RedisServer;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

const RUNS: usize = 6;
/// How long the cluster runs between two steps of the roll.
const BETWEEN: Duration = Duration::from_secs(4);

/// The previous build's binary, built from a git ref when that is what
/// `TAILRACE_UPGRADE_FROM` names.
fn previous() -> Option<PathBuf> {
    let from = std::env::var("TAILRACE_UPGRADE_FROM").ok().filter(|v| !v.is_empty())?;
    if Path::new(&from).is_file() {
        return Some(PathBuf::from(from));
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("the workspace root");
    let place: String = from.chars().map(|c| if c.is_ascii_alphanumeric() { c } else { '_' }).collect();
    let dir = root.join("target").join("upgrade-from").join(place);
    let source = dir.join("source");
    if !source.exists() {
        let added = Command::new("git")
            .current_dir(root)
            .args(["worktree", "add", "--detach"])
            .arg(&source)
            .arg(&from)
            .status()
            .expect("git runs");
        assert!(added.success(), "`{from}` is neither a file nor a git ref of this repository");
    }
    let target = dir.join("target");
    eprintln!("building the previous build ({from}) in {}", source.display());
    let built = Command::new(env!("CARGO"))
        .current_dir(&source)
        .args(["build", "--bin", "tailrace", "-p", "tailrace-server"])
        .env("CARGO_TARGET_DIR", &target)
        .status()
        .expect("cargo runs");
    assert!(built.success(), "the previous build ({from}) did not build");
    Some(target.join("debug").join(format!("tailrace{}", std::env::consts::EXE_SUFFIX)))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolling_upgrade_from_the_previous_build_and_back_loses_no_line_and_no_viewer() {
    let Some(old) = tokio::task::block_in_place(previous) else {
        eprintln!("skipped: set TAILRACE_UPGRADE_FROM to a previous build (a binary or a git ref)");
        return;
    };
    let new = common::tailrace_bin();
    // Which build each node runs when it (re)starts.
    let builds: Arc<Mutex<HashMap<String, PathBuf>>> =
        Arc::new(Mutex::new(NAMES.iter().map(|n| (n.to_string(), old.clone())).collect()));
    let server = RedisServer::start();
    let url = server.url();
    let chosen = builds.clone();
    let spawn = move |name: &str| {
        let program = chosen.lock().unwrap()[name].clone();
        let port = common::free_port();
        let text = config_on_defaults(&url, name, port, END_RULES);
        tokio::task::block_in_place(|| {
            let mut node = Proc::spawn_program(&program, name, port, &text, &["node"], &[], &[]);
            node.wait_serving();
            node
        })
    };
    let mut cluster = Cluster::start(server, Box::new(spawn));
    let stop = CancellationToken::new();
    let mut producers = Vec::new();
    for run in 0..RUNS {
        producers.push(cluster.producer(run, &stop).await);
    }
    let until = Instant::now() + PATIENCE + Duration::from_secs(120);
    let tab = |run: usize| if run.is_multiple_of(2) { Tab::Roaming } else { Tab::Sticky };
    let viewers = (0..RUNS).map(|run| (run, cluster.viewer(run, until, tab(run)))).collect();
    for (step, build) in [("upgrade", &new), ("rollback", &old)] {
        for (i, name) in NAMES.iter().enumerate() {
            tokio::time::sleep(BETWEEN).await;
            eprintln!("{step}: {name} to {}", build.display());
            builds.lock().unwrap().insert(name.to_string(), build.clone());
            cluster.bounce(i, "TERM").await;
        }
    }
    tokio::time::sleep(BETWEEN).await;
    match cluster.finish(stop, producers, viewers).await {
        Ok(summary) => eprintln!("upgrade and rollback: {summary}"),
        Err(problems) => panic!("{problems}"),
    }
}
