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
use serde::Deserialize;

use crate::stream::{Event, EventId, StreamId};

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
#[derive(Debug, Deserialize)]
pub(crate) struct LineView<'a> {
    #[serde(borrow)]
    id: Cow<'a, str>,
    #[serde(borrow)]
    stream: StreamView<'a>,
    ts: u64,
    #[serde(borrow, default, deserialize_with = "crate::stream::borrowed_text")]
    payload: Option<Cow<'a, str>>,
    #[serde(borrow, default, deserialize_with = "crate::stream::borrowed_text")]
    payload_b64: Option<Cow<'a, str>>,
    #[serde(default)]
    batch: Option<u32>,
    /// The stream exactly as the line wrote it, when the fast path read it.
    #[serde(skip)]
    stream_json: Option<&'a str>,
}

/// Appends `event` of `stream` as one line (with its `\n`) to `out`;
/// `batch` is the batch's line count, given on its first line only.
#[cfg(test)]
pub(crate) fn encode_line(stream: &StreamId, event: &Event, batch: Option<u32>, out: &mut Vec<u8>) {
    write_line(&stream_json(stream), event, batch.filter(|n| *n > 1), out);
}

/// Appends the lines of one batch of `stream` to `out`: what
/// `encode_line` writes for each event (the first line carrying the
/// batch's line count), with the stream serialised once, not per line.
pub(crate) fn encode_batch(stream: &StreamId, events: &[Event], out: &mut Vec<u8>) {
    let stream = stream_json(stream);
    let count = u32::try_from(events.len()).unwrap_or(u32::MAX);
    for (i, event) in events.iter().enumerate() {
        write_line(&stream, event, (i == 0 && count > 1).then_some(count), out);
    }
}

/// `stream` as JSON (`{"namespace":…,"key":…}`).
fn stream_json(stream: &StreamId) -> Vec<u8> {
    // Serialising two strings into a Vec cannot fail.
    serde_json::to_vec(stream).unwrap_or_default()
}

/// One line, field by field in the order `Line` serialises them (a test
/// holds the two to the same bytes).
fn write_line(stream: &[u8], event: &Event, batch: Option<u32>, out: &mut Vec<u8>) {
    out.extend_from_slice(b"{\"id\":");
    write_str(event.id.as_str(), out);
    out.extend_from_slice(b",\"stream\":");
    out.extend_from_slice(stream);
    out.extend_from_slice(b",\"ts\":");
    out.extend_from_slice(itoa::Buffer::new().format(event.timestamp_ms).as_bytes());
    match std::str::from_utf8(&event.payload) {
        Ok(text) => {
            out.extend_from_slice(b",\"payload\":");
            write_str(text, out);
        }
        Err(_) => {
            out.extend_from_slice(b",\"payload_b64\":\"");
            out.extend_from_slice(STANDARD.encode(&event.payload).as_bytes());
            out.push(b'"');
        }
    }
    if let Some(batch) = batch {
        out.extend_from_slice(b",\"batch\":");
        out.extend_from_slice(itoa::Buffer::new().format(batch).as_bytes());
    }
    out.extend_from_slice(b"}\n");
}

