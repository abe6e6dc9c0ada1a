//! The edge's settings: `[edge]`, `[edge.auth]` and `[edge.log_stream]`
//! (OpenMetadata's `LogStreamSettings`, in snake_case, with its defaults).
//! They live in the config, not in the edge, so that the config never reads
//! the edge (the edge reads the node, which reads the config);
//! `crate::edge` re-exports them.

use serde::{Deserialize, Serialize};

/// `[edge]`
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct EdgeOptions {
    /// Where the edge listens (`ip:port`; `tailrace node` binds exactly this
    /// address, `tailrace serve --listen` overrides it).
    pub listen: std::net::SocketAddr,
    /// Largest ingest request body, in bytes (larger: 413). At most
    /// `max_total_body_bytes`, and below 4 GiB.
    pub max_body_bytes: usize,
    /// Longest time an ingest request's body may take to arrive, from the
    /// end of its head (longer: 408). Seconds, may be fractional.
    pub body_timeout_seconds: f64,
    /// Bytes of ingest request bodies held in memory at once by the whole
    /// edge; a body that would pass it is refused at once with 503 and
    /// `Retry-After`. A declared `Content-Length` counts in full from the
    /// start, a chunked body as it arrives.
    pub max_total_body_bytes: usize,
    /// Most lines one ingest request may carry (more: 413).
    pub max_lines_per_request: usize,
    /// Most lines one page of `…/last` returns (`limit` is capped to it).
    pub max_page_lines: usize,
    /// Most pipelines or runs a listing returns.
    pub max_listing: usize,
    /// How long `PUT …/status` waits for the archiver to store the change
    /// (it goes through the run's stream, after the lines before it):
    /// `200` once stored, `202` if still on its way after this long. A read
    /// of a run through the edge that accepted its last write waits as long
    /// at most for that write to be stored (read your writes).
    pub status_wait_seconds: f64,
    /// Runs whose last accepted write the edge remembers, so that its own
    /// reads wait for it (the least recently written are forgotten).
    pub max_written_runs: usize,
    /// Most lines one search request scans (`next` says where to go on).
    pub max_search_scan_lines: usize,
    /// Most matches one search request returns (`limit` is capped to it).
    pub max_search_matches: usize,
    /// Most bytes of records one JSON Lines read (`…/lines`, `…/failures`)
    /// answers (`maxBytes` may ask for less); `next` continues.
    pub max_answer_bytes: usize,
    /// Most lines of each run a diff compares (a run with more: 422).
    pub max_diff_lines: usize,
    /// Most hunks one diff answer holds (`next` says where to go on).
    pub max_diff_hunks: usize,
    /// Diffs computed at once by this edge (more: 503 with `Retry-After`);
    /// each holds a hash of every line of both runs while it runs.
    pub max_concurrent_diffs: usize,
    /// Bearer tokens.
    pub auth: AuthOptions,
    /// HTTPS (off unless set): with it the edge serves HTTPS only.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tls: Option<EdgeTls>,
    /// The SSE log stream.
    pub log_stream: LogStreamSettings,
    /// The SSE stream of a pipeline's runs (`…/runs/stream`).
    pub runs_stream: RunsStreamSettings,
}

impl Default for EdgeOptions {
    fn default() -> Self {
        Self {
            listen: std::net::SocketAddr::from(([127, 0, 0, 1], 8585)),
            max_body_bytes: 4 * 1024 * 1024,
            body_timeout_seconds: 30.0,
            max_total_body_bytes: 64 * 1024 * 1024,
            max_lines_per_request: 10_000,
            max_page_lines: 10_000,
            max_listing: 200,
            status_wait_seconds: 5.0,
            max_written_runs: 10_000,
            max_search_scan_lines: 1_000_000,
            max_search_matches: 1_000,
            max_answer_bytes: 64 * 1024,
            max_diff_lines: 1_000_000,
            max_diff_hunks: 100,
            max_concurrent_diffs: 2,
            auth: AuthOptions::default(),
            tls: None,
            log_stream: LogStreamSettings::default(),
            runs_stream: RunsStreamSettings::default(),
        }
    }
}

