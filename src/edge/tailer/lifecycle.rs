//! One tailer's state machine: it goes live once the store's position is
//! known, the timer checks stalled viewers, lingering and the end
//! conditions, and the end releases its run slot and its subscription.

use std::sync::Arc;
use std::time::Duration;

use parking_lot::MutexGuard;
use tokio::time::Instant;

use super::{Ending, Known, Phase, State, Tailer};
use crate::config::secs;
use crate::edge::frames::{self, EndReason};
use crate::edge::window::Window;
use crate::node::SubscriptionHandle;
use crate::stream::SequenceToken;
use crate::telemetry;

/// What a status lookup found of a run with a status.
pub(super) struct Probed {
    pub(super) finished: bool,
    /// Lines the store held.
    pub(super) lines: u64,
    /// When the run was last active in the store (ms since the Unix epoch).
    pub(super) active_ms: u64,
}

impl Tailer {
    pub(super) fn join(&self) -> bool {
        let mut state = self.state.lock();
        if state.phase == Phase::Ended {
            return false;
        }
        state.audience.joining += 1;
        state.audience.empty_since = None;
        true
    }

    pub(super) fn go_live(
        self: &Arc<Self>,
        handle: SubscriptionHandle,
        lines: u64,
        token: Option<SequenceToken>,
        recent: Vec<u64>,
    ) -> bool {
        let mut state = self.state.lock();
        state.subscription = Some(handle);
        if state.phase == Phase::Ended {
            return false;
        }
        state.phase = Phase::Live;
        state.feed.window = Window::new(self.key.run(), lines, self.settings.max_replay_bytes);
        state.feed.base_token = token;
        state.feed.recent = recent.into();
        self.publish_snapshot(&state);
        drop(state);
        self.phase.send_replace(Phase::Live);
        true
    }

    pub(super) fn keep_subscription(&self, handle: SubscriptionHandle) {
        self.state.lock().subscription = Some(handle);
    }
    pub(super) fn is_lingering(&self) -> bool {
        self.state.lock().audience.empty_since.is_some()
    }

    pub(super) fn empty_since(&self) -> Option<Instant> {
        self.state.lock().audience.empty_since
    }

    pub(super) fn linger_over(&self) -> bool {
        self.empty_since().is_some_and(|since| since.elapsed() >= secs(self.settings.linger_seconds))
    }

    /// Nobody watches any more: end without a terminal frame.
    pub(super) fn unwatched(self: &Arc<Self>) {
        let state = self.state.lock();
        self.end(state, None);
    }

    /// Cuts every viewer whose socket took nothing for
    /// `stall_timeout_seconds` while it had lines to send.
    pub(super) fn cut_stalled(&self) {
        let limit = secs(self.settings.stall_timeout_seconds);
        let mut state = self.state.lock();
        let head = state.feed.window.head();
        state.audience.viewers.retain(|viewer| {
            let stalled = viewer.cursor() < head && viewer.stalled_for() >= limit;
            if stalled {
                tracing::debug!(run = %self.key, viewer = viewer.id(), "viewer stalled; cutting it");
                viewer.cut();
                metrics::counter!(telemetry::EDGE_VIEWERS_DROPPED).increment(1);
            }
            !stalled
        });
    }
    /// Whether the store said the run finished.
    pub(super) fn is_finished(&self) -> bool {
        self.state.lock().known == Known::Finished
    }

    pub(super) fn probe_due(&self) -> bool {
        let state = self.state.lock();
        state.known != Known::Finished
            && state.feed.bytes_since_tick == 0
            && state.clock.last_probe_at.is_none_or(|at| at.elapsed() >= secs(self.settings.run_probe_seconds))
    }

    /// The status lookup's result: finished or not, with the lines the
    /// store held then and when the run was last active there (ms since
    /// the Unix epoch); `None` without status. `timed`: it counts as the
    /// timer's probe (the lookup at going live does not).
    pub(super) fn probed(&self, finished: Option<Probed>, timed: bool) {
        let mut state = self.state.lock();
        if timed {
            state.clock.last_probe_at = Some(Instant::now());
        }
        state.known = match finished {
            Some(Probed { finished: true, lines, active_ms }) if state.feed.window.head() >= lines => {
                let age = Duration::from_millis(crate::stream::now_ms().saturating_sub(active_ms));
                state.clock.run_active_at = Instant::now().checked_sub(age);
                Known::Finished
            }
            Some(_) => Known::Running,
            None => Known::Unknown,
        };
    }

