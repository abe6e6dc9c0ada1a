//! The store lookup of a stream's subscriptions when the stream is first
//! seen: retried with the delivery backoff until it answers or the agent
//! stops, each attempt bounded. Runs on the work lane; the answer
//! ([`Registered`]) goes to the stream table.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use backon::Retryable;
use tokio_util::sync::CancellationToken;

use super::settings::AgentOptions;
use crate::pubsub::{PubSubError, PubSubStore, Subscription};
use crate::retry::Backoff;
use crate::stream::StreamId;

/// A store lookup's answer.
pub(crate) struct Registered {
    pub stream: StreamId,
    pub result: Result<Vec<Subscription>, PubSubError>,
}

/// The store lookup of a stream's subscriptions (after `after`), retried,
/// as work for the lane, and the answer if it panics.
pub(crate) fn look_up(
    store: Arc<dyn PubSubStore>,
    stream: StreamId,
    after: Duration,
    options: &AgentOptions,
    stop: Arc<CancellationToken>,
) -> (impl Future<Output = Registered> + Send + 'static, impl FnOnce(String) -> Registered + Send + 'static) {
    let (backoff, attempt_timeout) = (options.delivery_backoff, options.delivery_attempt_timeout);
    let on_panic = stream.clone();
    let work = async move {
        tokio::time::sleep(after).await;
        let result = lookup_with_retries(store.as_ref(), &stream, backoff, attempt_timeout, &stop).await;
        Registered { stream, result }
    };
    let panicked = move |panic: String| Registered {
        stream: on_panic,
        result: Err(PubSubError::Store(format!("lookup panicked: {panic}"))),
    };
    (work, panicked)
}

async fn lookup_with_retries(
    store: &dyn PubSubStore,
    stream: &StreamId,
    backoff: Backoff,
    attempt_timeout: Duration,
    stop: &CancellationToken,
) -> Result<Vec<Subscription>, PubSubError> {
    let attempt = || async {
        match tokio::time::timeout(attempt_timeout, store.subscriptions(stream)).await {
            Ok(answer) => answer,
            Err(_) => Err(PubSubError::Store(format!("no answer within {attempt_timeout:?}"))),
        }
    };
    // Until it answers, or the agent stops (the last error is the answer).
    let lookup = attempt
        .retry(backoff.schedule(u32::MAX))
        .when(|_| !stop.is_cancelled())
        .notify(|error, wait| tracing::warn!(%stream, %error, ?wait, "pub-sub lookup failed; retrying"));
    tokio::select! {
        answer = lookup => answer,
        _ = stop.cancelled() => Err(PubSubError::Store("the agent stopped before the lookup answered".into())),
    }
}
