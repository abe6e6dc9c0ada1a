//! What changes from one run of a pipeline to the next without meaning
//! anything: the normalisation rules a run diff applies to every line
//! before it compares two runs (`edge/diff.rs`).
//!
//! A line is first taken as a viewer sees it (`search::visible`: escape
//! sequences removed, the last `\r` state), then every span one of
//! [`RULES`] matches is replaced by `<rule>`: the two runs' lines are equal
//! when they differ only in such spans. The rules are one multi-pattern
//! regular expression (one pass of a lazy DFA over the line, which also
//! tells which rule matched); at a place where several could match, the
//! first in [`RULES`] wins. Each rule is named in the diff's answer and in
//! `docs/viewer.md`.

use std::borrow::Cow;
use std::sync::OnceLock;

use regex_automata::Input;
use regex_automata::meta::Regex;

use super::search::visible;

/// A calendar date and time of day: `2026-12-07`, `2026-12-07T12:04:31.207Z`,
/// `2026-12-07 12:04:31+01:00` (ISO 8601 / RFC 3339), or a clock time
/// alone, `12:04:31` or `12:04:31.207`.
const TIMESTAMP: &str = r"(?-u:\b)(?:[0-9]{4}-[0-9]{2}-[0-9]{2}(?:[T ][0-9]{1,2}:[0-9]{2}(?::[0-9]{2}(?:[.,][0-9]{1,9})?)?)?|[0-9]{1,2}:[0-9]{2}:[0-9]{2}(?:[.,][0-9]{1,9})?)(?:Z|[+-][0-9]{2}:?[0-9]{2})?";
/// `123e4567-e89b-12d3-a456-426614174000`.
const UUID: &str = r"(?-u:\b)[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}(?-u:\b)";
/// `1.23s`, `450ms`, `2m3s`, `1h 2m`, `3.2 seconds`, `12 ms`: numbers with
/// a unit of time (`m`, `h` and `d` only written right after the number).
const DURATION: &str = concat!(
    r"(?-u:\b)",
    r"[0-9]+(?:\.[0-9]+)?(?:\x20?(?:nanoseconds?|microseconds?|milliseconds?|seconds?|secs?|minutes?|mins?|hours?|hrs?|days?|ns|us|µs|ms|s)|[mhd])",
    r"(?:\x20?[0-9]+(?:\.[0-9]+)?(?:\x20?(?:nanoseconds?|microseconds?|milliseconds?|seconds?|secs?|minutes?|mins?|hours?|hrs?|days?|ns|us|µs|ms|s)|[mhd]))*",
    r"(?-u:\b)",
);
/// Hex ids and hashes: `0x` and hex digits, or a word of at least
/// [`MIN_HEX_DIGITS`] hex digits with at least one digit and one letter
/// (`9f86d08`, a commit; not `1234567` nor `deadbeef`, which could be
/// counts or words).
const HEX: &str = r"(?-u:\b)(?:0[xX][0-9a-fA-F]+|[0-9a-fA-F]*(?:[0-9][0-9a-fA-F]*[a-fA-F]|[a-fA-F][0-9a-fA-F]*[0-9])[0-9a-fA-F]*)(?-u:\b)";
/// Fewest hex digits of a hex id without `0x`.
const MIN_HEX_DIGITS: usize = 7;
/// A port after a host: an IPv4 address, `localhost`, a bracketed IPv6
/// address or the host of a URL (`scheme://host`), then `:` and 1 to 5
/// digits. Only the port is replaced (`127.0.0.1:<port>`).
const PORT: &str = r"(?:(?-u:\b)[0-9]{1,3}(?:\.[0-9]{1,3}){3}|(?-u:\b)localhost|\[[0-9a-fA-F:.]+\]|(?-u:\b)[a-zA-Z][a-zA-Z0-9+.-]*://(?:[^\s/@]*@)?[^\s/:@\[\]]+):[0-9]{1,5}(?-u:\b)";
/// A path in a temporary directory (`/tmp/…`, `/var/tmp/…`,
/// `/var/folders/…`, `/private/var/…`, `/private/tmp/…`), up to a space,
/// a quote or one of `:,;()[]<>|`; not inside a longer path (the
/// character before it, if any, is matched too and stays).
const TEMP_PATH: &str =
    r#"(?:^|[^A-Za-z0-9_./~-])(?:/tmp/|/var/tmp/|/var/folders/|/private/var/|/private/tmp/)[^\s"'`:,;()\[\]<>|]*"#;

/// The rules, by name, in the order they are tried at one place.
pub(crate) const RULES: [(&str, &str); 6] = [
    ("timestamp", TIMESTAMP),
    ("uuid", UUID),
    ("duration", DURATION),
    ("hex", HEX),
    ("port", PORT),
    ("temp-path", TEMP_PATH),
];

/// The rules' names, as the diff's answer lists them.
pub(crate) fn rule_names() -> Vec<&'static str> {
    RULES.iter().map(|(name, _)| *name).collect()
}

/// The rules as one regular expression: pattern `i` is rule `i`.
fn rules() -> &'static Regex {
    static RULES_REGEX: OnceLock<Regex> = OnceLock::new();
    RULES_REGEX.get_or_init(|| {
        let patterns: Vec<&str> = RULES.iter().map(|(_, p)| *p).collect();
        // The patterns are constants, checked by the tests below.
        Regex::new_many(&patterns).unwrap_or_else(|e| unreachable!("the normalisation rules: {e}"))
    })
}

