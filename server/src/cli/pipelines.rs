//! Simulated pipeline runs for the demo: a few pipelines, each running one
//! run after another, writing log lines at a human pace through the log
//! path (the run log store and the `logs` streams), then finishing with a
//! status. Watch them at `/` or with `tailrace tail`.

use std::sync::Arc;
use std::time::Duration;

use rand::RngExt;
use tailrace::Node;
use tailrace::archive::{RunKey, RunState, status_event};
use tailrace::{Event, EventId};
use tokio_util::sync::CancellationToken;

/// The simulated pipelines.
pub const PIPELINES: [&str; 3] = ["demo.etl_orders", "demo.ml_training", "demo.dbt_nightly"];

const STEPS: [&str; 6] = [
    "fetching source tables",
    "validating schema",
    "transforming records",
    "computing aggregates",
    "writing to the warehouse",
    "refreshing downstream views",
];

/// Run `n` of `pipeline` in a demo started at `epoch` (seconds): unique
/// across restarts of the demo.
pub fn run_id(pipeline: &str, epoch: u64, n: u64) -> String {
    format!("{}-{epoch}-{n}", pipeline.rsplit('.').next().unwrap_or(pipeline))
}

/// Runs every simulated pipeline until `stop`; their first runs are
/// `run_id(pipeline, epoch, 1)`.
pub fn spawn(node: Arc<Node>, epoch: u64, stop: CancellationToken) -> Vec<tokio::task::JoinHandle<()>> {
    PIPELINES.iter().map(|pipeline| tokio::spawn(run_pipeline(node.clone(), pipeline, epoch, stop.clone()))).collect()
}

async fn run_pipeline(node: Arc<Node>, pipeline: &'static str, epoch: u64, stop: CancellationToken) {
    for n in 1u64.. {
        let run = run_id(pipeline, epoch, n);
        let Ok(key) = RunKey::new(pipeline, &run) else { return };
        if let Err(error) = one_run(&node, &key, &stop).await {
            eprintln!("demo pipeline {pipeline}: {error}");
        }
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_secs(3)) => {}
            _ = stop.cancelled() => return,
        }
    }
}

async fn one_run(node: &Node, key: &RunKey, stop: &CancellationToken) -> anyhow::Result<()> {
    let stream = key.stream();
    // Status changes go through the run's stream, in order with its lines.
    node.produce(&stream, vec![status_event(RunState::Running)]).await?;
    let lines_total: u64 = rand::rng().random_range(150..400);
    let mut written = 0;
    while written < lines_total {
        if stop.is_cancelled() {
            node.produce(&stream, vec![status_event(RunState::Stopped)]).await?;
            return Ok(());
        }
        let batch = rand::rng().random_range(1..=4u64).min(lines_total - written);
        let events: Vec<Event> = (written..written + batch)
            .map(|i| {
                let step = STEPS[(i * STEPS.len() as u64 / lines_total) as usize % STEPS.len()];
                let level = if i % 37 == 36 { "WARN " } else { "INFO " };
                let line = format!("{} {level} [{}] {step}: chunk {i}", clock(), key.run());
                Event::new(EventId::new(format!("{}#{i}", key.run())), line)
            })
            .collect();
        node.produce(&stream, events).await?;
        written += batch;
        let pause = rand::rng().random_range(40..250);
        tokio::time::sleep(Duration::from_millis(pause)).await;
    }
    let state = if rand::rng().random_range(0..10) == 0 { RunState::Failed } else { RunState::Success };
    node.produce(&stream, vec![status_event(state)]).await?;
    Ok(())
}

/// `HH:MM:SS.mmm` (UTC) of now.
fn clock() -> String {
    let ms = super::now_ms();
    let (s, ms) = (ms / 1000, ms % 1000);
    format!("{:02}:{:02}:{:02}.{ms:03}", (s / 3600) % 24, (s / 60) % 60, s % 60)
}
