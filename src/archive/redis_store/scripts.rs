//! The run log store's Lua scripts: each touches one run's keys only (one
//! slot on a Redis Cluster).

/// KEYS: run hash, log list, times zset (one slot: they share the run's
/// hash tag on a Redis Cluster).
/// ARGV: created, token major, token minor, bytes, fingerprint, fence,
/// arrived, lines...
///
/// Answers `{appended, created, indexed}`: whether the lines went in (0 or
/// 1), the run's creation time, and whether the run is in its pipeline's
/// listing yet (0 or 1). The listing keys are in other slots, so the
/// caller adds the run to them when `indexed` is 0, then marks it.
///
/// Token parts are unsigned 64-bit decimals, compared as strings (shorter
/// is smaller, then byte order): Lua numbers are doubles and would take
/// tokens above 2^53 that differ for equal ones.
///
/// ARGV[5] is the container's fingerprint (16 hex digits, or empty): one
/// the run's `recent` field holds (the last 128, space-separated) is a
/// producer's retried batch, so only the token moves.
///
/// ARGV[7] is when the lines arrived (ms, or empty): a member
/// `offset:ms` of the times sorted set (KEYS[3]), scored by the offset of
/// the container's first line. Lines start at ARGV[8].
///
/// ARGV[6] is the writer's lease fencing token (or empty, unfenced): one
/// below the run's `fence` field (the highest token that appended to it)
/// is refused with the error `FENCED`, before anything is written.
pub(super) const APPEND: &str = r"
local RECENT_CHARS = 128 * 17
local function less(a, b)
  if #a ~= #b then return #a < #b end
  return a < b
end
if ARGV[6] ~= '' then
  local mark = redis.call('HGET', KEYS[1], 'fence')
  if mark and less(ARGV[6], mark) then
    return redis.error_reply('FENCED run fence ' .. mark)
  end
  redis.call('HSET', KEYS[1], 'fence', ARGV[6])
end
if redis.call('HSETNX', KEYS[1], 'created', ARGV[1]) == 1 then
  redis.call('HSET', KEYS[1], 'updated', ARGV[1])
end
local function answer(appended)
  local run = redis.call('HMGET', KEYS[1], 'created', 'indexed')
  return {appended, run[1], run[2] and 1 or 0}
end
local major = redis.call('HGET', KEYS[1], 'major')
local minor = redis.call('HGET', KEYS[1], 'minor')
if major and minor then
  local m, n = ARGV[2], ARGV[3]
  if less(m, major) or (m == major and not less(minor, n)) then
    return answer(0)
  end
end
local recent = redis.call('HGET', KEYS[1], 'recent') or ''
if ARGV[5] ~= '' and string.find(' ' .. recent .. ' ', ' ' .. ARGV[5] .. ' ', 1, true) then
  redis.call('HSET', KEYS[1], 'major', ARGV[2], 'minor', ARGV[3])
  return answer(0)
end
if ARGV[7] ~= '' and #ARGV > 7 then
  local first = redis.call('LLEN', KEYS[2])
  redis.call('ZADD', KEYS[3], first, first .. ':' .. ARGV[7])
end
for i = 8, #ARGV do
  redis.call('RPUSH', KEYS[2], ARGV[i])
end
redis.call('HINCRBY', KEYS[1], 'lines', #ARGV - 7)
redis.call('HINCRBY', KEYS[1], 'bytes', ARGV[4])
redis.call('HSET', KEYS[1], 'major', ARGV[2], 'minor', ARGV[3], 'updated', ARGV[1])
if ARGV[5] ~= '' then
  recent = ARGV[5] .. ' ' .. recent
  if #recent > RECENT_CHARS then
    recent = string.sub(recent, 1, RECENT_CHARS - 1)
  end
  redis.call('HSET', KEYS[1], 'recent', recent)
end
return answer(1)";

/// KEYS: run hash. ARGV: created, state. Answers `{created, indexed}` as
/// `APPEND` does.
pub(super) const ENSURE: &str = r"
if redis.call('HSETNX', KEYS[1], 'created', ARGV[1]) == 1 then
  redis.call('HSET', KEYS[1], 'updated', ARGV[1])
end
if redis.call('HGET', KEYS[1], 'state') ~= ARGV[2] then
  redis.call('HSET', KEYS[1], 'state', ARGV[2], 'updated', ARGV[1])
end
local run = redis.call('HMGET', KEYS[1], 'created', 'indexed')
return {run[1], run[2] and 1 or 0}";

/// KEYS: run hash, log list, times zset.
/// ARGV: bytes, updated, state ('' for none), as chosen.
pub(super) const PRUNE: &str = r"
if redis.call('EXISTS', KEYS[1]) == 0 then
  return 0
end
local bytes = tonumber(redis.call('HGET', KEYS[1], 'bytes') or '0')
local updated = tonumber(redis.call('HGET', KEYS[1], 'updated') or '0')
local state = redis.call('HGET', KEYS[1], 'state') or ''
if bytes ~= tonumber(ARGV[1]) or updated ~= tonumber(ARGV[2]) or state ~= ARGV[3] then
  return 0
end
redis.call('DEL', KEYS[1], KEYS[2], KEYS[3])
return 1";
