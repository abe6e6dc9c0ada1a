//! What Redis keeps across a crash or restart, read with `CONFIG GET
//! appendonly`, `appendfsync` and `save` at a node's start, and said in one
//! line. Managed Redis often forbids `CONFIG`: then it is unknown, and said
//! so.

use redis::aio::ConnectionManager;

/// Redis's persistence settings, as read at start.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Persistence {
    /// Read from the server.
    Known {
        /// `appendonly yes`: every write goes to the append-only file.
        appendonly: bool,
        /// `always`, `everysec` or `no`.
        appendfsync: String,
        /// The RDB snapshot points (`""`: none).
        save: String,
    },
    /// `CONFIG GET` was refused or failed: why.
    Unknown(String),
}

async fn config_get(conn: &mut ConnectionManager, name: &str) -> Result<String, redis::RedisError> {
    let pair: Vec<String> = redis::cmd("CONFIG").arg("GET").arg(name).query_async(conn).await?;
    pair.into_iter().nth(1).ok_or_else(|| {
        redis::RedisError::from((
            redis::ErrorKind::UnexpectedReturnType,
            "CONFIG GET answered no value",
            name.to_string(),
        ))
    })
}

impl Persistence {
    /// Reads the settings; a refusal (`CONFIG` renamed, forbidden by an ACL
    /// or the provider) is [`Persistence::Unknown`].
    pub async fn read(conn: &mut ConnectionManager) -> Self {
        let read = async {
            Ok::<_, redis::RedisError>(Self::Known {
                appendonly: config_get(conn, "appendonly").await? == "yes",
                appendfsync: config_get(conn, "appendfsync").await?,
                save: config_get(conn, "save").await?,
            })
        };
        read.await.unwrap_or_else(|e| Self::Unknown(e.to_string()))
    }

    /// Whether a fencing counter survives a Redis restart: `Some(false)`
    /// with neither the append-only file nor RDB snapshots; `None` if
    /// unknown.
    pub fn survives_restart(&self) -> Option<bool> {
        match self {
            Self::Known { appendonly, save, .. } => Some(*appendonly || !save.trim().is_empty()),
            Self::Unknown(_) => None,
        }
    }

    /// Whether a Redis crash can lose an acknowledged write (`None` if
    /// unknown).
    pub fn loses_on_crash(&self) -> Option<bool> {
        match self {
            Self::Known { appendonly: true, appendfsync, .. } => Some(appendfsync != "always"),
            Self::Known { .. } => Some(true),
            Self::Unknown(_) => None,
        }
    }

    /// One line: the settings and what they guarantee.
    pub fn describe(&self) -> String {
        let what = "acknowledged events, checkpoints, run log lines and fence increments";
        match self {
            Self::Known { appendonly: true, appendfsync, .. } if appendfsync == "always" => format!(
                "Redis persistence: AOF appendfsync=always: every write is on disk before Redis answers; a crash of \
                 Redis or its machine loses no {what}"
            ),
            Self::Known { appendonly: true, appendfsync, .. } if appendfsync == "everysec" => format!(
                "Redis persistence: AOF appendfsync=everysec: a crash of the Redis process loses nothing, a crash of \
                 its machine (power, kernel) can lose up to about 1 s (at worst 2 s) of {what}"
            ),
            Self::Known { appendonly: true, appendfsync, .. } => format!(
                "Redis persistence: AOF appendfsync={appendfsync}: the kernel decides when the file reaches disk; a \
                 crash of Redis's machine can lose up to about 30 s of {what}"
            ),
            Self::Known { save, .. } if !save.trim().is_empty() => format!(
                "Redis persistence: RDB snapshots only (save \"{save}\"): a stop in order keeps everything, a crash \
                 loses every write since the last snapshot, and fence counters that go back make the run log store \
                 refuse appends until those runs are removed"
            ),
            Self::Known { .. } => "Redis persistence: none (appendonly no, save \"\"): a Redis restart loses every \
                                   queue, checkpoint, run log and subscription, and fence counters start again at 1"
                .to_string(),
            Self::Unknown(why) => format!(
                "Redis persistence could not be checked ({why}); make sure the server runs with appendonly yes \
                 (appendfsync always to lose no acknowledged write)"
            ),
        }
    }
}
