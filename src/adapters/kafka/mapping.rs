//! `[adapters.kafka.mapping]`: how a record that others write (`records =
//! "mapped"`) names its stream, its run and its lines, checked once at load
//! into a [`Mapping`] the adapter reads and writes records with (the
//! codec, `mapping/codec.rs`, is built with the `kafka` feature).
//!
//! A source is written as text: `"key"` (the record key), `"header:NAME"`
//! (a record header, by its exact name) or `"json-field:NAME"` (a field of
//! the value's JSON object: a top-level name, or a JSON pointer such as
//! `/kubernetes/labels/run` when it starts with `/`). A value is `"line"`,
//! `"lines"` or `"json-field:NAME"`.

#[cfg(feature = "kafka")]
mod codec;

use serde::{Deserialize, Serialize};

use crate::stream::{LOGS_NAMESPACE, RunKey, StreamId};

#[cfg(feature = "kafka")]
pub(super) use codec::{decode, encode};

/// The header in which tailrace writes each event's id (and reads it back).
pub(crate) const ID_HEADER: &str = "tailrace-id";

/// `[adapters.kafka.mapping]`: where a record's stream, run and lines are
/// (used with `records = "mapped"`). Every key is text; see
/// `docs/configuration.md`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct KafkaMapping {
    /// The namespace of the streams records name (`logs`: run logs, whose
    /// stream keys are `{pipeline}/{run}`).
    pub namespace: String,
    /// Where a record's stream (its key within `namespace`) is: `"key"`,
    /// `"header:NAME"` or `"json-field:NAME"`.
    pub stream: String,
    /// The stream of a record that names none (no key, header or field, or
    /// an empty one); unset, such a record is unreadable.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub default_stream: Option<String>,
    /// What a record's value holds: `"line"` (one event), `"lines"` (one
    /// event per line) or `"json-field:NAME"` (one event, that field's text).
    pub value: String,
    /// Where a record names its pipeline (`"header:NAME"` or
    /// `"json-field:NAME"`); with `run`, a record that names both is a line
    /// of that run's log, the stream (`logs`, `{pipeline}/{run}`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pipeline: Option<String>,
    /// Where a record names its run (with `pipeline`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub run: Option<String>,
}

impl Default for KafkaMapping {
    fn default() -> Self {
        Self {
            namespace: LOGS_NAMESPACE.into(),
            stream: "key".into(),
            default_stream: None,
            value: "lines".into(),
            pipeline: None,
            run: None,
        }
    }
}

/// A mapping that cannot be used, said with the key and the value at fault.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub(crate) enum MappingError {
    /// A `header` or `json-field` source without its name.
    #[error("[adapters.kafka.mapping] {key} = {value:?}: a {kind} source needs a name ({kind}:NAME)")]
    NoName { key: &'static str, value: String, kind: &'static str },
    /// Not one of the sources.
    #[error(
        "[adapters.kafka.mapping] {key} = {value:?} is not a source: write \"key\", \"header:NAME\" or \"json-field:NAME\""
    )]
    UnknownSource { key: &'static str, value: String },
    /// Not one of the values.
    #[error(
        "[adapters.kafka.mapping] value = {value:?} is not a value: write \"line\", \"lines\" or \"json-field:NAME\""
    )]
    UnknownValue { value: String },
    /// The record key named as the pipeline or the run.
    #[error(
        "[adapters.kafka.mapping] {key} = \"key\": the record key is the stream's (it places the record on its \
         partition), so the pipeline and the run come from a header or a JSON field"
    )]
    KeyNamesRun { key: &'static str },
    /// `pipeline` without `run`, or the other way round.
    #[error("[adapters.kafka.mapping] {given} is set but {missing} is not: the two name a run together")]
    HalfRun { given: &'static str, missing: &'static str },
    /// A JSON field read from a value that is not a JSON object.
    #[error(
        "[adapters.kafka.mapping] {key} = {value:?} is a field of the value's JSON, so value must be \
         \"json-field:NAME\" too (tailrace writes records with that field in the value's JSON object)"
    )]
    FieldOfText { key: &'static str, value: String },
    /// Two settings read (and would write) the same place.
    #[error("[adapters.kafka.mapping] {first} and {second} both use {place}: each needs a place of its own")]
    SharedPlace { first: &'static str, second: &'static str, place: String },
    /// A header tailrace keeps for itself.
    #[error("[adapters.kafka.mapping] {key}: the header `{ID_HEADER}` is tailrace's own (each event's id)")]
    ReservedHeader { key: &'static str },
    /// A JSON pointer that is not one.
    #[error("[adapters.kafka.mapping] {key} = {value:?}: `~` in a JSON pointer must be `~0` or `~1`")]
    BadPointer { key: &'static str, value: String },
    /// An empty namespace.
    #[error("[adapters.kafka.mapping] namespace must not be empty")]
    EmptyNamespace,
    /// A default stream that is no stream of the namespace.
    #[error("[adapters.kafka.mapping] default_stream = {value:?}: {reason}")]
    BadDefaultStream { value: String, reason: String },
    /// A mapping given while tailrace's own format is read.
    #[error(
        "[adapters.kafka.mapping] is set, but records = \"tailrace\" reads tailrace's own records: set \
         [adapters.kafka] records = \"mapped\" to use it"
    )]
    Unused,
}