impl EdgeOptions {
    /// Problems with these settings, if any.
    pub fn check(&self) -> Result<(), String> {
        let timeout = self.body_timeout_seconds;
        if !(timeout > 0.0 && timeout.is_finite()) {
            return Err(format!("edge.body_timeout_seconds must be a positive number of seconds (got {timeout})"));
        }
        if u32::try_from(self.max_body_bytes).is_err() {
            return Err(format!("edge.max_body_bytes must be below 4 GiB (got {})", self.max_body_bytes));
        }
        if self.max_body_bytes > self.max_total_body_bytes {
            return Err(format!(
                "edge.max_body_bytes ({}) must not be more than edge.max_total_body_bytes ({})",
                self.max_body_bytes, self.max_total_body_bytes
            ));
        }
        for (name, value) in
            [("max_diff_hunks", self.max_diff_hunks), ("max_concurrent_diffs", self.max_concurrent_diffs)]
        {
            if value == 0 {
                return Err(format!("edge.{name} must be at least 1"));
            }
        }
        if let Some(tls) = &self.tls {
            for (key, path) in [("cert", &tls.cert), ("key", &tls.key)] {
                if path.as_os_str().is_empty() {
                    return Err(format!("edge.tls.{key} must name a file"));
                }
            }
        }
        self.log_stream.check()?;
        self.runs_stream.check()
    }
}

/// `[edge.tls]`: PEM files; with them the edge serves HTTPS only.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EdgeTls {
    /// The edge's certificate chain (its own certificate first).
    pub cert: std::path::PathBuf,
    /// Its private key.
    pub key: std::path::PathBuf,
}

/// What a token may do.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Scope {
    /// Stream, page and download logs; list pipelines and runs.
    Read,
    /// Ingest lines and set run states.
    Write,
    /// The cluster's state and its agents (`/api/v1/admin/…`).
    Admin,
}

/// One bearer token.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokenEntry {
    /// The secret sent as `Authorization: Bearer <token>`.
    pub token: String,
    /// What it may do.
    pub scopes: Vec<Scope>,
}

/// Shows the scopes, never the secret.
impl std::fmt::Debug for TokenEntry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenEntry").field("token", &"***").field("scopes", &self.scopes).finish()
    }
}

/// `[edge.auth]`: with no token, the API is open and the edge refuses to
/// listen anywhere but loopback.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AuthOptions {
    /// Accepted tokens (`[[edge.auth.tokens]]`).
    pub tokens: Vec<TokenEntry>,
}

/// `[edge.log_stream]`. Durations are in seconds and may be fractional.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LogStreamSettings {
    /// How often each run's tailer checks its end conditions (new lines are
    /// pushed, not polled).
    pub poll_seconds: f64,
    /// Lines per store read when a viewer catches up.
    pub lines_per_read: usize,
    /// Store reads per viewer and tick while catching up.
    pub max_reads_per_tick: usize,
    /// Bytes of content per viewer and tick while catching up.
    pub max_bytes_per_tick: usize,
    /// Content a tailer publishes before it ends with `maxBytes`.
    pub max_stream_bytes: u64,
    /// Tailer lifetime before it ends with `maxDuration`.
    pub max_stream_seconds: f64,
    /// Quiet time before a tailer ends with `idleTimeout`.
    pub max_idle_seconds: f64,
    /// Quiet time after a run finished before `runFinished`.
    pub finish_grace_seconds: f64,
    /// Quiet time for a run with no status before `runFinished`.
    pub unknown_run_grace_seconds: f64,
    /// Least time between two lookups of a run's status.
    pub run_probe_seconds: f64,
    /// Content kept in memory per run (its window): viewers read it at
    /// their own pace; one that falls behind it reads from the store.
    pub max_replay_bytes: usize,
    /// Ignored: viewers hold no frames of their own any more (they are
    /// metered by lag, see `stall_timeout_seconds`). Accepted so that
    /// older configs still load.
    pub max_pending_bytes_per_client: usize,
    /// How long a viewer's socket may take nothing while it has lines to
    /// send before its connection is cut (without `complete`; it resumes
    /// with its cursor).
    pub stall_timeout_seconds: f64,
    /// How long a run's tailer stays after its last viewer left, so that
    /// a viewer reconnecting finds it (0: it ends at once).
    pub linger_seconds: f64,
    /// How long a viewer waits for lines it asked for that the stream has
    /// not reached, or the store has not stored, yet, before it gets the
    /// truncation notice and the window.
    pub resume_wait_seconds: f64,
    /// Runs tailed at once on this node.
    pub max_active_runs: usize,
    /// SSE connections at once on this node.
    pub max_active_connections: usize,
    /// Interval of the `: heartbeat` comment.
    pub heartbeat_seconds: f64,
}

