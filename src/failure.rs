//! What happens when a consumer keeps failing: the failure handler decides
//! (skip the batch or fault the subscription), and a skipped batch goes to a
//! dead-letter sink together with the original error. Also where a queue's
//! unreadable lines or records go (the same sink), and the throttle that
//! keeps a flood of them from flooding the log.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use parking_lot::Mutex;
use serde::Serialize;

use crate::pubsub::{SubscriptionId, SubscriptionInfo};
use crate::stream::{Event, SequenceToken, StreamId};

/// The handler's decision.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FailureAction {
    /// Dead-letter the batch and go on with the next one.
    Skip,
    /// Remove the subscription (explicit subscriptions only; an implicit one
    /// is always skipped).
    Fault,
}

/// Decides what to do after delivery or handshake retries ran out.
pub trait FailureHandler: Send + Sync + 'static {
    /// A batch could not be delivered within the max delivery time.
    fn on_delivery_failure(&self, subscription: &SubscriptionInfo, token: SequenceToken, error: &str) -> FailureAction;

    /// The handshake kept failing (the subscription then starts at its own
    /// start position unless faulted).
    fn on_subscription_failure(&self, subscription: &SubscriptionInfo, error: &str) -> FailureAction;
}

/// Skips (the default, like Orleans) or faults on every failure.
#[derive(Clone, Copy, Debug, Default)]
pub struct DefaultFailureHandler {
    /// Fault explicit subscriptions instead of skipping.
    pub fault_on_error: bool,
}

impl FailureHandler for DefaultFailureHandler {
    fn on_delivery_failure(&self, _: &SubscriptionInfo, _: SequenceToken, _: &str) -> FailureAction {
        if self.fault_on_error { FailureAction::Fault } else { FailureAction::Skip }
    }

    fn on_subscription_failure(&self, _: &SubscriptionInfo, _: &str) -> FailureAction {
        if self.fault_on_error { FailureAction::Fault } else { FailureAction::Skip }
    }
}

/// A batch that was given up on, with why.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct DeadLetter {
    /// The subscription it was for (none when the queue itself could not
    /// read it, e.g. a corrupt line).
    pub subscription: Option<SubscriptionId>,
    /// Where it came from when that is not a subscription (`file:line`).
    pub origin: Option<String>,
    /// Its stream.
    pub stream: StreamId,
    /// The container's token.
    pub token: SequenceToken,
    /// The events, unchanged.
    pub events: Vec<Event>,
    /// The consumer's last error, as it reported it.
    pub error: String,
    /// How many delivery attempts were made.
    pub attempts: u32,
}

/// Where skipped batches go.
#[async_trait]
pub trait DeadLetterSink: Send + Sync + 'static {
    /// Keeps `letter`.
    async fn dead_letter(&self, letter: DeadLetter) -> Result<(), String>;
}

/// Logs each dead letter (the default sink): at most 5 per 10 s in one
/// process; each line says how many were not logged since the last one
/// (`not_logged`).
#[derive(Default)]
pub struct LogDeadLetters;

/// The throttle of [`LogDeadLetters`]' log.
static LOGGED: LogThrottle = LogThrottle::new(5, Duration::from_secs(10));

#[async_trait]
impl DeadLetterSink for LogDeadLetters {
    async fn dead_letter(&self, letter: DeadLetter) -> Result<(), String> {
        let Some(not_logged) = LOGGED.admit() else { return Ok(()) };
        tracing::error!(
            subscription = ?letter.subscription,
            origin = ?letter.origin,
            stream = %letter.stream,
            token = %letter.token,
            events = letter.events.len(),
            attempts = letter.attempts,
            error = %letter.error,
            not_logged,
            "dead letter: delivery given up"
        );
        Ok(())
    }
}

/// Lets a repeated error into the log `burst` times per `window`, and
/// says, with the next one it lets in, how many it held back meanwhile.
pub(crate) struct LogThrottle {
    burst: u32,
    window: Duration,
    state: Mutex<Throttled>,
}

struct Throttled {
    since: Option<Instant>,
    logged: u32,
    held: u64,
}

impl LogThrottle {
    pub(crate) const fn new(burst: u32, window: Duration) -> Self {
        Self { burst, window, state: parking_lot::const_mutex(Throttled { since: None, logged: 0, held: 0 }) }
    }

    /// `Some(how many were held back since the last one logged)` when this
    /// one may be logged now.
    pub(crate) fn admit(&self) -> Option<u64> {
        self.admit_at(Instant::now())
    }

    fn admit_at(&self, now: Instant) -> Option<u64> {
        let mut state = self.state.lock();
        if state.since.is_none_or(|since| now.saturating_duration_since(since) >= self.window) {
            state.since = Some(now);
            state.logged = 0;
        }
        if state.logged < self.burst {
            state.logged += 1;
            Some(std::mem::take(&mut state.held))
        } else {
            state.held += 1;
            None
        }
    }
}

/// Keeps the newest `capacity` dead letters in memory (tests, the demo).
pub struct MemoryDeadLetters {
    capacity: usize,
    letters: Mutex<VecDeque<DeadLetter>>,
}

impl MemoryDeadLetters {
    /// Holds at most `capacity` letters; the oldest go first.
    pub fn new(capacity: usize) -> Self {
        Self { capacity: capacity.max(1), letters: Mutex::new(VecDeque::new()) }
    }

    /// The letters kept, oldest first.
    pub fn letters(&self) -> Vec<DeadLetter> {
        self.letters.lock().iter().cloned().collect()
    }
}

#[async_trait]
impl DeadLetterSink for MemoryDeadLetters {
    async fn dead_letter(&self, letter: DeadLetter) -> Result<(), String> {
        let mut letters = self.letters.lock();
        if letters.len() == self.capacity {
            letters.pop_front();
        }
        letters.push_back(letter);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A flood is logged `burst` times per window; the first line after
    /// it says how many were held back.
    #[test]
    fn a_flood_is_logged_a_few_times_per_window_and_counted() {
        let throttle = LogThrottle::new(2, Duration::from_secs(10));
        let start = Instant::now();
        let at = |ms| start + Duration::from_millis(ms);
        assert_eq!(throttle.admit_at(at(0)), Some(0));
        assert_eq!(throttle.admit_at(at(1)), Some(0));
        for ms in 2..100 {
            assert_eq!(throttle.admit_at(at(ms)), None, "held back at {ms} ms");
        }
        assert_eq!(throttle.admit_at(at(10_000)), Some(98), "a new window says what was held back");
        assert_eq!(throttle.admit_at(at(10_001)), Some(0));
        assert_eq!(throttle.admit_at(at(10_002)), None);
    }
}
