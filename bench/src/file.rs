//! `tailrace-bench file`: the JSON Lines handoff against plain file I/O of
//! the same lines, in the same run.
//!
//! - writer, per fsync policy: `LoggingConsumer::append_batch` + `flush` per
//!   batch (rotation, budget, lock checks included) against a `BufWriter`
//!   that serialises the same events with serde_json and syncs at the same
//!   points (never / every batch / at most every 10 ms);
//! - reader: the file adapter's receiver reading sealed files (read, parse,
//!   one container per batch, ack) against a sequential `read` of the same
//!   files split into lines. The `RESULT` line reports the reader.
//!
//! Both run in rounds (3 with `--quick`, 5); the two writers write the same
//! batches in turn within a round, so the shared disk's stalls fall on both;
//! each ratio is the median round's, with the
//! lowest and highest beside it (`…_min`, `…_max`).

use std::io::Write;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use bytes::Bytes;
use serde::Serialize;
use tailrace::adapters::file::{FileAdapterFactory, FileOptions};
use tailrace::handoff::{FsyncPolicy, LoggingConsumer, WriterOptions};
use tailrace::queue::{Fence, QueueAdapterFactory};
use tailrace::{Event, EventId, QueueId, StreamId};

use super::Progress;

const BATCH: usize = 64;
const PREFIX: &str = "events";

/// A log line of a typical length (~100 bytes of payload).
fn events(total: usize) -> Vec<(StreamId, Vec<Event>)> {
    let payload =
        Bytes::from_static(b"2026-11-30T02:11:09Z INFO  step 3/7: compiling tailrace v0.1.0 (/build/src) [worker-2]");
    let now = crate::now_ms();
    (0..total / BATCH)
        .map(|b| {
            let stream = StreamId::new("logs", format!("pipeline-{}/run-1", b % 16));
            let events = (0..BATCH)
                .map(|i| Event {
                    id: EventId::from_u64((b * BATCH + i) as u64),
                    timestamp_ms: now,
                    payload: payload.clone(),
                })
                .collect();
            (stream, events)
        })
        .collect()
}

pub async fn run(quick: bool) -> anyhow::Result<()> {
    let (write_events, read_events, runs) = if quick { (64_000, 256_000, 3) } else { (256_000, 1_024_000, 5) };
    println!("file: writer {write_events} events per policy in batches of {BATCH}; reader {read_events} events");
    let root = tempfile::tempdir().context("a scratch directory")?;
    let batches = events(write_events);
    let mut extra = Vec::new();
    // TAILRACE_BENCH_ONLY=reader skips the writer runs, =writer the reader
    // runs (for profiling).
    let only = std::env::var("TAILRACE_BENCH_ONLY").unwrap_or_default();
    let policies = match only.as_str() {
        "reader" => vec![],
        _ => vec![FsyncPolicy::Never, FsyncPolicy::Group(Duration::from_millis(10)), FsyncPolicy::EveryFlush],
    };
    for policy in policies {
        let mut rounds = Vec::new();
        for round in 0..runs {
            let dir = root.path().join(format!("w-{round}"));
            let (t, b) = tokio::task::block_in_place(|| writers_run(&dir, policy, &batches))?;
            std::fs::remove_dir_all(&dir).ok();
            println!("  writer fsync={policy:<11} round {}: ratio {:.3}", round + 1, t / b.max(1e-9));
            rounds.push((t, b));
        }
        let line = super::median_line("file-writer", &rounds, &[]);
        println!("  writer fsync={policy:<11} {}", line.trim_start_matches("RESULT scenario=file-writer "));
        extra.push(super::Spread::of(&rounds));
    }

    if only == "writer" {
        return Ok(());
    }
    // The reader's input: sealed files written once by the handoff.
    let queues = root.path().join("r");
    let queue_dir = queues.join("q0");
    tokio::task::block_in_place(|| {
        let mut writer =
            LoggingConsumer::open(&queue_dir, PREFIX, reader_input_options()).context("opening the input writer")?;
        for (stream, batch) in events(read_events) {
            writer.append_batch(&stream, &batch)?;
        }
        writer.close()?;
        anyhow::Ok(())
    })?;
    let bytes = dir_bytes(&queue_dir)?;
    println!("  reader input: {:.1} MiB in {} files", bytes as f64 / 1048576.0, std::fs::read_dir(&queue_dir)?.count());
    let mut rounds = Vec::new();
    for round in 1..=if quick { 3 } else { 5 } {
        let t = reader_run(&queues, read_events as u64).await?;
        let b = tokio::task::block_in_place(|| baseline_reader(&queue_dir))?;
        anyhow::ensure!(b.1 == read_events as u64, "the baseline read {} lines, not {read_events}", b.1);
        let (t, b) = (t, b.0);
        println!(
            "  reader round {round}: tailrace {:>8.0} MiB/s   baseline {:>8.0} MiB/s   ratio {:.3}",
            mib(bytes, t),
            mib(bytes, b),
            b / t.max(1e-9)
        );
        rounds.push((read_events as f64 / t, read_events as f64 / b));
    }
    let mut fields: Vec<(&str, String)> = vec![("events", read_events.to_string())];
    let labels = ["never", "group_10ms", "every_flush"];
    let mut writer_fields = Vec::new();
    for (label, spread) in labels.iter().zip(&extra) {
        writer_fields.push((format!("writer_ratio_{label}"), format!("{:.3}", spread.median)));
        writer_fields.push((format!("writer_ratio_{label}_min"), format!("{:.3}", spread.min)));
        writer_fields.push((format!("writer_ratio_{label}_max"), format!("{:.3}", spread.max)));
    }
    fields.extend(writer_fields.iter().map(|(k, v)| (k.as_str(), v.clone())));
    println!("{}", super::median_line("file", &rounds, &fields));
    Ok(())
}

