//! One **run feed** per watched pipeline per node: a task that reads the
//! pipeline's newest runs (`edge.runs_stream.max_runs`) from the run log
//! store every `edge.runs_stream.poll_seconds`, only while someone
//! watches, and publishes what it read to every watcher of the pipeline on
//! this node (`runs_stream.rs`), however many. Since it reads the store,
//! it sees the runs any node stored (a cluster shares its Redis store).
//!
//! The table of feeds is bounded by `edge.runs_stream.max_pipelines`. A
//! feed ends at the first read after its last watcher left; a watcher that
//! comes after that starts a new one. Each feed is a task of the edge's
//! [`Tasks`] and ends when the edge stops.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::sync::watch;

use crate::archive::{RunLogReader, RunSummary};
use crate::config::{RunsStreamSettings, secs};
use crate::tasks::Tasks;

/// A pipeline's newest runs as one read of the store found them, newest
/// first; `None` until the first read succeeded.
pub(crate) type Listing = Option<Arc<Vec<RunSummary>>>;

/// The node's run feeds, one per watched pipeline.
pub(crate) struct Feeds {
    store: RunLogReader,
    settings: RunsStreamSettings,
    tasks: Tasks,
    feeds: Mutex<HashMap<String, watch::Sender<Listing>>>,
}

impl Feeds {
    pub(crate) fn new(store: RunLogReader, settings: RunsStreamSettings, tasks: Tasks) -> Arc<Self> {
        Arc::new(Self { store, settings, tasks, feeds: Mutex::new(HashMap::new()) })
    }

    /// A watcher of `fqn`'s runs: the receiver of its listings, from the
    /// pipeline's feed (started if there is none). `None` past
    /// `max_pipelines`, or once the edge stops.
    pub(crate) fn watch(self: &Arc<Self>, fqn: &str) -> Option<watch::Receiver<Listing>> {
        if self.tasks.token().is_cancelled() {
            return None;
        }
        let mut feeds = self.feeds.lock();
        if let Some(feed) = feeds.get(fqn) {
            return Some(feed.subscribe());
        }
        if feeds.len() >= self.settings.max_pipelines {
            return None;
        }
        let (feed, watcher) = watch::channel(None);
        feeds.insert(fqn.to_string(), feed.clone());
        drop(feeds);
        let span = tracing::debug_span!("runs feed", pipeline = %fqn);
        self.tasks.spawn("runs feed", tracing::Instrument::instrument(poll(self.clone(), fqn.to_string(), feed), span));
        Some(watcher)
    }

    /// Pipelines watched now on this node.
    pub(crate) fn len(&self) -> usize {
        self.feeds.lock().len()
    }
}

/// A feed's life: read, publish what changed, wait, until nobody watches.
async fn poll(feeds: Arc<Feeds>, fqn: String, feed: watch::Sender<Listing>) {
    let every = secs(feeds.settings.poll_seconds).max(Duration::from_millis(1));
    let stop = feeds.tasks.token().clone();
    loop {
        {
            // Under the table's lock: a watcher either subscribed before
            // this look, or finds no feed and starts a new one.
            let mut table = feeds.feeds.lock();
            if feed.receiver_count() == 0 || stop.is_cancelled() {
                table.remove(&fqn);
                return;
            }
        }
        match feeds.store.runs(&fqn, feeds.settings.max_runs).await {
            Ok(runs) => {
                feed.send_if_modified(|listing| {
                    if listing.as_deref() == Some(&runs) {
                        return false;
                    }
                    *listing = Some(Arc::new(runs));
                    true
                });
            }
            // Retried at the next read; watchers keep what they have.
            Err(error) => tracing::debug!(%error, "reading the pipeline's runs failed; retrying"),
        }
        tokio::select! {
            () = tokio::time::sleep(every) => {}
            () = stop.cancelled() => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::archive::{Append, Archiver, FileRunLogStore, RunKey, RunLogStore, RunState};
    use crate::stream::SequenceToken;

    fn feeds(dir: &std::path::Path, max_pipelines: usize) -> (Arc<Feeds>, Arc<FileRunLogStore>) {
        let store = Arc::new(FileRunLogStore::open(dir, false).unwrap());
        let reader = Archiver::new(store.clone()).reader();
        let settings = RunsStreamSettings { poll_seconds: 0.05, max_pipelines, ..RunsStreamSettings::default() };
        (Feeds::new(reader, settings, Tasks::default()), store)
    }

    #[tokio::test]
    async fn watchers_of_a_pipeline_share_one_feed_that_ends_when_they_leave() {
        let dir = tempfile::tempdir().unwrap();
        let (feeds, store) = feeds(dir.path(), 1);
        let run = RunKey::new("svc.a", "r-1").unwrap();
        store.append(&run, SequenceToken::new(0, 0), &["x"], Append::new()).await.unwrap();
        let mut first = feeds.watch("svc.a").unwrap();
        let second = feeds.watch("svc.a").unwrap();
        assert!(feeds.watch("svc.b").is_none(), "max_pipelines: one feed");
        first.changed().await.unwrap();
        let listing = first.borrow_and_update().clone().unwrap();
        assert_eq!(listing.iter().map(|r| r.run.as_str()).collect::<Vec<_>>(), ["r-1"]);
        assert!(Arc::ptr_eq(&listing, second.borrow().as_ref().unwrap()), "one read for both");

        store.set_state(&run, RunState::Success).await.unwrap();
        first.changed().await.unwrap();
        assert_eq!(first.borrow_and_update().as_ref().unwrap()[0].info.state, Some(RunState::Success));

        drop((first, second));
        let ended = async {
            while feeds.len() > 0 {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        };
        tokio::time::timeout(Duration::from_secs(5), ended).await.expect("nobody watches: the feed ends");
        assert!(feeds.watch("svc.b").is_some(), "its slot is free");
    }
}
