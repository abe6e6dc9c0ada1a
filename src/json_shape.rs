//! JSON written in one exact shape, read without a general parser: the
//! hot decoders (handoff lines, queue entries) try their writer's shape
//! with this first and leave anything else, escapes included, to
//! `serde_json`, so both paths accept and produce the same.

/// What is left of the text being read.
pub(crate) struct Cursor<'a>(pub(crate) &'a str);

impl<'a> Cursor<'a> {
    /// Consumes `expected`, if the text goes on with it.
    pub(crate) fn literal(&mut self, expected: &str) -> Option<()> {
        self.0 = self.0.strip_prefix(expected)?;
        Some(())
    }

    /// The rest of a string whose opening quote was consumed, and its
    /// closing quote. `None` on an escape or a control character (the
    /// general parser decides those).
    pub(crate) fn string(&mut self) -> Option<&'a str> {
        let end = memchr::memchr2(b'"', b'\\', self.0.as_bytes())?;
        let (text, rest) = self.0.split_at(end);
        if !rest.starts_with('"') || text.bytes().fold(false, |control, b| control | (b < 0x20)) {
            return None;
        }
        self.0 = &rest[1..];
        Some(text)
    }

    /// A JSON unsigned integer: digits, no leading zero, fits in a u64.
    /// (Read digit by digit in one pass: `str::parse` after counting the
    /// digits read them twice and was a fifth of a line's time.)
    pub(crate) fn number(&mut self) -> Option<u64> {
        let bytes = self.0.as_bytes();
        let mut value: u64 = 0;
        let mut digits = 0;
        while let Some(&b) = bytes.get(digits) {
            if !b.is_ascii_digit() {
                break;
            }
            value = value.checked_mul(10)?.checked_add(u64::from(b - b'0'))?;
            digits += 1;
        }
        if digits == 0 || (digits > 1 && bytes[0] == b'0') {
            return None;
        }
        self.0 = &self.0[digits..];
        Some(value)
    }
}
