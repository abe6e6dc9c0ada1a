//! The format of a run's stream, in one place: what its events mean.
//! Producers (the edge's ingest, `tailrace pipelines`), the archiver and
//! the edge's tailer all read and write it through this module.
//!
//! - A run is the stream `logs/{fqn}/{runId}` ([`super::RunKey::stream`]).
//! - An event whose id starts with [`STATUS_ID_PREFIX`] sets the run's
//!   status to its payload ([`status_event`]); every other event carries
//!   log text, split into lines by [`lines_of`].
//! - Ids that start with [`RESERVED_ID_PREFIX`] are the runtime's own:
//!   producers may not use them ([`is_reserved`]).
//! - A container's [`batch_fingerprint`] (its events' ids, in order) lets a
//!   store drop a producer's retried batch.

use super::RunState;
use crate::stream::{Event, EventId};

/// Producer ids may not start with this: the run's stream uses such ids
/// for its own records (status changes).
pub const RESERVED_ID_PREFIX: &str = "tailrace:";

/// Whether a producer's `id` is one of the runtime's own (refused at ingest).
pub fn is_reserved(id: &str) -> bool {
    id.starts_with(RESERVED_ID_PREFIX)
}

/// Event ids that start with this carry a run's status change, not lines
/// (producers may not use it for their own ids; ingest refuses them).
pub const STATUS_ID_PREFIX: &str = "tailrace:status:";

/// The event that sets a run's status to `state`. Produced to the run's
/// stream like its lines, so the change is stored, and reaches viewers,
/// after every line produced before it.
pub fn status_event(state: RunState) -> Event {
    Event::new(EventId::new(format!("{STATUS_ID_PREFIX}{:016x}", rand::random::<u64>())), state.as_str())
}

/// Whether `event` is a status change (see [`status_event`]).
pub fn is_status(event: &Event) -> bool {
    event.id.as_str().starts_with(STATUS_ID_PREFIX)
}

/// What a container of a run's stream says: the texts of its line events,
/// in order, and the last status change it carries (a status event whose
/// payload is not a state is ignored).
pub struct Contents<'a> {
    /// One text per line event (each may hold several lines).
    pub texts: Vec<std::borrow::Cow<'a, str>>,
    /// The last status set.
    pub status: Option<RunState>,
}

impl<'a> Contents<'a> {
    /// Reads `events`.
    pub fn of(events: &'a [Event]) -> Self {
        let mut contents = Contents { texts: Vec::new(), status: None };
        for event in events {
            if is_status(event) {
                if let Some(state) = std::str::from_utf8(&event.payload).ok().and_then(RunState::parse) {
                    contents.status = Some(state);
                }
            } else {
                contents.texts.push(String::from_utf8_lossy(&event.payload));
            }
        }
        contents
    }

    /// The lines, in order: each text split at `\n` (a final newline ends
    /// the last line; a `\r` before a newline is dropped).
    pub fn lines(&self) -> impl Iterator<Item = &str> {
        self.texts.iter().flat_map(|t| lines_of(t))
    }
}

/// A container's fingerprint: a hash of its events' ids, in order. A
/// producer that retries a POST with the same ids (NDJSON `id`) sends the
/// same fingerprint; generated ids never repeat.
pub(crate) fn batch_fingerprint(events: &[Event]) -> u64 {
    let mut hasher = xxhash_rust::xxh3::Xxh3::new();
    for event in events {
        hasher.update(event.id.as_str().as_bytes());
        hasher.update(&[0]);
    }
    hasher.digest()
}

/// The log lines an event carries: its payload split at `\n` (a final
/// newline ends the last line; a `\r` before a newline is dropped). The
/// archiver and the SSE edge count offsets with this same function.
pub(crate) fn lines_of(text: &str) -> impl Iterator<Item = &str> {
    let text = text.strip_suffix('\n').unwrap_or(text);
    text.split('\n').map(|line| line.strip_suffix('\r').unwrap_or(line))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_events_are_reserved_and_read_back_in_order_with_lines() {
        let status = status_event(RunState::Success);
        assert!(is_status(&status) && is_reserved(status.id.as_str()));
        assert!(!is_reserved("e-1") && !is_reserved("tailrace"));
        let events = [Event::new("e-1", "one\ntwo\n"), status, Event::new("e-2", "three\r\n")];
        let contents = Contents::of(&events);
        assert_eq!(contents.lines().collect::<Vec<_>>(), ["one", "two", "three"]);
        assert_eq!(contents.status, Some(RunState::Success));
        let retried = [Event::new("e-1", "other text"), Event::new("e-2", "")];
        assert_eq!(batch_fingerprint(&events[..1]), batch_fingerprint(&retried[..1]), "ids, not payloads");
        assert_ne!(batch_fingerprint(&events), batch_fingerprint(&retried));
    }
}
