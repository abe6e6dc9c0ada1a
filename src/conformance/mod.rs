//! The conformance kit: checks that a queue adapter keeps the contract of
//! [`crate::queue`]. Built-in adapters and users' adapters run the same kit.
//!
//! The adapter declares what it promises in [`Claims`]; a check whose
//! promise is not made is reported as *not claimed*, never as passed. Every
//! check runs in bounded time and a failure names the check, the queue, the
//! token and the event involved.
//!
//! ```
//! use std::sync::Arc;
//! use tailrace::adapters::memory::{MemoryAdapterFactory, MemoryOptions};
//! use tailrace::conformance::{self, Claims};
//! use tailrace::queue::QueueAdapterFactory;
//!
//! # #[tokio::main]
//! # async fn main() -> Result<(), tailrace::conformance::Failures> {
//! // What the adapter promises; a check whose claim is not made is
//! // reported as not claimed, never as passed.
//! let claims = Claims { rewindable: true, exclusive_receivers: true, ..Claims::default() };
//! let report = conformance::run(claims, || async {
//!     // A fresh factory per call (the durability check restarts it).
//!     Ok(Arc::new(MemoryAdapterFactory::new(4, MemoryOptions::default())) as Arc<dyn QueueAdapterFactory>)
//! })
//! .await?;
//! assert!(report.passed.contains(&"ordering"), "{report}");
//! # Ok(()) }
//! ```
//!
//! | check | claim | what must hold |
//! |---|---|---|
//! | `direction` | — | a write-only adapter refuses receivers, a read-only one refuses writes, a read-write one does both on every queue |
//! | `ordering` | — | with concurrent producers, each producer's batches come back per stream in the order it sent them; tokens increase per queue; nothing lost or duplicated |
//! | `tokens` | — | a container is read back with the token `enqueue` returned for it |
//! | `payloads` | — | stream, ids, timestamps and payload bytes (text, empty, binary, large) survive |
//! | `read_max` | — | `read(max)` never returns more than `max` containers |
//! | `restart` | — | after a graceful restart the unacknowledged containers come back in order, the acknowledged ones do not |
//! | `ack_gaps` | — | acks out of order and with gaps, then a restart: everything unacknowledged comes back, nothing below the first gap does |
//! | `acks` | — | acking twice, an unknown token or nothing is harmless and acknowledges nothing else |
//! | `failed` | — | `failed(tokens)` touches only those containers, and the queue goes on past them |
//! | `takeover` | — | a receiver dropped without shutdown (a crash): the next one gets what it had not acknowledged, in order |
//! | `exclusive` | `exclusive_receivers` | a second receiver on a queue fences the first (its reads fail) |
//! | `rewind` | — | if `rewindable`: a rewind serves a past token without moving the live position; otherwise it is refused |
//! | `retention` | `trims` and `rewindable` | a rewind to a container no longer held is refused with `CannotRewind`, never served from later data, naming the oldest position still held, from which a rewind is served |
//! | `durability` | `durable` | after `close` and a fresh factory, what was unacknowledged comes back, what was acknowledged does not |
//! | `shutdown` | — | on every queue, shutdown twice is fine and a read after it is an error |
//! | `bad_input` | — | an empty batch and an unknown queue are refused; nothing accepted around them is lost |
//! | `back_pressure` | `bounded` | a queue never accepts more than the bound unread: producers wait or are refused, and nothing accepted is dropped |

mod acks;
mod durable;
mod limits;
mod order;
mod support;

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use crate::queue::{Direction, QueueAdapterFactory, QueueError};
use support::Kit;

/// What an adapter promises. A check whose claim is `false` (or `None`) is
/// reported as not claimed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Claims {
    /// The store outlives the process: after [`QueueAdapter::close`](crate::queue::QueueAdapter::close)
    /// and a fresh factory from the kit's `open`, unacknowledged containers
    /// are read again and acknowledged ones are not (given the checkpoint
    /// the kit saved, as the agent does).
    pub durable: bool,
    /// [`QueueReceiver::rewind`](crate::queue::QueueReceiver::rewind) serves past tokens (must match
    /// [`QueueAdapter::is_rewindable`](crate::queue::QueueAdapter::is_rewindable)).
    pub rewindable: bool,
    /// A newly initialized receiver of a queue fences older ones.
    pub exclusive_receivers: bool,
    /// Producers feel back-pressure (a wait, or `Full`/`Refused`) before one
    /// queue holds this many unread events of the kit's size (about 100
    /// bytes each).
    pub bounded: Option<usize>,
    /// Acknowledged containers the saved checkpoint has passed are dropped
    /// before long (retention), so a rewind to them must be refused.
    pub trims: bool,
}

/// A check that did not hold.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("conformance check `{check}` failed: {message}")]
pub struct Failure {
    /// The check's name.
    pub check: &'static str,
    /// What was seen, with the queue, token and event involved.
    pub message: String,
}

/// What the kit found.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Report {
    /// The adapter's name.
    pub adapter: String,
    /// Checks that held.
    pub passed: Vec<&'static str>,
    /// Checks that did not hold.
    pub failed: Vec<Failure>,
    /// Checks not run, with why (the claim was not made, or the adapter's
    /// direction rules them out).
    pub not_claimed: Vec<(&'static str, &'static str)>,
}

