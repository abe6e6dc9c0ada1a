//! What nodes say to each other over the cluster transport: versioned
//! requests and replies, as JSON envelopes `{"v":1,"m":…}`. Event payloads
//! travel as in a Redis stream entry: UTF-8 text as `p`, anything else as
//! base64 in `b64`, so every payload crosses byte for byte.

use std::sync::Arc;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use bytes::Bytes;
use serde::{Deserialize, Serialize};

use crate::pubsub::{
    ConsumerError, Delivery, DeliveryOutcome, Origin, StartPosition, Subscription, SubscriptionId, SubscriptionInfo,
};
use crate::queue::Fence;
use crate::stream::{BatchContainer, Event, EventId, SequenceToken, StreamId};

/// The version of the messages this build speaks.
pub const WIRE_VERSION: u32 = 1;

/// A call from one node to another.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Request {
    /// Attach a stored subscription to the queue's agent (on its lease
    /// holder).
    Attach {
        /// The subscription, as stored.
        subscription: Subscription,
    },
    /// Detach a subscription from the queue's agent.
    Detach {
        /// Its stream.
        stream: StreamId,
        /// The subscription.
        id: SubscriptionId,
    },
    /// An agent's handshake with a consumer hosted by the callee.
    Handshake {
        /// The calling agent's queue and lease token.
        from: Option<Origin>,
        /// The consumer's name in the callee's directory.
        consumer: String,
        /// The subscription.
        id: SubscriptionId,
        /// Its stream.
        stream: StreamId,
    },
    /// An agent's delivery to a consumer hosted by the callee.
    Deliver {
        /// The calling agent's queue and lease token.
        from: Option<Origin>,
        /// The consumer's name in the callee's directory.
        consumer: String,
        /// The delivery.
        delivery: WireDelivery,
    },
    /// An agent tells a consumer it gave up on a batch or faulted it.
    OnError {
        /// The calling agent's queue and lease token.
        from: Option<Origin>,
        /// The consumer's name in the callee's directory.
        consumer: String,
        /// The subscription.
        id: SubscriptionId,
        /// Its stream.
        stream: StreamId,
        /// The cause.
        error: String,
    },
    /// Start, stop or report the callee's agents (the admin API of another
    /// node).
    Agents {
        /// What to do.
        command: AgentsCommand,
    },
}

/// What `Request::Agents` asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AgentsCommand {
    /// Start the agents.
    Start,
    /// Stop the agents (ordered handoff of every queue).
    Stop,
    /// Report only.
    State,
}

/// A node's agents, as `Request::Agents` reports them.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AgentsReport {
    /// `running` or `stopped`.
    pub state: String,
    /// Agents running now.
    pub running: usize,
}

/// The answer to a [`Request`].
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(tag = "reply", rename_all = "snake_case")]
pub enum Reply {
    /// `Attach`: where the subscription starts, or why not.
    Attached {
        /// The start, or the refusal.
        result: Result<StartPosition, AttachRefusal>,
    },
    /// `Detach` done.
    Detached,
    /// `Handshake`: the consumer's answer.
    Handshaken {
        /// Where to continue, or the consumer's error.
        result: Result<Option<StartPosition>, ConsumerError>,
    },
    /// `Deliver`: the consumer's answer.
    Delivered {
        /// What next, or the consumer's error.
        result: Result<DeliveryOutcome, ConsumerError>,
    },
    /// `OnError` told.
    Told,
    /// `Agents`: the state after the command.
    Agents {
        /// The report, or why the command failed.
        result: Result<AgentsReport, String>,
    },
    /// The callee refused the call: a stale lease token, not ready yet, too
    /// busy, or a version it does not speak.
    Refused {
        /// Why.
        refusal: Refusal,
    },
}

/// Why an attach was refused on the lease holder.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AttachRefusal {
    /// The queue is moving or has no agent there: ask again.
    pub retry: bool,
    /// What the agent said.
    pub message: String,
    /// The oldest position the queue still holds, when the start asked
    /// for is older than its retention (absent from older nodes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub oldest: Option<crate::stream::SequenceToken>,
}

