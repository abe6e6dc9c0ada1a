//! `tailrace-bench diff`: the run diff on two runs of 1 000 000 lines each
//! (100 000 with `--quick`), served by one in-process node and edge (file
//! run log store). Every line carries a timestamp, a duration and a hex id
//! that differ from one run to the other (what the normalisation rules
//! mask); the failed run also differs from the good one in a few places
//! (an error line added every 20 000 lines, a line changed 5 lines after
//! it: one hunk each; its last lines, which the added ones displace,
//! missing: one more).
//!
//! Measured: the time from the request to the whole answer of
//! `GET …/runs/failed/diff?against=last-success` (reading both runs from
//! the store, normalising and hashing every line, the edit script, the
//! hunks' text). The baseline is GNU `diff` on the same two runs written
//! to files with what the rules mask already left out: the same line
//! comparison, without a store or normalisation. Rounds alternate; ends
//! with `RESULT scenario=diff tailrace_ms=… baseline_ms=… ratio=…
//! ratio_min=… ratio_max=… rounds=… lines=… hunks=…`, `ratio` being
//! tailrace's speed over the baseline's in the median round (above 1,
//! tailrace was faster).

use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, bail};
use tailrace::Node;
use tailrace::adapters::memory::{MemoryAdapterFactory, MemoryOptions};
use tailrace::archive::{Append, Archiver, FileRunLogStore, LOGS_NAMESPACE, RunKey, RunLogStore, RunState};
use tailrace::config::{Config, EdgeOptions};
use tailrace::edge::LogEdge;
use tailrace::pubsub::ImplicitSubscriptions;
use tailrace::{NodeId, SequenceToken};
use tokio_util::sync::CancellationToken;

use crate::Spread;

const FQN: &str = "bench.diff";
/// Lines between two places where the failed run really differs.
const EVERY: u64 = 20_000;

/// Line `i` (1-based) of a run: its noise (a time, a duration, an id)
/// from `seed`, and whether it is the failed run; and the same line with
/// the noise left out.
fn line(i: u64, seed: u64, failed: bool) -> (String, String) {
    let t = i * 7 + seed * 3_600_000;
    let (h, m, s, ms) = ((t / 3_600_000) % 24, (t / 60_000) % 60, (t / 1_000) % 60, t % 1_000);
    let noise = |text: &str| {
        let id = (i * 2_654_435_761 + seed * 97) % (1 << 32);
        format!("2026-12-07T{h:02}:{m:02}:{s:02}.{ms:03}Z {text} in {}ms id 0x{id:08x}", (i * 13 + seed) % 997)
    };
    // A changed line 5 lines after each added one: one hunk each.
    let changed = failed && i % EVERY == 5 && i > EVERY;
    let text = if changed { format!("WARN step {i} slow") } else { format!("INFO step {i} ok") };
    (noise(&text), format!("{text} in id"))
}

/// The extra line the failed run has after line `i`, if any.
fn extra(i: u64, failed: bool) -> Option<String> {
    (failed && i.is_multiple_of(EVERY)).then(|| format!("ERROR request {i} failed: status 500"))
}

/// Stores `lines` lines of a run and writes them without their noise to
/// `plain`. The failed run's added lines take the place of the good run's
/// last lines (its end is missing: one hunk more).
async fn store_run(
    store: &FileRunLogStore,
    run: &RunKey,
    lines: u64,
    seed: u64,
    failed: bool,
    plain: &std::path::Path,
) -> anyhow::Result<()> {
    use std::io::Write;
    let mut file = std::io::BufWriter::new(std::fs::File::create(plain)?);
    // Line `i` of the good run, and the lines stored so far.
    let (mut i, mut stored) = (0u64, 0u64);
    let mut token = 0u64;
    while stored < lines {
        let mut chunk = Vec::new();
        while chunk.len() < 10_000 && stored < lines {
            i += 1;
            let (text, bare) = line(i, seed, failed);
            chunk.push(text);
            writeln!(file, "{bare}")?;
            stored += 1;
            if let Some(extra) = extra(i, failed).filter(|_| stored < lines) {
                writeln!(file, "{extra}")?;
                chunk.push(extra);
                stored += 1;
            }
        }
        let refs: Vec<&str> = chunk.iter().map(String::as_str).collect();
        store.append(run, SequenceToken::new(0, token), &refs, Append::new()).await?;
        token += 1;
    }
    file.flush()?;
    store.set_state(run, if failed { RunState::Failed } else { RunState::Success }).await?;
    Ok(())
}

