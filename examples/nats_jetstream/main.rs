//! A real broker plugged in from outside the crate: tailrace queues on NATS
//! JetStream, written only against tailrace's public API.
//!
//! `cargo run --release --example nats_jetstream [-- --events N --rounds R]` starts
//! its own `nats-server` (JetStream on, a free loopback port, a temporary
//! store), proves the adapter with the conformance kit, then runs a node on
//! it with concurrent producers and subscribers and prints what flowed,
//! next to a raw `async-nats` publish/fetch/ack loop moving the same
//! batches, R times (medians in the last line, a `RESULT …` summary; the
//! two sides take turns going first). Without `nats-server` on
//! the PATH it says how to install it and exits with status 2.
//!
//! `cargo run --example nats_jetstream -- --node --config FILE --nats URL` runs a
//! whole cluster node on it instead: `tailrace node`'s server (the HTTP
//! edge with SSE viewers, the archiver, leases, membership and
//! subscriptions in the config's Redis) with its queues on the JetStream at
//! `URL`, until SIGTERM or Ctrl-C.
//!
//! `docs/adapters.md` walks through writing this adapter step by step.

mod adapter;
mod raw;
mod receiver;
mod server;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use adapter::{JetStreamFactory, JetStreamOptions};
use async_trait::async_trait;
use tailrace::Node;
use tailrace::conformance::{self, Claims};
use tailrace::pubsub::{ConsumerError, Delivery, DeliveryOutcome, StartPosition, StreamConsumer};
use tailrace::queue::QueueAdapterFactory;
use tailrace::{Event, NodeId, StreamId};

const QUEUES: u32 = 4;
const PRODUCERS: usize = 4;
const STREAMS_PER_PRODUCER: usize = 2;
const BATCH: usize = 10;
/// Messages one queue holds in the kit's run (the bound it claims).
const KIT_MAX_MESSAGES: i64 = 128;

/// Per stream: events received, the last event number, events out of order.
type Seen = BTreeMap<StreamId, (usize, Option<u64>, usize)>;

/// Counts what it receives, per stream, and notes any event out of order.
#[derive(Clone, Default)]
struct Counter {
    seen: Arc<Mutex<Seen>>,
}

impl Counter {
    fn total(&self) -> usize {
        self.seen.lock().map(|s| s.values().map(|v| v.0).sum()).unwrap_or(0)
    }
}

#[async_trait]
impl StreamConsumer for Counter {
    async fn deliver(&self, delivery: &Delivery) -> Result<DeliveryOutcome, ConsumerError> {
        let mut seen = self.seen.lock().map_err(|_| ConsumerError::failed("the counter's lock was poisoned"))?;
        let entry = seen.entry(delivery.stream.clone()).or_default();
        for (event, _) in delivery.events() {
            // Event ids are `{n}` in production order per stream.
            let n: Option<u64> = event.id.as_str().parse().ok();
            if entry.1.is_some_and(|last| n.is_none_or(|n| n <= last)) {
                entry.2 += 1;
            }
            entry.0 += 1;
            entry.1 = n.or(entry.1);
        }
        Ok(DeliveryOutcome::Continue)
    }
}

/// `--events N` (per round) and `--rounds R`.
fn arguments() -> Result<(usize, usize), String> {
    let mut args = std::env::args().skip(1);
    let (mut events, mut rounds) = (10_000, 1);
    while let Some(arg) = args.next() {
        let slot = match arg.as_str() {
            "--events" => &mut events,
            "--rounds" => &mut rounds,
            other => return Err(format!("unknown argument {other} (try --events N --rounds R)")),
        };
        let value = args.next().ok_or(format!("{arg} needs a number"))?;
        *slot = value.parse().map_err(|e| format!("{arg} {value}: {e}"))?;
    }
    Ok((events.max(PRODUCERS * STREAMS_PER_PRODUCER * BATCH), rounds.max(1)))
}

