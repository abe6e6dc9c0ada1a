//! Run logs in Redis (cluster mode: every node reads every run).
//!
//! ```text
//! {prefix}:pipelines                 set of pipeline names
//! {prefix}:runs:{n}:{fqn}            sorted set of run ids by creation time
//! {prefix}:run:{n}:{fqn}:{runId}     hash: lines, bytes, state, created, updated, major and minor
//!                                    (the last stored container's token), fence, recent, indexed
//! {prefix}:log:{n}:{fqn}:{runId}     list of lines
//! {prefix}:times:{n}:{fqn}:{runId}   sorted set of `offset:ms` by offset: when each container's lines arrived
//! ```
//!
//! (`{n}` is the length of the fqn, so no two runs share a key; `created`
//! and `updated` are ms since the Unix epoch; `recent` holds the
//! fingerprints of the last 128 containers appended, so one redelivered
//! under another token is not appended twice. The run facts the edge
//! answers are `lines`, `bytes`, `state`, `created` as `createdMs` and the
//! later of `created` and `updated` as `updatedMs`.) On a
//! Redis Cluster a run's three keys end in `{{n}:{fqn}:{runId}}` instead, a
//! hash tag that keeps them in one slot; the two listing keys live
//! wherever they hash.
//!
//! An append is one Lua script over the run's keys: it compares the
//! container's token with the stored one, pushes the lines and updates the
//! counters together, so a redelivered container changes nothing and a
//! crash leaves all or none. A run not yet `indexed` is then added to its
//! pipeline's runs and the pipeline to the pipelines (other slots, so other
//! commands), and marked: a crash in between lists it on the next write of
//! the run, which the archiver's redelivery makes.
//!
//! A fenced append (the archiver's, under a queue lease) also compares the
//! writer's lease token with the run's `fence` field, the highest token
//! that appended to the run, and is refused if it is lower: an agent whose
//! lease was superseded, and whose successor already wrote to the run,
//! writes nothing more. The run keeps its own mark rather than reading the
//! queue's fencing counter because the store may live on another server
//! or another Cluster slot than the queues. A run always maps to one
//! queue, so the tokens it sees come from one counter.
//!
//! Retention lists the runs through the pipelines set and each pipeline's
//! runs (their hashes only, in pipelined pages), then removes each chosen
//! run: out of its pipeline's runs first, then one script deletes its keys
//! if its bytes, status and last update are still the ones it was chosen
//! by (else it is listed again), then the pipeline leaves the pipelines if
//! it has no run left. Scripts run one at a time, so an append either comes
//! before (and keeps the run) or after (and starts it anew). Several nodes
//! may prune the same store: the second finds nothing to remove.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

use super::retention::{Candidate, Planner};
use super::{
    Append, Clock, PruneReport, RetentionPolicy, RunInfo, RunKey, RunLogStore, RunState, RunSummary, StoreError,
};
use crate::redis_conn::tracking::KeyWaits;
use crate::redis_conn::{RedisConn, RedisEndpoint, WaitReplicas};
use crate::stream::SequenceToken;
use crate::telemetry;
use scripts::{APPEND, ENSURE, PRUNE};

mod prune;
mod scripts;

/// Limit of one command to a Redis Cluster (one server's connection has
/// its own).
const RESPONSE_TIMEOUT: Duration = Duration::from_secs(5);

