//! `tailrace-bench redis`: one node on the Redis adapter (producers ->
//! pipelined XADD -> consumer group -> agents -> one subscriber per stream)
//! against a raw redis-rs loop on the same server: the same producers
//! `XADD` the same entries, one task per queue `XREADGROUP`s, decodes,
//! hands each batch to the same per-stream counter and `XACK`s.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use anyhow::{Context, bail};
use serde::Deserialize;
use tailrace::adapters::redis::{RedisAdapterFactory, RedisOptions};
use tailrace::queue::QueueMapper;
use tailrace::redis_conn::RedisEndpoint;
use tailrace::{Event, StreamId};

use super::Progress;
use super::pipeline::{Counter, Shape, Tally, produce, run_node, stream_ids};

const GROUP: &str = "bench";
/// Entries per `XREADGROUP` in the baseline.
const COUNT: usize = 256;

fn shape(quick: bool) -> Shape {
    Shape {
        streams: 64,
        queues: 4,
        batch: 64,
        events_per_stream: if quick { 2_048 } else { 16_384 },
        producers: 4,
        queue_capacity_events: 0,
    }
}

pub async fn run(quick: bool, url: &str) -> anyhow::Result<()> {
    let shape = shape(quick);
    let endpoint = RedisEndpoint::from_url(url, "--redis-url");
    let client = endpoint.client()?;
    let mut conn = client
        .get_multiplexed_async_connection()
        .await
        .with_context(|| format!("no Redis at {} (start one, or pass --redis-url)", endpoint.shown()))?;
    println!(
        "redis: {} streams over {} queues, {} events each ({} total), batches of {}, {} producers, {}",
        shape.streams,
        shape.queues,
        shape.events_per_stream,
        shape.streams as u64 * shape.events_per_stream,
        shape.batch,
        shape.producers,
        endpoint.shown()
    );
    let total = shape.streams as u64 * shape.events_per_stream;
    let runs = if quick { 1 } else { 5 };
    // TAILRACE_BENCH_ONLY=tailrace|baseline runs one side (for profiling).
    let only = std::env::var("TAILRACE_BENCH_ONLY").unwrap_or_default();
    let mut rounds = Vec::new();
    for round in 1..=runs {
        let prefix = format!("tailrace-bench:{}:{round}", std::process::id());
        let options =
            RedisOptions { url: url.to_string(), key_prefix: format!("{prefix}:t"), ..RedisOptions::default() };
        let factory = Arc::new(RedisAdapterFactory::connect(shape.queues, options).await?);
        // Each side goes first in every other round: the second one runs
        // against a server that already holds the first one's entries.
        let (mut t, mut b) = (0.0, 0.0);
        for side in if round % 2 == 1 { ["tailrace", "baseline"] } else { ["baseline", "tailrace"] } {
            match side {
                "tailrace" if only != "baseline" => t = run_node(shape, factory.clone()).await?,
                "baseline" if only != "tailrace" => b = baseline_run(shape, &client, &format!("{prefix}:b")).await?,
                _ => {}
            }
        }
        clean(&mut conn, &prefix).await?;
        println!(
            "  round {round}: tailrace {t:>10.0} events/s   baseline {b:>10.0} events/s   ratio {:.3}",
            t / b.max(1e-9)
        );
        rounds.push((t, b));
    }
    println!("{}", super::median_line("redis", &rounds, &[("events", total.to_string())]));
    Ok(())
}

/// Deletes every key of a round.
async fn clean(conn: &mut redis::aio::MultiplexedConnection, prefix: &str) -> anyhow::Result<()> {
    let keys: Vec<String> = redis::cmd("KEYS").arg(format!("{prefix}:*")).query_async(conn).await?;
    for key in keys {
        redis::cmd("DEL").arg(key).query_async::<()>(conn).await?;
    }
    Ok(())
}

/// The adapter's entry format (`{"s": stream, "e": [{id, ts, p}]}`), as the
/// raw loop encodes and decodes it.
#[derive(serde::Serialize, Deserialize)]
pub(super) struct Entry<'a> {
    #[serde(borrow)]
    pub(super) s: StreamRef<'a>,
    #[serde(borrow)]
    pub(super) e: Vec<EntryEvent<'a>>,
}

#[derive(serde::Serialize, Deserialize)]
pub(super) struct StreamRef<'a> {
    pub(super) namespace: &'a str,
    pub(super) key: &'a str,
}

#[derive(serde::Serialize, Deserialize)]
pub(super) struct EntryEvent<'a> {
    pub(super) id: &'a str,
    pub(super) ts: u64,
    pub(super) p: &'a str,
}

