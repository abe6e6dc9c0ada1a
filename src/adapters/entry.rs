//! One batch container as the bytes a store keeps (a Redis entry's field
//! `b`, a Kafka record's value): the stream and its events as JSON,
//! `{"s":{"namespace":…,"key":…},"e":[{"id":…,"ts":…,"p":…}]}`. A payload
//! that is not UTF-8 is carried as `"b64"` instead of `"p"`.

use std::borrow::Cow;

mod fast;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use bytes::Bytes;
use serde::{Deserialize, Serialize};

use crate::stream::{BatchContainer, Event, EventId, SequenceToken, StreamId, StreamIdCache};

#[derive(Serialize)]
struct EntryOut<'a> {
    s: &'a StreamId,
    e: Vec<EventOut<'a>>,
}

#[derive(Serialize)]
struct EventOut<'a> {
    id: &'a str,
    ts: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    p: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    b64: Option<String>,
}

/// Read back borrowing from the entry's bytes.
#[derive(Deserialize)]
struct EntryIn<'a> {
    #[serde(borrow)]
    s: StreamIn<'a>,
    #[serde(borrow)]
    e: Vec<EventIn<'a>>,
}

#[derive(Deserialize)]
struct StreamIn<'a> {
    #[serde(borrow)]
    namespace: Cow<'a, str>,
    #[serde(borrow)]
    key: Cow<'a, str>,
}

#[derive(Deserialize)]
struct EventIn<'a> {
    #[serde(borrow)]
    id: Cow<'a, str>,
    ts: u64,
    #[serde(borrow, default, deserialize_with = "crate::stream::borrowed_text")]
    p: Option<Cow<'a, str>>,
    #[serde(borrow, default, deserialize_with = "crate::stream::borrowed_text")]
    b64: Option<Cow<'a, str>>,
}

/// The bytes holding `events` of `stream`.
pub(crate) fn encode_entry(stream: &StreamId, events: &[Event]) -> Vec<u8> {
    let e = events
        .iter()
        .map(|event| match std::str::from_utf8(&event.payload) {
            Ok(text) => EventOut { id: event.id.as_str(), ts: event.timestamp_ms, p: Some(text), b64: None },
            Err(_) => EventOut {
                id: event.id.as_str(),
                ts: event.timestamp_ms,
                p: None,
                b64: Some(STANDARD.encode(&event.payload)),
            },
        })
        .collect();
    // Sized for the usual entry (text without escapes), so that the
    // buffer is not grown and copied as it fills.
    let size = 64 + stream.namespace().len() + stream.key().len();
    let size = events.iter().fold(size, |n, e| n + 40 + e.id.as_str().len() + e.payload.len());
    let mut body = Vec::with_capacity(size);
    // Plain strings and numbers always serialise.
    match serde_json::to_writer(&mut body, &EntryOut { s: stream, e }) {
        Ok(()) => body,
        Err(_) => Vec::new(),
    }
}