/// Where a record names something.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Source {
    /// The record key.
    Key,
    /// The header of this exact name.
    Header(String),
    /// A field of the value's JSON object.
    Field(FieldPath),
}

/// A field of a JSON object: one top-level name, or the names of a JSON
/// pointer (objects only).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct FieldPath {
    /// As the setting wrote it.
    pub(crate) text: String,
    pub(crate) names: Vec<String>,
}

/// What a record's value holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum ValueShape {
    /// One event, the whole value.
    Line,
    /// One event per line.
    Lines,
    /// One event: that field's text.
    Field(FieldPath),
}

/// A checked `[adapters.kafka.mapping]`.
#[derive(Clone, Debug, PartialEq, Eq)]
#[cfg_attr(not(feature = "kafka"), allow(dead_code))]
pub(crate) struct Mapping {
    pub(crate) namespace: String,
    pub(crate) stream: Source,
    pub(crate) default_stream: Option<String>,
    pub(crate) value: ValueShape,
    /// The pipeline's and the run's sources.
    pub(crate) run: Option<(Source, Source)>,
}

impl KafkaMapping {
    /// Checks the settings; the mapping they describe.
    pub(crate) fn compile(&self) -> Result<Mapping, MappingError> {
        if self.namespace.is_empty() {
            return Err(MappingError::EmptyNamespace);
        }
        let stream = source("stream", &self.stream)?;
        let value = value(&self.value)?;
        let run = match (&self.pipeline, &self.run) {
            (Some(pipeline), Some(run)) => Some((run_source("pipeline", pipeline)?, run_source("run", run)?)),
            (None, None) => None,
            (Some(_), None) => return Err(MappingError::HalfRun { given: "pipeline", missing: "run" }),
            (None, Some(_)) => return Err(MappingError::HalfRun { given: "run", missing: "pipeline" }),
        };
        let default_stream = match &self.default_stream {
            Some(text) => Some(default_stream(&self.namespace, text)?),
            None => None,
        };
        let mapping = Mapping { namespace: self.namespace.clone(), stream, default_stream, value, run };
        mapping.check_places(self)?;
        Ok(mapping)
    }
}