impl Entry<'_> {
    /// `stream`'s batch as the raw loops write it.
    pub(super) fn encode(stream: &StreamId, events: &[Event]) -> Option<Vec<u8>> {
        let e = events
            .iter()
            .map(|e| EntryEvent {
                id: e.id.as_str(),
                ts: e.timestamp_ms,
                p: std::str::from_utf8(&e.payload).unwrap_or_default(),
            })
            .collect();
        serde_json::to_vec(&Entry { s: StreamRef { namespace: stream.namespace(), key: stream.key() }, e }).ok()
    }
}

/// The raw loops' read side: counts an entry's events on its stream's
/// counter (`index`: stream key to counter).
pub(super) fn count_entry(body: &[u8], index: &HashMap<String, usize>, counters: &[Counter]) -> anyhow::Result<()> {
    let decoded: Entry = serde_json::from_slice(body)?;
    let stream = index.get(decoded.s.key).copied().context("an unknown stream")?;
    if let Some(first) = decoded.e.first() {
        counters[stream].take(first.id, decoded.e.len() as u64);
    }
    Ok(())
}

async fn baseline_run(shape: Shape, client: &redis::Client, prefix: &str) -> anyhow::Result<f64> {
    let streams = stream_ids(shape);
    let mapper = QueueMapper::new(shape.queues);
    let index: Arc<HashMap<String, usize>> =
        Arc::new(streams.iter().enumerate().map(|(i, s)| (s.key().to_string(), i)).collect());
    let tally = Tally::new(shape.total());
    let delivered = tally.delivered.clone();
    let counters: Arc<Vec<Counter>> = Arc::new((0..shape.streams).map(|_| tally.counter()).collect());
    let key = |q: u32| format!("{prefix}:q{q}");
    let mut consumers = Vec::new();
    for q in 0..shape.queues {
        let mut conn = client.get_multiplexed_async_connection().await?;
        redis::cmd("XGROUP")
            .arg("CREATE")
            .arg(key(q))
            .arg(GROUP)
            .arg("$")
            .arg("MKSTREAM")
            .query_async::<()>(&mut conn)
            .await?;
        let (key, index, counters, delivered) = (key(q), index.clone(), counters.clone(), delivered.clone());
        consumers.push(tokio::spawn(async move {
            while delivered.load(Ordering::Relaxed) < shape.total() {
                let reply: redis::streams::StreamReadReply = redis::cmd("XREADGROUP")
                    .arg("GROUP")
                    .arg(GROUP)
                    .arg("c")
                    .arg("COUNT")
                    .arg(COUNT)
                    .arg("BLOCK")
                    .arg(100)
                    .arg("STREAMS")
                    .arg(&key)
                    .arg(">")
                    .query_async(&mut conn)
                    .await?;
                let mut ids = Vec::new();
                for entry in reply.keys.into_iter().flat_map(|k| k.ids) {
                    let Some(redis::Value::BulkString(body)) = entry.map.get("b") else {
                        bail!("an entry without `b`")
                    };
                    count_entry(body, &index, &counters)?;
                    ids.push(entry.id);
                }
                if !ids.is_empty() {
                    redis::cmd("XACK").arg(&key).arg(GROUP).arg(&ids).query_async::<()>(&mut conn).await?;
                }
            }
            anyhow::Ok(())
        }));
    }
    let producer_conn = client.get_multiplexed_async_connection().await?;
    let routes: Arc<Vec<u32>> = Arc::new(streams.iter().map(|s| mapper.queue_for(s).0).collect());
    let streams = Arc::new(streams);
    let progress = Progress::start("baseline", shape.total(), delivered.clone());
    let started = Instant::now();
    let mut producers = Vec::new();
    for p in 0..shape.producers {
        let (conn, routes, streams, prefix) =
            (producer_conn.clone(), routes.clone(), streams.clone(), prefix.to_string());
        producers.push(tokio::spawn(produce(shape, p, move |stream, events| {
            let (mut conn, routes, streams, prefix) = (conn.clone(), routes.clone(), streams.clone(), prefix.clone());
            async move {
                let id = &streams[stream];
                let Some(body) = Entry::encode(id, &events) else { return false };
                redis::cmd("XADD")
                    .arg(format!("{prefix}:q{}", routes[stream]))
                    .arg("*")
                    .arg("b")
                    .arg(body)
                    .query_async::<String>(&mut conn)
                    .await
                    .is_ok()
            }
        })));
    }
    tally.finish("the baseline", producers, consumers, started, progress).await
}
