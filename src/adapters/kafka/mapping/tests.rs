//! The settings: every source kind and value, the defaults, and each
//! refusal with its text, as a config file gets it at load.

use super::*;
use crate::adapters::kafka::{KafkaOptions, RecordFormat};
use crate::config::Config;

fn mapping(text: &str) -> Result<Mapping, MappingError> {
    let settings: KafkaMapping = toml::from_str(text).unwrap_or_else(|e| panic!("{text}: {e}"));
    settings.compile()
}

fn field_path(text: &str, names: &[&str]) -> FieldPath {
    FieldPath { text: text.into(), names: names.iter().map(|n| n.to_string()).collect() }
}

/// Without any key: the record key is the stream, of `logs`; the value is
/// lines; no default stream, no run sources.
#[test]
fn the_defaults_read_keyed_lines_of_runs() {
    let defaults = KafkaMapping::default();
    assert_eq!(toml::from_str::<KafkaMapping>("").ok(), Some(defaults.clone()));
    let compiled = defaults.compile();
    assert_eq!(
        compiled,
        Ok(Mapping {
            namespace: "logs".into(),
            stream: Source::Key,
            default_stream: None,
            value: ValueShape::Lines,
            run: None,
        })
    );
    let options = KafkaOptions::default();
    assert_eq!(options.records, RecordFormat::Tailrace);
    assert_eq!(options.check(), Ok(()));
}

#[test]
fn every_source_and_value_kind_parses() {
    assert_eq!(mapping("stream = \"key\"\n").map(|m| m.stream), Ok(Source::Key));
    assert_eq!(mapping("stream = \"header:x-stream\"\n").map(|m| m.stream), Ok(Source::Header("x-stream".into())));
    let field = "stream = \"json-field:service\"\nvalue = \"json-field:message\"\n";
    assert_eq!(mapping(field).map(|m| m.stream), Ok(Source::Field(field_path("service", &["service"]))));
    let pointer = "stream = \"json-field:/kubernetes/labels/app~1name\"\nvalue = \"json-field:/log/m~0\"\n";
    let compiled = mapping(pointer).unwrap();
    assert_eq!(
        compiled.stream,
        Source::Field(field_path("/kubernetes/labels/app~1name", &["kubernetes", "labels", "app/name"]))
    );
    assert_eq!(compiled.value, ValueShape::Field(field_path("/log/m~0", &["log", "m~"])));
    assert_eq!(mapping("value = \"line\"\n").map(|m| m.value), Ok(ValueShape::Line));
    assert_eq!(mapping("value = \"lines\"\n").map(|m| m.value), Ok(ValueShape::Lines));
    let run = "pipeline = \"header:pipeline\"\nrun = \"json-field:run_id\"\nvalue = \"json-field:msg\"\n";
    assert_eq!(
        mapping(run).map(|m| m.run),
        Ok(Some((Source::Header("pipeline".into()), Source::Field(field_path("run_id", &["run_id"])))))
    );
    let default = "namespace = \"events\"\ndefault_stream = \"unkeyed\"\n";
    let compiled = mapping(default).unwrap();
    assert_eq!((compiled.namespace.as_str(), compiled.default_stream.as_deref()), ("events", Some("unkeyed")));
    assert_eq!(mapping("default_stream = \"svc.misc/unkeyed\"\n").map(|m| m.default_stream.is_some()), Ok(true));
}