fn mib(bytes: u64, seconds: f64) -> f64 {
    bytes as f64 / 1048576.0 / seconds.max(1e-9)
}

fn dir_bytes(dir: &Path) -> anyhow::Result<u64> {
    let mut total = 0;
    for entry in std::fs::read_dir(dir)? {
        total += entry?.metadata()?.len();
    }
    Ok(total)
}

fn reader_input_options() -> WriterOptions {
    WriterOptions {
        max_file_bytes: 8 * 1024 * 1024,
        max_total_bytes: 16 * 1024 * 1024 * 1024,
        max_file_age: None,
        fsync: FsyncPolicy::Never,
        ..WriterOptions::default()
    }
}

/// Events per second through the handoff writer and through the plain
/// one, writing the same batches in turn (each side first in every other
/// batch): both meet the disk in the same state, so a stall of the shared
/// disk lands on both sides instead of on one round of one.
fn writers_run(dir: &Path, fsync: FsyncPolicy, batches: &[(StreamId, Vec<Event>)]) -> anyhow::Result<(f64, f64)> {
    let mut spent = [Duration::ZERO; 2];
    let options = WriterOptions { fsync, ..reader_input_options() };
    let mut tailrace = timed(&mut spent[0], || Ok(LoggingConsumer::open(dir.join("t"), PREFIX, options)?))?;
    let mut plain = timed(&mut spent[1], || PlainWriter::open(&dir.join("b"), fsync))?;
    for (n, (stream, batch)) in batches.iter().enumerate() {
        let [t, b] = &mut spent;
        let mut ours = || timed(t, || Ok(tailrace.append_batch(stream, batch).and_then(|_| tailrace.flush())?));
        let mut theirs = || timed(b, || plain.write(stream, batch));
        if n % 2 == 0 {
            ours()?;
            theirs()?;
        } else {
            theirs()?;
            ours()?;
        }
    }
    timed(&mut spent[0], || Ok(tailrace.close()?))?;
    timed(&mut spent[1], || plain.close())?;
    let events = (batches.len() * BATCH) as f64;
    Ok((events / spent[0].as_secs_f64().max(1e-9), events / spent[1].as_secs_f64().max(1e-9)))
}