/// Why a node refused a call.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[serde(tag = "kind", content = "detail", rename_all = "snake_case")]
pub enum Refusal {
    /// The caller's lease token is lower than one already seen for its
    /// queue: the caller is a paused or partitioned old owner.
    #[error("stale lease token {token} for queue {queue} (newest seen: {newest})")]
    Fenced {
        /// The queue.
        queue: u32,
        /// The caller's token.
        token: u64,
        /// The newest token the callee has seen.
        newest: u64,
    },
    /// The callee is starting and does not serve calls yet.
    #[error("the node is starting")]
    NotReady,
    /// The callee has its limit of calls in flight.
    #[error("the node has its limit of {0} calls in flight")]
    Busy(usize),
    /// The message could not be read (another version, or damaged).
    #[error("unreadable message: {0}")]
    Unreadable(String),
}

/// A delivery on the wire.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct WireDelivery {
    /// The subscription.
    pub subscription: SubscriptionId,
    /// The stream.
    pub stream: StreamId,
    /// The delivering agent's lease token.
    pub fence: Option<u64>,
    /// Containers in order.
    pub batches: Vec<WireBatch>,
    /// Why events may be missing before this delivery ([`Delivery::gap`]);
    /// absent from the wire when none (older peers neither send nor read it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gap: Option<String>,
}

/// One container on the wire.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct WireBatch {
    /// Its token.
    pub token: SequenceToken,
    /// Its events.
    pub events: Vec<WireEvent>,
}

/// One event on the wire: exactly one of `p` (UTF-8) and `b64`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct WireEvent {
    id: EventId,
    ts: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    p: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    b64: Option<String>,
}

impl WireDelivery {
    /// `delivery` as sent.
    pub fn from_delivery(delivery: &Delivery) -> Self {
        let batches = delivery
            .batches
            .iter()
            .map(|batch| WireBatch { token: batch.token, events: batch.events.iter().map(WireEvent::from).collect() })
            .collect();
        Self {
            subscription: delivery.subscription,
            stream: delivery.stream.clone(),
            fence: delivery.fence.token(),
            batches,
            gap: delivery.gap.clone(),
        }
    }

    /// The delivery as received.
    pub fn into_delivery(self) -> Result<Delivery, String> {
        let stream = self.stream;
        let mut batches = Vec::with_capacity(self.batches.len());
        for batch in self.batches {
            let events = batch.events.into_iter().map(Event::try_from).collect::<Result<Vec<_>, _>>()?;
            batches.push(Arc::new(BatchContainer { stream: stream.clone(), token: batch.token, events }));
        }
        let delivery = Delivery::new(self.subscription, stream, batches).fenced(Fence::from(self.fence));
        Ok(match self.gap {
            Some(reason) => delivery.after_gap(reason),
            None => delivery,
        })
    }
}

impl From<&Event> for WireEvent {
    fn from(event: &Event) -> Self {
        let (p, b64) = match std::str::from_utf8(&event.payload) {
            Ok(text) => (Some(text.to_string()), None),
            Err(_) => (None, Some(STANDARD.encode(&event.payload))),
        };
        Self { id: event.id.clone(), ts: event.timestamp_ms, p, b64 }
    }
}

impl TryFrom<WireEvent> for Event {
    type Error = String;

    fn try_from(event: WireEvent) -> Result<Self, String> {
        let payload = match (event.p, event.b64) {
            (Some(text), None) => Bytes::from(text),
            (None, Some(b64)) => {
                STANDARD.decode(b64.as_bytes()).map_err(|e| format!("event {}: {e}", event.id))?.into()
            }
            _ => return Err(format!("event {}: needs exactly one of `p` and `b64`", event.id)),
        };
        Ok(Event { id: event.id, timestamp_ms: event.ts, payload })
    }
}

/// The subscription a handshake or an error report is about.
pub fn info(id: SubscriptionId, stream: StreamId) -> SubscriptionInfo {
    SubscriptionInfo { id, stream }
}