/// See the module documentation.
pub struct RedisRunLogStore {
    conn: RedisConn,
    prefix: String,
    /// A run's keys carry a hash tag (a Redis Cluster keeps them in one
    /// slot); without one, the layout of one server.
    tagged: bool,
    /// Replicas an append must reach before it counts as stored.
    wait: Option<WaitReplicas>,
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
    pub fn new(conn: impl Into<RedisConn>, prefix: &str) -> Self {
        let conn = conn.into();
        Self {
            tagged: conn.is_cluster(),
            wait: None,
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

    /// An append counts as stored only once `wait.replicas` replicas have
    /// it (`WAIT` on the run's master after the script).
    pub fn with_wait_replicas(mut self, wait: Option<WaitReplicas>) -> Self {
        self.wait = wait;
        self
    }

    /// Connects to `url` (credentials in the URL).
    pub async fn connect(url: &str, prefix: &str) -> Result<Self, StoreError> {
        Self::connect_to(&RedisEndpoint::from_url(url, "url"), prefix).await
    }

    /// Connects to `endpoint` (one server, reconnecting with backoff when
    /// the connection drops, or a Redis Cluster when its access says so).
    /// A refused password or certificate names the setting. Waits for a
    /// run are told of its writes (client-side tracking, on a cluster by
    /// the run's shard).
    pub async fn connect_to(endpoint: &RedisEndpoint, prefix: &str) -> Result<Self, StoreError> {
        let config = redis::aio::ConnectionManagerConfig::new();
        let conn = endpoint
            .connect_any(config.clone(), RESPONSE_TIMEOUT)
            .await
            .map_err(|e| StoreError::Backend(e.to_string()))?;
        let waits = KeyWaits::new(endpoint.clone(), config, "status waits look every 100 ms");
        Ok(Self { waits: Some(Arc::new(waits)), ..Self::new(conn, prefix) })
    }

    /// What every key of `run` ends with: `{n}:{fqn}:{run}`, in braces
    /// when tagged (the same text in every key of the run, so one slot).
    fn run_part(&self, run: &RunKey) -> String {
        let part = format!("{}:{}:{}", run.fqn().len(), run.fqn(), run.run());
        if self.tagged { format!("{{{part}}}") } else { part }
    }

    fn run_key(&self, run: &RunKey) -> String {
        format!("{}:run:{}", self.prefix, self.run_part(run))
    }

    fn times_key(&self, run: &RunKey) -> String {
        format!("{}:times:{}", self.prefix, self.run_part(run))
    }

    fn log_key(&self, run: &RunKey) -> String {
        format!("{}:log:{}", self.prefix, self.run_part(run))
    }

    fn runs_key(&self, fqn: &str) -> String {
        format!("{}:runs:{}:{fqn}", self.prefix, fqn.len())
    }

    fn pipelines_key(&self) -> String {
        format!("{}:pipelines", self.prefix)
    }

    async fn ensure(&self, run: &RunKey, state: RunState) -> Result<(), StoreError> {
        let mut invocation = self.ensure.key(self.run_key(run));
        invocation.arg((self.clock)()).arg(state.as_str());
        let (created, indexed): (u64, u8) = invocation.invoke_async(&mut self.conn.clone()).await.map_err(backend)?;
        self.replicated(run).await?;
        if indexed == 0 {
            self.index(run, created).await?;
        }
        Ok(())
    }

    /// Lists `run` in its pipeline's runs and the pipeline among the
    /// pipelines (keys in other slots than the run's), then marks the run
    /// listed. Every step may repeat: a crash before the mark lists it
    /// again on its next write.
    async fn index(&self, run: &RunKey, created: u64) -> Result<(), StoreError> {
        let runs = self.runs_key(run.fqn());
        let pipelines = self.pipelines_key();
        let listing = vec![
            (runs.clone(), redis::cmd("ZADD").arg(&runs).arg("NX").arg(created).arg(run.run()).clone()),
            (pipelines.clone(), redis::cmd("SADD").arg(&pipelines).arg(run.fqn()).clone()),
        ];
        let _: Vec<redis::Value> = self.conn.query_by_slot(listing).await.map_err(backend)?;
        redis::cmd("HSET")
            .arg(self.run_key(run))
            .arg("indexed")
            .arg(1)
            .query_async::<()>(&mut self.conn.clone())
            .await
            .map_err(backend)
    }

    /// With `wait_replicas`: an error unless that many replicas have the
    /// last write to `run` (the archiver then tries the container again,
    /// which stores nothing twice).
    async fn replicated(&self, run: &RunKey) -> Result<(), StoreError> {
        let Some(wait) = self.wait else { return Ok(()) };
        let confirmed = self.conn.wait_replicas(&self.run_key(run), wait).await.map_err(backend)?;
        if confirmed < wait.replicas {
            return Err(StoreError::Backend(format!(
                "redis: run {run}: {confirmed} of {} replicas had the write within {:?} ([adapters.redis] \
                 wait_replicas)",
                wait.replicas, wait.timeout
            )));
        }
        Ok(())
    }

    /// The hashes of `keys`, one round (a pipeline per slot).
    async fn hashes(&self, keys: &[RunKey]) -> Result<Vec<std::collections::HashMap<String, String>>, StoreError> {
        let reads = keys.iter().map(|key| {
            let hash = self.run_key(key);
            (hash.clone(), redis::cmd("HGETALL").arg(hash).clone())
        });
        self.conn.query_by_slot(reads.collect()).await.map_err(backend)
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
        invocation.key(self.log_key(run)).key(self.times_key(run));
        invocation.arg((self.clock)()).arg(token.major).arg(token.minor).arg(bytes);
        invocation.arg(fingerprint.map_or(String::new(), |f| format!("{f:016x}")));
        invocation.arg(fence.map_or(String::new(), |f| f.to_string()));
        invocation.arg(how.arrived_ms.map_or(String::new(), |ms| ms.to_string()));
        for line in lines {
            invocation.arg(*line);
        }
        match invocation.invoke_async::<(i64, u64, u8)>(&mut self.conn.clone()).await {
            Ok((appended, created, indexed)) => {
                self.replicated(run).await?;
                if indexed == 0 {
                    self.index(run, created).await?;
                }
                Ok(appended == 1)
            }
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

    async fn info_and_recent(&self, run: &RunKey) -> Result<Option<(RunInfo, Vec<u64>)>, StoreError> {
        let fields: std::collections::HashMap<String, String> =
            redis::cmd("HGETALL").arg(self.run_key(run)).query_async(&mut self.conn.clone()).await.map_err(backend)?;
        // Newest first in the hash; oldest first here.
        let mut recent: Vec<u64> = fields
            .get("recent")
            .map(|r| r.split(' ').filter_map(|f| u64::from_str_radix(f, 16).ok()).collect())
            .unwrap_or_default();
        recent.reverse();
        Ok(parse_info(run, fields)?.map(|info| (info, recent)))
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
        let keys: Vec<RunKey> = ids.iter().filter_map(|id| RunKey::new(fqn, id).ok()).collect();
        let mut out = Vec::with_capacity(keys.len());
        for (key, fields) in keys.iter().zip(self.hashes(&keys).await?) {
            if let Some(info) = parse_info(key, fields)? {
                out.push(RunSummary { run: key.run().to_string(), info });
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
