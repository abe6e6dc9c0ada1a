//! Retention on the Redis store: listing the runs a page at a time, and
//! removing a chosen run only if it is still as chosen.

use super::{Candidate, Planner, RedisRunLogStore, backend, parse_info};
use crate::archive::{RunKey, StoreError};

/// Runs asked for in one round trip while pruning.
const PAGE: usize = 256;

impl RedisRunLogStore {
    /// Offers every run of `fqn` to the planner, a page of hashes per
    /// round trip.
    pub(super) async fn plan_pipeline(&self, fqn: &str, planner: &mut Planner<'_>) -> Result<(), StoreError> {
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
            let hashes = self.hashes(&keys).await?;
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

    /// Takes the run out of its pipeline's listing, removes it if it is
    /// still as chosen, and lists it again if not: an append that comes in
    /// between either changed it (kept, listed again) or comes after (a new
    /// run, which lists itself). The pipeline leaves the pipelines when its
    /// last run went, and comes back if a run was listed meanwhile.
    pub(super) async fn remove_if_unchanged(&self, candidate: &Candidate) -> Result<bool, StoreError> {
        let run = &candidate.run;
        let mut conn = self.conn.clone();
        let runs = self.runs_key(run.fqn());
        redis::cmd("ZREM").arg(&runs).arg(run.run()).query_async::<()>(&mut conn).await.map_err(backend)?;
        let mut invocation = self.prune.key(self.run_key(run));
        invocation.key(self.log_key(run)).key(self.times_key(run));
        invocation.arg(candidate.info.bytes).arg(candidate.info.updated_ms);
        invocation.arg(candidate.info.state.map_or("", |s| s.as_str()));
        let removed: i64 = invocation.invoke_async(&mut conn).await.map_err(backend)?;
        if removed != 1 {
            let _: i64 = redis::cmd("ZADD")
                .arg(&runs)
                .arg("NX")
                .arg(candidate.info.created_ms)
                .arg(run.run())
                .query_async(&mut conn)
                .await
                .map_err(backend)?;
            return Ok(false);
        }
        let mut count = redis::cmd("ZCARD");
        count.arg(&runs);
        if count.query_async::<u64>(&mut conn).await.map_err(backend)? == 0 {
            let pipelines = self.pipelines_key();
            redis::cmd("SREM").arg(&pipelines).arg(run.fqn()).query_async::<()>(&mut conn).await.map_err(backend)?;
            if count.query_async::<u64>(&mut conn).await.map_err(backend)? > 0 {
                redis::cmd("SADD")
                    .arg(&pipelines)
                    .arg(run.fqn())
                    .query_async::<()>(&mut conn)
                    .await
                    .map_err(backend)?;
            }
        }
        Ok(true)
    }
}
