//! This node asking the other nodes of a multi-process cluster: a
//! subscription whose queue is pulled elsewhere is attached (and detached)
//! through the transport, on the queue's lease holder. Answering them is
//! `serving.rs`.

use super::{Node, SubscribeError};
use crate::cluster::wire::{AttachRefusal, Reply, Request};
use crate::pubsub::{StartPosition, Subscription, SubscriptionId};
use crate::stream::{QueueId, StreamId};

impl Node {
    /// One attach on the lease holder of `subscription`'s queue, if another
    /// node holds it: `None` to try again (no holder yet, the queue moving,
    /// the link down).
    pub(super) async fn attach_on_holder(
        &self,
        subscription: &Subscription,
        queue: QueueId,
    ) -> Option<Result<StartPosition, SubscribeError>> {
        let transport = self.transport.as_ref()?;
        let holder = self.leases.holder(queue).await.ok()??;
        if holder.holder == self.id {
            return None;
        }
        let request = Request::Attach { subscription: subscription.clone() };
        match transport.call(&holder.holder, request).await {
            Ok(Reply::Attached { result: Ok(start) }) => Some(Ok(start)),
            Ok(Reply::Attached { result: Err(AttachRefusal { retry: false, message, oldest }) }) => {
                Some(Err(SubscribeError::Remote { node: holder.holder, message, oldest }))
            }
            Ok(_) => None,
            Err(error) => {
                tracing::debug!(node = %holder.holder, %error, "attach on the lease holder failed; retrying");
                None
            }
        }
    }

    /// Detaches `id` on the lease holder of its queue (best effort: a holder
    /// that does not answer finds the subscription gone from the store at
    /// its next handshake).
    pub(super) async fn detach_on_holder(&self, stream: &StreamId, id: SubscriptionId) {
        let Some(transport) = self.transport.as_ref() else { return };
        let queue = self.mapper.queue_for(stream);
        let Ok(Some(holder)) = self.leases.holder(queue).await else { return };
        if holder.holder == self.id {
            return;
        }
        let request = Request::Detach { stream: stream.clone(), id };
        if let Err(error) = transport.call(&holder.holder, request).await {
            tracing::debug!(node = %holder.holder, %error, "detach on the lease holder failed");
        }
    }
}
