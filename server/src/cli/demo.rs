//! `tailrace demo`: several nodes in this process pulling shared queues,
//! producers writing events to many streams, consumers checking order, and a
//! progress line every second, until Ctrl-C (or `--seconds`).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

mod checker;

use anyhow::Context;
use async_trait::async_trait;
use checker::{CheckerFactory, Tally};
use tailrace::archive::{Archiver, LOGS_NAMESPACE};
use tailrace::edge::LogEdge;
use tailrace::handoff::DataDirLock;
use tailrace::harness::InProcessCluster;
use tailrace::pubsub::{
    ConsumerError, Delivery, DeliveryOutcome, ImplicitSubscriptions, StartPosition, StreamConsumer,
};
use tailrace::{Event, StreamId};
use tokio_util::sync::CancellationToken;

/// Options of the demo.
#[derive(clap::Args, Debug)]
pub struct DemoArgs {
    /// Nodes to run in this process.
    #[arg(long, default_value_t = 3)]
    nodes: usize,
    /// Streams the producers write to.
    #[arg(long, default_value_t = 16)]
    streams: usize,
    /// Events per second, all streams together.
    #[arg(long, default_value_t = 5_000)]
    rate: u64,
    /// Where the demo's edge listens (it replaces `[edge] listen`): the log
    /// API (ingest, SSE stream, pages), the viewer page, `/metrics`,
    /// `/healthz` and `/readyz`; no admin API.
    #[arg(long, default_value = "127.0.0.1:8585")]
    listen: SocketAddr,
    /// A TOML config (defaults otherwise).
    #[arg(long)]
    config: Option<PathBuf>,
    /// The demo's data directory, locked while it runs: queues in
    /// `DIR/queues`, run logs in `DIR/runs`, Kafka's file checkpoints in
    /// `DIR/kafka`, and the checker's `DIR/demo-seen.log` (events survive a
    /// restart of the demo).
    #[arg(long, default_value = "data")]
    data_dir: PathBuf,
    /// Stop after this many seconds instead of waiting for Ctrl-C.
    #[arg(long)]
    seconds: Option<u64>,
    /// Crash a node every 20 s and bring it back 10 s later, to watch the
    /// queues move and nothing get lost.
    #[arg(long)]
    chaos: bool,
}

/// Keeps the last line of one stream, for the progress display.
#[derive(Default)]
struct LastLine(Mutex<String>);

#[async_trait]
impl StreamConsumer for LastLine {
    async fn deliver(&self, delivery: &Delivery) -> Result<DeliveryOutcome, ConsumerError> {
        if let Some(batch) = delivery.batches.last()
            && let Some(event) = batch.events.last()
        {
            *self.0.lock() = String::from_utf8_lossy(&event.payload).into_owned();
        }
        Ok(DeliveryOutcome::Continue)
    }
}

