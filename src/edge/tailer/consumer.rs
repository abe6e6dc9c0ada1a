//! The tailer as the run stream's subscriber: deliveries wait until it is
//! live, then each new container becomes a chunk of its window.

use std::sync::{Arc, Weak};

use async_trait::async_trait;
use tokio::time::Instant;

use super::{Ending, Known, Phase, Tailer};
use crate::archive::{Contents, RECENT_BATCHES, batch_fingerprint};
use crate::edge::frames::EndReason;
use crate::pubsub::{ConsumerError, Delivery, DeliveryOutcome, StreamConsumer};
use crate::stream::{BatchContainer, SequenceToken};
use crate::telemetry;

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

/// The tailer as the run stream's subscriber.
pub(super) struct TailerConsumer {
    pub(super) tailer: Weak<Tailer>,
}

#[async_trait]
impl StreamConsumer for TailerConsumer {
    async fn deliver(&self, delivery: &Delivery) -> Result<DeliveryOutcome, ConsumerError> {
        let gone = || ConsumerError::Unavailable("the tailer ended".into());
        let tailer = self.tailer.upgrade().ok_or_else(gone)?;
        // Until the store's position is known, deliveries wait (this
        // subscription only).
        if tailer.started().await == Phase::Ended {
            return Err(gone());
        }
        tailer.publish(&delivery.batches)?;
        Ok(DeliveryOutcome::Continue)
    }
}
