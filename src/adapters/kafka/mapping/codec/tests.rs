//! Records read and written as each kind of mapping says: the stream from
//! the key, a header, a JSON field or the run's pipeline and run, the
//! default stream, the value as a line, lines or a field; the refusals,
//! with their text; what tailrace writes reads back as its stream.

use std::collections::BTreeMap;

use super::*;
use crate::adapters::kafka::mapping::KafkaMapping;
use crate::adapters::kafka::records::{Reason, Records};
use crate::archive::{RunState, is_status, status_event};
use crate::queue::QueueMapper;
use crate::stream::{QueueId, SequenceToken};

fn mapping(text: &str) -> Mapping {
    let settings: KafkaMapping = toml::from_str(text).unwrap_or_else(|e| panic!("{text}: {e}"));
    settings.compile().unwrap_or_else(|e| panic!("{text}: {e}"))
}

fn record(key: Option<&str>, headers: &[(&str, &str)], value: Option<&str>) -> Fetched {
    Fetched {
        key: key.map(|k| k.as_bytes().to_vec()),
        value: value.map(|v| Bytes::from(v.to_string())),
        headers: headers.iter().map(|(k, v)| (k.to_string(), v.as_bytes().to_vec())).collect(),
        timestamp_ms: 1_700_000_000_000,
    }
}

fn read(mapping: &Mapping, record: &Fetched) -> Result<BatchContainer, String> {
    decode(mapping, 2, 40, record, &mut StreamIdCache::default())
}

/// (stream, [(id, payload)]) of what a record reads as.
fn seen(mapping: &Mapping, record: &Fetched) -> (String, Vec<(String, String)>) {
    let container = read(mapping, record).unwrap_or_else(|e| panic!("unreadable: {e}"));
    let events =
        container.events.iter().map(|e| (e.id.to_string(), String::from_utf8_lossy(&e.payload).into_owned())).collect();
    (container.stream.to_string(), events)
}

fn pairs(items: &[(&str, &str)]) -> Vec<(String, String)> {
    items.iter().map(|(a, b)| (a.to_string(), b.to_string())).collect()
}

#[test]
fn the_key_names_the_stream_and_the_value_is_lines() {
    let m = mapping("");
    let container = read(&m, &record(Some("svc.a/r-1"), &[], Some("one\r\ntwo\n"))).unwrap();
    assert_eq!(container.token, SequenceToken::new(40, 0), "the offset is the token");
    assert!(container.events.iter().all(|e| e.timestamp_ms == 1_700_000_000_000), "the record's timestamp");
    assert_eq!(
        seen(&m, &record(Some("svc.a/r-1"), &[], Some("one\r\ntwo\n"))),
        ("logs/svc.a/r-1".into(), pairs(&[("2@40#0", "one"), ("2@40#1", "two")]))
    );
    assert_eq!(seen(&m, &record(Some("svc.a/r-1"), &[], Some(""))).1, pairs(&[("2@40", "")]), "one empty line");
    let named = record(Some("svc.a/r-1"), &[("tailrace-id", "e-7")], Some("only"));
    assert_eq!(seen(&m, &named).1, pairs(&[("e-7", "only")]), "tailrace's id header is the event's id");
}

#[test]
fn a_line_is_the_whole_value() {
    let m = mapping("value = \"line\"\n");
    assert_eq!(seen(&m, &record(Some("svc.a/r-1"), &[], Some("a\nb"))).1, pairs(&[("2@40", "a\nb")]));
}

#[test]
fn a_header_names_the_stream_and_the_default_stream_takes_the_rest() {
    let m = mapping("namespace = \"events\"\nstream = \"header:x-stream\"\ndefault_stream = \"misc\"\n");
    assert_eq!(seen(&m, &record(None, &[("x-stream", "orders")], Some("a"))).0, "events/orders");
    assert_eq!(seen(&m, &record(Some("k"), &[], Some("a"))).0, "events/misc", "no header: the default");
    assert_eq!(seen(&m, &record(None, &[("x-stream", "")], Some("a"))).0, "events/misc", "an empty one too");
    let strict = mapping("namespace = \"events\"\nstream = \"header:x-stream\"\n");
    assert_eq!(
        read(&strict, &record(Some("k"), &[], Some("a"))).unwrap_err(),
        "it names no stream (the header `x-stream` is missing) and no default_stream is set"
    );
    let bytes = Fetched { headers: BTreeMap::from([("x-stream".into(), vec![0xff])]), ..record(None, &[], Some("a")) };
    assert_eq!(read(&strict, &bytes).unwrap_err(), "the header `x-stream` is not UTF-8");
}

