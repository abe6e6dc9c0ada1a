//! How a writer writes (file sizes, its byte budget, sealing by age, when
//! it forces bytes to disk) and where an appended batch landed.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// When written bytes are forced to disk.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum FsyncPolicy {
    /// Only when a file is sealed (`"never"`): fastest; a crash may lose what
    /// the active file held.
    Never,
    /// On every `flush` (`"every-flush"`): an event is durable once the flush
    /// after it returned.
    #[default]
    EveryFlush,
    /// At most one fsync per interval, covering every flush before it
    /// (`"group:10ms"`): an event is durable once a group sync covered it.
    Group(Duration),
}

impl fmt::Display for FsyncPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FsyncPolicy::Never => f.write_str("never"),
            FsyncPolicy::EveryFlush => f.write_str("every-flush"),
            FsyncPolicy::Group(every) => write!(f, "group:{}", humantime::format_duration(*every)),
        }
    }
}

impl FromStr for FsyncPolicy {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "never" => Ok(FsyncPolicy::Never),
            "every-flush" => Ok(FsyncPolicy::EveryFlush),
            other => match other.strip_prefix("group:") {
                Some(every) => {
                    humantime::parse_duration(every).map(FsyncPolicy::Group).map_err(|e| format!("`{other}`: {e}"))
                }
                None => Err(format!("`{other}` is not an fsync policy (never, every-flush, group:<duration>)")),
            },
        }
    }
}

impl Serialize for FsyncPolicy {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for FsyncPolicy {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        String::deserialize(deserializer)?.parse().map_err(serde::de::Error::custom)
    }
}

/// Where a line is: the file's number and the 1-based line in it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct LinePosition {
    /// `{prefix}-{file}.open|jsonl`.
    pub file: u64,
    /// 1-based.
    pub line: u64,
}

/// A writer's settings.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct WriterOptions {
    /// A file is sealed once it would grow past this.
    pub max_file_bytes: u64,
    /// The prefix's budget: `.open` and `.jsonl` files together.
    pub max_total_bytes: u64,
    /// A non-empty active file older than this is sealed (so a quiet writer
    /// still hands its lines over); none: only size and `close` seal.
    #[serde(with = "humantime_serde")]
    pub max_file_age: Option<Duration>,
    /// When bytes are forced to disk.
    pub fsync: FsyncPolicy,
    /// Lines are buffered up to this many bytes before being written.
    pub buffer_bytes: usize,
}

impl Default for WriterOptions {
    fn default() -> Self {
        Self {
            max_file_bytes: 64 * 1024 * 1024,
            max_total_bytes: 1024 * 1024 * 1024,
            max_file_age: None,
            fsync: FsyncPolicy::EveryFlush,
            buffer_bytes: 64 * 1024,
        }
    }
}
