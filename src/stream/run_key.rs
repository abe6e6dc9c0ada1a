//! A pipeline run's name and its stream, (`logs`, `{fqn}/{runId}`): part
//! of the data model, so that the run log store and the adapters that read
//! records others write (which name runs) share one set of rules.
//! `crate::archive` re-exports it.

use std::fmt;

use super::StreamId;

/// The namespace of run logs.
pub const LOGS_NAMESPACE: &str = "logs";

/// Longest pipeline name or run id, in bytes.
pub const MAX_NAME_BYTES: usize = 1024;

/// A pipeline run: (pipeline fully qualified name, run id).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RunKey {
    fqn: String,
    run: String,
}

/// A pipeline name or run id that cannot name a run.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("invalid {what} `{value}`: {reason}")]
pub struct InvalidName {
    /// `pipeline fqn` or `run id`.
    pub what: &'static str,
    /// The value given (shortened).
    pub value: String,
    /// What is wrong with it.
    pub reason: &'static str,
}

fn check(what: &'static str, value: &str) -> Result<(), InvalidName> {
    let invalid = |reason| InvalidName { what, value: value.chars().take(80).collect(), reason };
    if value.is_empty() {
        return Err(invalid("it is empty"));
    }
    if value.len() > MAX_NAME_BYTES {
        return Err(invalid("it is longer than 1024 bytes"));
    }
    if value == "." || value == ".." {
        return Err(invalid("`.` and `..` are not names"));
    }
    if value.contains('/') || value.contains('\\') {
        return Err(invalid("it contains a slash"));
    }
    if value.chars().any(char::is_control) {
        return Err(invalid("it contains a control character"));
    }
    Ok(())
}

impl RunKey {
    /// Validates both parts: 1–1024 bytes, no slash, backslash or control
    /// character, not `.` or `..`.
    pub fn new(fqn: &str, run: &str) -> Result<Self, InvalidName> {
        check("pipeline fqn", fqn)?;
        check("run id", run)?;
        Ok(Self { fqn: fqn.to_string(), run: run.to_string() })
    }

    /// The run of a `logs` stream, if its key is `{fqn}/{runId}`.
    pub fn from_stream(stream: &StreamId) -> Result<Self, InvalidName> {
        let not_a_run = |reason| InvalidName { what: "log stream", value: stream.to_string(), reason };
        if stream.namespace() != LOGS_NAMESPACE {
            return Err(not_a_run("its namespace is not `logs`"));
        }
        let (fqn, run) = stream.key().split_once('/').ok_or_else(|| not_a_run("its key is not `{fqn}/{runId}`"))?;
        Self::new(fqn, run)
    }

    /// The pipeline.
    pub fn fqn(&self) -> &str {
        &self.fqn
    }

    /// The run id.
    pub fn run(&self) -> &str {
        &self.run
    }

    /// The run's stream: (`logs`, `{fqn}/{runId}`).
    pub fn stream(&self) -> StreamId {
        StreamId::new(LOGS_NAMESPACE, format!("{}/{}", self.fqn, self.run))
    }
}

impl fmt::Display for RunKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.fqn, self.run)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn run_keys_refuse_what_could_escape_the_store() {
        assert!(RunKey::new("sample.etl_daily", "scheduled__2026-08-10T00:00:00").is_ok());
        for (fqn, run) in [("", "r"), ("..", "r"), ("a", "."), ("a/b", "r"), ("a", "r\\x"), ("a", "r\n"), ("a", "")] {
            assert!(RunKey::new(fqn, run).is_err(), "{fqn:?} {run:?}");
        }
        let long = "x".repeat(1025);
        assert!(RunKey::new(&long, "r").unwrap_err().to_string().contains("longer than 1024 bytes"));
    }

    #[test]
    fn a_run_is_its_stream() {
        let key = RunKey::new("svc.pipe", "run-1").unwrap();
        assert_eq!(key.stream(), StreamId::new("logs", "svc.pipe/run-1"));
        assert_eq!(RunKey::from_stream(&key.stream()).unwrap(), key);
        assert!(RunKey::from_stream(&StreamId::new("other", "a/b")).is_err());
        assert!(RunKey::from_stream(&StreamId::new("logs", "no-slash")).is_err());
    }
}