/// `text` as a JSON string, escaped as serde_json escapes it (`"`, `\` and
/// control characters). Most text has nothing to escape: one pass that
/// the compiler vectorises finds that out, and the text is copied as is.
fn write_str(text: &str, out: &mut Vec<u8>) {
    let plain = !text.bytes().fold(false, |escape, b| escape | (b < 0x20) | (b == b'"') | (b == b'\\'));
    if plain {
        out.push(b'"');
        out.extend_from_slice(text.as_bytes());
        out.push(b'"');
    } else {
        // Serialising a string into a Vec cannot fail.
        let _ = serde_json::to_writer(&mut *out, text);
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

/// Two views are equal when they read the same line content (however
/// they were parsed).
impl PartialEq for LineView<'_> {
    fn eq(&self, other: &Self) -> bool {
        (&self.id, &self.stream, self.ts, &self.payload, &self.payload_b64, self.batch)
            == (&other.id, &other.stream, other.ts, &other.payload, &other.payload_b64, other.batch)
    }
}

impl<'a> LineView<'a> {
    /// Parses one line (without its `\n`).
    pub(crate) fn parse(line: &'a [u8]) -> Result<Self, String> {
        match fast::parse(line) {
            Some(view) => Ok(view),
            None => Self::parse_json(line),
        }
    }

    /// Reads the line at the start of `text` (the rest of a file) when it
    /// has exactly the shape the writer produces, without escapes: the
    /// view and the line's length (without its `\n`). `None`: find the
    /// line's end and use [`LineView::parse`].
    pub(crate) fn parse_prefix(text: &'a str) -> Option<(Self, usize)> {
        fast::parse_prefix(text)
    }

    /// Parses one line with the general JSON parser.
    fn parse_json(line: &'a [u8]) -> Result<Self, String> {
        serde_json::from_slice(line).map_err(|e| e.to_string())
    }

    /// The next line of the batch this line starts, at the start of `text`
    /// (the rest of the same file): its event and its length (without the
    /// `\n`) when it has the writer's exact shape and this line's stream
    /// bytes. `None`: read it with [`LineView::parse_prefix`] or
    /// [`LineView::parse`]. `buffer` holds the file's bytes.
    pub(crate) fn next_in_batch(&self, text: &'a str, buffer: &bytes::Bytes) -> Option<(Event, usize)> {
        let (id, ts, payload, length) = fast::parse_in_batch(text, self.stream_json?)?;
        let event = Event { id: EventId::new(id), timestamp_ms: ts, payload: buffer.slice_ref(payload.as_bytes()) };
        Some((event, length))
    }

    /// Lines in the batch this line starts (1 for a single event).
    pub(crate) fn batch(&self) -> u32 {
        self.batch.unwrap_or(1).max(1)
    }

    /// Whether the line belongs to `stream`.
    pub(crate) fn is_of(&self, stream: &StreamId) -> bool {
        self.stream.namespace == stream.namespace() && self.stream.key == stream.key()
    }

    /// Its stream.
    pub(crate) fn stream(&self) -> StreamId {
        StreamId::new(self.stream.namespace.as_ref(), self.stream.key.as_ref())
    }

    /// Its stream, from the ids a reader met lately.
    pub(crate) fn stream_from(&self, streams: &mut crate::stream::StreamIdCache) -> StreamId {
        streams.get(&self.stream.namespace, &self.stream.key)
    }

    /// Its event. `buffer` holds the bytes the view was parsed from (the
    /// line or the whole file): a text payload without escapes is shared
    /// with it, not copied.
    pub(crate) fn event(&self, buffer: &bytes::Bytes) -> Result<Event, String> {
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

    /// The line as serde serialises it: the reference `write_line` is held to.
    #[derive(serde::Serialize)]
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

    fn serde_line(stream: &StreamId, event: &Event, batch: Option<u32>) -> Vec<u8> {
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
        let mut out = serde_json::to_vec(&line).unwrap();
        out.push(b'\n');
        out
    }

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
    fn the_general_parse_borrows_payloads_without_escapes() {
        let plain = br#"{"ts":1,"payload":"plain","id":"1","stream":{"namespace":"a","key":"b"}}"#;
        assert!(matches!(LineView::parse_json(plain).unwrap().payload, Some(Cow::Borrowed("plain"))));
        let escaped = br#"{"ts":1,"payload":"a\nb","id":"1","stream":{"namespace":"a","key":"b"}}"#;
        assert!(matches!(LineView::parse_json(escaped).unwrap().payload, Some(Cow::Owned(text)) if text == "a\nb"));
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
        /// A batch's later lines read by comparing stream bytes give the
        /// events the general parser gives, and a line of another stream,
        /// or one that starts a batch of its own, is never taken as one.
        #[test]
        fn a_batch_read_by_stream_bytes_is_the_batch_serde_json_reads(
            ids in proptest::collection::vec("\\PC{0,8}", 2..5),
            key in "[a-z\"\\\\\u{1}é]{0,6}",
            other in "[a-z]{0,3}",
            text in "[a-z\"\\\\\u{1}é \n]{0,20}",
            ts in proptest::num::u64::ANY,
            cut in proptest::option::of(0usize..400),
        ) {
            let stream = StreamId::new("logs", &key);
            let events: Vec<Event> = ids
                .iter()
                .map(|id| Event { id: EventId::new(id), timestamp_ms: ts, payload: bytes::Bytes::from(text.clone()) })
                .collect();
            let mut file = Vec::new();
            encode_batch(&stream, &events, &mut file);
            // A different stream's line, and a batch of its own, after it.
            encode_line(&StreamId::new("logs", format!("{key}{other}-2")), &events[0], None, &mut file);
            encode_batch(&stream, &events[..2], &mut file);
            if let Some(cut) = cut {
                file.truncate(cut.min(file.len()));
            }
            let buffer = bytes::Bytes::from(file);
            let Ok(text) = std::str::from_utf8(&buffer) else { return Ok(()) };
            let lines: Vec<&str> = text.split('\n').collect();
            let Some((first, length)) = LineView::parse_prefix(text) else { return Ok(()) };
            let mut at = length + 1;
            // The batch's own lines, then the other stream's line, then the
            // line that starts a batch of its own.
            for (i, line) in lines.iter().enumerate().skip(1).take(ids.len() + 1) {
                let Some(rest) = text.get(at..) else { break };
                match first.next_in_batch(rest, &buffer) {
                    Some((event, length)) => {
                        proptest::prop_assert!(i < ids.len(), "line {} is not of the batch", i);
                        proptest::prop_assert_eq!(length, line.len());
                        let general = decode_line(line.as_bytes()).expect("a line read fast is a line");
                        proptest::prop_assert_eq!(general.stream, stream.clone());
                        proptest::prop_assert_eq!(general.batch, 1);
                        proptest::prop_assert_eq!(&event, &general.event);
                    }
                    None => proptest::prop_assert!(
                        i >= ids.len() || decode_line(line.as_bytes()).is_err() || line.contains('\\') || cut.is_some(),
                        "line {} of the batch was not read fast", i
                    ),
                }
                at += line.len() + 1;
            }
        }

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
            let stream = StreamId::new(namespace, key);
            let mut line = Vec::new();
            encode_line(&stream, &event, Some(batch), &mut line);
            proptest::prop_assert_eq!(&line, &serde_line(&stream, &event, Some(batch)), "the same bytes as serde's");
            let mut lines = Vec::new();
            encode_batch(&stream, &[event.clone(), event.clone()], &mut lines);
            let mut expected = serde_line(&stream, &event, Some(2));
            expected.extend(serde_line(&stream, &event, None));
            proptest::prop_assert_eq!(lines, expected, "a batch: its count on the first line only");
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
