//! One event per line: UTF-8 JSON with the event id kept.
//!
//! `{"id":"e-17","stream":{"namespace":"logs","key":"etl/run-1"},"ts":1764460800000,"payload":"text"}`
//!
//! A payload that is not UTF-8 is written as `"payload_b64"` (standard
//! base64) instead of `"payload"`. The first line of a batch of several
//! events carries `"batch": <lines>`, so readers hand the batch on whole.

use std::borrow::Cow;

mod fast;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use serde::{Deserialize, Serialize};

use crate::stream::{Event, EventId, StreamId};

#[derive(Serialize)]
struct Line<'a> {
    id: Cow<'a, str>,
    stream: StreamId,
    ts: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    payload: Option<Cow<'a, str>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    payload_b64: Option<Cow<'a, str>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    batch: Option<u32>,
}

/// The stream of a line as read: borrowed, so the lines after a batch's
/// first are compared, never allocated.
#[derive(Debug, PartialEq, Deserialize)]
struct StreamView<'a> {
    #[serde(borrow)]
    namespace: Cow<'a, str>,
    #[serde(borrow)]
    key: Cow<'a, str>,
}

/// A line as read, borrowing from the line's bytes.
#[derive(Debug, PartialEq, Deserialize)]
pub struct LineView<'a> {
    #[serde(borrow)]
    id: Cow<'a, str>,
    #[serde(borrow)]
    stream: StreamView<'a>,
    ts: u64,
    #[serde(borrow, default)]
    payload: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    payload_b64: Option<Cow<'a, str>>,
    #[serde(default)]
    batch: Option<u32>,
}

/// Appends `event` of `stream` as one line (with its `\n`) to `out`;
/// `batch` is the batch's line count, given on its first line only.
pub fn encode_line(stream: &StreamId, event: &Event, batch: Option<u32>, out: &mut Vec<u8>) {
    let (payload, payload_b64) = match std::str::from_utf8(&event.payload) {
        Ok(text) => (Some(Cow::Borrowed(text)), None),
        Err(_) => (None, Some(Cow::Owned(STANDARD.encode(&event.payload)))),
    };
    let line = Line {
        id: Cow::Borrowed(event.id.as_str()),
        stream: stream.clone(),
        ts: event.timestamp_ms,
        payload,
        payload_b64,
        batch: batch.filter(|n| *n > 1),
    };
    // Serialising plain strings and numbers into a Vec cannot fail.
    if serde_json::to_writer(&mut *out, &line).is_ok() {
        out.push(b'\n');
    }
}

/// A line read back.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DecodedLine {
    /// Its stream.
    pub stream: StreamId,
    /// Its event.
    pub event: Event,
    /// Lines in the batch this line starts (1 for a single event).
    pub batch: u32,
}

impl<'a> LineView<'a> {
    /// Parses one line (without its `\n`).
    pub fn parse(line: &'a [u8]) -> Result<Self, String> {
        match fast::parse(line) {
            Some(view) => Ok(view),
            None => Self::parse_json(line),
        }
    }

    /// Reads the line at the start of `text` (the rest of a file) when it
    /// has exactly the shape the writer produces, without escapes: the
    /// view and the line's length (without its `\n`). `None`: find the
    /// line's end and use [`LineView::parse`].
    pub fn parse_prefix(text: &'a str) -> Option<(Self, usize)> {
        fast::parse_prefix(text)
    }

    /// Parses one line with the general JSON parser.
    fn parse_json(line: &'a [u8]) -> Result<Self, String> {
        serde_json::from_slice(line).map_err(|e| e.to_string())
    }

    /// Lines in the batch this line starts (1 for a single event).
    pub fn batch(&self) -> u32 {
        self.batch.unwrap_or(1).max(1)
    }

    /// Whether the line belongs to `stream`.
    pub fn is_of(&self, stream: &StreamId) -> bool {
        self.stream.namespace == stream.namespace() && self.stream.key == stream.key()
    }

    /// Its stream.
    pub fn stream(&self) -> StreamId {
        StreamId::new(self.stream.namespace.as_ref(), self.stream.key.as_ref())
    }

