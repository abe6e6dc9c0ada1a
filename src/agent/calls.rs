//! A call to a consumer retried within limits: the attempt timeout, the
//! backoff between attempts and the longest time to keep trying. Handshakes
//! and deliveries both go through [`call_with_retries`]; what each does with
//! the [`Attempted`] result is its own rule.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::Poll;
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::{CancellationToken, WaitForCancellationFuture};

use super::settings::AgentOptions;
use crate::pubsub::ConsumerError;
use crate::retry::Backoff;

/// The wait between calls to a consumer whose node is unreachable.
const RELINK_BACKOFF: Backoff =
    Backoff::new(Duration::from_millis(100), Duration::from_secs(2), Duration::from_millis(100));

/// The end of a call retried within limits.
pub(crate) enum Attempted<T> {
    /// It succeeded.
    Done(T),
    /// The consumer is gone; not retried.
    Unavailable(String),
    /// The consumer's node refused this agent's lease token.
    Fenced(String),
    /// Retries ran out; the last error.
    Failed { error: String, attempts: u32 },
    /// The subscription was removed or re-handshaken meanwhile.
    Revoked,
}

/// Revokes a subscription's handshake or deliveries in flight. Every
/// delivery asks whether it was revoked before it starts; the flag answers
/// without the lock a token's `is_cancelled` takes, and the token is what a
/// call that waits watches.
#[derive(Default)]
pub(crate) struct Revoke {
    revoked: AtomicBool,
    token: CancellationToken,
}

impl Revoke {
    pub(crate) fn cancel(&self) {
        self.revoked.store(true, Ordering::Release);
        self.token.cancel();
    }

    pub(crate) fn is_cancelled(&self) -> bool {
        self.revoked.load(Ordering::Acquire)
    }

    fn cancelled(&self) -> WaitForCancellationFuture<'_> {
        self.token.cancelled()
    }
}

/// Limits of one retried call.
#[derive(Clone)]
pub(crate) struct RetryLimits {
    max_time: Duration,
    attempt_timeout: Duration,
    backoff: Backoff,
}

impl From<&AgentOptions> for RetryLimits {
    fn from(options: &AgentOptions) -> Self {
        Self {
            max_time: options.max_delivery_time,
            attempt_timeout: options.delivery_attempt_timeout,
            backoff: options.delivery_backoff,
        }
    }
}

/// Calls `call` until it succeeds, the consumer is unavailable, the time
/// runs out (no new attempt starts past `max_time`), the agent is stopping
/// (`stop`: the current attempt finishes, no retry) or the work is revoked.
///
/// Most consumers answer on the first poll: then nothing of the retry
/// machinery (timers, the revoke watch) is built, and the future stays a
/// few words (it is boxed for every delivery); the rest is boxed only when
/// needed.
pub(crate) async fn call_with_retries<T, F, Fut>(
    mut call: F,
    limits: &RetryLimits,
    stop: &CancellationToken,
    revoke: &Revoke,
) -> Attempted<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, ConsumerError>> + Unpin,
{
    if revoke.is_cancelled() {
        return Attempted::Revoked;
    }
    let mut first = call();
    let first = match std::future::poll_fn(|cx| Poll::Ready(Pin::new(&mut first).poll(cx))).await {
        Poll::Ready(Ok(value)) => return Attempted::Done(value),
        Poll::Ready(Err(error)) => Err(error),
        Poll::Pending => Ok(first),
    };
    Box::pin(retried(call, first, limits, stop, revoke)).await
}

/// The rest of [`call_with_retries`], from a first attempt that waits
/// (`Ok`) or failed (`Err`).
async fn retried<T, F, Fut>(
    mut call: F,
    first: Result<Fut, ConsumerError>,
    limits: &RetryLimits,
    stop: &CancellationToken,
    revoke: &Revoke,
) -> Attempted<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, ConsumerError>> + Unpin,
{
    let mut started = Some(Instant::now());
    let mut attempts = 1;
    let mut relinks = 0;
    let mut attempt = Some(first);
    loop {
        let attempt = match attempt.take() {
            Some(first) => first,
            None => {
                attempts += 1;
                if revoke.is_cancelled() {
                    return Attempted::Revoked;
                }
                let mut call = call();
                match std::future::poll_fn(|cx| Poll::Ready(Pin::new(&mut call).poll(cx))).await {
                    Poll::Ready(Ok(value)) => return Attempted::Done(value),
                    Poll::Ready(Err(error)) => Err(error),
                    Poll::Pending => Ok(call),
                }
            }
        };
        // Only a call that waits pays for a timer and for watching the
        // revoke signal.
        let outcome = match attempt {
            Err(error) => Ok(Err(error)),
            Ok(call) => {
                started.get_or_insert_with(Instant::now);
                tokio::select! {
                    _ = revoke.cancelled() => return Attempted::Revoked,
                    outcome = tokio::time::timeout(limits.attempt_timeout, call) => outcome,
                }
            }
        };
        let error = match outcome {
            Ok(Ok(value)) => return Attempted::Done(value),
            Ok(Err(ConsumerError::Unavailable(reason))) => return Attempted::Unavailable(reason),
            Ok(Err(ConsumerError::Fenced(reason))) => return Attempted::Fenced(reason),
            Ok(Err(ConsumerError::Unreachable(reason))) => {
                // The consumer's node is live but its link is down: retried
                // with a short backoff and no time limit (the budget starts
                // again once it answers); stopping or revoking still ends it.
                relinks += 1;
                started = None;
                tracing::debug!(%reason, attempts = relinks, "consumer unreachable; retrying");
                let wait = RELINK_BACKOFF.delay(relinks - 1);
                tokio::select! {
                    _ = tokio::time::sleep(wait) => continue,
                    _ = stop.cancelled() => return Attempted::Failed { error: reason, attempts },
                    _ = revoke.cancelled() => return Attempted::Revoked,
                }
            }
            Ok(Err(ConsumerError::Failed(error))) => error,
            Err(_) => format!("no answer within {:?}", limits.attempt_timeout),
        };
        relinks = 0;
        let wait = limits.backoff.delay(attempts - 1);
        let started = *started.get_or_insert_with(Instant::now);
        if stop.is_cancelled() || started.elapsed() + wait > limits.max_time {
            return Attempted::Failed { error, attempts };
        }
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = stop.cancelled() => return Attempted::Failed { error, attempts },
            _ = revoke.cancelled() => return Attempted::Revoked,
        }
    }
}