/// Decodes the container at `token` whose bytes are `body`. Payloads
/// without escapes share `body`'s buffer; the stream's id comes from
/// `streams`.
pub(crate) fn decode_entry(
    token: SequenceToken,
    body: Bytes,
    streams: &mut StreamIdCache,
) -> Result<BatchContainer, String> {
    if let Some(container) = fast::decode(token, &body, streams) {
        return Ok(container);
    }
    let entry: EntryIn = serde_json::from_slice(&body).map_err(|e| format!("entry {token}: {e}"))?;
    let mut events = Vec::with_capacity(entry.e.len());
    for event in entry.e {
        let payload = match (event.p, event.b64) {
            (Some(Cow::Borrowed(text)), None) => body.slice_ref(text.as_bytes()),
            (Some(Cow::Owned(text)), None) => Bytes::from(text),
            (None, Some(b64)) => STANDARD.decode(b64.as_bytes()).map_err(|e| format!("entry {token}: {e}"))?.into(),
            _ => return Err(format!("entry {token}: an event needs exactly one of `p` and `b64`")),
        };
        events.push(Event { id: EventId::new(event.id.as_ref()), timestamp_ms: event.ts, payload });
    }
    if events.is_empty() {
        return Err(format!("entry {token} has no event"));
    }
    Ok(BatchContainer { stream: streams.get(&entry.s.namespace, &entry.s.key), token, events })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_round_trip_text_binary_and_escapes() {
        let stream = StreamId::new("logs", "p/run-1");
        let events = vec![
            Event { id: EventId::new("a"), timestamp_ms: 1, payload: Bytes::from_static(b"plain") },
            Event { id: EventId::new("b"), timestamp_ms: 2, payload: Bytes::from_static(b"with \"quotes\"\n") },
            Event { id: EventId::new("c"), timestamp_ms: 3, payload: Bytes::from_static(&[0xff, 0x00]) },
        ];
        let body = encode_entry(&stream, &events);
        let token = SequenceToken::new(5, 1);
        let back = decode_entry(token, Bytes::from(body), &mut StreamIdCache::default()).unwrap();
        assert_eq!((back.stream, back.token, back.events), (stream, SequenceToken::new(5, 1), events));
    }

    #[test]
    fn payloads_without_escapes_are_borrowed_from_the_entry() {
        let body =
            br#"{"s":{"namespace":"a","key":"b"},"e":[{"id":"1","ts":1,"p":"plain"},{"id":"2","ts":2,"p":"a\"b"}]}"#;
        let entry: EntryIn = serde_json::from_slice(body).unwrap();
        assert!(matches!(entry.e[0].p, Some(Cow::Borrowed("plain"))));
        assert!(matches!(&entry.e[1].p, Some(Cow::Owned(text)) if text == "a\"b"));
        assert!(matches!(entry.e[0].id, Cow::Borrowed("1")));
    }

    /// Redis entries and Kafka records (`records = "tailrace"`) as release
    /// 0.1.0 wrote them are read, and written back byte for byte.
    #[test]
    fn the_previous_releases_entries_are_read_and_written_the_same() {
        let golden = include_str!("../../tests/golden/0.1.0/entries.jsonl");
        for (n, line) in golden.lines().enumerate() {
            let token = SequenceToken::new(n as u64 + 1, 0);
            let container = decode_entry(token, Bytes::copy_from_slice(line.as_bytes()), &mut StreamIdCache::default());
            let container = container.unwrap_or_else(|e| panic!("line {}: {e}", n + 1));
            let again = encode_entry(&container.stream, &container.events);
            assert_eq!(String::from_utf8_lossy(&again), line, "line {}", n + 1);
        }
        assert_eq!(golden.lines().count(), 2);
    }

    #[test]
    fn the_writers_plain_entries_take_the_fast_path() {
        let stream = StreamId::new("logs", "p/run-1");
        let events: Vec<Event> = (0..3)
            .map(|i| Event { id: EventId::new(format!("e-{i}")), timestamp_ms: i, payload: Bytes::from("line é ✓") })
            .collect();
        let body = Bytes::from(encode_entry(&stream, &events));
        let token = SequenceToken::new(9, 0);
        let fast = fast::decode(token, &body, &mut StreamIdCache::default()).expect("the fast path reads it");
        assert_eq!((fast.stream, fast.token, fast.events), (stream, token, events));
    }

    proptest::proptest! {
        /// Whatever `encode_entry` writes (escapes, control characters,
        /// binary payloads, any text), the fast path reads the same as
        /// `serde_json` or leaves it to it; without escapes or binary
        /// payloads it always reads it.
        #[test]
        fn the_fast_path_reads_what_serde_json_reads(
            namespace in "\\PC{0,6}|[a-z\"\\\\\u{1}]{0,4}",
            key in "\\PC{0,8}",
            events in proptest::collection::vec(
                ("\\PC{0,6}", proptest::num::u64::ANY, proptest::collection::vec(proptest::num::u8::ANY, 0..12), "\\PC{0,12}", proptest::bool::ANY),
                1..5,
            ),
        ) {
            let stream = StreamId::new(namespace.clone(), key.clone());
            let events: Vec<Event> = events
                .into_iter()
                .map(|(id, ts, bytes, text, binary)| Event {
                    id: EventId::new(id),
                    timestamp_ms: ts,
                    payload: if binary { Bytes::from(bytes) } else { Bytes::from(text) },
                })
                .collect();
            let body = Bytes::from(encode_entry(&stream, &events));
            let token = SequenceToken::new(1, 2);
            let general: EntryIn = serde_json::from_slice(&body).unwrap();
            let plain = |s: &str| !s.bytes().any(|b| b == b'"' || b == b'\\' || b < 0x20);
            let all_plain = plain(stream.namespace())
                && plain(stream.key())
                && events.iter().all(|e| plain(e.id.as_str()) && std::str::from_utf8(&e.payload).is_ok_and(plain));
            match fast::decode(token, &body, &mut StreamIdCache::default()) {
                Some(fast) => {
                    proptest::prop_assert_eq!(fast.stream.namespace(), general.s.namespace.as_ref());
                    proptest::prop_assert_eq!(fast.stream.key(), general.s.key.as_ref());
                    proptest::prop_assert_eq!(&fast.events, &events);
                }
                None => proptest::prop_assert!(!all_plain, "a plain entry missed the fast path: {:?}", body),
            }
            let decoded = decode_entry(token, body.clone(), &mut StreamIdCache::default()).unwrap();
            proptest::prop_assert_eq!((decoded.stream, decoded.events), (stream, events));
        }
    }

    #[test]
    fn bad_entries_are_errors() {
        let token = SequenceToken::new(5, 1);
        let decode = |body: &'static [u8]| decode_entry(token, Bytes::from_static(body), &mut StreamIdCache::default());
        assert!(decode(br#"{"s":{"namespace":"a","key":"b"},"e":[]}"#).unwrap_err().contains("no event"));
        assert!(decode(b"not json").unwrap_err().contains("entry 5-1"));
        let both = br#"{"s":{"namespace":"a","key":"b"},"e":[{"id":"1","ts":1,"p":"x","b64":"eA=="}]}"#;
        assert!(decode(both).unwrap_err().contains("exactly one"));
    }
}
