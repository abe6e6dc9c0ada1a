//! Run log retention: which runs go, in what order, and the task that
//! prunes a store every `interval`.
//!
//! A run is a **candidate** when it is finished (success, failed, partial
//! success, stopped) and its last activity (its last appended line or status
//! change, [`RunInfo::last_activity_ms`]) is at least `min_age` old. With
//! `abandoned_after` set, a run that never finished and saw no activity for
//! that long counts as finished too; by default such a run is kept forever.
//! Candidates go oldest first (last activity, then creation, then name):
//! every candidate past `max_age`, then more until the runs left hold at
//! most `max_total_bytes`. A running, queued or status-less run is never a
//! candidate, so a store can stay above the byte cap.
//!
//! A store removes a run only if it is unchanged since it was chosen (same
//! lines, bytes, status and last activity), checked atomically with the
//! removal (under the run's lock, or in one Redis script), so a line the
//! archiver appends meanwhile keeps the run.

use std::collections::BinaryHeap;
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::{RunInfo, RunKey, RunLogStore};
use crate::telemetry;

/// The most runs one [`RunLogStore::prune`] call removes; a call that
/// stopped there says so ([`PruneReport::more`]) and the next one goes on.
pub const MAX_RUNS_PER_PRUNE: usize = 1000;

/// The most run keys a [`PruneReport`] lists.
pub const MAX_REPORTED_RUNS: usize = 64;

/// `[archive.retention]`: how long finished runs are kept and how much they
/// may take. A zero duration or byte count turns its rule off.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RetentionPolicy {
    /// Remove a finished run this long after its last activity (30 days).
    #[serde(with = "humantime_serde")]
    pub max_age: Duration,
    /// Remove the oldest finished runs while all runs' log lines take more
    /// than this many bytes (10 GiB).
    pub max_total_bytes: u64,
    /// Never remove a run whose last activity is more recent than this,
    /// whatever the byte total (10 minutes): late lines and viewers of a
    /// run that just finished find it whole.
    #[serde(with = "humantime_serde")]
    pub min_age: Duration,
    /// Treat a run that never finished as finished once it saw no activity
    /// for this long (0, the default: such a run is never removed).
    #[serde(with = "humantime_serde")]
    pub abandoned_after: Duration,
    /// How often the retention task prunes (1 minute; 0 turns retention off).
    #[serde(with = "humantime_serde")]
    pub interval: Duration,
}

impl Default for RetentionPolicy {
    fn default() -> Self {
        Self {
            max_age: Duration::from_secs(30 * 24 * 3600),
            max_total_bytes: 10 << 30,
            min_age: Duration::from_secs(600),
            abandoned_after: Duration::ZERO,
            interval: Duration::from_secs(60),
        }
    }
}

fn ms(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

/// What the policy says of one run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Running, queued, without status, or too recent.
    Keep,
    /// Finished and old enough: removed if the byte cap needs the room.
    Candidate,
    /// Finished and past `max_age`: removed.
    Expired,
}

impl RetentionPolicy {
    /// Whether the task has anything to do: an interval and an age or byte
    /// rule.
    pub fn is_enabled(&self) -> bool {
        !self.interval.is_zero() && (!self.max_age.is_zero() || self.max_total_bytes > 0)
    }

    /// What the policy says of a run at `now_ms`.
    pub fn verdict(&self, info: &RunInfo, now_ms: u64) -> Verdict {
        let age = now_ms.saturating_sub(info.last_activity_ms());
        let abandoned = !self.abandoned_after.is_zero() && age >= ms(self.abandoned_after);
        let finished = info.state.is_some_and(|s| s.is_finished()) || abandoned;
        if !finished || age < ms(self.min_age) {
            Verdict::Keep
        } else if !self.max_age.is_zero() && age >= ms(self.max_age) {
            Verdict::Expired
        } else if self.max_total_bytes > 0 {
            Verdict::Candidate
        } else {
            Verdict::Keep
        }
    }
}