#[tokio::main]
async fn main() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into());
    tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).init();
    let args: Vec<String> = std::env::args().skip(1).collect();
    if let ["--node", "--config", config, "--nats", url] = args.iter().map(String::as_str).collect::<Vec<_>>()[..] {
        if let Err(error) = serve_node(config, url).await {
            eprintln!("nats_jetstream: {error}");
            std::process::exit(1);
        }
        return;
    }
    match run().await {
        Ok(summary) => println!("{summary}"),
        Err((code, message)) => {
            eprintln!("nats_jetstream: {message}");
            std::process::exit(code);
        }
    }
}

/// One node of a cluster on JetStream: the library's server with this
/// adapter (see the module documentation).
async fn serve_node(config: &str, url: &str) -> Result<(), String> {
    let chain = |error: &dyn std::error::Error| {
        let mut text = error.to_string();
        let mut source = error.source();
        while let Some(cause) = source {
            text.push_str(&format!(": {cause}"));
            source = cause.source();
        }
        text
    };
    let config = tailrace::config::Config::load(std::path::Path::new(config)).map_err(|e| chain(&e))?;
    let factory = JetStreamFactory::connect(config.queues.count, JetStreamOptions::new(url.to_string()))
        .await
        .map_err(|e| chain(&e))?;
    let server = tailrace::server::Server::builder(config).adapter(Arc::new(factory), None).member();
    server.run().await.map_err(|e| chain(&e))
}

type Failed = (i32, String);

fn failed(error: impl std::fmt::Display) -> Failed {
    (1, error.to_string())
}

async fn run() -> Result<String, Failed> {
    let (events, rounds) = arguments().map_err(|e| (2, e))?;
    let streams = PRODUCERS * STREAMS_PER_PRODUCER;
    let total = events / (streams * BATCH) * streams * BATCH;
    if !server::available() {
        return Err((2, format!("nats-server was not found on the PATH; {}", server::INSTALL_HINT)));
    }
    let server = server::NatsServer::start().map_err(failed)?;
    println!("nats-server with JetStream at {}", server.url());
    // TAILRACE_BENCH_ONLY=tailrace|baseline runs one side, without the kit
    // (for profiling).
    let only = std::env::var("TAILRACE_BENCH_ONLY").unwrap_or_default();
    let report = if only.is_empty() { kit(&server).await? } else { conformance::Report::default() };
    let (mut node_rates, mut raw_rates, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
    let mut delivered = usize::MAX;
    for round in 0..rounds {
        // Each round on streams of its own, the two sides taking turns
        // going first (a warmer server favours whichever goes second).
        let mut node_rate = f64::NAN;
        let mut raw_rate = f64::NAN;
        for side in if round % 2 == 0 { ["tailrace", "baseline"] } else { ["baseline", "tailrace"] } {
            if !only.is_empty() && only != side {
                continue;
            }
            if side == "tailrace" {
                let got;
                (node_rate, got) = node_run(&server, total, &format!("demo{round}")).await?;
                delivered = delivered.min(got);
            } else {
                let took =
                    raw::run(&server.url(), &format!("raw{round}"), total / BATCH, BATCH).await.map_err(failed)?;
                raw_rate = total as f64 / took.as_secs_f64();
                println!(
                    "raw async-nats publish/fetch/ack loop: {total} events in {took:.2?} ({raw_rate:.0} events/s)"
                );
            }
        }
        println!("round {}: ratio {:.3}", round + 1, node_rate / raw_rate);
        node_rates.push(node_rate);
        raw_rates.push(raw_rate);
        ratios.push(node_rate / raw_rate);
    }
    let delivered = if delivered == usize::MAX { 0 } else { delivered };
    Ok(format!(
        "RESULT example=nats_jetstream kit_checks={} kit_failed={} rounds={rounds} events={total} delivered={delivered} node_events_per_s={:.0} raw_events_per_s={:.0} ratio={:.2}",
        report.checks_run(),
        report.failed.len(),
        median(node_rates),
        median(raw_rates),
        median(ratios),
    ))
}

/// The middle value (the upper one of an even count).
fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values.get(values.len() / 2).copied().unwrap_or(f64::NAN)
}