    /// The first end condition that holds, OpenMetadata's order.
    pub(super) fn end_reason(&self) -> Option<EndReason> {
        let mut state = self.state.lock();
        let quiet_tick = std::mem::take(&mut state.feed.bytes_since_tick) == 0;
        let settings = &self.settings;
        let quiet_for = state.clock.last_content_at.elapsed();
        if state.feed.streamed_bytes >= settings.max_stream_bytes {
            Some(EndReason::MaxBytes)
        } else if state.clock.started_at.elapsed() >= secs(settings.max_stream_seconds) {
            Some(EndReason::MaxDuration)
        } else if quiet_for >= secs(settings.max_idle_seconds) {
            Some(EndReason::IdleTimeout)
        } else if quiet_tick
            // A session still joining would find the tailer ended and no
            // place in it: the run ends once every one attached.
            && state.audience.joining == 0
            && match state.known {
                Known::Running => false,
                // Quiet since the run's last line, stored or received: a
                // run that finished long ago ends at once, one that just
                // finished keeps the grace for late lines.
                Known::Finished => {
                    let last = match (state.clock.run_active_at, state.clock.content_at) {
                        (Some(stored), Some(received)) => Some(stored.max(received)),
                        (stored, received) => stored.or(received),
                    };
                    last.map_or(quiet_for, |last| last.elapsed()) >= secs(settings.finish_grace_seconds)
                }
                Known::Unknown => quiet_for >= secs(settings.unknown_run_grace_seconds),
            }
        {
            Some(EndReason::RunFinished)
        } else {
            None
        }
    }

    pub(super) fn complete(self: &Arc<Self>, reason: EndReason) {
        let state = self.state.lock();
        self.end(state, Some(Ending::Complete(reason)));
    }

    /// The edge stops: every viewer's stream ends (it reconnects with its
    /// cursor), and the subscription is given back.
    pub(super) fn stop(self: &Arc<Self>) {
        let state = self.state.lock();
        self.end(state, None);
    }

    /// A persistent failure: every viewer gets an `error` and is closed.
    pub(super) fn fail(self: &Arc<Self>, message: &str) {
        tracing::warn!(run = %self.key, %message, "tailer failed");
        let state = self.state.lock();
        self.end(state, Some(Ending::Error(message.to_string())));
    }

    /// Ends the tailer: viewers get what they have not pulled yet of the
    /// window, then the terminal frame (if any). Its table sees the end and
    /// frees the run slot and the subscription.
    pub(super) fn end(self: &Arc<Self>, mut state: MutexGuard<'_, State>, ending: Option<Ending>) {
        if state.phase == Phase::Ended {
            return;
        }
        state.phase = Phase::Ended;
        let head = state.feed.window.head();
        state.end.completed = match &ending {
            Some(Ending::Complete(reason)) => Some(*reason),
            _ => None,
        };
        state.end.terminal = match &ending {
            Some(Ending::Complete(reason)) => Some(frames::complete(self.key.run(), Some(head), *reason)),
            Some(Ending::Error(message)) => Some(frames::error(self.key.run(), message)),
            None => None,
        };
        if let Some(Ending::Error(_)) = &ending {
            state.end.failure = state.end.terminal.clone();
        }
        state.audience.viewers.clear();
        self.publish_snapshot(&state);
        drop(state);
        self.phase.send_replace(Phase::Ended);
        self.version.send_modify(|v| *v += 1);
        if let Some(reason) = &ending {
            tracing::debug!(run = %self.key, ?reason, "tailer ended");
        }
    }

    /// The subscription, once the tailer ended (for its table to end it).
    pub(super) fn take_subscription(&self) -> Option<SubscriptionHandle> {
        self.state.lock().subscription.take()
    }

    /// Resolves once the tailer ended.
    pub(super) async fn ended(&self) {
        let _ = self.phase.subscribe().wait_for(|phase| *phase == Phase::Ended).await;
    }
}