/// What one [`RunLogStore::prune`] call did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PruneReport {
    /// Runs removed.
    pub runs_removed: u64,
    /// Bytes of log lines they held.
    pub bytes_freed: u64,
    /// The first [`MAX_REPORTED_RUNS`] runs removed, oldest first.
    pub removed: Vec<RunKey>,
    /// Runs left in the store.
    pub runs_kept: u64,
    /// Bytes of log lines the runs left hold.
    pub bytes_kept: u64,
    /// Runs chosen but changed before they could be removed (a late line or
    /// status): kept, and judged again next time.
    pub changed: u64,
    /// Runs that could not be removed (the store logged why).
    pub failed: u64,
    /// The call stopped at [`MAX_RUNS_PER_PRUNE`]: more runs are due.
    pub more: bool,
}

impl PruneReport {
    /// Counts a removed run.
    pub fn removed_run(&mut self, run: &RunKey, bytes: u64) {
        self.runs_removed += 1;
        self.bytes_freed += bytes;
        self.runs_kept = self.runs_kept.saturating_sub(1);
        self.bytes_kept = self.bytes_kept.saturating_sub(bytes);
        if self.removed.len() < MAX_REPORTED_RUNS {
            self.removed.push(run.clone());
        }
    }

    /// Counts what became of a chosen run: removed, changed since it was
    /// chosen (kept), or not removable (logged, kept).
    pub(crate) fn record(&mut self, candidate: &Candidate, removed: Result<bool, super::StoreError>) {
        match removed {
            Ok(true) => self.removed_run(&candidate.run, candidate.info.bytes),
            Ok(false) => self.changed += 1,
            Err(e) => {
                tracing::warn!(run = %candidate.run, error = %e, "retention could not remove a run");
                self.failed += 1;
            }
        }
    }
}

/// A run chosen for removal, with what the store held when it was chosen.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Candidate {
    pub(crate) run: RunKey,
    pub(crate) info: RunInfo,
    expired: bool,
}

impl Candidate {
    fn order(&self) -> (u64, u64, &RunKey) {
        (self.info.last_activity_ms(), self.info.created_ms, &self.run)
    }
}

impl Ord for Candidate {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.order().cmp(&other.order())
    }
}

impl PartialOrd for Candidate {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

/// Chooses what a prune removes while a store lists its runs once, in
/// memory bounded by [`MAX_RUNS_PER_PRUNE`] (it keeps the oldest
/// candidates only).
pub(crate) struct Planner<'a> {
    policy: &'a RetentionPolicy,
    now_ms: u64,
    runs: u64,
    bytes: u64,
    /// The newest of the kept candidates on top.
    oldest: BinaryHeap<Candidate>,
    overflow: bool,
}

impl<'a> Planner<'a> {
    pub(crate) fn new(policy: &'a RetentionPolicy, now_ms: u64) -> Self {
        Self { policy, now_ms, runs: 0, bytes: 0, oldest: BinaryHeap::new(), overflow: false }
    }

    /// One run of the store.
    pub(crate) fn offer(&mut self, run: &RunKey, info: &RunInfo) {
        self.runs += 1;
        self.bytes = self.bytes.saturating_add(info.bytes);
        let expired = match self.policy.verdict(info, self.now_ms) {
            Verdict::Keep => return,
            Verdict::Candidate => false,
            Verdict::Expired => true,
        };
        if self.oldest.len() == MAX_RUNS_PER_PRUNE {
            self.overflow = true;
            let order = (info.last_activity_ms(), info.created_ms, run);
            let older_than_kept = self.oldest.peek().is_some_and(|newest| newest.order() > order);
            if !older_than_kept {
                return;
            }
            self.oldest.pop();
        }
        self.oldest.push(Candidate { run: run.clone(), info: info.clone(), expired });
    }

