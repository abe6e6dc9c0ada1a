//! This node answering the other nodes of a multi-process cluster (the
//! server's; asking them is `remote.rs`):
//!
//! - answering ([`Node::remote_calls`]): attaches and detaches for the
//!   agents this node runs, calls to the consumers it hosts, and agents
//!   commands. A call from an agent carries its queue and lease token; a
//!   token lower than the newest this node has seen for that queue comes
//!   from a paused or partitioned old owner and is refused;
//! - cleaning up ([`Node::purge_departed`]): the stored subscriptions of a
//!   node that left (its consumers died with it) are removed after a grace
//!   period, and this node's own from a previous life at start.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Weak};
use std::time::Duration;

use async_trait::async_trait;
use parking_lot::Mutex;
use ractor::rpc::CallResult;
use tokio::sync::watch;
use tokio::time::Instant;

use super::Node;
use crate::agent::{AgentMsg, AttachError};
use crate::cluster::wire::{self, AgentsCommand, AgentsReport, AttachRefusal, Refusal, Reply, Request};
use crate::cluster::{Member, Served};
use crate::pubsub::{ConsumerError, Origin, StreamConsumer, Subscription, SubscriptionId};
use crate::stream::{NodeId, QueueId, StreamId};

impl Node {
    /// What this node answers other nodes with (install it in the
    /// transport once the node runs).
    pub(crate) fn remote_calls(self: &Arc<Self>) -> Arc<dyn Served> {
        Arc::new(RemoteCalls { node: Arc::downgrade(self), newest: Mutex::new(HashMap::new()) })
    }

    /// Removes this node's own stored subscriptions (left by a previous
    /// life of this name: their consumers died with it), then, until the
    /// node shuts down, those of every node gone from `members` for
    /// `grace`.
    pub(crate) fn purge_departed(self: &Arc<Self>, members: watch::Receiver<Vec<Member>>, grace: Duration) {
        let node = Arc::downgrade(self);
        let stop = self.tasks.token().clone();
        let me = self.id.clone();
        let store = self.store.clone();
        self.tasks.spawn("subscription purge", async move {
            match store.remove_node(&me).await {
                Ok(0) => {}
                Ok(n) => {
                    tracing::info!(node = %me, purged = n, "removed this node's subscriptions from a previous run")
                }
                Err(error) => tracing::warn!(node = %me, %error, "cannot remove this node's old subscriptions"),
            }
            tokio::select! {
                _ = stop.cancelled() => {}
                _ = purge_loop(node, members, grace) => {}
            }
        });
    }
}

/// Watches membership; a node absent for `grace` has its subscriptions
/// removed (once per departure).
async fn purge_loop(node: Weak<Node>, mut members: watch::Receiver<Vec<Member>>, grace: Duration) {
    let mut seen: HashSet<NodeId> = HashSet::new();
    let mut gone_since: HashMap<NodeId, Instant> = HashMap::new();
    loop {
        let live: HashSet<NodeId> = members.borrow_and_update().iter().map(|m| m.name.clone()).collect();
        let now = Instant::now();
        for name in seen.difference(&live) {
            gone_since.entry(name.clone()).or_insert(now);
        }
        gone_since.retain(|name, _| !live.contains(name));
        seen.extend(live.iter().cloned());
        let due: Vec<NodeId> =
            gone_since.iter().filter(|(_, at)| now >= **at + grace).map(|(n, _)| n.clone()).collect();
        for name in due {
            let Some(node) = node.upgrade() else { return };
            gone_since.remove(&name);
            seen.remove(&name);
            match node.store.remove_node(&name).await {
                Ok(n) => {
                    metrics::counter!(crate::telemetry::PURGED_SUBSCRIPTIONS).increment(n as u64);
                    tracing::info!(departed = %name, purged = n, "removed the subscriptions of a node that left");
                }
                Err(error) => tracing::warn!(departed = %name, %error, "cannot remove a departed node's subscriptions"),
            }
        }
        let next = gone_since.values().map(|at| *at + grace).min();
        tokio::select! {
            changed = members.changed() => if changed.is_err() { return },
            _ = async { match next { Some(at) => tokio::time::sleep_until(at).await, None => std::future::pending().await } } => {}
        }
    }
}

/// Answers other nodes for one node.
struct RemoteCalls {
    node: Weak<Node>,
    /// The newest lease token seen per queue (at most `queues.count`).
    newest: Mutex<HashMap<QueueId, u64>>,
}

