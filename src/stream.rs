//! The data model every other module speaks: stream ids, events, batch
//! containers and sequence tokens.
//!
//! - A [`StreamId`] names an ordered sequence of events: `(namespace, key)`.
//!   It is cheap to clone (one `Arc`) and carries a stable 64-bit hash of its
//!   bytes, computed once, that the queue mapper uses.
//! - An [`Event`] is an opaque payload with an immutable producer-chosen
//!   [`EventId`] and the producer's timestamp.
//! - A [`BatchContainer`] is what a queue holds: events of one stream and the
//!   [`SequenceToken`] the queue gave them.
//! - A [`SequenceToken`] is a totally ordered position in a queue made of two
//!   unsigned 64-bit parts (a Redis entry id `ms-seq`, a file number and a line,
//!   a counter and zero). Its string form `major-minor` is opaque to users.
//! - A [`QueueId`] names one queue of a provider and a [`NodeId`] one node of
//!   a cluster. They live here, at the bottom, because almost every module
//!   speaks of them; this is their one path.

use std::cmp::Ordering;
use std::fmt;
use std::hash::{Hash, Hasher};
use std::str::FromStr;
use std::sync::Arc;

use bytes::Bytes;
use compact_str::CompactString;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

mod run_key;

pub use run_key::{InvalidName, LOGS_NAMESPACE, MAX_NAME_BYTES, RunKey};

/// One queue of a provider: its index in `0..queue_count`.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct QueueId(pub u32);

impl fmt::Display for QueueId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "q{}", self.0)
    }
}

impl fmt::Debug for QueueId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "q{}", self.0)
    }
}

/// A node's name, unique in its cluster.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct NodeId(CompactString);

impl NodeId {
    /// Names a node.
    pub fn new(name: impl Into<CompactString>) -> Self {
        Self(name.into())
    }

    /// The name.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for NodeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for NodeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Node({})", self.0)
    }
}

/// Names one ordered stream of events: a namespace (`logs`) and a key
/// (`pipeline.fqn/run-42`).
#[derive(Clone)]
pub struct StreamId {
    inner: Arc<StreamIdInner>,
}

struct StreamIdInner {
    namespace: Box<str>,
    key: Box<str>,
    hash: u64,
}

impl StreamId {
    /// Builds a stream id. The stable hash of its bytes is computed here, once.
    pub fn new(namespace: impl AsRef<str>, key: impl AsRef<str>) -> Self {
        let (namespace, key) = (namespace.as_ref(), key.as_ref());
        Self::hashed(stable_hash(namespace, key), namespace, key)
    }

    fn hashed(hash: u64, namespace: &str, key: &str) -> Self {
        Self { inner: Arc::new(StreamIdInner { hash, namespace: namespace.into(), key: key.into() }) }
    }

    /// The namespace (`logs` for run logs). Implicit subscriptions bind to it.
    pub fn namespace(&self) -> &str {
        &self.inner.namespace
    }

    /// The key inside the namespace.
    pub fn key(&self) -> &str {
        &self.inner.key
    }

    /// A hash of the id's bytes that is the same in every process and every
    /// release (xxh3-64 of `namespace 0xFF key`); golden-vector tested.
    pub fn stable_hash(&self) -> u64 {
        self.inner.hash
    }
}

/// The stream ids a reader met lately: reading a stream again gives the
/// same id (one `Arc`), without allocating it again, and equal ids then
/// compare by pointer downstream. Bounded: past `STREAM_ID_CACHE` ids it
/// starts over.
#[derive(Default)]
pub(crate) struct StreamIdCache {
    ids: rustc_hash::FxHashMap<u64, StreamId>,
}

/// For `#[serde(borrow, default, deserialize_with = "...")]` on an
/// `Option<Cow<str>>` field: a string without escapes is borrowed from the
/// input. serde borrows a `Cow<str>` field, but copies one inside an
/// `Option` into a `String` (an allocation per event payload).
pub(crate) fn borrowed_text<'de, D: Deserializer<'de>>(
    deserializer: D,
) -> Result<Option<std::borrow::Cow<'de, str>>, D::Error> {
    #[derive(Deserialize)]
    struct Text<'a>(#[serde(borrow)] std::borrow::Cow<'a, str>);
    Ok(Option::<Text>::deserialize(deserializer)?.map(|text| text.0))
}