    /// The runs to remove, oldest first, and the report to fill in.
    pub(crate) fn finish(self) -> (Vec<Candidate>, PruneReport) {
        let cap = self.policy.max_total_bytes;
        let mut left = self.bytes;
        let mut chosen = Vec::new();
        for candidate in self.oldest.into_sorted_vec() {
            if !(candidate.expired || (cap > 0 && left > cap)) {
                break;
            }
            left = left.saturating_sub(candidate.info.bytes);
            chosen.push(candidate);
        }
        let more = self.overflow && chosen.len() == MAX_RUNS_PER_PRUNE;
        let report = PruneReport { runs_kept: self.runs, bytes_kept: self.bytes, more, ..PruneReport::default() };
        (chosen, report)
    }
}

/// The retention task: prunes a store every [`RetentionPolicy::interval`].
pub struct Retention;

impl Retention {
    /// Spawns [`Retention::run`] on the current runtime.
    pub fn spawn(store: Arc<dyn RunLogStore>, policy: RetentionPolicy, cancel: CancellationToken) -> JoinHandle<()> {
        tokio::spawn(Self::run(store, policy, cancel))
    }

    /// Prunes at once, then every `interval`, until `cancel`; right away
    /// again while a prune stopped at [`MAX_RUNS_PER_PRUNE`]. Logs what it
    /// removed and counts it (`tailrace_archive_runs_pruned_total`,
    /// `tailrace_archive_bytes_pruned_total`). A failed prune is logged and
    /// tried again next interval.
    pub async fn run(store: Arc<dyn RunLogStore>, policy: RetentionPolicy, cancel: CancellationToken) {
        if !policy.is_enabled() {
            tracing::info!("run log retention is off: runs are kept forever");
            return;
        }
        let mut ticker = tokio::time::interval(policy.interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut over_cap = false;
        loop {
            tokio::select! {
                _ = ticker.tick() => {}
                _ = cancel.cancelled() => return,
            }
            loop {
                let report = tokio::select! {
                    report = store.prune(&policy, crate::stream::now_ms()) => report,
                    _ = cancel.cancelled() => return,
                };
                match report {
                    Ok(report) => {
                        Self::record(&policy, &report, &mut over_cap);
                        if !report.more {
                            break;
                        }
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "run log retention failed; trying again next interval");
                        break;
                    }
                }
            }
        }
    }

