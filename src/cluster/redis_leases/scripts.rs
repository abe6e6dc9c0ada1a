//! The leases' Lua scripts: each touches the keys of one slot (a queue's,
//! or one node's alive key).

/// Grants the lease (KEYS[1]) to ARGV[1] under epoch ARGV[2], with a new
/// token from the fence (KEYS[2]), if it is free, already ARGV[1]'s, or
/// still the grant the caller saw dead (holder ARGV[3], epoch ARGV[4]).
/// `{token}`, or `{0, holder}` when another node holds it.
///
/// Whether a holder's epoch is dead is read before, from its alive key:
/// on a Redis Cluster that key is in another slot than the lease, and a
/// script may not read it. Reading it first is safe because an epoch never
/// comes back: once its alive key lost it, it is dead for good, so a grant
/// still under it when this script runs is still dead.
pub(super) const GRANT: &str = r"
local holder = redis.call('HGET', KEYS[1], 'holder')
if holder and holder ~= ARGV[1] then
  if holder ~= ARGV[3] or redis.call('HGET', KEYS[1], 'epoch') ~= ARGV[4] then
    return {'0', holder}
  end
end
local token = string.format('%d', redis.call('INCR', KEYS[2]))
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], 'holder', ARGV[1], 'token', token, 'epoch', ARGV[2])
return {token}";

/// A new epoch ARGV[1] for the alive key KEYS[1], for ARGV[2] ms: every
/// grant of the old epoch is dead from now on.
pub(super) const REJOIN: &str = r"
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return 1";

/// Extends the alive key KEYS[1] to ARGV[2] ms if it still holds epoch
/// ARGV[1]: every lease of that epoch is renewed at once. 1, or 0.
pub(super) const RENEW: &str = r"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
return 0";

/// Deletes the lease if ARGV[1] holds it with token ARGV[2].
pub(super) const RELEASE: &str = r"
if redis.call('HGET', KEYS[1], 'token') == ARGV[2] and redis.call('HGET', KEYS[1], 'holder') == ARGV[1] then
  redis.call('DEL', KEYS[1])
  return 1
end
return 0";

/// Deletes the alive key KEYS[1]: every grant of that node is free.
pub(super) const EVICT: &str = r"
return redis.call('DEL', KEYS[1])";
