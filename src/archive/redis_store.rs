//! Run logs in Redis (cluster mode: every node reads every run).
//!
//! ```text
//! {prefix}:pipelines                 set of pipeline names
//! {prefix}:runs:{n}:{fqn}            sorted set of run ids by creation time
//! {prefix}:run:{n}:{fqn}:{runId}     hash: lines, bytes, state, token, created, updated
//! {prefix}:log:{n}:{fqn}:{runId}     list of lines
//! {prefix}:times:{n}:{fqn}:{runId}   sorted set of `offset:ms` by offset: when each container's lines arrived
//! ```
//!
//! (`{n}` is the length of the fqn, so no two runs share a key.) An append
//! is one Lua script: it compares the container's token with the stored
//! one, pushes the lines and updates the counters together, so a
//! redelivered container changes nothing and a crash leaves all or none.
//!
//! A fenced append (the archiver's, under a queue lease) also compares the
//! writer's lease token with the run's `fence` field, the highest token
//! that appended to the run, and is refused if it is lower: an agent whose
//! lease was superseded, and whose successor already wrote to the run,
//! writes nothing more. The run keeps its own mark rather than reading the
//! queue's fencing counter because the store may live on another server
//! (or, later, another Cluster slot) than the queues. A run always maps to
//! one queue, so the tokens it sees come from one counter.
//!
//! Retention lists the runs through the pipelines set and each pipeline's
//! runs (their hashes only, in pipelined pages), then removes each chosen
//! run with one script: if its bytes, status and last update are still the
//! ones it was chosen by, it deletes the hash and the list, takes the run
//! out of its pipeline's set and, when that empties, the pipeline out of the
//! pipelines set. Scripts run one at a time, so an append either comes
//! before (and keeps the run) or after (and starts it anew). Several nodes
//! may prune the same store: the second finds nothing to remove.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use redis::aio::ConnectionManager;

use super::retention::{Candidate, Planner};
use super::{
    Append, Clock, PruneReport, RetentionPolicy, RunInfo, RunKey, RunLogStore, RunState, RunSummary, StoreError,
};
use crate::redis_conn::RedisEndpoint;
use crate::redis_conn::tracking::KeyWaits;
use crate::stream::SequenceToken;
use crate::telemetry;

/// Runs asked for in one round trip while pruning.
const PAGE: usize = 256;

/// KEYS: run hash, log list, runs zset, pipelines set, times zset.
/// ARGV: fqn, run, created, token major, token minor, bytes, fingerprint,
/// fence, arrived, lines...
///
/// Token parts are unsigned 64-bit decimals, compared as strings (shorter
/// is smaller, then byte order): Lua numbers are doubles and would take
/// tokens above 2^53 that differ for equal ones.
///
/// ARGV[7] is the container's fingerprint (16 hex digits, or empty): one
/// the run's `recent` field holds (the last 128, space-separated) is a
/// producer's retried batch, so only the token moves.
///
/// ARGV[9] is when the lines arrived (ms, or empty): a member
/// `offset:ms` of the times sorted set (KEYS[5]), scored by the offset of
/// the container's first line. Lines start at ARGV[10].
///
/// ARGV[8] is the writer's lease fencing token (or empty, unfenced): one
/// below the run's `fence` field (the highest token that appended to it)
/// is refused with the error `FENCED`, before anything is written.
const APPEND: &str = r"
local RECENT_CHARS = 128 * 17
local function less(a, b)
  if #a ~= #b then return #a < #b end
  return a < b
end
if ARGV[8] ~= '' then
  local mark = redis.call('HGET', KEYS[1], 'fence')
  if mark and less(ARGV[8], mark) then
    return redis.error_reply('FENCED run fence ' .. mark)
  end
  redis.call('HSET', KEYS[1], 'fence', ARGV[8])
end
if redis.call('HSETNX', KEYS[1], 'created', ARGV[3]) == 1 then
  redis.call('HSET', KEYS[1], 'updated', ARGV[3])
  redis.call('ZADD', KEYS[3], ARGV[3], ARGV[2])
  redis.call('SADD', KEYS[4], ARGV[1])