pub async fn run(args: DemoArgs) -> anyhow::Result<()> {
    let config = super::node_config(args.config.as_ref(), &args.data_dir, Some(args.listen))?;
    let mut signals = super::StopSignal::install()?;
    // Held until the process ends: what a crash left in the queues is ours.
    let owner = DataDirLock::acquire(&args.data_dir)?;
    if config.queues.adapter == "redis" {
        // Said, not enforced: the demo's leases are in memory.
        let redis = &config.adapters.redis;
        let endpoint = redis.endpoint();
        let reconnecting = tailrace::redis_conn::reconnecting(redis.response_timeout);
        let mut conn = endpoint.connect_any(reconnecting, redis.response_timeout).await?;
        tailrace::server::check_persistence(&config, &mut conn, false).await?;
    }
    let metrics = tailrace::edge::install_metrics()?;
    let stop = CancellationToken::new();
    let store =
        tailrace::archive::open_store(&config.archive, &config.adapters.redis.access(), config.adapters.redis.wait())
            .await
            .context("opening the run log store")?;
    let retention = tailrace::archive::Retention::spawn(store.clone(), config.archive.retention.clone(), stop.clone());
    let factory = tailrace::backend::build(&config, Some(&owner)).await.context("opening the queues")?.factory;
    let adapter = factory.create_adapter().await?;
    let life = super::now_ms();
    let tally = Tally::open(&args.data_dir, life)?;
    let archiver = Archiver::new(store.clone());
    let implicit = ImplicitSubscriptions::new()
        .bind("demo", Arc::new(CheckerFactory(tally.clone())))
        .bind(LOGS_NAMESPACE, archiver.clone());
    let cluster = Arc::new(InProcessCluster::new(factory, config.clone()).with_implicit(implicit));
    let names: Vec<String> = (1..=args.nodes.max(1)).map(|i| format!("node-{i}")).collect();
    for name in &names {
        cluster.add_node(name).await?;
    }
    cluster.wait_balanced(Duration::from_secs(30)).await.map_err(anyhow::Error::msg)?;
    let streams: Vec<StreamId> =
        (0..args.streams.max(1)).map(|i| StreamId::new("demo", format!("pipeline-{i:02}"))).collect();
    let last_line = Arc::new(LastLine::default());
    let first = cluster.node(&names[0]).context("the first node is gone")?;
    first.subscribe(&streams[0], last_line.clone(), StartPosition::Latest).await?;
    // The log path: simulated pipeline runs, and the edge on the first node
    // (chaos spares it, so viewers stay connected while queues move).
    let logs = LogEdge::new(first.clone(), archiver, config.edge.clone(), stop.clone());
    let (bound, server) = logs
        .serve(args.listen, tailrace::edge::router(metrics), stop.clone())
        .await
        .context("the demo serves its edge there; pick another --listen")?;
    let epoch = super::now_ms() / 1000;
    let runs = super::pipelines::spawn(first.clone(), epoch, stop.clone());

    println!(
        "tailrace demo: {} nodes, {} queues ({} adapter), {} streams at {} events/s",
        names.len(),
        config.queues.count,
        config.queues.adapter,
        streams.len(),
        args.rate
    );
    let pipeline = super::pipelines::PIPELINES[0];
    let run = super::pipelines::run_id(pipeline, epoch, 1);
    let base = format!("{}://{bound}", super::edge_scheme(&config));
    println!("viewer:  {base}/?fqn={pipeline}&run={run}");
    println!("tail:    tailrace tail --url {base} --fqn {pipeline} --run {run}");
    println!("metrics: {base}/metrics   (Ctrl-C to stop)");

    let produced = Arc::new(AtomicU64::new(0));
    let producer = tokio::spawn(produce(adapter, streams.clone(), life, args.rate, produced.clone(), stop.clone()));
    let display = (streams[0].clone(), last_line.clone());
    let chaos = args.chaos.then(|| tokio::spawn(chaos(cluster.clone(), names.clone(), display, stop.clone())));

    let started = Instant::now();
    let deadline = args.seconds.map(|s| started + Duration::from_secs(s));
    let mut ticker = tokio::time::interval(Duration::from_secs(1));
    let mut last_delivered = 0;
    loop {
        tokio::select! {
            _ = ticker.tick() => {}
            signal = signals.recv() => {
                println!("{signal}: stopping");
                break;
            }
        }
        let delivered = tally.delivered.load(Ordering::Relaxed);
        let mut owners = Vec::new();
        for (node, queues) in cluster.running().await? {
            owners.push(format!("{node}:{}", queues.iter().map(|q| q.0.to_string()).collect::<Vec<_>>().join(",")));
        }
        println!(
            "{:>4}s produced {:>9} delivered {:>9} ({:>6}/s) earlier lives {} dup {} lost {} | queues {} | tails {} viewers {} | {}: {}",
            started.elapsed().as_secs(),
            produced.load(Ordering::Relaxed),
            delivered,
            delivered - last_delivered,
            tally.earlier.load(Ordering::Relaxed),
            tally.duplicates.load(Ordering::Relaxed),
            tally.lost.load(Ordering::Relaxed),
            owners.join(" "),
            logs.active_runs(),
            logs.active_connections(),
            streams[0].key(),
            last_line.0.lock(),
        );
        last_delivered = delivered;
        if deadline.is_some_and(|d| Instant::now() >= d) {
            break;
        }
    }

    println!("stopping: producers first, then every node hands its queues over");
    stop.cancel();
    producer.await??;
    if let Some(chaos) = chaos {
        chaos.await??;
    }
    for run in runs {
        let _ = run.await;
    }
    let total = produced.load(Ordering::Relaxed);
    let settle = Instant::now() + Duration::from_secs(30);
    while tally.delivered.load(Ordering::Relaxed) < total && Instant::now() < settle {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for name in &names {
        cluster.stop_node(name).await?;
    }
    cluster.adapter_close().await?;
    let _ = server.await;
    let _ = retention.await;
    let delivered = tally.delivered.load(Ordering::Relaxed);
    let lost = tally.lost.load(Ordering::Relaxed);
    println!(
        "done: produced {total}, delivered {delivered}, from earlier lives {}, duplicates {}, lost {lost}",
        tally.earlier.load(Ordering::Relaxed),
        tally.duplicates.load(Ordering::Relaxed),
    );
    anyhow::ensure!(delivered == total, "{} events were not delivered", total.saturating_sub(delivered));
    anyhow::ensure!(lost == 0, "{lost} events were skipped (never delivered)");
    Ok(())
}

/// Writes `rate` events per second over `streams` in small batches.
async fn produce(
    adapter: Arc<dyn tailrace::queue::QueueAdapter>,
    streams: Vec<StreamId>,
    life: u64,
    rate: u64,
    produced: Arc<AtomicU64>,
    stop: CancellationToken,
) -> anyhow::Result<()> {
    let mut sequence = vec![0u64; streams.len()];
    let mut tick = tokio::time::interval(Duration::from_millis(10));
    let per_tick = (rate / 100).max(1);
    let mut turn = 0usize;
    while !stop.is_cancelled() {
        tick.tick().await;
        let mut left = per_tick;
        while left > 0 {
            let i = turn % streams.len();
            turn += 1;
            let n = left.min(8);
            left -= n;
            let batch: Vec<Event> = (0..n)
                .map(|k| {
                    let seq = sequence[i] + k;
                    let line = format!("[{}] step {seq}: processing record batch", streams[i].key());
                    Event::new(checker::event_id(&streams[i], life, seq), line)
                })
                .collect();
            sequence[i] += n;
            adapter.enqueue(&streams[i], batch).await?;
            produced.fetch_add(n, Ordering::Relaxed);
        }
    }
    Ok(())
}

/// Crashes a node every 20 s and brings it back 10 s later. The display
/// subscriber lives on the first node: when that one comes back, it
/// subscribes again (its old consumer died with it).
async fn chaos(
    cluster: Arc<InProcessCluster>,
    names: Vec<String>,
    display: (StreamId, Arc<LastLine>),
    stop: CancellationToken,
) -> anyhow::Result<()> {
    let mut victim = 0;
    loop {
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_secs(20)) => {}
            _ = stop.cancelled() => return Ok(()),
        }
        // The first node hosts the edge; the others take turns.
        let victims = if names.len() > 1 { &names[1..] } else { &names[..] };
        let name = &victims[victim % victims.len()];
        victim += 1;
        println!("chaos: {name} crashes (kill, no handoff)");
        cluster.kill_node(name);
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_secs(10)) => {}
            _ = stop.cancelled() => {}
        }
        println!("chaos: {name} comes back");
        let node = cluster.add_node(name).await?;
        if name == &names[0] {
            node.subscribe(&display.0, display.1.clone(), StartPosition::Latest).await?;
        }
        if stop.is_cancelled() {
            return Ok(());
        }
    }
}