    /// Its event. `buffer` holds the bytes the view was parsed from (the
    /// line or the whole file): a text payload without escapes is shared
    /// with it, not copied.
    pub fn event(&self, buffer: &bytes::Bytes) -> Result<Event, String> {
        let payload = match (&self.payload, &self.payload_b64) {
            (Some(Cow::Borrowed(text)), None) => buffer.slice_ref(text.as_bytes()),
            (Some(Cow::Owned(text)), None) => bytes::Bytes::from(text.clone()),
            (None, Some(b64)) => STANDARD.decode(b64.as_bytes()).map_err(|e| format!("payload_b64: {e}"))?.into(),
            (None, None) => return Err("no payload or payload_b64".into()),
            (Some(_), Some(_)) => return Err("both payload and payload_b64".into()),
        };
        Ok(Event { id: EventId::new(self.id.as_ref()), timestamp_ms: self.ts, payload })
    }
}

/// Parses one line (without its `\n`).
pub fn decode_line(line: &[u8]) -> Result<DecodedLine, String> {
    let owned = bytes::Bytes::copy_from_slice(line);
    let view = LineView::parse(&owned)?;
    Ok(DecodedLine { stream: view.stream(), event: view.event(&owned)?, batch: view.batch() })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_and_binary_payloads_round_trip() {
        let stream = StreamId::new("logs", "etl/run-1");
        for payload in [
            bytes::Bytes::from_static(b"a line \"quoted\" \xe2\x9c\x93"),
            bytes::Bytes::from_static(&[0xff, 0x00, 0x10]),
        ] {
            let event = Event { id: EventId::new("e-17"), timestamp_ms: 1_764_460_800_000, payload };
            let mut out = Vec::new();
            encode_line(&stream, &event, Some(3), &mut out);
            assert_eq!(out.last(), Some(&b'\n'));
            assert_eq!(out.iter().filter(|b| **b == b'\n').count(), 1, "one line");
            let back = decode_line(&out[..out.len() - 1]).unwrap();
            assert_eq!(back, DecodedLine { stream: stream.clone(), event, batch: 3 });
        }
    }

    #[test]
    fn the_format_is_stable() {
        let mut out = Vec::new();
        let event = Event { id: EventId::new("e1"), timestamp_ms: 5, payload: "hi".into() };
        encode_line(&StreamId::new("logs", "a"), &event, None, &mut out);
        assert_eq!(
            String::from_utf8(out.clone()).unwrap(),
            "{\"id\":\"e1\",\"stream\":{\"namespace\":\"logs\",\"key\":\"a\"},\"ts\":5,\"payload\":\"hi\"}\n"
        );
        assert!(fast::parse(&out[..out.len() - 1]).is_some(), "the writer's lines take the fast path");
    }

    #[test]
    fn garbage_is_an_error_not_a_panic() {
        for bad in [
            &b"{"[..],
            b"not json",
            b"{\"id\":\"x\",\"stream\":{\"namespace\":\"a\",\"key\":\"b\"},\"ts\":1}",
            &[0xff, 0xfe],
        ] {
            assert!(decode_line(bad).is_err());
        }
    }

    proptest::proptest! {
        /// The fast path and serde_json agree on every line the writer
        /// makes, and on any corruption of one: same view or both refuse.
        #[test]
        fn the_fast_path_reads_exactly_what_serde_json_reads(
            id in "\\PC{0,12}",
            namespace in "[a-z\"\\\\\u{1}é]{0,6}",
            key in "\\PC{0,10}",
            ts in proptest::num::u64::ANY,
            payload in proptest::collection::vec(proptest::num::u8::ANY, 0..40),
            text in "\\PC{0,40}",
            binary in proptest::bool::ANY,
            batch in 0u32..4,
            flip in proptest::option::of((0usize..200, proptest::num::u8::ANY)),
        ) {
            let payload = if binary { bytes::Bytes::from(payload) } else { bytes::Bytes::from(text) };
            let event = Event { id: EventId::new(id), timestamp_ms: ts, payload };
            let mut line = Vec::new();
            encode_line(&StreamId::new(namespace, key), &event, Some(batch), &mut line);
            line.pop();
            if let Some((at, byte)) = flip {
                let at = at % line.len();
                line[at] = byte;
            }
            let general = LineView::parse_json(&line);
            if let Some(view) = fast::parse(&line) {
                proptest::prop_assert_eq!(Ok(view), general);
            }
            if flip.is_none() {
                let back = decode_line(&line).unwrap();
                proptest::prop_assert_eq!(back.event, event);
            }
        }
    }
}