#[test]
fn json_fields_name_the_stream_and_hold_the_text() {
    let m = mapping("namespace = \"events\"\nstream = \"json-field:/k8s/app\"\nvalue = \"json-field:message\"\n");
    let value = r#"{"k8s":{"app":"web"},"message":"GET / 200\nsecond"}"#;
    assert_eq!(
        seen(&m, &record(None, &[], Some(value))),
        ("events/web".into(), pairs(&[("2@40", "GET / 200\nsecond")]))
    );
    let number = r#"{"k8s":{"app":7},"message":42}"#;
    assert_eq!(seen(&m, &record(None, &[], Some(number))), ("events/7".into(), pairs(&[("2@40", "42")])));
    let refusals = [
        (r#"{"k8s":{"app":"web"}}"#, "the JSON field `message` is missing"),
        (r#"{"k8s":{"app":"web"},"message":null}"#, "the JSON field `message` is missing"),
        (r#"{"k8s":{"app":"web"},"message":["a"]}"#, "the JSON field `message` is neither text nor a number"),
        (r#"{"k8s":{"app":true},"message":"m"}"#, "the JSON field `/k8s/app` is neither text nor a number"),
        (
            r#"{"message":"m"}"#,
            "it names no stream (the JSON field `/k8s/app` is missing) and no default_stream is set",
        ),
        (r#"["a"]"#, "its value is JSON but not an object"),
        ("plain text", "its value is not a JSON object: expected value at line 1 column 1"),
    ];
    for (value, expected) in refusals {
        assert_eq!(read(&m, &record(None, &[], Some(value))).unwrap_err(), expected, "{value}");
    }
}

#[test]
fn the_pipeline_and_run_name_the_runs_stream() {
    let m = mapping("pipeline = \"header:pipeline\"\nrun = \"header:run\"\n");
    let both = record(None, &[("pipeline", "svc.etl"), ("run", "r-9")], Some("x"));
    assert_eq!(seen(&m, &both).0, "logs/svc.etl/r-9");
    assert_eq!(seen(&m, &record(Some("svc.b/r-1"), &[], Some("x"))).0, "logs/svc.b/r-1", "neither: the key");
    let half = record(Some("svc.b/r-1"), &[("pipeline", "svc.etl")], Some("x"));
    assert_eq!(read(&m, &half).unwrap_err(), "it names its pipeline but not its run (the header `run` is missing)");
    let half = record(None, &[("run", "r-9")], Some("x"));
    assert_eq!(
        read(&m, &half).unwrap_err(),
        "it names its run but not its pipeline (the header `pipeline` is missing)"
    );
    let slash = record(None, &[("pipeline", "svc.etl"), ("run", "a/b")], Some("x"));
    assert_eq!(read(&m, &slash).unwrap_err(), "it names no run: invalid run id `a/b`: it contains a slash");
    let fields = mapping("pipeline = \"json-field:pipeline\"\nrun = \"json-field:run\"\nvalue = \"json-field:log\"\n");
    let value = r#"{"pipeline":"svc.etl","run":123,"log":"started"}"#;
    assert_eq!(
        seen(&fields, &record(None, &[], Some(value))),
        ("logs/svc.etl/123".into(), pairs(&[("2@40", "started")]))
    );
}

#[test]
fn a_record_that_names_no_run_of_logs_or_holds_no_value_is_unreadable() {
    let m = mapping("");
    assert_eq!(
        read(&m, &record(Some("web-1"), &[], Some("x"))).unwrap_err(),
        "stream `logs/web-1` is no run: invalid log stream `logs/web-1`: its key is not `{fqn}/{runId}`"
    );
    assert_eq!(read(&m, &record(Some("svc.a/r-1"), &[], None)).unwrap_err(), "it has no value (a tombstone)");
    assert_eq!(
        read(&m, &record(None, &[], Some("x"))).unwrap_err(),
        "it names no stream (the record key is missing) and no default_stream is set"
    );
    let key = Fetched { key: Some(vec![0xc3]), ..record(None, &[], Some("x")) };
    assert_eq!(read(&m, &key).unwrap_err(), "the record key is not UTF-8");
}

/// What tailrace writes in each mapping is read back as the same stream
/// and events (ids and a status change included), keyed by the stream's key.
#[test]
fn what_tailrace_writes_reads_back_in_every_mapping() {
    let run = crate::archive::RunKey::new("svc.etl", "r-1").unwrap().stream();
    let events = vec![Event::new("e-1", "first line"), Event::new("e-2", "second"), status_event(RunState::Success)];
    let cases = [
        ("", &run),
        ("value = \"line\"\n", &run),
        ("stream = \"header:stream\"\n", &run),
        ("stream = \"json-field:/meta/stream\"\nvalue = \"json-field:message\"\n", &run),
        ("pipeline = \"header:pipeline\"\nrun = \"header:run\"\n", &run),
        ("pipeline = \"json-field:p\"\nrun = \"json-field:/r/id\"\nvalue = \"json-field:/log/text\"\n", &run),
    ];
    for (text, stream) in cases {
        let m = mapping(text);
        let records = encode(&m, stream, &events).unwrap_or_else(|e| panic!("{text}: {e}"));
        assert_eq!(records.len(), 3, "{text}: one record per event");
        for (record, event) in records.into_iter().zip(&events) {
            assert_eq!(record.key.as_deref(), Some("svc.etl/r-1".as_bytes()), "{text}: keyed by the stream's key");
            let container = read(&m, &Fetched::from(record)).unwrap_or_else(|e| panic!("{text}: {e}"));
            assert_eq!(&container.stream, stream, "{text}");
            assert_eq!(container.events.len(), 1, "{text}");
            assert_eq!((&container.events[0].id, &container.events[0].payload), (&event.id, &event.payload), "{text}");
        }
    }
    let m = mapping("pipeline = \"header:pipeline\"\nrun = \"header:run\"\n");
    let records = encode(&m, &run, &events[2..]).unwrap();
    let status = read(&m, &Fetched::from(records[0].clone())).unwrap();
    assert!(is_status(&status.events[0]), "a status change stays one");
    assert_eq!(records[0].headers.get("pipeline").map(Vec::as_slice), Some("svc.etl".as_bytes()));
    let other = mapping("namespace = \"events\"\nstream = \"header:s\"\n");
    let orders = StreamId::new("events", "orders");
    let written = encode(&other, &orders, &events[..1]).unwrap();
    assert_eq!(written[0].headers.get("s").map(Vec::as_slice), Some("orders".as_bytes()));
}

#[test]
fn a_stream_the_mapping_cannot_write_is_refused_saying_why() {
    let m = mapping("");
    let events = vec![Event::new("e-1", "x")];
    assert_eq!(
        encode(&m, &StreamId::new("orders", "42"), &events).unwrap_err(),
        "stream `orders/42` is not of namespace `logs`, the one [adapters.kafka.mapping] writes"
    );
    assert_eq!(
        encode(&m, &StreamId::new("logs", "no-run"), &events).unwrap_err(),
        "a record of stream `logs/no-run` would not read back: stream `logs/no-run` is no run: invalid log stream \
         `logs/no-run`: its key is not `{fqn}/{runId}`"
    );
    let json = mapping("value = \"json-field:message\"\n");
    let binary = vec![Event::new("e-1", vec![0xffu8, 0])];
    assert_eq!(
        encode(&json, &StreamId::new("logs", "a/b"), &binary).unwrap_err(),
        "event `e-1` is not UTF-8 text, which value = \"json-field:message\" holds"
    );
}

/// A record of a stream another partition holds is not delivered from
/// this one: it would reach the stream's subscribers out of order with
/// that partition's records, or not at all.
#[test]
fn a_misplaced_record_is_unreadable_naming_its_partition() {
    let records = Records::Mapped(Box::new(mapping("")));
    let mapper = QueueMapper::kafka_keys(3);
    let at = |key: &str, offset| rskafka::record::RecordAndOffset {
        record: Record {
            key: Some(key.as_bytes().to_vec()),
            value: Some(b"x".to_vec()),
            headers: BTreeMap::new(),
            timestamp: connect::timestamp(0),
        },
        offset,
    };
    // murmur2("svc.a/r-1") % 3 == 0, as kafka-python places it.
    let home = records.decode(QueueId(0), mapper, at("svc.a/r-1", 5), &mut StreamIdCache::default());
    assert_eq!(home.map(|c| c.stream.to_string()).ok().as_deref(), Some("logs/svc.a/r-1"));
    let Err(misplaced) = records.decode(QueueId(1), mapper, at("svc.a/r-1", 6), &mut StreamIdCache::default()) else {
        panic!("a misplaced record was read");
    };
    assert_eq!((misplaced.offset, misplaced.reason), (6, Reason::Misplaced));
    assert_eq!(misplaced.stream.map(|s| s.to_string()).as_deref(), Some("logs/svc.a/r-1"));
    assert_eq!(
        misplaced.error,
        "its stream `logs/svc.a/r-1` is read from partition 0, where Kafka's default partitioner puts a record keyed \
         `svc.a/r-1`, not from partition 1: key the stream's records so, or give the topic one partition"
    );
    let Err(garbage) =
        Records::Tailrace.decode(QueueId(0), QueueMapper::new(1), at("k", 7), &mut StreamIdCache::default())
    else {
        panic!("garbage was read as a container");
    };
    assert_eq!(garbage.reason, Reason::Format);
    assert!(garbage.error.starts_with("entry 7-0: "), "{}", garbage.error);
}