/// Most ids a [`StreamIdCache`] keeps.
const STREAM_ID_CACHE: usize = 4096;

impl StreamIdCache {
    /// The id of `namespace` and `key`.
    pub(crate) fn get(&mut self, namespace: &str, key: &str) -> StreamId {
        let hash = stable_hash(namespace, key);
        if let Some(id) = self.ids.get(&hash)
            && id.namespace() == namespace
            && id.key() == key
        {
            return id.clone();
        }
        let id = StreamId::hashed(hash, namespace, key);
        if self.ids.len() >= STREAM_ID_CACHE {
            self.ids.clear();
        }
        self.ids.insert(hash, id.clone());
        id
    }
}

/// `0xFF` never occurs in UTF-8, so it separates namespace and key unambiguously.
fn stable_hash(namespace: &str, key: &str) -> u64 {
    let mut hasher = xxhash_rust::xxh3::Xxh3::new();
    hasher.update(namespace.as_bytes());
    hasher.update(&[0xFF]);
    hasher.update(key.as_bytes());
    hasher.digest()
}

impl PartialEq for StreamId {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
            || (self.inner.hash == other.inner.hash
                && self.inner.namespace == other.inner.namespace
                && self.inner.key == other.inner.key)
    }
}

impl Eq for StreamId {}

impl Hash for StreamId {
    fn hash<H: Hasher>(&self, state: &mut H) {
        state.write_u64(self.inner.hash);
    }
}

impl PartialOrd for StreamId {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for StreamId {
    fn cmp(&self, other: &Self) -> Ordering {
        (self.namespace(), self.key()).cmp(&(other.namespace(), other.key()))
    }
}

impl fmt::Display for StreamId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace(), self.key())
    }
}

impl fmt::Debug for StreamId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "StreamId({self})")
    }
}

#[derive(Serialize, Deserialize)]
struct StreamIdRepr<'a> {
    namespace: std::borrow::Cow<'a, str>,
    key: std::borrow::Cow<'a, str>,
}

impl Serialize for StreamId {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        StreamIdRepr { namespace: self.namespace().into(), key: self.key().into() }.serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for StreamId {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let repr = StreamIdRepr::deserialize(deserializer)?;
        Ok(StreamId::new(repr.namespace, repr.key))
    }
}

/// An event's immutable identity, chosen by the producer (or generated).
/// Short ids (up to 24 bytes) are stored inline without allocation.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct EventId(CompactString);

impl EventId {
    /// Wraps a producer-chosen id.
    pub fn new(id: impl Into<CompactString>) -> Self {
        Self(id.into())
    }

    /// An id made of a decimal number (stored inline, no allocation).
    pub fn from_u64(n: u64) -> Self {
        // `itoa` into a stack buffer: `to_compact_string` went through the
        // formatting machinery and was a third of a producer's time.
        Self(CompactString::new(itoa::Buffer::new().format(n)))
    }

    /// The id as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for EventId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for EventId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "EventId({})", self.0)
    }
}

impl From<&str> for EventId {
    fn from(value: &str) -> Self {
        Self::new(value)
    }
}

/// One event: an opaque payload with an immutable id and the producer's
/// timestamp (milliseconds since the Unix epoch).
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub struct Event {
    /// The producer's id for this event; kept through every hop.
    pub id: EventId,
    /// When the producer made it, in milliseconds since the Unix epoch.
    pub timestamp_ms: u64,
    /// The opaque payload (cheap to clone).
    pub payload: Bytes,
}

impl Event {
    /// Builds an event stamped with the current wall-clock time.
    pub fn new(id: impl Into<EventId>, payload: impl Into<Bytes>) -> Self {
        Self { id: id.into(), timestamp_ms: now_ms(), payload: payload.into() }
    }
}

/// Milliseconds since the Unix epoch (0 if the clock is before 1970).
pub(crate) fn now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

/// What a queue holds: events of one stream plus the position the queue gave
/// them. Shared by reference (`Arc`) between the cache and deliveries.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct BatchContainer {
    /// The stream all these events belong to.
    pub stream: StreamId,
    /// The container's position in its queue.
    pub token: SequenceToken,
    /// The events, in the order they were enqueued.
    pub events: Vec<Event>,
}

