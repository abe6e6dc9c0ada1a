//! The fast path of reading an entry: one in exactly the shape
//! `encode_entry` writes, with text payloads and no escapes in its
//! strings, is split without a general JSON parser (a node reading a busy
//! queue spent a fifth of its time in `serde_json` here). Anything else
//! returns `None` and goes to `serde_json`; a property test holds the two
//! paths to the same result.

use bytes::Bytes;

use crate::json_shape::Cursor;
use crate::stream::{BatchContainer, Event, EventId, SequenceToken, StreamIdCache};

/// The container at `token` whose bytes are `body`, if `body` is
/// `{"s":{"namespace":"…","key":"…"},"e":[{"id":"…","ts":N,"p":"…"},…]}`
/// with at least one event; its payloads share `body`.
pub(super) fn decode(token: SequenceToken, body: &Bytes, streams: &mut StreamIdCache) -> Option<BatchContainer> {
    let text = simdutf8::basic::from_utf8(body).ok()?;
    let mut cursor = Cursor(text);
    cursor.literal("{\"s\":{\"namespace\":\"")?;
    let namespace = cursor.string()?;
    cursor.literal(",\"key\":\"")?;
    let key = cursor.string()?;
    cursor.literal("},\"e\":[")?;
    let mut events = Vec::new();
    loop {
        cursor.literal("{\"id\":\"")?;
        let id = cursor.string()?;
        cursor.literal(",\"ts\":")?;
        let timestamp_ms = cursor.number()?;
        cursor.literal(",\"p\":\"")?;
        let payload = cursor.string()?;
        cursor.literal("}")?;
        events.push(Event { id: EventId::new(id), timestamp_ms, payload: body.slice_ref(payload.as_bytes()) });
        if cursor.literal(",").is_none() {
            break;
        }
    }
    cursor.literal("]}")?;
    if !cursor.0.is_empty() {
        return None;
    }
    Some(BatchContainer { stream: streams.get(namespace, key), token, events })
}
