//! The SSE frames of the log stream: one unnamed event per frame, `data:`
//! carrying one compact JSON `LogStreamEvent`, no `id:`, no `retry:`.

use bytes::Bytes;
use serde::Serialize;

/// `TOO_MANY_RUNS`.
pub(crate) const TOO_MANY_RUNS: &str = "The server is already streaming the maximum number of pipeline runs. Retry shortly or use the paginated log endpoint.";
/// `TOO_MANY_VIEWERS`.
pub(crate) const TOO_MANY_VIEWERS: &str = "The server is already serving the maximum number of log stream connections. Retry shortly or use the paginated log endpoint.";
/// `idleTimeout`.
pub(crate) const IDLE_MESSAGE: &str = "No new logs for this run. Reconnect with the last cursor to resume.";
/// `maxDuration`.
pub(crate) const DURATION_MESSAGE: &str = "Stream lifetime limit reached. Reconnect with the last cursor to resume.";
/// `maxBytes`.
pub(crate) const BYTES_MESSAGE: &str = "Stream size limit reached. Download the full log to see the rest of this run.";

/// Why a stream completed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub(super) enum EndReason {
    /// The run finished (or never reported) and went quiet.
    RunFinished,
    /// No new lines for `max_idle_seconds`.
    IdleTimeout,
    /// The tailer lived `max_stream_seconds`.
    MaxDuration,
    /// The tailer published `max_stream_bytes`.
    MaxBytes,
}

impl EndReason {
    /// The `message` of its `complete` event (none for `runFinished`).
    pub(super) fn message(self) -> Option<&'static str> {
        match self {
            EndReason::RunFinished => None,
            EndReason::IdleTimeout => Some(IDLE_MESSAGE),
            EndReason::MaxDuration => Some(DURATION_MESSAGE),
            EndReason::MaxBytes => Some(BYTES_MESSAGE),
        }
    }
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct LogStreamEvent<'a> {
    event_type: &'static str,
    run_id: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    logs: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    after: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    replay: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    truncated: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    reason: Option<EndReason>,
    #[serde(skip_serializing_if = "Option::is_none")]
    message: Option<&'a str>,
}

fn frame(event: &LogStreamEvent<'_>) -> Bytes {
    let mut out = Vec::with_capacity(96 + event.logs.map_or(0, str::len));
    out.extend_from_slice(b"data: ");
    // Strings and numbers always serialise; JSON never holds a raw newline.
    let _ = serde_json::to_writer(&mut out, event);
    out.extend_from_slice(b"\n\n");
    Bytes::from(out)
}

/// `frame` as one HTTP/1.1 chunk: its size in hex, the frame, CRLF.
pub(super) fn chunk(frame: &[u8]) -> Bytes {
    use std::io::Write as _;
    let mut out = Vec::with_capacity(frame.len() + 12);
    // (Into the buffer: no string per frame.)
    let _ = write!(out, "{:x}\r\n", frame.len());
    out.extend_from_slice(frame);
    out.extend_from_slice(b"\r\n");
    Bytes::from(out)
}

/// The last chunk of a chunked response.
pub(super) const LAST_CHUNK: &[u8] = b"0\r\n\r\n";

/// A chunk of lines; `after` is the cursor just past it.
pub(super) fn logs(run_id: &str, lines: &str, after: u64, replay: bool) -> Bytes {
    frame(&LogStreamEvent {
        event_type: "logs",
        run_id,
        logs: Some(lines),
        after: Some(after.to_string()),
        replay: Some(replay),
        truncated: Some(false),
        reason: None,
        message: None,
    })
}

/// The truncation notice: reset the view, a replay follows. No `after`.
pub(super) fn truncated(run_id: &str) -> Bytes {
    frame(&LogStreamEvent {
        event_type: "logs",
        run_id,
        logs: Some(""),
        after: None,
        replay: Some(true),
        truncated: Some(true),
        reason: None,
        message: None,
    })
}

/// The end of the stream.
pub(super) fn complete(run_id: &str, after: Option<u64>, reason: EndReason) -> Bytes {
    frame(&LogStreamEvent {
        event_type: "complete",
        run_id,
        logs: None,
        after: after.map(|a| a.to_string()),
        replay: None,
        truncated: None,
        reason: Some(reason),
        message: reason.message(),
    })
}

/// A failure, then the stream closes.
pub(super) fn error(run_id: &str, message: &str) -> Bytes {
    frame(&LogStreamEvent {
        event_type: "error",
        run_id,
        logs: None,
        after: None,
        replay: None,
        truncated: None,
        reason: None,
        message: Some(message),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_are_byte_exact() {
        assert_eq!(
            &logs("r1", "a\nb", 2, false)[..],
            b"data: {\"eventType\":\"logs\",\"runId\":\"r1\",\"logs\":\"a\\nb\",\"after\":\"2\",\"replay\":false,\"truncated\":false}\n\n"
        );
        assert_eq!(
            &truncated("r1")[..],
            b"data: {\"eventType\":\"logs\",\"runId\":\"r1\",\"logs\":\"\",\"replay\":true,\"truncated\":true}\n\n"
        );
        assert_eq!(
            &complete("r1", Some(7), EndReason::RunFinished)[..],
            b"data: {\"eventType\":\"complete\",\"runId\":\"r1\",\"after\":\"7\",\"reason\":\"runFinished\"}\n\n"
        );
        let idle = String::from_utf8(complete("r1", None, EndReason::IdleTimeout).to_vec()).unwrap();
        assert!(idle.contains(
            r#""reason":"idleTimeout","message":"No new logs for this run. Reconnect with the last cursor to resume.""#
        ));
        assert!(!idle.contains("after"));
        assert_eq!(
            &error("r1", TOO_MANY_RUNS)[..],
            format!("data: {{\"eventType\":\"error\",\"runId\":\"r1\",\"message\":\"{TOO_MANY_RUNS}\"}}\n\n")
                .as_bytes()
        );
    }
}