/// The contract, on a prefix of its own, with every claim this adapter
/// makes.
async fn kit(server: &server::NatsServer) -> Result<conformance::Report, Failed> {
    let mut kit_options = JetStreamOptions::new(server.url());
    kit_options.prefix = "kit".into();
    kit_options.max_messages = Some(KIT_MAX_MESSAGES);
    kit_options.purge_every = Duration::ZERO;
    kit_options.read_wait = Duration::from_millis(50);
    let claims = Claims {
        durable: true,
        rewindable: true,
        exclusive_receivers: true,
        bounded: Some(KIT_MAX_MESSAGES as usize * 8),
        trims: true,
    };
    let report = conformance::run(claims, move || {
        let options = kit_options.clone();
        async move { Ok(Arc::new(JetStreamFactory::connect(QUEUES, options).await?) as Arc<dyn QueueAdapterFactory>) }
    })
    .await
    .map_err(failed)?;
    println!("conformance: {report}");
    Ok(report)
}

/// A node on it, producers and subscribers, moving `total` events on
/// streams named after `prefix`, every event in order: (events/s, events
/// delivered).
async fn node_run(server: &server::NatsServer, total: usize, prefix: &str) -> Result<(f64, usize), Failed> {
    let mut options = JetStreamOptions::new(server.url());
    options.prefix = prefix.into();
    let factory = Arc::new(JetStreamFactory::connect(QUEUES, options).await.map_err(failed)?);
    let adapter = factory.adapter();
    let node = Node::builder(NodeId::new("nats-1"), factory).start().await.map_err(failed)?;
    let counter = Counter::default();
    let streams: Vec<StreamId> =
        (0..PRODUCERS * STREAMS_PER_PRODUCER).map(|i| StreamId::new("orders", format!("region-{i}"))).collect();
    for stream in &streams {
        node.subscribe(stream, Arc::new(counter.clone()), StartPosition::Latest).await.map_err(failed)?;
    }
    let batches_per_stream = total / (streams.len() * BATCH);
    let node = Arc::new(node);
    let started = Instant::now();
    let mut producers = Vec::new();
    for p in 0..PRODUCERS {
        let node = node.clone();
        let mine: Vec<StreamId> = streams[p * STREAMS_PER_PRODUCER..(p + 1) * STREAMS_PER_PRODUCER].to_vec();
        producers.push(tokio::spawn(async move {
            for b in 0..batches_per_stream {
                for stream in &mine {
                    let batch: Vec<Event> = (0..BATCH)
                        .map(|k| {
                            let n = (b * BATCH + k) as u64;
                            Event::new(tailrace::EventId::from_u64(n), format!("order {n} of {stream}"))
                        })
                        .collect();
                    node.produce(stream, batch).await?;
                }
            }
            Ok::<_, tailrace::queue::QueueError>(())
        }));
    }
    for producer in producers {
        producer.await.map_err(failed)?.map_err(failed)?;
    }
    let produced_in = started.elapsed();
    let deadline = Instant::now() + Duration::from_secs(120);
    while counter.total() < total {
        if Instant::now() >= deadline {
            return Err(failed(format!("only {} of {total} events were delivered within 120 s", counter.total())));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let delivered_in = started.elapsed();
    let node_rate = total as f64 / delivered_in.as_secs_f64();
    let out_of_order: usize = counter.seen.lock().map(|s| s.values().map(|v| v.2).sum()).unwrap_or(0);
    if let Ok(seen) = counter.seen.lock() {
        for (stream, (count, last, _)) in seen.iter() {
            println!("  {stream}: {count} events, last id {}", last.unwrap_or(0));
        }
    }
    println!(
        "node: {total} events in {} batches produced in {produced_in:.2?}, all delivered in {delivered_in:.2?} ({node_rate:.0} events/s), {out_of_order} out of order",
        total / BATCH
    );
    Arc::try_unwrap(node).map_err(|_| failed("the node is still shared"))?.shutdown().await.map_err(failed)?;
    tailrace::queue::QueueAdapter::close(adapter.as_ref()).await.map_err(failed)?;
    if out_of_order > 0 {
        return Err(failed(format!("{out_of_order} events arrived out of order")));
    }
    Ok((node_rate, counter.total()))
}