impl RemoteCalls {
    /// Refuses a token older than the newest seen for its queue.
    fn check(&self, node: &Node, from: Option<Origin>) -> Result<(), Refusal> {
        let Some(Origin { queue, fence: Some(token) }) = from else { return Ok(()) };
        if queue.0 >= node.mapper.queue_count() {
            return Err(Refusal::Unreadable(format!("queue {queue} does not exist here")));
        }
        let mut newest = self.newest.lock();
        let seen = newest.entry(queue).or_insert(token);
        if token < *seen {
            metrics::counter!(crate::telemetry::FENCED_CALLS).increment(1);
            return Err(Refusal::Fenced { queue: queue.0, token, newest: *seen });
        }
        *seen = token;
        Ok(())
    }

    fn consumer(node: &Node, name: &str) -> Result<Arc<dyn StreamConsumer>, ConsumerError> {
        node.consumers
            .get(name)
            .ok_or_else(|| ConsumerError::Unavailable(format!("no consumer `{name}` on node {}", node.id)))
    }

    async fn attach(node: &Node, subscription: Subscription) -> Reply {
        let queue = node.mapper.queue_for(&subscription.stream);
        let Some(agent) = node.agents.get(queue) else {
            let message = format!("node {} runs no agent for queue {queue}", node.id);
            return Reply::Attached { result: Err(AttachRefusal { retry: true, message, oldest: None }) };
        };
        let timeout = node.config.pubsub.attach_timeout;
        let result = match agent.call(|reply| AgentMsg::Attach { subscription, reply }, Some(timeout)).await {
            Ok(CallResult::Success(Ok(start))) => Ok(start),
            // The consumer's own node asks: if the agent found it
            // unavailable, this node's view of it is behind (it was away
            // and is back). Both are worth another try.
            Ok(CallResult::Success(Err(error))) => {
                let retry = matches!(error, AttachError::NotServing(_) | AttachError::ConsumerUnavailable { .. });
                let oldest = match &error {
                    AttachError::CannotStart { oldest, .. } => *oldest,
                    _ => None,
                };
                Err(AttachRefusal { retry, message: error.to_string(), oldest })
            }
            _ => {
                let message = format!("the agent of queue {queue} did not answer");
                Err(AttachRefusal { retry: true, message, oldest: None })
            }
        };
        Reply::Attached { result }
    }

    async fn detach(node: &Node, stream: StreamId, id: SubscriptionId) -> Reply {
        if let Some(agent) = node.agents.get(node.mapper.queue_for(&stream)) {
            let timeout = node.config.pubsub.attach_timeout;
            let _ = agent.call(|reply| AgentMsg::Detach { stream, id, reply }, Some(timeout)).await;
        }
        Reply::Detached
    }

    async fn agents(node: &Node, command: AgentsCommand) -> Reply {
        let done = match command {
            AgentsCommand::Start => node.start_agents().await,
            AgentsCommand::Stop => node.stop_agents().await,
            AgentsCommand::State => Ok(()),
        };
        let report = async {
            done?;
            let state = node.agents_state().await?;
            let running = node.running_agents().await?;
            let state =
                serde_json::to_value(state).ok().and_then(|v| v.as_str().map(str::to_string)).unwrap_or_default();
            Ok::<_, super::NodeError>(AgentsReport { state, running })
        };
        Reply::Agents { result: report.await.map_err(|e| e.to_string()) }
    }
}

#[async_trait]
impl Served for RemoteCalls {
    async fn serve(&self, request: Request) -> Reply {
        let Some(node) = self.node.upgrade() else {
            return Reply::Refused { refusal: Refusal::NotReady };
        };
        match request {
            Request::Attach { subscription } => Self::attach(&node, subscription).await,
            Request::Detach { stream, id } => Self::detach(&node, stream, id).await,
            Request::Handshake { from, consumer, id, stream } => {
                if let Err(refusal) = self.check(&node, from) {
                    return Reply::Refused { refusal };
                }
                let result = match Self::consumer(&node, &consumer) {
                    Ok(consumer) => consumer.handshake(&wire::info(id, stream)).await,
                    Err(error) => Err(error),
                };
                Reply::Handshaken { result }
            }
            Request::Deliver { from, consumer, delivery } => {
                if let Err(refusal) = self.check(&node, from) {
                    return Reply::Refused { refusal };
                }
                let result = match (Self::consumer(&node, &consumer), delivery.into_delivery()) {
                    (Ok(consumer), Ok(delivery)) => consumer.deliver(&delivery).await,
                    (Err(error), _) => Err(error),
                    (_, Err(error)) => Err(ConsumerError::Failed(format!("an unreadable delivery: {error}"))),
                };
                Reply::Delivered { result }
            }
            Request::OnError { from, consumer, id, stream, error } => {
                if self.check(&node, from).is_ok()
                    && let Ok(consumer) = Self::consumer(&node, &consumer)
                {
                    consumer.on_error(&wire::info(id, stream), &error).await;
                }
                Reply::Told
            }
            Request::Agents { command } => Self::agents(&node, command).await,
        }
    }
}