end
local major = redis.call('HGET', KEYS[1], 'major')
local minor = redis.call('HGET', KEYS[1], 'minor')
if major and minor then
  local m, n = ARGV[4], ARGV[5]
  if less(m, major) or (m == major and not less(minor, n)) then
    return 0
  end
end
local recent = redis.call('HGET', KEYS[1], 'recent') or ''
if ARGV[7] ~= '' and string.find(' ' .. recent .. ' ', ' ' .. ARGV[7] .. ' ', 1, true) then
  redis.call('HSET', KEYS[1], 'major', ARGV[4], 'minor', ARGV[5])
  return 0
end
if ARGV[9] ~= '' and #ARGV > 9 then
  local first = redis.call('LLEN', KEYS[2])
  redis.call('ZADD', KEYS[5], first, first .. ':' .. ARGV[9])
end
for i = 10, #ARGV do
  redis.call('RPUSH', KEYS[2], ARGV[i])
end
redis.call('HINCRBY', KEYS[1], 'lines', #ARGV - 9)
redis.call('HINCRBY', KEYS[1], 'bytes', ARGV[6])
redis.call('HSET', KEYS[1], 'major', ARGV[4], 'minor', ARGV[5], 'updated', ARGV[3])
if ARGV[7] ~= '' then
  recent = ARGV[7] .. ' ' .. recent
  if #recent > RECENT_CHARS then
    recent = string.sub(recent, 1, RECENT_CHARS - 1)
  end
  redis.call('HSET', KEYS[1], 'recent', recent)
end
return 1";

/// KEYS: run hash, runs zset, pipelines set. ARGV: fqn, run, created, state.
const ENSURE: &str = r"
if redis.call('HSETNX', KEYS[1], 'created', ARGV[3]) == 1 then
  redis.call('HSET', KEYS[1], 'updated', ARGV[3])
  redis.call('ZADD', KEYS[2], ARGV[3], ARGV[2])
  redis.call('SADD', KEYS[3], ARGV[1])
end
if redis.call('HGET', KEYS[1], 'state') ~= ARGV[4] then
  redis.call('HSET', KEYS[1], 'state', ARGV[4], 'updated', ARGV[3])
end
return 1";

/// KEYS: run hash, log list, runs zset, pipelines set, times zset.
/// ARGV: fqn, run, bytes, updated, state ('' for none), as chosen.
const PRUNE: &str = r"
if redis.call('EXISTS', KEYS[1]) == 0 then
  return 0
end
local bytes = tonumber(redis.call('HGET', KEYS[1], 'bytes') or '0')
local updated = tonumber(redis.call('HGET', KEYS[1], 'updated') or '0')
local state = redis.call('HGET', KEYS[1], 'state') or ''
if bytes ~= tonumber(ARGV[3]) or updated ~= tonumber(ARGV[4]) or state ~= ARGV[5] then
  return 0
end
redis.call('DEL', KEYS[1], KEYS[2], KEYS[5])
redis.call('ZREM', KEYS[3], ARGV[2])
if redis.call('ZCARD', KEYS[3]) == 0 then
  redis.call('SREM', KEYS[4], ARGV[1])
end
return 1";

/// See the module documentation.
pub struct RedisRunLogStore {
    conn: ConnectionManager,
    prefix: String,
    append: redis::Script,
    ensure: redis::Script,
    prune: redis::Script,
    clock: Clock,
    /// Tells [`RunLogStore::wait_stored`] of writes to a run's hash (by any
    /// node); `None` over a connection given to [`RedisRunLogStore::new`]:
    /// waits look every [`super::STORED_POLL`].
    waits: Option<Arc<KeyWaits>>,
}

fn backend(e: redis::RedisError) -> StoreError {
    StoreError::Backend(format!("redis: {e}"))
}

impl RedisRunLogStore {
    /// Over an existing connection; every key starts with `prefix`.
    pub fn new(conn: ConnectionManager, prefix: &str) -> Self {
        Self {
            conn,
            prefix: prefix.to_string(),
            append: redis::Script::new(APPEND),
            ensure: redis::Script::new(ENSURE),
            prune: redis::Script::new(PRUNE),
            clock: super::system_clock(),
            waits: None,
        }
    }

    /// Stamps runs with `clock`'s time instead of the system's.
    pub fn with_clock(mut self, clock: Clock) -> Self {
        self.clock = clock;
        self
    }

    /// Connects to `url` (credentials in the URL).
    pub async fn connect(url: &str, prefix: &str) -> Result<Self, StoreError> {
        Self::connect_to(&RedisEndpoint::from_url(url, "url"), prefix).await
    }

    /// Connects to `endpoint`, reconnecting with backoff when the
    /// connection drops. A refused password or certificate names the
    /// setting.
    pub async fn connect_to(endpoint: &RedisEndpoint, prefix: &str) -> Result<Self, StoreError> {
        let config = redis::aio::ConnectionManagerConfig::new();
        let conn = endpoint.connect(config.clone()).await.map_err(|e| StoreError::Backend(e.to_string()))?;
        let waits = KeyWaits::new(endpoint.clone(), config, "status waits look every 100 ms");
        Ok(Self { waits: Some(Arc::new(waits)), ..Self::new(conn, prefix) })
    }

    fn run_key(&self, run: &RunKey) -> String {
        format!("{}:run:{}:{}:{}", self.prefix, run.fqn().len(), run.fqn(), run.run())
    }

    fn times_key(&self, run: &RunKey) -> String {
        format!("{}:times:{}:{}:{}", self.prefix, run.fqn().len(), run.fqn(), run.run())
    }

    fn log_key(&self, run: &RunKey) -> String {
        format!("{}:log:{}:{}:{}", self.prefix, run.fqn().len(), run.fqn(), run.run())
    }

    fn runs_key(&self, fqn: &str) -> String {
        format!("{}:runs:{}:{fqn}", self.prefix, fqn.len())
    }

    fn pipelines_key(&self) -> String {
        format!("{}:pipelines", self.prefix)
    }

    async fn ensure(&self, run: &RunKey, state: RunState) -> Result<(), StoreError> {
        let mut invocation = self.ensure.key(self.run_key(run));
        invocation.key(self.runs_key(run.fqn())).key(self.pipelines_key());
        invocation.arg(run.fqn()).arg(run.run()).arg((self.clock)()).arg(state.as_str());
        invocation.invoke_async::<i64>(&mut self.conn.clone()).await.map_err(backend).map(|_| ())
    }

    /// Offers every run of `fqn` to the planner, a page of hashes per
    /// round trip.
    async fn plan_pipeline(&self, fqn: &str, planner: &mut Planner<'_>) -> Result<(), StoreError> {
        let mut conn = self.conn.clone();
        let mut start = 0usize;
        loop {
            let ids: Vec<String> = redis::cmd("ZRANGE")
                .arg(self.runs_key(fqn))
                .arg(start)
                .arg(start + PAGE - 1)
                .query_async(&mut conn)
                .await
                .map_err(backend)?;
            let keys: Vec<RunKey> = ids.iter().filter_map(|id| RunKey::new(fqn, id).ok()).collect();
            let mut pipe = redis::pipe();
            for key in &keys {
                pipe.cmd("HGETALL").arg(self.run_key(key));
            }
            let hashes: Vec<std::collections::HashMap<String, String>> =
                if keys.is_empty() { Vec::new() } else { pipe.query_async(&mut conn).await.map_err(backend)? };
            for (key, fields) in keys.iter().zip(hashes) {
                match parse_info(key, fields) {
                    Ok(Some(info)) => planner.offer(key, &info),
                    Ok(None) => {}
                    Err(e) => tracing::warn!(run = %key, error = %e, "retention skips a run it cannot read"),
                }
            }
            if ids.len() < PAGE {
                return Ok(());
            }
            start += PAGE;
        }
    }

    async fn remove_if_unchanged(&self, candidate: &Candidate) -> Result<bool, StoreError> {
        let run = &candidate.run;
        let mut invocation = self.prune.key(self.run_key(run));
        invocation.key(self.log_key(run)).key(self.runs_key(run.fqn())).key(self.pipelines_key());
        invocation.key(self.times_key(run));
        invocation.arg(run.fqn()).arg(run.run()).arg(candidate.info.bytes).arg(candidate.info.updated_ms);
        invocation.arg(candidate.info.state.map_or("", |s| s.as_str()));
        let removed: i64 = invocation.invoke_async(&mut self.conn.clone()).await.map_err(backend)?;
        Ok(removed == 1)
    }
}

fn parse_info(run: &RunKey, fields: std::collections::HashMap<String, String>) -> Result<Option<RunInfo>, StoreError> {
    if fields.is_empty() {
        return Ok(None);
    }
    let number = |name: &str| -> Result<Option<u64>, StoreError> {
        fields
            .get(name)
            .map(|v| v.parse::<u64>().map_err(|_| StoreError::Corrupt(format!("field `{name}` of run {run}"))))
            .transpose()
    };
    let last_token = match (number("major")?, number("minor")?) {
        (Some(major), Some(minor)) => Some(SequenceToken::new(major, minor)),
        _ => None,
    };
    Ok(Some(RunInfo {
        lines: number("lines")?.unwrap_or(0),
        bytes: number("bytes")?.unwrap_or(0),
        state: fields.get("state").and_then(|s| RunState::parse(s)),
        last_token,
        created_ms: number("created")?.unwrap_or(0),
        updated_ms: number("updated")?.unwrap_or(0),
    }))
}

impl RedisRunLogStore {
    async fn append_lines(
        &self,
        run: &RunKey,
        token: SequenceToken,
        how: Append,
        lines: &[&str],
    ) -> Result<bool, StoreError> {
        let (fingerprint, fence) = (how.fingerprint, how.fence.token());
        let bytes: usize = lines.iter().map(|l| l.len() + 1).sum();
        let mut invocation = self.append.key(self.run_key(run));
        invocation.key(self.log_key(run)).key(self.runs_key(run.fqn())).key(self.pipelines_key());
        invocation.key(self.times_key(run));
        invocation.arg(run.fqn()).arg(run.run()).arg((self.clock)()).arg(token.major).arg(token.minor).arg(bytes);
        invocation.arg(fingerprint.map_or(String::new(), |f| format!("{f:016x}")));
        invocation.arg(fence.map_or(String::new(), |f| f.to_string()));
        invocation.arg(how.arrived_ms.map_or(String::new(), |ms| ms.to_string()));
        for line in lines {
            invocation.arg(*line);
        }
        match invocation.invoke_async::<i64>(&mut self.conn.clone()).await {
            Ok(appended) => Ok(appended == 1),
            Err(error) if error.code() == Some("FENCED") => {
                let token = fence.unwrap_or(0);
                tracing::warn!(%run, token, %error, "run log append refused: a newer lease of its queue appended");
                metrics::counter!(telemetry::FENCED_WRITES, "kind" => "append").increment(1);
                Err(StoreError::Fenced { run: run.to_string(), token })
            }
            Err(error) => Err(backend(error)),
        }
    }
}

#[async_trait]
impl RunLogStore for RedisRunLogStore {
    async fn append(
        &self,
        run: &RunKey,
        token: SequenceToken,
        lines: &[&str],
        how: Append,
    ) -> Result<bool, StoreError> {
        self.append_lines(run, token, how, lines).await
    }

    async fn set_state(&self, run: &RunKey, state: RunState) -> Result<(), StoreError> {
        self.ensure(run, state).await
    }

    async fn times(&self, run: &RunKey, from: u64, to: u64) -> Result<Vec<(u64, u64)>, StoreError> {
        if to <= from {
            return Ok(Vec::new());
        }
        let key = self.times_key(run);
        let (lines, before, inside): (Option<u64>, Vec<String>, Vec<String>) = redis::pipe()
            .cmd("HGET")
            .arg(self.run_key(run))
            .arg("lines")
            .cmd("ZREVRANGEBYSCORE")
            .arg(&key)
            .arg(from)
            .arg("-inf")
            .arg("LIMIT")
            .arg(0)
            .arg(1)
            .cmd("ZRANGEBYSCORE")
            .arg(&key)
            .arg(format!("({from}"))
            .arg(format!("({to}"))
            .query_async(&mut self.conn.clone())
            .await
            .map_err(backend)?;
        if from >= lines.unwrap_or(0) {
            return Ok(Vec::new());
        }
        let mark = |member: &String| {
            let (offset, ms) = member.split_once(':')?;
            Some((offset.parse().ok()?, ms.parse().ok()?))
        };
        Ok(before.iter().chain(&inside).filter_map(mark).collect())
    }

    async fn wait_stored(&self, run: &RunKey, token: SequenceToken, within: Duration) -> bool {
        let arm = || {
            let waits = self.waits.as_ref()?;
            let key = self.run_key(run);
            let mut check = redis::cmd("HMGET");
            check.arg(&key).arg("major").arg("minor");
            waits.wait(key, check, move |answer| {
                let held: Option<(Option<u64>, Option<u64>)> = redis::from_redis_value_ref(answer).ok();
                matches!(held, Some((Some(major), Some(minor))) if SequenceToken::new(major, minor) >= token)
            })
        };
        super::stored_within(self, run, token, within, arm).await
    }

    async fn info(&self, run: &RunKey) -> Result<Option<RunInfo>, StoreError> {
        let fields: std::collections::HashMap<String, String> =
            redis::cmd("HGETALL").arg(self.run_key(run)).query_async(&mut self.conn.clone()).await.map_err(backend)?;
        parse_info(run, fields)
    }

    async fn read(
        &self,
        run: &RunKey,
        from: u64,
        max_lines: usize,
        max_bytes: usize,
    ) -> Result<Vec<String>, StoreError> {
        if max_lines == 0 {
            return Ok(Vec::new());
        }
        // Redis indexes are signed 64-bit: a larger offset is past any list.
        let start = from.min(i64::MAX as u64);
        let lines: Vec<String> = redis::cmd("LRANGE")
            .arg(self.log_key(run))
            .arg(start)
            .arg(start.saturating_add(max_lines as u64 - 1).min(i64::MAX as u64))
            .query_async(&mut self.conn.clone())
            .await
            .map_err(backend)?;
        let mut taken = 0;
        let mut out = Vec::with_capacity(lines.len());
        for line in lines {
            if !out.is_empty() && taken + line.len() + 1 > max_bytes {
                break;
            }
            taken += line.len() + 1;
            out.push(line);
        }
        Ok(out)
    }

    async fn pipeline_exists(&self, fqn: &str) -> Result<bool, StoreError> {
        redis::cmd("SISMEMBER")
            .arg(self.pipelines_key())
            .arg(fqn)
            .query_async(&mut self.conn.clone())
            .await
            .map_err(backend)
    }

    async fn pipelines(&self, limit: usize) -> Result<Vec<String>, StoreError> {
        let mut names: Vec<String> = redis::cmd("SMEMBERS")
            .arg(self.pipelines_key())
            .query_async(&mut self.conn.clone())
            .await
            .map_err(backend)?;
        names.sort();
        names.truncate(limit);
        Ok(names)
    }

    async fn runs(&self, fqn: &str, limit: usize) -> Result<Vec<RunSummary>, StoreError> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        let ids: Vec<String> = redis::cmd("ZREVRANGE")
            .arg(self.runs_key(fqn))
            .arg(0)
            .arg(limit - 1)
            .query_async(&mut self.conn.clone())
            .await
            .map_err(backend)?;
        let mut out = Vec::with_capacity(ids.len());
        for id in ids {
            let Ok(run) = RunKey::new(fqn, &id) else { continue };
            if let Some(info) = self.info(&run).await? {
                out.push(RunSummary { run: id, info });
            }
        }
        Ok(out)
    }

    async fn prune(&self, policy: &RetentionPolicy, now_ms: u64) -> Result<PruneReport, StoreError> {
        let mut planner = Planner::new(policy, now_ms);
        // As `pipelines` does: one name per pipeline (SSCAN may repeat one).
        let fqns: Vec<String> = redis::cmd("SMEMBERS")
            .arg(self.pipelines_key())
            .query_async(&mut self.conn.clone())
            .await
            .map_err(backend)?;
        for fqn in fqns {
            self.plan_pipeline(&fqn, &mut planner).await?;
        }
        let (chosen, mut report) = planner.finish();
        for candidate in chosen {
            let removed = self.remove_if_unchanged(&candidate).await;
            report.record(&candidate, removed);
        }
        Ok(report)
    }
}
