//! The fast path of reading a line: lines in exactly the shape the writer
//! produces, with no escapes in their strings, are split without a general
//! JSON parser. Anything else returns `None` and goes to `serde_json`, so
//! the two paths accept and produce the same (a property test holds them
//! to it).

use std::borrow::Cow;

use super::{LineView, StreamView};

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
    cursor.literal(",\"stream\":{\"namespace\":\"")?;
    let namespace = cursor.string()?;
    cursor.literal(",\"key\":\"")?;
    let key = cursor.string()?;
    cursor.literal("},\"ts\":")?;
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
    };
    Some((view, text.len() - cursor.0.len()))
}

struct Cursor<'a>(&'a str);

impl<'a> Cursor<'a> {
    fn literal(&mut self, expected: &str) -> Option<()> {
        self.0 = self.0.strip_prefix(expected)?;
        Some(())
    }

    /// The rest of a string whose opening quote was consumed, and its
    /// closing quote. `None` on an escape or a control character (the
    /// general parser decides those).
    fn string(&mut self) -> Option<&'a str> {
        let end = memchr::memchr2(b'"', b'\\', self.0.as_bytes())?;
        let (text, rest) = self.0.split_at(end);
        if !rest.starts_with('"') || text.bytes().fold(false, |control, b| control | (b < 0x20)) {
            return None;
        }
        self.0 = &rest[1..];
        Some(text)
    }

    /// A JSON unsigned integer: digits, no leading zero, fits in a u64.
    fn number(&mut self) -> Option<u64> {
        let digits = self.0.bytes().take_while(|b| b.is_ascii_digit()).count();
        let (text, rest) = self.0.split_at(digits);
        if digits == 0 || (digits > 1 && text.starts_with('0')) {
            return None;
        }
        let value = text.parse().ok()?;
        self.0 = rest;
        Some(value)
    }
}
