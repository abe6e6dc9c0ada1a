//! A consumer on another node, as the delivering agent sees it: every call
//! crosses the transport to the consumer's node with the agent's queue and
//! lease token. A link that is down (while the node is a live member)
//! answers `Unreachable`, which the agent retries without a time limit and
//! never dead-letters; a node that left answers `Unavailable`; a node that
//! refused the agent's lease token answers `Fenced` (the agent stops). A delivery
//! larger than `cluster.max_message_bytes` is sent as several, in order.

use std::sync::Arc;

use async_trait::async_trait;

use super::{ClusterTransport, TransportError};
use crate::cluster::wire::{Refusal, Reply, Request, WireDelivery};
use crate::pubsub::{
    ConsumerAddress, ConsumerError, Delivery, DeliveryOutcome, Origin, StartPosition, StreamConsumer, SubscriptionInfo,
};

pub(super) struct Proxy {
    transport: Arc<dyn ClusterTransport>,
    address: ConsumerAddress,
    origin: Option<Origin>,
}

impl Proxy {
    pub(super) fn new(transport: Arc<dyn ClusterTransport>, address: ConsumerAddress, origin: Option<Origin>) -> Self {
        Self { transport, address, origin }
    }

    async fn call(&self, request: Request) -> Result<Reply, ConsumerError> {
        self.transport.call(&self.address.node, request).await.map_err(consumer_error)
    }

    fn unexpected(&self, reply: &Reply) -> ConsumerError {
        ConsumerError::Failed(format!("node {} answered with an unexpected reply: {reply:?}", self.address.node))
    }

    /// Sends `delivery`, split in halves while a part is too large.
    async fn deliver_parts(&self, delivery: &Delivery) -> Result<DeliveryOutcome, ConsumerError> {
        let request = Request::Deliver {
            from: self.origin,
            consumer: self.address.name.clone(),
            delivery: WireDelivery::from_delivery(delivery),
        };
        match self.transport.call(&self.address.node, request).await {
            Err(TransportError::TooLarge { .. }) if delivery.batches.len() > 1 => {
                let half = delivery.batches.len() / 2;
                let first = Delivery { batches: delivery.batches[..half].to_vec(), ..delivery.clone() };
                let outcome = Box::pin(self.deliver_parts(&first)).await?;
                if let DeliveryOutcome::SeekAfter(_) = outcome {
                    return Ok(outcome);
                }
                // A gap lies before the first part only.
                let second = Delivery { batches: delivery.batches[half..].to_vec(), gap: None, ..delivery.clone() };
                Box::pin(self.deliver_parts(&second)).await
            }
            answer => match answer.map_err(consumer_error)? {
                Reply::Delivered { result } => result,
                reply => Err(self.unexpected(&reply)),
            },
        }
    }
}

/// What the agent makes of a failed call: a node that left is gone, a
/// stale token ends this agent's calls, a link down is retried.
fn consumer_error(error: TransportError) -> ConsumerError {
    match error {
        TransportError::NotMember(_) => ConsumerError::Unavailable(error.to_string()),
        TransportError::Refused { refusal: Refusal::Fenced { .. }, .. } => {
            metrics::counter!(crate::telemetry::FENCED_DELIVERIES).increment(1);
            tracing::warn!(%error, "a consumer's node refused this agent's stale lease token");
            ConsumerError::Fenced(error.to_string())
        }
        error if error.is_transient() => ConsumerError::Unreachable(error.to_string()),
        error => ConsumerError::Failed(error.to_string()),
    }
}

#[async_trait]
impl StreamConsumer for Proxy {
    async fn handshake(&self, subscription: &SubscriptionInfo) -> Result<Option<StartPosition>, ConsumerError> {
        let request = Request::Handshake {
            from: self.origin,
            consumer: self.address.name.clone(),
            id: subscription.id,
            stream: subscription.stream.clone(),
        };
        match self.call(request).await? {
            Reply::Handshaken { result } => result,
            reply => Err(self.unexpected(&reply)),
        }
    }

    async fn deliver(&self, delivery: &Delivery) -> Result<DeliveryOutcome, ConsumerError> {
        self.deliver_parts(delivery).await
    }

    async fn on_error(&self, subscription: &SubscriptionInfo, error: &str) {
        let request = Request::OnError {
            from: self.origin,
            consumer: self.address.name.clone(),
            id: subscription.id,
            stream: subscription.stream.clone(),
            error: error.to_string(),
        };
        if let Err(error) = self.call(request).await {
            tracing::debug!(peer = %self.address.node, %error, "could not tell a remote consumer about an error");
        }
    }
}