impl Mapping {
    /// Each setting reads its own header or field (tailrace writes each
    /// there), and a field is read from a value that is a JSON object.
    fn check_places(&self, settings: &KafkaMapping) -> Result<(), MappingError> {
        let mut places: Vec<(&'static str, &Source, &str)> = vec![("stream", &self.stream, &settings.stream)];
        if let (Some((pipeline, run)), Some(p), Some(r)) = (&self.run, &settings.pipeline, &settings.run) {
            places.push(("pipeline", pipeline, p));
            places.push(("run", run, r));
        }
        for (key, source, text) in &places {
            match source {
                Source::Header(name) if name == ID_HEADER => return Err(MappingError::ReservedHeader { key }),
                Source::Field(_) if !matches!(self.value, ValueShape::Field(_)) => {
                    return Err(MappingError::FieldOfText { key, value: text.to_string() });
                }
                _ => {}
            }
        }
        let mut fields: Vec<(&'static str, &FieldPath)> = Vec::new();
        let mut headers: Vec<(&'static str, &str)> = Vec::new();
        if let ValueShape::Field(path) = &self.value {
            fields.push(("value", path));
        }
        for (key, source, _) in &places {
            match source {
                Source::Header(name) => {
                    if let Some((first, _)) = headers.iter().find(|(_, other)| other == name) {
                        let place = format!("the header `{name}`");
                        return Err(MappingError::SharedPlace { first, second: key, place });
                    }
                    headers.push((key, name));
                }
                Source::Field(path) => {
                    // One inside the other (`/a` and `/a/b`) cannot both be written.
                    let clash = fields.iter().find(|(_, other)| {
                        let n = other.names.len().min(path.names.len());
                        other.names[..n] == path.names[..n]
                    });
                    if let Some((first, other)) = clash {
                        let place = format!("the JSON field `{}`", other.text);
                        return Err(MappingError::SharedPlace { first, second: key, place });
                    }
                    fields.push((key, path));
                }
                Source::Key => {}
            }
        }
        Ok(())
    }
}

/// `stream`'s source.
fn source(key: &'static str, text: &str) -> Result<Source, MappingError> {
    let no_name = |kind| MappingError::NoName { key, value: text.into(), kind };
    match text.split_once(':') {
        None if text == "key" => Ok(Source::Key),
        None if text == "header" => Err(no_name("header")),
        None if text == "json-field" => Err(no_name("json-field")),
        Some(("header", "")) => Err(no_name("header")),
        Some(("header", name)) => Ok(Source::Header(name.into())),
        Some(("json-field", "")) => Err(no_name("json-field")),
        Some(("json-field", name)) => Ok(Source::Field(field(key, name)?)),
        _ => Err(MappingError::UnknownSource { key, value: text.into() }),
    }
}

/// `pipeline`'s or `run`'s source: not the key.
fn run_source(key: &'static str, text: &str) -> Result<Source, MappingError> {
    match source(key, text)? {
        Source::Key => Err(MappingError::KeyNamesRun { key }),
        other => Ok(other),
    }
}

fn value(text: &str) -> Result<ValueShape, MappingError> {
    let no_name = || MappingError::NoName { key: "value", value: text.into(), kind: "json-field" };
    match text {
        "line" => Ok(ValueShape::Line),
        "lines" => Ok(ValueShape::Lines),
        "json-field" | "json-field:" => Err(no_name()),
        _ => match text.strip_prefix("json-field:") {
            Some(name) => Ok(ValueShape::Field(field("value", name)?)),
            None => Err(MappingError::UnknownValue { value: text.into() }),
        },
    }
}

/// A field's name, or a JSON pointer (RFC 6901) when it starts with `/`.
fn field(key: &'static str, text: &str) -> Result<FieldPath, MappingError> {
    let Some(pointer) = text.strip_prefix('/') else {
        return Ok(FieldPath { text: text.into(), names: vec![text.into()] });
    };
    let mut names = Vec::new();
    for token in pointer.split('/') {
        let mut name = String::with_capacity(token.len());
        let mut chars = token.chars();
        while let Some(c) = chars.next() {
            if c != '~' {
                name.push(c);
                continue;
            }
            match chars.next() {
                Some('0') => name.push('~'),
                Some('1') => name.push('/'),
                _ => return Err(MappingError::BadPointer { key, value: format!("json-field:{text}") }),
            }
        }
        names.push(name);
    }
    Ok(FieldPath { text: text.into(), names })
}

/// The default stream's key: in `logs`, a run's (`{pipeline}/{run}`).
fn default_stream(namespace: &str, text: &str) -> Result<String, MappingError> {
    let bad = |reason: String| MappingError::BadDefaultStream { value: text.into(), reason };
    if text.is_empty() {
        return Err(bad("it is empty (leave it out for no default)".into()));
    }
    if namespace == LOGS_NAMESPACE {
        RunKey::from_stream(&StreamId::new(namespace, text))
            .map_err(|e| bad(format!("a stream of `{LOGS_NAMESPACE}` is a run, `{{pipeline}}/{{run}}`: {e}")))?;
    }
    Ok(text.into())
}

#[cfg(test)]
mod tests;