/// The start of what is replaced of the span `[start, end)` of `text` that
/// rule `rule` matched, and the rule's name; `None` for a match the rule
/// then refuses (a short hex word).
fn replaced(text: &str, start: usize, end: usize, rule: usize) -> Option<(usize, &'static str)> {
    let name: &'static str = RULES.get(rule)?.0;
    let span = &text[start..end];
    match name {
        "hex" if !span.starts_with("0x") && !span.starts_with("0X") && span.len() < MIN_HEX_DIGITS => None,
        // The host stays: only what follows its last `:` is the port.
        "port" => span.rfind(':').map(|colon| (start + colon + 1, name)),
        // The character before the path stays.
        "temp-path" => span.find('/').map(|slash| (start + slash, name)),
        _ => Some((start, name)),
    }
}

/// `line` as a diff compares it: as a viewer sees it, every span a rule
/// matches replaced by `<rule>`.
pub(crate) fn normalise(line: &str) -> Cow<'_, str> {
    let text = visible(line);
    let regex = rules();
    let (mut out, mut copied, mut at) = (String::new(), 0, 0);
    while at < text.len() {
        let Some(found) = regex.find(Input::new(&*text).range(at..)) else { break };
        let (start, end) = (found.start(), found.end());
        if let Some((from, name)) = replaced(&text, start, end, found.pattern().as_usize()) {
            out.push_str(&text[copied..from]);
            out.push('<');
            out.push_str(name);
            out.push('>');
            copied = end;
        }
        // No rule matches an empty span; were one to, move on a character.
        at = if end > start { end } else { text[end..].chars().next().map_or(text.len(), |c| end + c.len_utf8()) };
    }
    if copied == 0 {
        return text;
    }
    out.push_str(&text[copied..]);
    Cow::Owned(out)
}

/// What the diff compares of `line`: the hash of [`normalise`]'s text.
pub(crate) fn line_hash(line: &str) -> u64 {
    xxhash_rust::xxh3::xxh3_64(normalise(line).as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn same(a: &str, b: &str) {
        assert_eq!(normalise(a), normalise(b), "{a:?} and {b:?} should compare equal");
    }

    fn differ(a: &str, b: &str) {
        assert_ne!(normalise(a), normalise(b), "{a:?} and {b:?} should differ");
    }

    #[test]
    fn each_rule_is_one_pattern() {
        assert_eq!(rules().pattern_len(), RULES.len());
    }

    #[test]
    fn timestamps() {
        assert_eq!(normalise("2026-12-07T12:04:31.207Z start"), "<timestamp> start");
        assert_eq!(normalise("[2026-12-07 12:04:31+01:00] ok"), "[<timestamp>] ok");
        assert_eq!(normalise("at 9:04:31.5 done"), "at <timestamp> done");
        assert_eq!(normalise("built on 2026-12-07"), "built on <timestamp>");
        same("12:00:01 step", "23:59:59 step");
        differ("12:00:01 step 1", "12:00:01 step 2");
        assert_eq!(normalise("ratio 12:30"), "ratio 12:30", "hh:mm alone is not a time");
    }

    #[test]
    fn durations() {
        for (line, expected) in [
            ("took 1.23s", "took <duration>"),
            ("took 450ms", "took <duration>"),
            ("took 2m3s", "took <duration>"),
            ("finished in 3.2 seconds", "finished in <duration>"),
            ("(12 ms)", "(<duration>)"),
            ("uptime 1h 2m", "uptime <duration>"),
        ] {
            assert_eq!(normalise(line), expected, "{line}");
        }
        for kept in ["Found 3 matches", "step 2 of 5", "v1.2", "3 d", "x86s"] {
            assert_eq!(normalise(kept), kept);
        }
    }

    #[test]
    fn uuids() {
        assert_eq!(normalise("job 123e4567-e89b-12d3-a456-426614174000 queued"), "job <uuid> queued");
        same("id=123E4567-E89B-12D3-A456-426614174000", "id=00000000-0000-0000-0000-000000000000");
    }

    #[test]
    fn hex_ids_and_hashes() {
        assert_eq!(normalise("commit 9f86d08 and sha256:9f86d081884c7d65"), "commit <hex> and sha256:<hex>");
        assert_eq!(normalise("pointer 0x7ffd5a2c"), "pointer <hex>");
        for kept in ["1234567 rows", "deadbeef", "a1b2c3", "cafe", "e2e tests"] {
            assert_eq!(normalise(kept), kept, "needs 7 hex digits, a digit and a letter");
        }
    }

    #[test]
    fn ports() {
        assert_eq!(normalise("listening on 127.0.0.1:43521"), "listening on 127.0.0.1:<port>");
        assert_eq!(normalise("GET http://localhost:8080/x"), "GET http://localhost:<port>/x");
        assert_eq!(normalise("connect [::1]:5432 ok"), "connect [::1]:<port> ok");
        assert_eq!(normalise("https://ci.example.org:8443/job"), "https://ci.example.org:<port>/job");
        assert_eq!(normalise("src/main.rs:12:5 error"), "src/main.rs:12:5 error", "a file and line stay");
    }

    #[test]
    fn temp_paths() {
        assert_eq!(normalise("wrote /tmp/.tmpA1b2/out.log, done"), "wrote <temp-path>, done");
        assert_eq!(normalise("cd /var/folders/xy/abc/T/t1"), "cd <temp-path>");
        assert_eq!(normalise("\"/private/var/x/y\""), "\"<temp-path>\"");
        assert_eq!(normalise("/home/u/tmp/file"), "/home/u/tmp/file", "not a temporary directory");
    }

    #[test]
    fn lines_are_compared_as_a_viewer_sees_them() {
        same("\x1b[32mINFO\x1b[0m ok", "INFO ok");
        same(" 10%\r100% done", "100% done");
        assert!(matches!(normalise("nothing changes here"), Cow::Borrowed(_)));
        assert_eq!(line_hash("took 3s"), line_hash("took 4.5s"));
        assert_ne!(line_hash("ok"), line_hash("failed"));
    }
}
