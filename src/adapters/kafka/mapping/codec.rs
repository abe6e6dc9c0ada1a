//! Mapped records read and written: a record (key, headers, value) as a
//! container of its stream, and a batch as records, as the [`Mapping`]
//! says. A record tailrace writes reads back as the stream it was written
//! for; one that names no stream, or no readable one, is refused with why.

use bytes::Bytes;
use rskafka::record::Record;
use serde_json::{Map, Value};

use super::{FieldPath, ID_HEADER, Mapping, Source, ValueShape};
use crate::adapters::kafka::connect;
use crate::adapters::kafka::records::Fetched;
use crate::stream::{BatchContainer, Event, EventId, LOGS_NAMESPACE, RunKey, StreamId, StreamIdCache};

/// Longest event id read from a record's `tailrace-id` header (the edge's
/// limit for a producer's id).
const MAX_ID_BYTES: usize = 256;

/// The container of the record at `offset` of `partition`, or why it
/// cannot be read.
pub(in crate::adapters::kafka) fn decode(
    mapping: &Mapping,
    partition: u32,
    offset: i64,
    record: &Fetched,
    streams: &mut StreamIdCache,
) -> Result<BatchContainer, String> {
    let value = record.value.as_ref().ok_or("it has no value (a tombstone)")?;
    let json = if uses_json(mapping) { Some(object(value)?) } else { None };
    let found = Found { key: record.key.as_deref(), headers: &record.headers, json: json.as_ref() };
    let (namespace, stream_key) = found.stream(mapping)?;
    let base_id = match record.headers.get(ID_HEADER).and_then(|id| std::str::from_utf8(id).ok()) {
        Some(id) if !id.is_empty() && id.len() <= MAX_ID_BYTES => id.to_string(),
        _ => format!("{partition}@{offset}"),
    };
    let event = |id: String, payload: Bytes| Event { id: EventId::new(id), timestamp_ms: record.timestamp_ms, payload };
    let events = match &mapping.value {
        ValueShape::Line => vec![event(base_id, value.clone())],
        ValueShape::Lines => {
            let lines = lines_of(value);
            let many = lines.len() > 1;
            let id = |i: usize| if many { format!("{base_id}#{i}") } else { base_id.clone() };
            lines.into_iter().enumerate().map(|(i, line)| event(id(i), value.slice(line))).collect()
        }
        ValueShape::Field(path) => {
            let text = match json.as_ref().and_then(|json| get(json, path)) {
                Some(Value::String(text)) => text.clone(),
                Some(Value::Number(n)) => n.to_string(),
                None | Some(Value::Null) => return Err(format!("the JSON field `{}` is missing", path.text)),
                Some(_) => return Err(format!("the JSON field `{}` is neither text nor a number", path.text)),
            };
            vec![event(base_id, Bytes::from(text))]
        }
    };
    Ok(BatchContainer { stream: streams.get(namespace, &stream_key), token: connect::token(offset), events })
}

/// `events` of `stream` as records (one per event, keyed by the stream's
/// key, the event's id in the `tailrace-id` header), or why this mapping
/// cannot write them.
pub(in crate::adapters::kafka) fn encode(
    mapping: &Mapping,
    stream: &StreamId,
    events: &[Event],
) -> Result<Vec<Record>, String> {
    let mut headers = std::collections::BTreeMap::new();
    let mut fields = Vec::new();
    let mut put = |source: &Source, text: &str| match source {
        Source::Key => {}
        Source::Header(name) => drop(headers.insert(name.clone(), text.as_bytes().to_vec())),
        Source::Field(path) => fields.push((path.clone(), text.to_string())),
    };
    match (&mapping.run, RunKey::from_stream(stream)) {
        (Some((pipeline, run)), Ok(key)) => {
            put(pipeline, key.fqn());
            put(run, key.run());
        }
        _ if stream.namespace() != mapping.namespace => {
            return Err(format!(
                "stream `{stream}` is not of namespace `{}`, the one [adapters.kafka.mapping] writes",
                mapping.namespace
            ));
        }
        _ => put(&mapping.stream, stream.key()),
    }
    let mut records = Vec::with_capacity(events.len());
    for event in events {
        let mut headers = headers.clone();
        headers.insert(ID_HEADER.to_string(), event.id.as_str().as_bytes().to_vec());
        let value = match &mapping.value {
            ValueShape::Line | ValueShape::Lines => event.payload.to_vec(),
            ValueShape::Field(path) => {
                let text = std::str::from_utf8(&event.payload).map_err(|_| {
                    format!("event `{}` is not UTF-8 text, which value = \"json-field:{}\" holds", event.id, path.text)
                })?;
                let mut object = Map::new();
                set(&mut object, path, text);
                for (path, text) in &fields {
                    set(&mut object, path, text);
                }
                serde_json::to_vec(&object).map_err(|e| e.to_string())?
            }
        };
        records.push(Record {
            key: Some(stream.key().as_bytes().to_vec()),
            value: Some(value),
            headers,
            timestamp: connect::timestamp(event.timestamp_ms),
        });
    }
    // What is written must read back as its stream.
    if let Some(first) = records.first() {
        let read = decode(mapping, 0, 0, &Fetched::from(first.clone()), &mut StreamIdCache::default())
            .map_err(|e| format!("a record of stream `{stream}` would not read back: {e}"))?;
        if &read.stream != stream {
            return Err(format!("a record of stream `{stream}` would read back as stream `{}`", read.stream));
        }
    }
    Ok(records)
}