impl Default for LogStreamSettings {
    fn default() -> Self {
        Self {
            poll_seconds: 2.0,
            lines_per_read: 1000,
            max_reads_per_tick: 20,
            max_bytes_per_tick: 1_048_576,
            max_stream_bytes: 33_554_432,
            max_stream_seconds: 3600.0,
            max_idle_seconds: 300.0,
            finish_grace_seconds: 10.0,
            unknown_run_grace_seconds: 60.0,
            run_probe_seconds: 10.0,
            max_replay_bytes: 262_144,
            max_pending_bytes_per_client: 4_194_304,
            stall_timeout_seconds: 30.0,
            linger_seconds: 10.0,
            resume_wait_seconds: 10.0,
            max_active_runs: 200,
            max_active_connections: 500,
            heartbeat_seconds: 25.0,
        }
    }
}

/// `[edge.runs_stream]`: a pipeline's runs as they start, change state and
/// finish (`GET /api/v1/logs/{fqn}/runs/stream`). A node reads a watched
/// pipeline's runs from the run log store with one reader per pipeline,
/// shared by its watchers, and only while someone watches.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RunsStreamSettings {
    /// How often a watched pipeline's runs are read from the store.
    pub poll_seconds: f64,
    /// The newest runs each read takes: the stream follows those.
    pub max_runs: usize,
    /// Pipelines watched at once on this node (one reader each).
    pub max_pipelines: usize,
    /// A resumed stream sends again the runs changed up to this long
    /// before its cursor (the clocks of the nodes that stored them may
    /// differ by that much).
    pub resume_overlap_seconds: f64,
}

impl Default for RunsStreamSettings {
    fn default() -> Self {
        Self { poll_seconds: 1.0, max_runs: 50, max_pipelines: 100, resume_overlap_seconds: 5.0 }
    }
}

impl RunsStreamSettings {
    /// Problems with these settings, if any.
    pub fn check(&self) -> Result<(), String> {
        let poll = self.poll_seconds;
        if !(poll > 0.0 && poll.is_finite()) {
            return Err(format!("edge.runs_stream.poll_seconds must be a positive number of seconds (got {poll})"));
        }
        let overlap = self.resume_overlap_seconds;
        if !(overlap >= 0.0 && overlap.is_finite()) {
            return Err(format!("edge.runs_stream.resume_overlap_seconds must be 0 or more seconds (got {overlap})"));
        }
        for (name, value) in [("max_runs", self.max_runs), ("max_pipelines", self.max_pipelines)] {
            if value == 0 {
                return Err(format!("edge.runs_stream.{name} must be at least 1"));
            }
        }
        Ok(())
    }
}

#[cfg(feature = "edge")]
/// Seconds from the config as a duration (negative or NaN: zero).
pub(crate) fn secs(value: f64) -> std::time::Duration {
    std::time::Duration::try_from_secs_f64(value).unwrap_or_default()
}

impl LogStreamSettings {
    /// Problems with these settings, if any.
    pub fn check(&self) -> Result<(), String> {
        let positive = [
            ("poll_seconds", self.poll_seconds),
            ("heartbeat_seconds", self.heartbeat_seconds),
            ("max_stream_seconds", self.max_stream_seconds),
            ("max_idle_seconds", self.max_idle_seconds),
            ("stall_timeout_seconds", self.stall_timeout_seconds),
        ];
        for (name, value) in positive {
            if !(value > 0.0 && value.is_finite()) {
                return Err(format!("edge.log_stream.{name} must be a positive number of seconds (got {value})"));
            }
        }
        let not_negative = [("linger_seconds", self.linger_seconds), ("resume_wait_seconds", self.resume_wait_seconds)];
        for (name, value) in not_negative {
            if !(value >= 0.0 && value.is_finite()) {
                return Err(format!("edge.log_stream.{name} must be 0 or more seconds (got {value})"));
            }
        }
        let counts = [
            ("lines_per_read", self.lines_per_read),
            ("max_reads_per_tick", self.max_reads_per_tick),
            ("max_active_runs", self.max_active_runs),
            ("max_active_connections", self.max_active_connections),
        ];
        for (name, value) in counts {
            if value == 0 {
                return Err(format!("edge.log_stream.{name} must be at least 1"));
            }
        }
        Ok(())
    }
}