/// Runs `work`, adding the time it took to `spent`.
fn timed<T>(spent: &mut Duration, work: impl FnOnce() -> anyhow::Result<T>) -> anyhow::Result<T> {
    let started = Instant::now();
    let result = work();
    *spent += started.elapsed();
    result
}

#[derive(Serialize)]
struct PlainLine<'a> {
    id: &'a str,
    stream: &'a StreamId,
    ts: u64,
    payload: &'a str,
}

/// The baseline: a `BufWriter` of the same lines, synced at the same points.
struct PlainWriter {
    out: std::io::BufWriter<std::fs::File>,
    fsync: FsyncPolicy,
    last_sync: Instant,
}

impl PlainWriter {
    fn open(dir: &Path, fsync: FsyncPolicy) -> anyhow::Result<Self> {
        std::fs::create_dir_all(dir)?;
        let file = std::fs::File::create(dir.join("plain.jsonl"))?;
        Ok(Self { out: std::io::BufWriter::with_capacity(64 * 1024, file), fsync, last_sync: Instant::now() })
    }

    fn write(&mut self, stream: &StreamId, batch: &[Event]) -> anyhow::Result<()> {
        for event in batch {
            let payload = std::str::from_utf8(&event.payload)?;
            let line = PlainLine { id: event.id.as_str(), stream, ts: event.timestamp_ms, payload };
            serde_json::to_writer(&mut self.out, &line)?;
            self.out.write_all(b"\n")?;
        }
        self.out.flush()?;
        let sync = match self.fsync {
            FsyncPolicy::Never => false,
            FsyncPolicy::EveryFlush => true,
            FsyncPolicy::Group(every) => self.last_sync.elapsed() >= every,
        };
        if sync {
            self.out.get_ref().sync_data()?;
            self.last_sync = Instant::now();
        }
        Ok(())
    }

    fn close(mut self) -> anyhow::Result<()> {
        self.out.flush()?;
        Ok(self.out.get_ref().sync_all()?)
    }
}

/// Seconds for the file adapter's receiver to read and ack every event.
async fn reader_run(queues: &Path, total: u64) -> anyhow::Result<f64> {
    let options =
        FileOptions { dir: queues.to_path_buf(), write: false, delete_consumed: false, ..FileOptions::default() };
    let factory = FileAdapterFactory::new(1, options)?;
    let adapter = factory.create_adapter().await?;
    let done = Arc::new(AtomicU64::new(0));
    let progress = Progress::start("tailrace reader", total, done.clone());
    let started = Instant::now();
    let mut receiver = adapter.create_receiver(QueueId(0), Fence::NONE).await?;
    receiver.initialize(Duration::from_secs(5)).await?;
    let mut read = 0u64;
    while read < total {
        let batch = receiver.read(256).await?;
        anyhow::ensure!(!batch.is_empty() || started.elapsed() < Duration::from_secs(60), "the reader stalled");
        let tokens: Vec<_> = batch.iter().map(|c| c.token).collect();
        read += batch.iter().map(|c| c.events.len() as u64).sum::<u64>();
        receiver.delivered(&tokens).await?;
        done.store(read, Ordering::Relaxed);
    }
    let elapsed = started.elapsed().as_secs_f64();
    progress.finish();
    receiver.shutdown(Duration::from_secs(5)).await?;
    anyhow::ensure!(read == total, "the reader read {read} events, not {total}");
    Ok(elapsed)
}

/// Seconds to read the same files sequentially and split them into lines,
/// and the lines counted.
fn baseline_reader(dir: &Path) -> anyhow::Result<(f64, u64)> {
    let started = Instant::now();
    let mut files: Vec<_> = std::fs::read_dir(dir)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "jsonl"))
        .collect();
    files.sort_by_key(|p| {
        let name = p.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
        name.rsplit('-').next().and_then(|n| n.parse::<u64>().ok()).unwrap_or(0)
    });
    let mut lines = 0u64;
    for path in files {
        let data = std::fs::read(&path)?;
        lines += data.split(|b| *b == b'\n').filter(|line| !line.is_empty()).count() as u64;
    }
    Ok((started.elapsed().as_secs_f64(), lines))
}