/// A totally ordered position in one queue: `(major, minor)` compared as a
/// pair of unsigned 64-bit numbers, so gaps larger than `i32::MAX` or
/// `i64::MAX` compare correctly.
///
/// ```
/// use tailrace::SequenceToken;
///
/// let token: SequenceToken = "1764460800000-3".parse().unwrap();
/// assert_eq!(token, SequenceToken::new(1_764_460_800_000, 3));
/// assert_eq!(token.to_string(), "1764460800000-3");
/// assert!(SequenceToken::new(2, 0) > SequenceToken::new(1, u64::MAX));
/// assert!("7".parse::<SequenceToken>().is_err());
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct SequenceToken {
    /// The major part: a counter, a Redis millisecond time, a file number.
    pub major: u64,
    /// The minor part: zero, a Redis sequence, a line number.
    pub minor: u64,
}

impl SequenceToken {
    /// Builds a token from its two parts.
    pub const fn new(major: u64, minor: u64) -> Self {
        Self { major, minor }
    }
}

impl fmt::Display for SequenceToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}-{}", self.major, self.minor)
    }
}

impl fmt::Debug for SequenceToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Token({self})")
    }
}

/// A token's string form could not be parsed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`{0}` is not a sequence token (expected two unsigned numbers as `major-minor`)")]
pub struct ParseTokenError(pub String);

impl FromStr for SequenceToken {
    type Err = ParseTokenError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = || ParseTokenError(s.chars().take(64).collect());
        let (major, minor) = s.split_once('-').ok_or_else(err)?;
        Ok(Self { major: major.parse().map_err(|_| err())?, minor: minor.parse().map_err(|_| err())? })
    }
}

impl Serialize for SequenceToken {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for SequenceToken {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = std::borrow::Cow::<str>::deserialize(deserializer)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_round_trips_through_its_string_form() {
        let token = SequenceToken::new(u64::MAX, 7);
        let text = token.to_string();
        assert_eq!(text, "18446744073709551615-7");
        assert_eq!(text.parse::<SequenceToken>(), Ok(token));
        let json = serde_json::to_string(&token).unwrap();
        assert_eq!(json, "\"18446744073709551615-7\"");
        assert_eq!(serde_json::from_str::<SequenceToken>(&json).unwrap(), token);
    }

    #[test]
    fn token_rejects_garbage_with_a_clear_error() {
        for bad in ["", "12", "a-b", "1-", "-1", "1-2-3", "-1-2"] {
            let err = bad.parse::<SequenceToken>().unwrap_err();
            assert!(err.to_string().contains("is not a sequence token"), "{bad}");
        }
    }

    #[test]
    fn tokens_compare_as_unsigned_64_bit_pairs() {
        // Gaps larger than i32::MAX and i64::MAX (Orleans scenario 24).
        let low = SequenceToken::new(1, 0);
        let high = SequenceToken::new(1 + i32::MAX as u64 + 10, 0);
        let higher = SequenceToken::new(i64::MAX as u64 + 5, 0);
        assert!(low < high && high < higher);
        assert!(SequenceToken::new(5, u64::MAX) < SequenceToken::new(6, 0));
    }

    #[test]
    fn stream_ids_compare_by_content_and_hash_stably() {
        let a = StreamId::new("logs", "svc.pipe/run-1");
        let b = StreamId::new(String::from("logs"), "svc.pipe/run-1");
        assert_eq!(a, b);
        assert_eq!(a.stable_hash(), b.stable_hash());
        assert_ne!(a, StreamId::new("logsx", "vc.pipe/run-1"));
        assert_eq!(a.to_string(), "logs/svc.pipe/run-1");
        let json = serde_json::to_string(&a).unwrap();
        assert_eq!(json, r#"{"namespace":"logs","key":"svc.pipe/run-1"}"#);
        assert_eq!(serde_json::from_str::<StreamId>(&json).unwrap(), a);
    }

    #[test]
    fn numeric_event_ids_format_like_display() {
        for n in [0u64, 7, 10, 12345, u64::MAX] {
            assert_eq!(EventId::from_u64(n).as_str(), n.to_string());
        }
    }
}
