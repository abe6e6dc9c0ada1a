//! The subscribe path: a subscription is stored, its consumer registered,
//! and it is attached to its queue's agent (on this node, or through the
//! lease holder); a resume that fails leaves the previous one as it was.
//! Unsubscribing removes and detaches it.

use std::sync::Arc;
use std::time::Duration;

use ractor::rpc::CallResult;

use super::tracked::TrackedConsumer;
use super::{Node, SubscribeError, SubscriptionHandle};
use crate::agent::{AgentMsg, AttachError};
use crate::pubsub::{PubSubError, StartPosition, StreamConsumer, Subscription, SubscriptionId, SubscriptionState};
use crate::stream::StreamId;

impl Node {
    /// Subscribes `consumer` to `stream`. Returns once the queue's agent has
    /// attached it: every event enqueued after this returns is delivered,
    /// in order, at least once.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use async_trait::async_trait;
    /// use tailrace::pubsub::{ConsumerError, Delivery, DeliveryOutcome, StartPosition, StreamConsumer};
    /// use tailrace::{Event, StreamId};
    /// # use tailrace::adapters::memory::{MemoryAdapterFactory, MemoryOptions};
    /// # use tailrace::Node;
    /// # use tailrace::NodeId;
    ///
    /// /// Forwards every payload to a channel.
    /// struct Lines(tokio::sync::mpsc::Sender<String>);
    ///
    /// #[async_trait]
    /// impl StreamConsumer for Lines {
    ///     async fn deliver(&self, delivery: &Delivery) -> Result<DeliveryOutcome, ConsumerError> {
    ///         for (event, _token) in delivery.events() {
    ///             let line = String::from_utf8_lossy(&event.payload).into_owned();
    ///             self.0.send(line).await.map_err(ConsumerError::failed)?;
    ///         }
    ///         Ok(DeliveryOutcome::Continue)
    ///     }
    /// }
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let node = Node::builder(NodeId::new("n1"), Arc::new(MemoryAdapterFactory::new(4, MemoryOptions::default()))).start().await?;
    /// let stream = StreamId::new("logs", "etl.daily/run-7");
    /// let (tx, mut rx) = tokio::sync::mpsc::channel(8);
    /// node.subscribe(&stream, Arc::new(Lines(tx)), StartPosition::Latest).await?;
    /// node.produce(&stream, vec![Event::new("e-1", "one"), Event::new("e-2", "two")]).await?;
    /// assert_eq!(rx.recv().await.as_deref(), Some("one"));
    /// assert_eq!(rx.recv().await.as_deref(), Some("two"));
    /// # node.shutdown().await?;
    /// # Ok(()) }
    /// ```
    pub async fn subscribe(
        &self,
        stream: &StreamId,
        consumer: Arc<dyn StreamConsumer>,
        start: StartPosition,
    ) -> Result<SubscriptionHandle, SubscribeError> {
        self.bind(SubscriptionId::random(), stream, consumer, start).await
    }

    /// Re-binds a consumer to an existing subscription (after a restart);
    /// the newest handshake wins.
    pub async fn resume(
        &self,
        id: SubscriptionId,
        stream: &StreamId,
        consumer: Arc<dyn StreamConsumer>,
        start: StartPosition,
    ) -> Result<SubscriptionHandle, SubscribeError> {
        self.bind(id, stream, consumer, start).await
    }

    async fn bind(
        &self,
        id: SubscriptionId,
        stream: &StreamId,
        consumer: Arc<dyn StreamConsumer>,
        start: StartPosition,
    ) -> Result<SubscriptionHandle, SubscribeError> {
        // A resume that fails must leave the subscription as it was.
        let previous = self.store.subscriptions(stream).await?.into_iter().find(|s| s.id == id);
        let previous_local = (self.tracked.lock().get(&id).cloned(), self.consumers.get(&id.to_string()));
        let tracked = Arc::new(TrackedConsumer::new(consumer));
        let address = self.consumers.register(id.to_string(), tracked.clone())?;
        self.tracked.lock().insert(id, tracked.clone());
        let mut subscription =
            Subscription { id, stream: stream.clone(), consumer: address, start, state: SubscriptionState::Active };
        let outcome = async {
            tracked.remember(subscription.clone());
            self.store.upsert(subscription.clone()).await?;
            let concrete = self.attach(subscription.clone()).await?;
            if concrete != start {
                subscription.start = concrete;
                tracked.remember(subscription.clone());
                self.store.upsert(subscription.clone()).await?;
            }
            Ok::<_, SubscribeError>(concrete)
        }
        .await;
        match (outcome, previous) {
            (Ok(start), _) => Ok(SubscriptionHandle { id, stream: stream.clone(), start }),
            (Err(error), None) => {
                self.forget(id, stream).await;
                Err(error)
            }
            (Err(error), Some(previous)) => {
                tracked.close();
                match previous_local {
                    (Some(old_tracked), Some(old_consumer)) => {
                        self.tracked.lock().insert(id, old_tracked);
                        let _ = self.consumers.register(id.to_string(), old_consumer);
                    }
                    _ => {
                        self.tracked.lock().remove(&id);
                        self.consumers.unregister(&id.to_string());
                    }
                }
                let _ = self.store.upsert(previous).await;
                Err(error)
            }
        }
    }

    pub(super) async fn attach(&self, subscription: Subscription) -> Result<StartPosition, SubscribeError> {
        let queue = self.mapper.queue_for(&subscription.stream);
        let timeout = self.config.pubsub.attach_timeout;
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let remaining = deadline.saturating_duration_since(tokio::time::Instant::now());
            if let Some(agent) = self.agents.get(queue) {
                let sub = subscription.clone();
                let answer = agent.call(|reply| AgentMsg::Attach { subscription: sub, reply }, Some(remaining)).await;
                match answer {
                    Ok(CallResult::Success(Ok(start))) => return Ok(start),
                    Ok(CallResult::Success(Err(AttachError::NotServing(_)))) => {}
                    Ok(CallResult::Success(Err(error))) => return Err(error.into()),
                    Ok(CallResult::Timeout | CallResult::SenderError) | Err(_) => {}
                }
            } else if let Some(attached) = self.attach_on_holder(&subscription, queue).await {
                return attached;
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(SubscribeError::NotAttached { id: subscription.id, stream: subscription.stream, timeout });
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Ends a subscription: removed from the store, detached from its agent
    /// (in-flight work revoked); its consumer gets nothing after this returns.
    pub async fn unsubscribe(&self, handle: &SubscriptionHandle) -> Result<(), SubscribeError> {
        self.store.remove(&handle.stream, handle.id).await?;
        self.forget(handle.id, &handle.stream).await;
        Ok(())
    }

    async fn forget(&self, id: SubscriptionId, stream: &StreamId) {
        if let Some(tracked) = self.tracked.lock().remove(&id) {
            tracked.close();
        }
        self.consumers.unregister(&id.to_string());
        let _ = self.store.remove(stream, id).await;
        if let Some(agent) = self.agents.get(self.mapper.queue_for(stream)) {
            let stream = stream.clone();
            let _ = agent
                .call(|reply| AgentMsg::Detach { stream, id, reply }, Some(self.config.pubsub.attach_timeout))
                .await;
        } else {
            self.detach_on_holder(stream, id).await;
        }
    }

    /// The stored subscriptions of `stream`.
    pub async fn subscriptions(&self, stream: &StreamId) -> Result<Vec<Subscription>, PubSubError> {
        self.store.subscriptions(stream).await
    }
}