    fn record(policy: &RetentionPolicy, report: &PruneReport, over_cap: &mut bool) {
        metrics::counter!(telemetry::ARCHIVE_RUNS_PRUNED).increment(report.runs_removed);
        metrics::counter!(telemetry::ARCHIVE_BYTES_PRUNED).increment(report.bytes_freed);
        if report.runs_removed > 0 {
            let mut shown: Vec<String> = report.removed.iter().map(RunKey::to_string).collect();
            let unlisted = report.runs_removed.saturating_sub(shown.len() as u64);
            if unlisted > 0 {
                shown.push(format!("and {unlisted} more"));
            }
            tracing::info!(
                runs = report.runs_removed,
                bytes = report.bytes_freed,
                runs_kept = report.runs_kept,
                bytes_kept = report.bytes_kept,
                "run log retention removed {}",
                shown.join(", ")
            );
        }
        if report.failed > 0 {
            tracing::warn!(runs = report.failed, "run log retention could not remove some runs");
        }
        let above = policy.max_total_bytes > 0 && report.bytes_kept > policy.max_total_bytes;
        if above && !*over_cap {
            tracing::warn!(
                bytes_kept = report.bytes_kept,
                max_total_bytes = policy.max_total_bytes,
                "run logs take more than max_total_bytes, but what is left is running, unfinished or recent"
            );
        }
        *over_cap = above;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::archive::RunState;

    const DAY: u64 = 24 * 3600 * 1000;

    fn info(state: Option<RunState>, bytes: u64, last: u64) -> RunInfo {
        RunInfo { bytes, state, created_ms: last, updated_ms: last, ..RunInfo::default() }
    }

    fn key(run: &str) -> RunKey {
        RunKey::new("svc.etl", run).unwrap()
    }

    #[test]
    fn only_finished_runs_old_enough_are_candidates() {
        let policy = RetentionPolicy::default();
        let now = 100 * DAY;
        assert_eq!(policy.verdict(&info(Some(RunState::Success), 1, now - 31 * DAY), now), Verdict::Expired);
        assert_eq!(policy.verdict(&info(Some(RunState::Stopped), 1, now - DAY), now), Verdict::Candidate);
        assert_eq!(policy.verdict(&info(Some(RunState::Failed), 1, now - 60_000), now), Verdict::Keep, "min_age");
        for state in [None, Some(RunState::Running), Some(RunState::Queued)] {
            assert_eq!(policy.verdict(&info(state, 1, 0), now), Verdict::Keep, "{state:?}");
        }
        let abandoning = RetentionPolicy { abandoned_after: Duration::from_secs(90 * 24 * 3600), ..policy.clone() };
        assert_eq!(abandoning.verdict(&info(None, 1, now - 91 * DAY), now), Verdict::Expired);
        assert_eq!(abandoning.verdict(&info(Some(RunState::Running), 1, now - 89 * DAY), now), Verdict::Keep);
        let no_cap = RetentionPolicy { max_total_bytes: 0, ..policy };
        assert_eq!(no_cap.verdict(&info(Some(RunState::Success), 1, now - DAY), now), Verdict::Keep);
    }

    #[test]
    fn a_run_without_updated_ms_ages_from_its_creation() {
        let old = RunInfo { created_ms: 5, updated_ms: 0, ..RunInfo::default() };
        assert_eq!(old.last_activity_ms(), 5);
    }

    #[test]
    fn the_plan_takes_expired_runs_then_the_oldest_until_under_the_cap() {
        let policy = RetentionPolicy { max_total_bytes: 100, ..RetentionPolicy::default() };
        let now = 100 * DAY;
        let mut planner = Planner::new(&policy, now);
        planner.offer(&key("new"), &info(Some(RunState::Success), 40, now - DAY));
        planner.offer(&key("expired"), &info(Some(RunState::Success), 1, now - 40 * DAY));
        planner.offer(&key("running"), &info(Some(RunState::Running), 50, now - 50 * DAY));
        planner.offer(&key("older"), &info(Some(RunState::Failed), 30, now - 2 * DAY));
        planner.offer(&key("oldest"), &info(Some(RunState::Stopped), 30, now - 3 * DAY));
        let (chosen, report) = planner.finish();
        let names: Vec<&str> = chosen.iter().map(|c| c.run.run()).collect();
        // 151 bytes: the expired run goes (150), then the oldest (120),
        // then the next (90 ≤ 100).
        assert_eq!(names, ["expired", "oldest", "older"]);
        assert_eq!((report.runs_kept, report.bytes_kept, report.more), (5, 151, false));
    }

    #[test]
    fn the_plan_is_bounded_and_says_when_more_is_due() {
        let policy = RetentionPolicy { max_total_bytes: 0, ..RetentionPolicy::default() };
        let now = 100 * DAY;
        let mut planner = Planner::new(&policy, now);
        let total = MAX_RUNS_PER_PRUNE + 10;
        for i in (0..total).rev() {
            planner.offer(&key(&format!("r{i:05}")), &info(Some(RunState::Success), 1, i as u64));
        }
        let (chosen, report) = planner.finish();
        assert_eq!(chosen.len(), MAX_RUNS_PER_PRUNE);
        assert!(report.more);
        assert_eq!(chosen[0].run.run(), "r00000", "oldest first");
        assert_eq!(chosen[MAX_RUNS_PER_PRUNE - 1].run.run(), format!("r{:05}", MAX_RUNS_PER_PRUNE - 1));
    }
}
