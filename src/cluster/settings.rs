//! The settings of membership in Redis (`[membership]`) and of queue leases
//! (`[lease]`): their defaults and checks. They live here, below the
//! manager and the config, so both can use them; `crate::config` re-exports
//! them.

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// `[membership]`: each node keeps a member record alive in Redis.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MembershipOptions {
    /// How often a node refreshes its member record (and reads the others when they changed).
    #[serde(with = "humantime_serde")]
    pub heartbeat: Duration,
    /// A member record not refreshed for this long lapses: the node is gone.
    #[serde(with = "humantime_serde")]
    pub ttl: Duration,
    /// Most members a node keeps track of (more are ignored and logged).
    pub max_members: usize,
}

impl Default for MembershipOptions {
    fn default() -> Self {
        Self { heartbeat: Duration::from_secs(1), ttl: Duration::from_secs(5), max_members: 64 }
    }
}

impl MembershipOptions {
    /// Problems with these settings, if any.
    pub fn check(&self) -> Result<(), String> {
        if self.heartbeat.is_zero() {
            return Err("membership.heartbeat must be more than 0".into());
        }
        if self.ttl < self.heartbeat * 2 {
            return Err(format!(
                "membership.ttl ({:?}) must be at least twice membership.heartbeat ({:?})",
                self.ttl, self.heartbeat
            ));
        }
        if self.max_members == 0 {
            return Err("membership.max_members must be at least 1".into());
        }
        Ok(())
    }
}

/// `[lease]`: queue leases. A dead node's queues are re-owned within about
/// `ttl` (plus one `acquire` period with the lease balancer); a node that
/// cannot renew for `ttl − renew` stops its agents before its leases lapse.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LeaseOptions {
    /// How long a grant lasts unless renewed.
    #[serde(with = "humantime_serde")]
    pub ttl: Duration,
    /// How often a node renews every lease it holds.
    #[serde(with = "humantime_serde")]
    pub renew: Duration,
    /// How often the lease balancer tries to take free leases.
    #[serde(with = "humantime_serde")]
    pub acquire: Duration,
    /// Let `tailrace node` run on a Redis that keeps nothing across a
    /// restart (no AOF, no RDB `save`): its fence counters would start
    /// again at 1.
    pub allow_volatile_redis: bool,
}

impl Default for LeaseOptions {
    fn default() -> Self {
        Self {
            ttl: Duration::from_secs(8),
            renew: Duration::from_secs(2),
            acquire: Duration::from_secs(1),
            allow_volatile_redis: false,
        }
    }
}

impl LeaseOptions {
    /// A lease not renewed by `expires_at − margin` is given up (its agent
    /// killed) so that it stops before another node may take the queue:
    /// one renew period.
    pub fn margin(&self) -> Duration {
        self.renew
    }

    /// Problems with these settings, if any.
    pub fn check(&self) -> Result<(), String> {
        if self.renew.is_zero() || self.acquire.is_zero() {
            return Err("lease.renew and lease.acquire must be more than 0".into());
        }
        if self.ttl < self.renew * 3 {
            return Err(format!(
                "lease.ttl ({:?}) must be at least three times lease.renew ({:?}): two renewals may fail before a lease is given up",
                self.ttl, self.renew
            ));
        }
        Ok(())
    }
}
