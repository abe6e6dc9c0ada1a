//! Pub-sub: who receives which stream.
//!
//! - A [`Subscription`] is `(stream, consumer, start)` with an id. Explicit
//!   subscriptions are asked for (`Node::subscribe`) and kept in a
//!   [`PubSubStore`] (in memory here, Redis for clusters); implicit ones bind a
//!   whole namespace to a [`ConsumerFactory`] ([`ImplicitSubscriptions`]).
//! - A [`StreamConsumer`] is what the agent delivers to, wherever it runs.
//!   The agent first *handshakes* (asks the consumer where to continue; the
//!   newest handshake wins), then delivers batches in order, one at a time.
//! - A node's consumer directory resolves a consumer's address to something
//!   callable: a local consumer, or (a [`ConsumerResolver`], the cluster
//!   transport) a proxy to one on another node.

mod consumer;
mod directory;
mod store;

pub use consumer::{ConsumerError, ConsumerFactory, Delivery, DeliveryOutcome, StreamConsumer, SubscriptionInfo};
pub(crate) use directory::{ConsumerDirectory, LocalConsumers};
pub use directory::{ConsumerResolver, Origin};
pub use store::{MemoryPubSubStore, PubSubError, PubSubStore};

use std::fmt;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::cache::CursorStart;
use crate::stream::{NodeId, SequenceToken, StreamId};

/// Pub-sub settings.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PubSubOptions {
    /// Most subscriptions the in-memory store holds.
    pub max_subscriptions: usize,
    /// Most subscriptions one stream holds in a shared store (Redis).
    pub max_subscriptions_per_stream: usize,
    /// Most consumers one node hosts.
    pub max_local_consumers: usize,
    /// How long `subscribe` waits for the queue's agent to attach it.
    #[serde(with = "humantime_serde")]
    pub attach_timeout: std::time::Duration,
}

impl Default for PubSubOptions {
    fn default() -> Self {
        Self {
            max_subscriptions: 100_000,
            max_subscriptions_per_stream: 10_000,
            max_local_consumers: 100_000,
            attach_timeout: std::time::Duration::from_secs(10),
        }
    }
}

/// The bit that marks implicit subscription ids.
const IMPLICIT_BIT: u128 = 1 << 127;

/// Identifies a subscription: random for explicit ones, derived from the
/// binding and the stream for implicit ones.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SubscriptionId(pub u128);

impl SubscriptionId {
    /// A fresh random id (top bit clear: that bit marks implicit ids).
    pub fn random() -> Self {
        Self(rand::random::<u128>() & !IMPLICIT_BIT)
    }

    /// The implicit subscription of `binding` to `stream` (stable everywhere).
    pub fn implicit(binding: &str, stream: &StreamId) -> Self {
        let mut hasher = xxhash_rust::xxh3::Xxh3::new();
        hasher.update(binding.as_bytes());
        hasher.update(&[0xFF]);
        hasher.update(stream.namespace().as_bytes());
        hasher.update(&[0xFF]);
        hasher.update(stream.key().as_bytes());
        // The top bit marks implicit ids (Orleans does the same).
        Self(hasher.digest128() | IMPLICIT_BIT)
    }

    /// Whether this id belongs to an implicit subscription.
    pub fn is_implicit(self) -> bool {
        self.0 >> 127 == 1
    }
}

impl fmt::Display for SubscriptionId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:032x}", self.0)
    }
}

impl fmt::Debug for SubscriptionId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Sub({self})")
    }
}

impl Serialize for SubscriptionId {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for SubscriptionId {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = std::borrow::Cow::<str>::deserialize(deserializer)?;
        u128::from_str_radix(&text, 16)
            .map(SubscriptionId)
            .map_err(|_| serde::de::Error::custom(format!("`{text}` is not a subscription id (32 hex digits)")))
    }
}