pub async fn run(quick: bool) -> anyhow::Result<()> {
    let lines: u64 = if quick { 100_000 } else { 1_000_000 };
    let rounds = if quick { 1 } else { 3 };
    println!("diff: two runs of {lines} lines, a change every {EVERY} lines, against GNU diff on the same lines");
    let dir = tempfile::tempdir()?;
    let store = Arc::new(FileRunLogStore::open(dir.path().join("runs"), false)?);
    let started = Instant::now();
    let (good, failed) = (RunKey::new(FQN, "good")?, RunKey::new(FQN, "failed")?);
    let (good_plain, failed_plain) = (dir.path().join("good.txt"), dir.path().join("failed.txt"));
    store_run(&store, &good, lines, 1, false, &good_plain).await?;
    store_run(&store, &failed, lines, 2, true, &failed_plain).await?;
    println!("  stored both runs in {:.1} s", started.elapsed().as_secs_f64());

    let factory = Arc::new(MemoryAdapterFactory::new(4, MemoryOptions::default()));
    let archiver = Archiver::new(store);
    let implicit = ImplicitSubscriptions::new().bind(LOGS_NAMESPACE, archiver.clone());
    let node = Arc::new(
        Node::builder(NodeId::new("bench"), factory).config(Config::default()).implicit(implicit).start().await?,
    );
    let stop = CancellationToken::new();
    let edge = LogEdge::new(node.clone(), archiver, EdgeOptions::default(), stop.clone());
    let (bound, _server) = edge.serve("127.0.0.1:0".parse()?, axum::Router::new(), stop.clone()).await?;
    let url = format!("http://{bound}/api/v1/logs/{FQN}/runs/failed/diff?against=last-success");
    let http = reqwest::Client::new();

    let mut measured = Vec::new();
    let mut hunks = 0;
    for round in 1..=rounds {
        let began = Instant::now();
        let answer = http.get(&url).send().await?;
        anyhow::ensure!(answer.status().is_success(), "the diff answered {}", answer.status());
        let answer: serde_json::Value = answer.json().await?;
        let tailrace = began.elapsed().as_secs_f64();
        hunks = answer["hunks"].as_array().map_or(0, Vec::len);
        let expected = (lines / EVERY) as usize;
        anyhow::ensure!(hunks == expected && answer["next"].is_null(), "{hunks} hunks, expected {expected}");
        if answer["approximate"] == true {
            println!("  the diff ran past its deadline: its edit script is approximate");
        }

        let began = Instant::now();
        let baseline = std::process::Command::new("diff")
            .args([&good_plain, &failed_plain])
            .stdout(std::process::Stdio::null())
            .status()
            .context("running GNU diff (diffutils) for the baseline")?;
        let baseline_seconds = began.elapsed().as_secs_f64();
        if baseline.code() != Some(1) {
            bail!("GNU diff should find the runs different: {baseline}");
        }
        println!(
            "  round {round}: tailrace {:.0} ms, GNU diff {:.0} ms, {hunks} hunks",
            tailrace * 1e3,
            baseline_seconds * 1e3
        );
        measured.push((1.0 / tailrace, 1.0 / baseline_seconds));
    }
    stop.cancel();
    node.shutdown().await?;
    let spread = Spread::of(&measured);
    let (tailrace, baseline) = spread.median_round;
    println!(
        "RESULT scenario=diff tailrace_ms={:.0} baseline_ms={:.0} ratio={:.3} ratio_min={:.3} ratio_max={:.3} rounds={} lines={lines} hunks={hunks}",
        1e3 / tailrace,
        1e3 / baseline,
        spread.median,
        spread.min,
        spread.max,
        spread.rounds
    );
    Ok(())
}
