//! One event per line: UTF-8 JSON with the event id kept.
//!
//! `{"id":"e-17","stream":{"namespace":"logs","key":"etl/run-1"},"ts":1764460800000,"payload":"text"}`
//!
//! A payload that is not UTF-8 is written as `"payload_b64"` (standard
//! base64) instead of `"payload"`. The first line of a batch of several
//! events carries `"batch": <lines>`, so readers hand the batch on whole.

use std::borrow::Cow;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use serde::{Deserialize, Serialize};

use crate::stream::{Event, EventId, StreamId};

#[derive(Serialize, Deserialize)]
struct Line<'a> {
    #[serde(borrow)]
    id: Cow<'a, str>,
    stream: StreamId,
    ts: u64,
    #[serde(borrow, default, skip_serializing_if = "Option::is_none")]
    payload: Option<Cow<'a, str>>,
    #[serde(borrow, default, skip_serializing_if = "Option::is_none")]
    payload_b64: Option<Cow<'a, str>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
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

/// Parses one line (without its `\n`).
pub fn decode_line(line: &[u8]) -> Result<DecodedLine, String> {
    let parsed: Line = serde_json::from_slice(line).map_err(|e| e.to_string())?;
    let payload = match (parsed.payload, parsed.payload_b64) {
        (Some(text), None) => bytes::Bytes::from(text.into_owned()),
        (None, Some(b64)) => STANDARD.decode(b64.as_bytes()).map_err(|e| format!("payload_b64: {e}"))?.into(),
        (None, None) => return Err("no payload or payload_b64".into()),
        (Some(_), Some(_)) => return Err("both payload and payload_b64".into()),
    };
    Ok(DecodedLine {
        stream: parsed.stream,
        event: Event { id: EventId::new(parsed.id.as_ref()), timestamp_ms: parsed.ts, payload },
        batch: parsed.batch.unwrap_or(1).max(1),
    })
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
            String::from_utf8(out).unwrap(),
            "{\"id\":\"e1\",\"stream\":{\"namespace\":\"logs\",\"key\":\"a\"},\"ts\":5,\"payload\":\"hi\"}\n"
        );
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
}