/// Where a subscription starts when its consumer does not say otherwise.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "kind", content = "token")]
pub enum StartPosition {
    /// Only events read after the subscription is attached. Every event
    /// enqueued after `subscribe` returns is delivered.
    Latest,
    /// The oldest events of the stream the agent still caches.
    EarliestAvailable,
    /// From this token, inclusive (a rewind on rewindable adapters).
    At(SequenceToken),
    /// Just after this token (resuming after the last processed event).
    After(SequenceToken),
}

impl StartPosition {
    pub(crate) fn cursor_start(self) -> CursorStart {
        match self {
            StartPosition::Latest => CursorStart::Latest,
            StartPosition::EarliestAvailable => CursorStart::Earliest,
            StartPosition::At(t) => CursorStart::At(t),
            StartPosition::After(t) => CursorStart::After(t),
        }
    }
}

/// Where the agent reaches a subscription's consumer.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ConsumerAddress {
    /// The node the consumer lives on.
    pub node: NodeId,
    /// Its name in that node's consumer directory.
    pub name: String,
}

/// Whether a subscription still receives events.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "state", content = "reason")]
pub enum SubscriptionState {
    /// Receiving.
    Active,
    /// Removed from delivery by the failure handler, with the cause.
    Faulted(String),
}

/// An explicit subscription as stored.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Subscription {
    /// Its id.
    pub id: SubscriptionId,
    /// The stream it reads.
    pub stream: StreamId,
    /// Where its consumer is.
    pub consumer: ConsumerAddress,
    /// Where it starts when its consumer does not say.
    pub start: StartPosition,
    /// Active or faulted.
    pub state: SubscriptionState,
}

/// Namespaces bound to consumer factories: every stream of such a namespace
/// has an implicit subscription on every node (the same table everywhere).
#[derive(Clone, Default)]
pub struct ImplicitSubscriptions {
    bindings: Vec<(String, Arc<dyn ConsumerFactory>)>,
}

impl ImplicitSubscriptions {
    /// No bindings.
    pub fn new() -> Self {
        Self::default()
    }

    /// Binds `namespace` to `factory` (several factories may share one).
    pub fn bind(mut self, namespace: impl Into<String>, factory: Arc<dyn ConsumerFactory>) -> Self {
        self.bindings.push((namespace.into(), factory));
        self
    }

    /// The factories bound to `stream`'s namespace.
    pub fn for_stream<'a>(&'a self, stream: &'a StreamId) -> impl Iterator<Item = &'a Arc<dyn ConsumerFactory>> + 'a {
        self.bindings.iter().filter(move |(ns, _)| ns == stream.namespace()).map(|(_, f)| f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn implicit_ids_are_stable_and_marked() {
        let s = StreamId::new("logs", "a/1");
        let id = SubscriptionId::implicit("archiver", &s);
        assert_eq!(id, SubscriptionId::implicit("archiver", &StreamId::new("logs", "a/1")));
        assert!(id.is_implicit());
        assert_ne!(id, SubscriptionId::implicit("archiver", &StreamId::new("logs", "a/2")));
        assert!(!SubscriptionId(7).is_implicit());
        assert!((0..1_000).all(|_| !SubscriptionId::random().is_implicit()), "random ids are explicit");
    }

    #[test]
    fn subscriptions_round_trip_as_json() {
        let sub = Subscription {
            id: SubscriptionId(0xabc),
            stream: StreamId::new("logs", "p/r"),
            consumer: ConsumerAddress { node: NodeId::new("n1"), name: "viewer".into() },
            start: StartPosition::After(SequenceToken::new(3, 4)),
            state: SubscriptionState::Active,
        };
        let json = serde_json::to_string(&sub).unwrap();
        assert!(json.contains(r#""id":"00000000000000000000000000000abc""#), "{json}");
        assert!(json.contains(r#""start":{"kind":"after","token":"3-4"}"#), "{json}");
        assert_eq!(serde_json::from_str::<Subscription>(&json).unwrap(), sub);
        let bad = json.replace("00000000000000000000000000000abc", "zz");
        assert!(serde_json::from_str::<Subscription>(&bad).unwrap_err().to_string().contains("not a subscription id"));
    }
}