impl Report {
    /// How many checks ran (passed or failed).
    pub fn checks_run(&self) -> usize {
        self.passed.len() + self.failed.len()
    }

    /// The names of the checks that failed.
    pub fn failed_checks(&self) -> Vec<&'static str> {
        self.failed.iter().map(|f| f.check).collect()
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {} of {} checks passed", self.adapter, self.passed.len(), self.checks_run())?;
        if !self.passed.is_empty() {
            write!(f, " ({})", self.passed.join(", "))?;
        }
        for failure in &self.failed {
            write!(f, "; FAILED {failure}")?;
        }
        for (check, why) in &self.not_claimed {
            write!(f, "; not claimed: {check} ({why})")?;
        }
        Ok(())
    }
}

/// At least one check failed; the report says which and what passed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}", .0)]
pub struct Failures(pub Report);

/// Runs every check against the adapter `open` builds, as `claims` says.
///
/// `open` is called once at the start and, if `claims.durable`, once more
/// after the first adapter was closed: it must then open the *same* store
/// again (a new process would). Give it a store with empty queues.
pub async fn run<F, Fut>(claims: Claims, open: F) -> Result<Report, Failures>
where
    F: Fn() -> Fut + Send + Sync,
    Fut: Future<Output = Result<Arc<dyn QueueAdapterFactory>, QueueError>> + Send,
{
    run_with_deadline(claims, support::READ_DEADLINE, open).await
}

/// [`run`], waiting at most `read_deadline` (10 s in [`run`]) for
/// containers a check expects to read. A shorter one suits an in-memory
/// adapter; a failing check waits it out, so the kit's worst case grows
/// with it.
pub async fn run_with_deadline<F, Fut>(claims: Claims, read_deadline: Duration, open: F) -> Result<Report, Failures>
where
    F: Fn() -> Fut + Send + Sync,
    Fut: Future<Output = Result<Arc<dyn QueueAdapterFactory>, QueueError>> + Send,
{
    let mut report = Report::default();
    let mut kit = match Kit::open(claims, read_deadline, &open).await {
        Ok(kit) => kit,
        Err(failure) => {
            report.failed.push(failure);
            return Err(Failures(report));
        }
    };
    report.adapter = kit.adapter.name().to_string();
    let direction = kit.adapter.direction();
    record(&mut report, "direction", limits::direction(&kit).await);
    if direction != Direction::ReadWrite {
        for check in &CHECKS[1..] {
            report.not_claimed.push((check, "needs a read-write adapter"));
        }
        return finish(report);
    }
    for (check, result) in order::ordering(&kit).await {
        record(&mut report, check, result);
    }
    record(&mut report, "read_max", order::read_max(&kit).await);
    record(&mut report, "restart", acks::restart(&kit).await);
    record(&mut report, "ack_gaps", acks::ack_gaps(&kit).await);
    record(&mut report, "acks", acks::acks(&kit).await);
    record(&mut report, "failed", acks::failed(&kit).await);
    record(&mut report, "takeover", acks::takeover(&kit).await);
    claimed(&mut report, "exclusive", claims.exclusive_receivers, "exclusive_receivers", acks::exclusive(&kit)).await;
    record(&mut report, "rewind", durable::rewind(&kit).await);
    claimed(&mut report, "retention", claims.trims && claims.rewindable, "trims", durable::retention(&kit)).await;
    if claims.durable {
        let result = durable::durability(&mut kit, &open).await;
        record(&mut report, "durability", result);
    } else {
        report.not_claimed.push(("durability", "durable"));
    }
    record(&mut report, "shutdown", limits::shutdown(&kit).await);
    record(&mut report, "bad_input", limits::bad_input(&kit).await);
    match claims.bounded {
        Some(bound) => record(&mut report, "back_pressure", limits::back_pressure(&kit, bound).await),
        None => report.not_claimed.push(("back_pressure", "bounded")),
    }
    finish(report)
}

/// Every check of the kit, in the order they run.
pub const CHECKS: [&str; 17] = [
    "direction",
    "ordering",
    "tokens",
    "payloads",
    "read_max",
    "restart",
    "ack_gaps",
    "acks",
    "failed",
    "takeover",
    "exclusive",
    "rewind",
    "retention",
    "durability",
    "shutdown",
    "bad_input",
    "back_pressure",
];

fn record(report: &mut Report, check: &'static str, result: Result<(), Failure>) {
    match result {
        Ok(()) => report.passed.push(check),
        Err(failure) => report.failed.push(failure),
    }
}

async fn claimed(
    report: &mut Report,
    check: &'static str,
    claim: bool,
    name: &'static str,
    run: impl Future<Output = Result<(), Failure>>,
) {
    if claim {
        record(report, check, run.await);
    } else {
        report.not_claimed.push((check, name));
    }
}

fn finish(report: Report) -> Result<Report, Failures> {
    if report.failed.is_empty() { Ok(report) } else { Err(Failures(report)) }
}
