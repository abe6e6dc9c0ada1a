//! The topic's records as containers and back, in the format `records`
//! names: tailrace's own (one record per batch, its value the batch's
//! JSON, its key the stream), or `mapped` ([`super::mapping`]: one record
//! per event, its stream where the mapping says, on the partition Kafka's
//! default partitioner gives the stream's key). A record that is not a
//! container of the partition it was read from is [`Unreadable`].

use std::collections::BTreeMap;

use bytes::Bytes;
use rskafka::record::{Record, RecordAndOffset};

use super::mapping::{self, Mapping};
use super::{KafkaOptions, RecordFormat, connect};
use crate::adapters::entry::{decode_entry, encode_entry};
use crate::queue::{QueueError, QueueMapper};
use crate::stream::{BatchContainer, Event, QueueId, StreamId, StreamIdCache};

/// The format the topic's records are read and written in.
pub(super) enum Records {
    /// tailrace's batch containers.
    Tailrace,
    /// Records others write, as the mapping says.
    Mapped(Box<Mapping>),
}

/// A fetched record; its value is shared with the events read from it.
pub(super) struct Fetched {
    pub(super) key: Option<Vec<u8>>,
    pub(super) value: Option<Bytes>,
    pub(super) headers: BTreeMap<String, Vec<u8>>,
    /// The record's timestamp, in ms since the Unix epoch (0 before it).
    pub(super) timestamp_ms: u64,
}

impl From<Record> for Fetched {
    fn from(record: Record) -> Self {
        Self {
            key: record.key,
            value: record.value.map(Bytes::from),
            headers: record.headers,
            timestamp_ms: u64::try_from(record.timestamp.timestamp_millis()).unwrap_or(0),
        }
    }
}

/// A record that is not a container of its partition, and why.
pub(super) struct Unreadable {
    pub(super) offset: i64,
    pub(super) reason: Reason,
    pub(super) error: String,
    /// Its stream, when it names one (a misplaced record).
    pub(super) stream: Option<StreamId>,
    pub(super) record: Fetched,
}

/// Why a record is unreadable (the metric's `reason`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Reason {
    /// It does not read as the format says.
    Format,
    /// Its stream is read from another partition.
    Misplaced,
}

impl Reason {
    pub(super) fn as_str(self) -> &'static str {
        match self {
            Reason::Format => "format",
            Reason::Misplaced => "misplaced",
        }
    }
}

impl Records {
    /// The format `options` name, checked.
    pub(super) fn new(options: &KafkaOptions) -> Result<Self, QueueError> {
        options.check().map_err(|e| QueueError::Config(e.to_string()))?;
        Ok(match options.records {
            RecordFormat::Tailrace => Records::Tailrace,
            RecordFormat::Mapped => {
                Records::Mapped(Box::new(options.mapping.compile().map_err(|e| QueueError::Config(e.to_string()))?))
            }
        })
    }

    /// Which queue (partition) holds a stream: tailrace's own mapping, or
    /// Kafka's default partitioner on the stream's key for mapped records.
    pub(super) fn mapper(&self, queue_count: u32) -> QueueMapper {
        match self {
            Records::Tailrace => QueueMapper::new(queue_count),
            Records::Mapped(_) => QueueMapper::kafka_keys(queue_count),
        }
    }

    /// `events` of `stream` as the records to produce, and their size as
    /// `max_record_bytes` counts it (tailrace's: the value; mapped: keys,
    /// values and headers).
    pub(super) fn encode(&self, stream: &StreamId, events: &[Event]) -> Result<(Vec<Record>, usize), QueueError> {
        match self {
            Records::Tailrace => {
                let value = encode_entry(stream, events);
                let bytes = value.len();
                let record = Record {
                    key: Some(stream.to_string().into_bytes()),
                    value: Some(value),
                    headers: BTreeMap::new(),
                    timestamp: connect::timestamp(crate::stream::now_ms()),
                };
                Ok((vec![record], bytes))
            }
            Records::Mapped(mapping) => {
                let records = mapping::encode(mapping, stream, events)
                    .map_err(|e| QueueError::Config(format!("[adapters.kafka.mapping] {e}")))?;
                let size = |r: &Record| {
                    let headers: usize = r.headers.iter().map(|(k, v)| k.len() + v.len()).sum();
                    r.key.as_ref().map_or(0, Vec::len) + r.value.as_ref().map_or(0, Vec::len) + headers
                };
                let bytes = records.iter().map(size).sum();
                Ok((records, bytes))
            }
        }
    }

    /// The container the record at its offset of `queue`'s partition holds.
    pub(super) fn decode(
        &self,
        queue: QueueId,
        mapper: QueueMapper,
        fetched: RecordAndOffset,
        streams: &mut StreamIdCache,
    ) -> Result<BatchContainer, Box<Unreadable>> {
        let (offset, record) = (fetched.offset, Fetched::from(fetched.record));
        let decoded = match self {
            Records::Tailrace => match &record.value {
                Some(value) => decode_entry(connect::token(offset), value.clone(), streams),
                None => Err("it has no value (a tombstone)".into()),
            },
            Records::Mapped(mapping) => mapping::decode(mapping, queue.0, offset, &record, streams),
        };
        let container = match decoded {
            Ok(container) => container,
            Err(error) => {
                return Err(Box::new(Unreadable { offset, reason: Reason::Format, error, stream: None, record }));
            }
        };
        let home = mapper.queue_for(&container.stream);
        if matches!(self, Records::Mapped(_)) && home != queue {
            let stream = container.stream;
            let error = format!(
                "its stream `{stream}` is read from partition {home}, where Kafka's default partitioner puts a \
                 record keyed `{}`, not from partition {queue}: key the stream's records so, or give the topic one \
                 partition",
                stream.key(),
                home = home.0,
                queue = queue.0,
            );
            return Err(Box::new(Unreadable {
                offset,
                reason: Reason::Misplaced,
                error,
                stream: Some(stream),
                record,
            }));
        }
        Ok(container)
    }
}
