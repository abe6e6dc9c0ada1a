//! The fast path of reading a line: lines in exactly the shape the writer
//! produces, with no escapes in their strings, are split without a general
//! JSON parser. Anything else returns `None` and goes to `serde_json`, so
//! the two paths accept and produce the same (a property test holds them
//! to it).

use std::borrow::Cow;

use super::{LineView, StreamView};
use crate::json_shape::Cursor;

/// Splits `line` if it has the writer's exact shape:
/// `{"id":"…","stream":{"namespace":"…","key":"…"},"ts":N,"payload":"…"[,"batch":N]}`.
pub(super) fn parse(line: &[u8]) -> Option<LineView<'_>> {
    let text = simdutf8::basic::from_utf8(line).ok()?;
    let (view, length) = parse_prefix(text)?;
    (length == text.len()).then_some(view)
}

/// Splits the line at the start of `text` (the rest of a file) if it has
/// the writer's shape and ends at a `\n` or the end of `text`; returns it
/// with its length (without the `\n`).
pub(super) fn parse_prefix(text: &str) -> Option<(LineView<'_>, usize)> {
    let mut cursor = Cursor(text);
    cursor.literal("{\"id\":\"")?;
    let id = cursor.string()?;
    cursor.literal(",\"stream\":")?;
    let stream_from = cursor.0;
    cursor.literal("{\"namespace\":\"")?;
    let namespace = cursor.string()?;
    cursor.literal(",\"key\":\"")?;
    let key = cursor.string()?;
    cursor.literal("}")?;
    let stream_json = &stream_from[..stream_from.len() - cursor.0.len()];
    cursor.literal(",\"ts\":")?;
    let ts = cursor.number()?;
    cursor.literal(",\"payload\":\"")?;
    let payload = cursor.string()?;
    let batch =
        if cursor.literal(",\"batch\":").is_some() { Some(u32::try_from(cursor.number()?).ok()?) } else { None };
    cursor.literal("}")?;
    if !(cursor.0.is_empty() || cursor.0.starts_with('\n')) {
        return None;
    }
    let view = LineView {
        id: Cow::Borrowed(id),
        stream: StreamView { namespace: Cow::Borrowed(namespace), key: Cow::Borrowed(key) },
        ts,
        payload: Some(Cow::Borrowed(payload)),
        payload_b64: None,
        batch,
        stream_json: Some(stream_json),
    };
    Some((view, text.len() - cursor.0.len()))
}

/// Splits the line at the start of `text` if it is the next line of a
/// batch whose stream was written as `stream_json`: the writer's exact
/// shape, those very stream bytes, and no `"batch"` of its own. Returns
/// the id, the timestamp, the payload and the line's length (without the
/// `\n`). The stream is compared as bytes, not parsed again.
pub(super) fn parse_in_batch<'a>(text: &'a str, stream_json: &str) -> Option<(&'a str, u64, &'a str, usize)> {
    let mut cursor = Cursor(text);
    cursor.literal("{\"id\":\"")?;
    let id = cursor.string()?;
    cursor.literal(",\"stream\":")?;
    cursor.literal(stream_json)?;
    cursor.literal(",\"ts\":")?;
    let ts = cursor.number()?;
    cursor.literal(",\"payload\":\"")?;
    let payload = cursor.string()?;
    cursor.literal("}")?;
    if !(cursor.0.is_empty() || cursor.0.starts_with('\n')) {
        return None;
    }
    Some((id, ts, payload, text.len() - cursor.0.len()))
}