/// Each refusal, with the text a config file gets at load.
#[test]
fn a_mapping_that_cannot_work_is_refused_saying_why() {
    let refused = |text: &str| match mapping(text) {
        Ok(compiled) => panic!("{text} was taken: {compiled:?}"),
        Err(error) => error.to_string(),
    };
    let cases: &[(&str, &str)] = &[
        (
            "stream = \"json-field:\"\n",
            "[adapters.kafka.mapping] stream = \"json-field:\": a json-field source needs a name (json-field:NAME)",
        ),
        ("stream = \"json-field\"\n", "a json-field source needs a name"),
        ("stream = \"header\"\n", "stream = \"header\": a header source needs a name (header:NAME)"),
        ("stream = \"header:\"\n", "a header source needs a name"),
        (
            "stream = \"partition\"\n",
            "stream = \"partition\" is not a source: write \"key\", \"header:NAME\" or \"json-field:NAME\"",
        ),
        ("stream = \"key:x\"\n", "stream = \"key:x\" is not a source"),
        ("value = \"json-field\"\n", "value = \"json-field\": a json-field source needs a name"),
        ("value = \"text\"\n", "value = \"text\" is not a value: write \"line\", \"lines\" or \"json-field:NAME\""),
        (
            "pipeline = \"key\"\nrun = \"header:run\"\n",
            "pipeline = \"key\": the record key is the stream's (it places the record on its partition)",
        ),
        ("pipeline = \"header:p\"\n", "pipeline is set but run is not: the two name a run together"),
        ("run = \"header:r\"\n", "run is set but pipeline is not"),
        (
            "stream = \"json-field:svc\"\n",
            "stream = \"json-field:svc\" is a field of the value's JSON, so value must be \"json-field:NAME\" too",
        ),
        (
            "pipeline = \"header:p\"\nrun = \"header:p\"\n",
            "pipeline and run both use the header `p`: each needs a place of its own",
        ),
        ("value = \"json-field:/a\"\nstream = \"json-field:/a/b\"\n", "value and stream both use the JSON field `/a`"),
        ("stream = \"header:tailrace-id\"\n", "stream: the header `tailrace-id` is tailrace's own (each event's id)"),
        ("value = \"json-field:/a~2\"\n", "value = \"json-field:/a~2\": `~` in a JSON pointer must be `~0` or `~1`"),
        ("namespace = \"\"\n", "[adapters.kafka.mapping] namespace must not be empty"),
        ("default_stream = \"\"\n", "default_stream = \"\": it is empty (leave it out for no default)"),
        (
            "default_stream = \"unkeyed\"\n",
            "default_stream = \"unkeyed\": a stream of `logs` is a run, `{pipeline}/{run}`: invalid log stream",
        ),
    ];
    for (text, expected) in cases {
        let error = refused(text);
        assert!(error.contains(expected), "{text}: {error}");
    }
}

/// At load: the file's name and the mapping's own words; a mapping while
/// `records` is tailrace's is refused (it would do nothing); a typo in a
/// key is refused by name.
#[test]
fn the_config_file_is_checked_at_load() {
    let load = |text: &str| Config::from_toml(text, "node.toml").map(|c| c.adapters.kafka);
    let kafka = load(
        "[adapters.kafka]\nrecords = \"mapped\"\n[adapters.kafka.mapping]\nstream = \"header:stream\"\n\
         default_stream = \"svc.misc/unkeyed\"\n",
    )
    .unwrap();
    assert_eq!(kafka.records, RecordFormat::Mapped);
    assert_eq!(kafka.mapping.stream, "header:stream");
    let error = load("[adapters.kafka]\nrecords = \"mapped\"\n[adapters.kafka.mapping]\nstream = \"json-field:\"\n")
        .unwrap_err()
        .to_string();
    assert_eq!(
        error,
        "invalid config node.toml: [adapters.kafka.mapping] stream = \"json-field:\": a json-field source needs a \
         name (json-field:NAME)"
    );
    let error = load("[adapters.kafka.mapping]\nvalue = \"line\"\n").unwrap_err().to_string();
    assert!(error.contains("is set, but records = \"tailrace\" reads tailrace's own records"), "{error}");
    let error = load("[adapters.kafka.mapping]\nstreem = \"key\"\n").unwrap_err().to_string();
    assert!(error.contains("streem"), "{error}");
    let error = load("[adapters.kafka]\nrecords = \"vector\"\n").unwrap_err().to_string();
    assert!(error.contains("tailrace") && error.contains("mapped"), "the spellings are listed: {error}");
}