/// Whether any setting reads the value's JSON.
fn uses_json(mapping: &Mapping) -> bool {
    let field = |s: &Source| matches!(s, Source::Field(_));
    matches!(mapping.value, ValueShape::Field(_))
        || field(&mapping.stream)
        || mapping.run.as_ref().is_some_and(|(p, r)| field(p) || field(r))
}

fn object(value: &[u8]) -> Result<Value, String> {
    match serde_json::from_slice::<Value>(value) {
        Ok(json) if json.is_object() => Ok(json),
        Ok(_) => Err("its value is JSON but not an object".into()),
        Err(e) => Err(format!("its value is not a JSON object: {e}")),
    }
}

/// What a record holds, looked up by source.
struct Found<'a> {
    key: Option<&'a [u8]>,
    headers: &'a std::collections::BTreeMap<String, Vec<u8>>,
    json: Option<&'a Value>,
}

impl Found<'_> {
    /// The text at `source`: `None` when it is absent, null or empty.
    fn text(&self, source: &Source) -> Result<Option<String>, String> {
        let utf8 = |bytes: &[u8]| {
            std::str::from_utf8(bytes).map(str::to_string).map_err(|_| format!("{} is not UTF-8", described(source)))
        };
        let text = match source {
            Source::Key => self.key.map(utf8).transpose()?,
            Source::Header(name) => self.headers.get(name).map(|v| utf8(v)).transpose()?,
            Source::Field(path) => match self.json.and_then(|json| get(json, path)) {
                None | Some(Value::Null) => None,
                Some(Value::String(text)) => Some(text.clone()),
                Some(Value::Number(n)) => Some(n.to_string()),
                Some(_) => return Err(format!("{} is neither text nor a number", described(source))),
            },
        };
        Ok(text.filter(|t| !t.is_empty()))
    }

    /// The record's stream: its run's (pipeline and run both named), else
    /// what `stream` names, else `default_stream`.
    fn stream<'m>(&self, mapping: &'m Mapping) -> Result<(&'m str, String), String> {
        if let Some((pipeline, run)) = &mapping.run {
            match (self.text(pipeline)?, self.text(run)?) {
                (Some(p), Some(r)) => {
                    let key = RunKey::new(&p, &r).map_err(|e| format!("it names no run: {e}"))?;
                    return Ok((LOGS_NAMESPACE, key.stream().key().to_string()));
                }
                (None, None) => {}
                (Some(_), None) => {
                    return Err(format!("it names its pipeline but not its run ({} is missing)", described(run)));
                }
                (None, Some(_)) => {
                    return Err(format!("it names its run but not its pipeline ({} is missing)", described(pipeline)));
                }
            }
        }
        let key = match (self.text(&mapping.stream)?, &mapping.default_stream) {
            (Some(key), _) => key,
            (None, Some(default)) => default.clone(),
            (None, None) => {
                return Err(format!(
                    "it names no stream ({} is missing) and no default_stream is set",
                    described(&mapping.stream)
                ));
            }
        };
        let namespace = mapping.namespace.as_str();
        if namespace == LOGS_NAMESPACE {
            RunKey::from_stream(&StreamId::new(namespace, &key))
                .map_err(|e| format!("stream `{namespace}/{key}` is no run: {e}"))?;
        }
        Ok((namespace, key))
    }
}

/// How a message names `source`.
fn described(source: &Source) -> String {
    match source {
        Source::Key => "the record key".into(),
        Source::Header(name) => format!("the header `{name}`"),
        Source::Field(path) => format!("the JSON field `{}`", path.text),
    }
}

/// The value at `path` (objects only).
fn get<'a>(json: &'a Value, path: &FieldPath) -> Option<&'a Value> {
    path.names.iter().try_fold(json, |at, name| at.as_object()?.get(name))
}

/// Sets `path` to `text`, making the objects on the way.
fn set(object: &mut Map<String, Value>, path: &FieldPath, text: &str) {
    let Some((last, parents)) = path.names.split_last() else { return };
    let mut at = object;
    for name in parents {
        let slot = at.entry(name.clone()).or_insert_with(|| Value::Object(Map::new()));
        if !slot.is_object() {
            *slot = Value::Object(Map::new());
        }
        let Value::Object(inner) = slot else { return };
        at = inner;
    }
    at.insert(last.clone(), Value::String(text.to_string()));
}

/// The byte ranges of the lines of `value`, as the run log counts them: a
/// final newline ends the last line, a `\r` before a newline is dropped.
fn lines_of(value: &[u8]) -> Vec<std::ops::Range<usize>> {
    let end = value.strip_suffix(b"\n").map_or(value.len(), <[u8]>::len);
    let mut lines = Vec::new();
    let mut start = 0;
    for line in value[..end].split(|&b| b == b'\n') {
        let len = line.strip_suffix(b"\r").map_or(line.len(), <[u8]>::len);
        lines.push(start..start + len);
        start += line.len() + 1;
    }
    lines
}

#[cfg(test)]
mod tests;
