//! The tailer as the run stream's subscriber: deliveries wait until it is
//! live, then each new container becomes a chunk of its window. Once live
//! it answers every handshake with the last token it holds, so an agent
//! that serves it anew (a handoff, a node that left and came back)
//! continues right after what its window holds, however far that agent's
//! checkpoint is. A delivery that follows a gap (events the subscription
//! skipped) first re-bases the tailer on the run log store, so its offsets
//! stay the store's whatever the subscription missed.

use std::sync::{Arc, Weak};
use std::time::Duration;

use async_trait::async_trait;
use tokio::time::Instant;

use super::{Ending, Known, Phase, Tailer};
use crate::archive::{Contents, RECENT_BATCHES, RunLogReader, batch_fingerprint};
use crate::edge::frames::EndReason;
use crate::edge::window::Window;
use crate::pubsub::{ConsumerError, Delivery, DeliveryOutcome, StartPosition, StreamConsumer, SubscriptionInfo};
use crate::stream::{BatchContainer, SequenceToken};
use crate::telemetry;

/// How long a delivery after a gap waits for the store to hold its first
/// container before it fails (and is retried by its agent with backoff):
/// well inside `cluster.call_timeout`, so a remote agent sees the failure
/// rather than a timeout.
const REBASE_WAIT: Duration = Duration::from_secs(2);

impl Tailer {
    /// New containers from the subscription: each becomes a chunk of the
    /// window at the next offsets; viewers pull it.
    pub(super) fn publish(self: &Arc<Self>, batches: &[Arc<BatchContainer>]) -> Result<(), ConsumerError> {
        let mut state = self.state.lock();
        if state.phase == Phase::Ended {
            return Err(ConsumerError::Unavailable(format!("the tailer of {} ended", self.key)));
        }
        let mut published = false;
        for batch in batches {
            let stale = |t: Option<SequenceToken>| t.is_some_and(|t| t >= batch.token);
            if stale(state.feed.base_token) || stale(state.feed.last_token) {
                continue;
            }
            state.feed.last_token = Some(batch.token);
            let contents = Contents::of(&batch.events);
            if let Some(status) = contents.status {
                // In order with the lines: every line before it was published.
                state.known = if status.is_finished() { Known::Finished } else { Known::Running };
                state.clock.last_probe_at = Some(Instant::now());
            }
            if contents.texts.is_empty() {
                continue;
            }
            let fingerprint = batch_fingerprint(&batch.events);
            if state.feed.recent.contains(&fingerprint) {
                continue;
            }
            if state.feed.recent.len() >= RECENT_BATCHES {
                state.feed.recent.pop_front();
            }
            state.feed.recent.push_back(fingerprint);
            let bytes = state.feed.window.push(contents.lines().map(str::to_string).collect()) as u64;
            metrics::counter!(telemetry::EDGE_FRAMES).increment(state.audience.viewers.len() as u64);
            state.feed.streamed_bytes += bytes;
            state.feed.bytes_since_tick += bytes;
            state.clock.last_content_at = Instant::now();
            state.clock.content_at = Some(state.clock.last_content_at);
            published = true;
        }
        if state.feed.streamed_bytes >= self.settings.max_stream_bytes {
            self.end(state, Some(Ending::Complete(EndReason::MaxBytes)));
        } else if published {
            self.publish_snapshot(&state);
            drop(state);
            self.version.send_modify(|v| *v += 1);
        }
        Ok(())
    }
}

impl Tailer {
    /// Where the subscription continues: after the last container the
    /// window holds (or the store held when the tailer went live). `None`
    /// before the tailer is live: the subscription's own start.
    fn resume_after(&self) -> Option<SequenceToken> {
        let state = self.state.lock();
        if state.phase != Phase::Live {
            return None;
        }
        state.feed.last_token.max(state.feed.base_token)
    }

    /// The subscription skipped events before `first` (the first container
    /// of the delivery that says so): what the tailer numbered since may
    /// not match the store. Once the store holds `first` (so every line
    /// before it), the window starts again at the store's end, exactly as
    /// a new tailer would; viewers behind it read the store. Fails while
    /// the store has not caught up (the agent retries the delivery).
    async fn rebase(&self, store: &RunLogReader, first: SequenceToken, reason: &str) -> Result<(), ConsumerError> {
        if !store.wait_stored(&self.key, first, REBASE_WAIT).await {
            return Err(ConsumerError::Failed(format!(
                "run {}: after a gap in its stream the tailer waits for the store to hold {first}",
                self.key
            )));
        }
        let (info, recent) = store.info_and_recent(&self.key).await.map_err(ConsumerError::failed)?.unwrap_or_default();
        let mut state = self.state.lock();
        if state.phase == Phase::Ended {
            return Err(ConsumerError::Unavailable(format!("the tailer of {} ended", self.key)));
        }
        let head = state.feed.window.head();
        tracing::warn!(run = %self.key, %reason, head, store_lines = info.lines, "gap in the run's stream: tailer re-based on the store");
        metrics::counter!(telemetry::EDGE_REBASES).increment(1);
        state.feed.window = Window::new(self.key.run(), info.lines, self.settings.max_replay_bytes);
        state.feed.base_token = info.last_token;
        state.feed.last_token = info.last_token;
        state.feed.recent = recent.into();
        self.publish_snapshot(&state);
        drop(state);
        self.version.send_modify(|v| *v += 1);
        Ok(())
    }
}

/// The tailer as the run stream's subscriber.
pub(super) struct TailerConsumer {
    pub(super) tailer: Weak<Tailer>,
    /// The run log store, for a re-base after a gap.
    pub(super) store: RunLogReader,
}

#[async_trait]
impl StreamConsumer for TailerConsumer {
    async fn handshake(&self, _: &SubscriptionInfo) -> Result<Option<StartPosition>, ConsumerError> {
        let tailer = self.tailer.upgrade().ok_or_else(|| ConsumerError::Unavailable("the tailer ended".into()))?;
        Ok(tailer.resume_after().map(StartPosition::After))
    }

    async fn deliver(&self, delivery: &Delivery) -> Result<DeliveryOutcome, ConsumerError> {
        let gone = || ConsumerError::Unavailable("the tailer ended".into());
        let tailer = self.tailer.upgrade().ok_or_else(gone)?;
        // Until the store's position is known, deliveries wait (this
        // subscription only).
        if tailer.started().await == Phase::Ended {
            return Err(gone());
        }
        if let (Some(reason), Some(first)) = (&delivery.gap, delivery.batches.first()) {
            tailer.rebase(&self.store, first.token, reason).await?;
        }
        tailer.publish(&delivery.batches)?;
        Ok(DeliveryOutcome::Continue)
    }
}