#[derive(Serialize)]
struct EnvelopeOut<'a, T> {
    v: u32,
    m: &'a T,
}

#[derive(Deserialize)]
struct EnvelopeIn<T> {
    m: T,
}

/// `message` in an envelope of this version.
pub fn encode<T: Serialize>(message: &T) -> Result<Vec<u8>, String> {
    encode_after(&[], message)
}

/// `message` in an envelope of this version, written after `prefix` (a
/// lane's call id) in the same buffer.
pub(crate) fn encode_after<T: Serialize>(prefix: &[u8], message: &T) -> Result<Vec<u8>, String> {
    let mut bytes = Vec::with_capacity(prefix.len() + 128);
    bytes.extend_from_slice(prefix);
    serde_json::to_writer(&mut bytes, &EnvelopeOut { v: WIRE_VERSION, m: message }).map_err(|e| e.to_string())?;
    Ok(bytes)
}

/// The message in `bytes`, if its version is this build's.
pub fn decode<T: for<'de> Deserialize<'de>>(bytes: &[u8]) -> Result<T, Refusal> {
    #[derive(Deserialize)]
    struct Version {
        v: u32,
    }
    let version: Version = serde_json::from_slice(bytes).map_err(|e| Refusal::Unreadable(e.to_string()))?;
    if version.v != WIRE_VERSION {
        return Err(Refusal::Unreadable(format!("message version {} (this node speaks {WIRE_VERSION})", version.v)));
    }
    let envelope: EnvelopeIn<T> = serde_json::from_slice(bytes).map_err(|e| Refusal::Unreadable(e.to_string()))?;
    Ok(envelope.m)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stream::EventId;

    #[test]
    fn deliveries_cross_byte_for_byte() {
        let stream = StreamId::new("logs", "p/run");
        let events = vec![
            Event { id: EventId::new("a"), timestamp_ms: 1, payload: Bytes::from_static(b"line \"one\"\n") },
            Event { id: EventId::new("b"), timestamp_ms: 2, payload: Bytes::from_static(&[0xff, 0x00, 0x80]) },
        ];
        let delivery = Delivery {
            subscription: SubscriptionId(9),
            stream: stream.clone(),
            batches: vec![Arc::new(BatchContainer { stream, token: SequenceToken::new(4, 1), events: events.clone() })],
            fence: Fence::lease(7),
            gap: Some("a batch was given up".into()),
        };
        let request = Request::Deliver {
            from: Some(Origin { queue: crate::stream::QueueId(3), fence: Some(7) }),
            consumer: "c".into(),
            delivery: WireDelivery::from_delivery(&delivery),
        };
        let bytes = encode(&request).unwrap();
        let Request::Deliver { delivery: wire, from, .. } = decode::<Request>(&bytes).unwrap() else {
            panic!("not a delivery")
        };
        assert_eq!(from.and_then(|f| f.fence), Some(7));
        let back = wire.into_delivery().unwrap();
        assert_eq!(back.batches[0].events, events);
        assert_eq!((back.batches[0].token, back.fence), (SequenceToken::new(4, 1), Fence::lease(7)));
        assert_eq!(back.gap.as_deref(), Some("a batch was given up"), "a gap crosses with its delivery");
    }

    #[test]
    fn another_version_is_refused_by_name() {
        let bytes = br#"{"v":2,"m":{"op":"agents","command":"state"}}"#;
        let refusal = decode::<Request>(bytes).unwrap_err();
        assert!(refusal.to_string().contains("version 2"), "{refusal}");
        let refusal = decode::<Request>(b"not json").unwrap_err();
        assert!(matches!(refusal, Refusal::Unreadable(_)));
        let reply = Reply::Refused { refusal: Refusal::Fenced { queue: 1, token: 2, newest: 3 } };
        let back: Reply = decode(&encode(&reply).unwrap()).unwrap();
        assert!(matches!(back, Reply::Refused { refusal: Refusal::Fenced { newest: 3, .. } }));
    }
}
