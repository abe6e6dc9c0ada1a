//! Backoff with jitter, as Orleans' `ExponentialBackoff(min, max, step)`: the
//! n-th retry waits a uniformly random time in
//! `[min, min(min + step * 2^n, max))`.
//!
//! Retrying itself is `backon`'s: any iterator of waits is a backoff there,
//! so [`Backoff::schedule`] and [`Backoff::within`] drive
//! `operation.retry(…).when(…).notify(…)` at every call site.

use std::time::Duration;

use rand::RngExt;
use serde::{Deserialize, Serialize};

/// An exponential backoff with jitter.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Backoff {
    /// The shortest wait.
    #[serde(with = "humantime_serde")]
    pub min: Duration,
    /// The longest wait.
    #[serde(with = "humantime_serde")]
    pub max: Duration,
    /// The growth unit.
    #[serde(with = "humantime_serde")]
    pub step: Duration,
}

impl Backoff {
    /// A backoff from `min` to `max` growing by `step * 2^attempt`.
    pub const fn new(min: Duration, max: Duration, step: Duration) -> Self {
        Self { min, max, step }
    }

    /// A fixed wait.
    pub const fn fixed(wait: Duration) -> Self {
        Self { min: wait, max: wait, step: Duration::ZERO }
    }

    /// How long to wait before retry number `attempt` (0-based).
    pub fn delay(&self, attempt: u32) -> Duration {
        let growth = self.step.saturating_mul(1u32.checked_shl(attempt.min(31)).unwrap_or(u32::MAX));
        let upper = self.min.saturating_add(growth).min(self.max);
        if upper <= self.min {
            return self.min.min(self.max);
        }
        let span = (upper - self.min).as_nanos().min(u128::from(u64::MAX)) as u64;
        self.min + Duration::from_nanos(rand::rng().random_range(0..span))
    }
}

impl Backoff {
    /// The waits before `retries` retries (for `backon::Retryable::retry`).
    pub fn schedule(self, retries: u32) -> impl Iterator<Item = Duration> + Send + Sync + Unpin {
        (0..retries).map(move |n| self.delay(n))
    }

    /// The waits of retries for as long as their sum stays within `total`.
    pub fn within(self, total: Duration) -> impl Iterator<Item = Duration> + Send + Sync + Unpin {
        let mut spent = Duration::ZERO;
        (0..u32::MAX).map(move |n| self.delay(n)).take_while(move |wait| {
            spent = spent.saturating_add(*wait);
            spent <= total
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_grow_within_bounds() {
        let b = Backoff::new(Duration::from_secs(1), Duration::from_secs(30), Duration::from_secs(1));
        for attempt in 0..40 {
            let d = b.delay(attempt);
            assert!(d >= Duration::from_secs(1) && d < Duration::from_secs(30), "{attempt}: {d:?}");
        }
        // The first retry waits less than min + step.
        assert!((0..100).all(|_| b.delay(0) < Duration::from_secs(2)));
        assert_eq!(Backoff::fixed(Duration::from_millis(100)).delay(9), Duration::from_millis(100));
    }

    #[test]
    fn schedules_count_retries_or_time() {
        let fixed = Backoff::fixed(Duration::from_millis(50));
        assert_eq!(fixed.schedule(3).collect::<Vec<_>>(), [Duration::from_millis(50); 3]);
        assert_eq!(fixed.within(Duration::from_millis(175)).count(), 3);
        assert_eq!(fixed.within(Duration::ZERO).count(), 0);
    }
}
