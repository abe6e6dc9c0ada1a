//! What happens when a consumer keeps failing: the failure handler decides
//! (skip the batch or fault the subscription), and a skipped batch goes to a
//! dead-letter sink together with the original error.

use std::collections::VecDeque;

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

/// Logs each dead letter (the default sink).
#[derive(Default)]
pub struct LogDeadLetters;

#[async_trait]
impl DeadLetterSink for LogDeadLetters {
    async fn dead_letter(&self, letter: DeadLetter) -> Result<(), String> {
        tracing::error!(
            subscription = ?letter.subscription,
            origin = ?letter.origin,
            stream = %letter.stream,
            token = %letter.token,
            events = letter.events.len(),
            attempts = letter.attempts,
            error = %letter.error,
            "dead letter: delivery given up"
        );
        Ok(())
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
