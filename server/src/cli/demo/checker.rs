//! The demo's checker: every `demo` stream's implicit subscriber. It counts
//! deliveries, duplicates and gaps across the demo's lives on one data
//! directory.
//!
//! Event ids are `{stream}#{life}#{n}`: `life` is when the demo process
//! started (ms), `n` counts from 0 in each life, so a stream's ids are
//! ordered (life, n) across restarts. The newest id seen per stream goes to
//! an append-only file (`demo-seen.log`, no fsync: it only has to survive
//! the process, not the machine), so after a `kill -9` the next life still
//! knows what was delivered: a redelivery is counted as a duplicate, and a
//! gap (an event never delivered) as lost.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use async_trait::async_trait;
use parking_lot::Mutex;
use tailrace::pubsub::{ConsumerError, ConsumerFactory, Delivery, DeliveryOutcome, StreamConsumer};
use tailrace::{EventId, StreamId};

/// Lines in the seen-log after which it is rewritten with one line per stream.
const COMPACT_AFTER: u64 = 100_000;

/// A demo event's id.
pub fn event_id(stream: &StreamId, life: u64, n: u64) -> EventId {
    EventId::new(format!("{}#{life}#{n}", stream.key()))
}

fn parse_id(id: &str) -> Option<(u64, u64)> {
    let mut parts = id.rsplitn(3, '#');
    let n = parts.next()?.parse().ok()?;
    let life = parts.next()?.parse().ok()?;
    Some((life, n))
}

/// What the demo's consumers saw.
pub struct Tally {
    /// This life's start (ms): its events' `life`.
    pub life: u64,
    /// Events of this life delivered (first time).
    pub delivered: AtomicU64,
    /// Events of earlier lives delivered here for the first time.
    pub earlier: AtomicU64,
    /// Events delivered again (in this life or an earlier one).
    pub duplicates: AtomicU64,
    /// Events skipped over: a later event came first.
    pub lost: AtomicU64,
    state: Mutex<Seen>,
}

struct Seen {
    /// Per stream: the newest (life, n) delivered.
    newest: BTreeMap<String, (u64, u64)>,
    log: Option<std::fs::File>,
    path: PathBuf,
    lines: u64,
}

impl Tally {
    /// Loads what earlier lives saw from `{dir}/demo-seen.log`.
    pub fn open(dir: &Path, life: u64) -> anyhow::Result<Arc<Self>> {
        let path = dir.join("demo-seen.log");
        let mut newest = BTreeMap::new();
        let text = match std::fs::read_to_string(&path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
            Err(e) => return Err(anyhow::Error::new(e).context(format!("reading {}", path.display()))),
        };
        // A torn last line (the crash) is skipped: that delivery is then
        // counted again as a first one, never as lost.
        for line in text.lines() {
            let mut parts = line.split(' ');
            let (Some(stream), Some(life), Some(n)) = (parts.next(), parts.next(), parts.next()) else { continue };
            let (Ok(life), Ok(n)) = (life.parse(), n.parse()) else { continue };
            let entry = newest.entry(stream.to_string()).or_insert((life, n));
            *entry = (*entry).max((life, n));
        }
        let mut seen = Seen { newest, log: None, path, lines: 0 };
        seen.compact()?;
        Ok(Arc::new(Self {
            life,
            delivered: AtomicU64::new(0),
            earlier: AtomicU64::new(0),
            duplicates: AtomicU64::new(0),
            lost: AtomicU64::new(0),
            state: Mutex::new(seen),
        }))
    }

    fn record(&self, stream: &StreamId, ids: impl Iterator<Item = Option<(u64, u64)>>) -> std::io::Result<()> {
        let mut seen = self.state.lock();
        let key = stream.key();
        let mut newest = seen.newest.get(key).copied();
        for id in ids {
            let Some((life, n)) = id else { continue };
            if newest.is_some_and(|last| (life, n) <= last) {
                self.duplicates.fetch_add(1, Ordering::Relaxed);
                continue;
            }
            // The next expected: n + 1 of the same life, or 0 of a later one.
            let skipped = match newest {
                Some((last_life, last_n)) if last_life == life => n - last_n - 1,
                _ => n,
            };
            self.lost.fetch_add(skipped, Ordering::Relaxed);
            let counter = if life == self.life { &self.delivered } else { &self.earlier };
            counter.fetch_add(1, Ordering::Relaxed);
            newest = Some((life, n));
        }
        if let Some((life, n)) = newest
            && seen.newest.get(key) != Some(&(life, n))
        {
            seen.newest.insert(key.to_string(), (life, n));
            seen.append(key, life, n)?;
        }
        Ok(())
    }
}

impl Seen {
    fn append(&mut self, stream: &str, life: u64, n: u64) -> std::io::Result<()> {
        if self.lines >= COMPACT_AFTER {
            self.compact()?;
        }
        if let Some(log) = self.log.as_mut() {
            writeln!(log, "{stream} {life} {n}")?;
            self.lines += 1;
        }
        Ok(())
    }

    /// Rewrites the log with one line per stream (temp file, rename).
    fn compact(&mut self) -> std::io::Result<()> {
        let temp = self.path.with_extension("log.tmp");
        let mut body = String::new();
        for (stream, (life, n)) in &self.newest {
            body.push_str(&format!("{stream} {life} {n}\n"));
        }
        std::fs::write(&temp, body)?;
        std::fs::rename(&temp, &self.path)?;
        self.log = Some(std::fs::OpenOptions::new().append(true).open(&self.path)?);
        self.lines = self.newest.len() as u64;
        Ok(())
    }
}

/// Every stream of `demo` gets one of these (an implicit subscription).
struct Checker(Arc<Tally>);

#[async_trait]
impl StreamConsumer for Checker {
    async fn deliver(&self, delivery: &Delivery) -> Result<DeliveryOutcome, ConsumerError> {
        let ids = delivery.events().map(|(event, _)| parse_id(event.id.as_str()));
        self.0.record(&delivery.stream, ids).map_err(ConsumerError::failed)?;
        Ok(DeliveryOutcome::Continue)
    }
}

/// Binds a [`Checker`] to each stream.
pub struct CheckerFactory(pub Arc<Tally>);

impl ConsumerFactory for CheckerFactory {
    fn name(&self) -> &str {
        "demo-checker"
    }

    fn create(&self, _: &StreamId) -> Arc<dyn StreamConsumer> {
        Arc::new(Checker(self.0.clone()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn duplicates_and_gaps_are_counted_across_lives() {
        let dir = tempfile::tempdir().unwrap();
        let stream = StreamId::new("demo", "pipeline-00");
        let first = Tally::open(dir.path(), 1).unwrap();
        first.record(&stream, [(1, 0), (1, 1), (1, 2)].map(Some).into_iter()).unwrap();
        drop(first);
        // The next life: a redelivery of (1, 1..=2), then a gap at (1, 4).
        let second = Tally::open(dir.path(), 2).unwrap();
        second.record(&stream, [(1, 1), (1, 2), (1, 3), (1, 5), (2, 0), (2, 1)].map(Some).into_iter()).unwrap();
        assert_eq!(second.duplicates.load(Ordering::Relaxed), 2);
        assert_eq!(second.earlier.load(Ordering::Relaxed), 2);
        assert_eq!(second.lost.load(Ordering::Relaxed), 1);
        assert_eq!(second.delivered.load(Ordering::Relaxed), 2);
    }
}
