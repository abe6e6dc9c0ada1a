//! What Redis keeps across a crash or restart, read with `CONFIG GET
//! appendonly`, `appendfsync` and `save` at a node's start, and said in one
//! line. Managed Redis often forbids `CONFIG`: then it is unknown, and said
//! so.
//!
//! It also reads the `default` user (`ACL GETUSER default`, where allowed):
//! Redis replays its append-only file as that user, and until the fix of
//! redis/redis#14541 an `EXEC` it may not run is dropped at reload. Every
//! tailrace script with more than one write is written to the file as a
//! `MULTI`/`EXEC` block, so with the `default` user off or limited a
//! restart silently loses lease grants, fence increments and run log
//! appends.

use super::RedisConn;

/// Redis's persistence settings, as read at start.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Persistence {
    /// Read from the server.
    Known {
        /// `appendonly yes`: every write goes to the append-only file.
        appendonly: bool,
        /// `always`, `everysec` or `no`.
        appendfsync: String,
        /// The RDB snapshot points (`""`: none).
        save: String,
        /// The `default` user is off or may not run every command (`None`:
        /// `ACL GETUSER` refused).
        default_user_limited: Option<bool>,
    },
    /// `CONFIG GET` was refused or failed: why.
    Unknown(String),
}

async fn config_get(conn: &mut RedisConn, name: &str) -> Result<String, redis::RedisError> {
    let pair: Vec<String> = redis::cmd("CONFIG").arg("GET").arg(name).query_async(conn).await?;
    pair.into_iter().nth(1).ok_or_else(|| {
        redis::RedisError::from((
            redis::ErrorKind::UnexpectedReturnType,
            "CONFIG GET answered no value",
            name.to_string(),
        ))
    })
}

/// Whether the `default` user is off or limited, from `ACL GETUSER
/// default` (flags, passwords, commands, … as name, value pairs).
async fn default_user_limited(conn: &mut RedisConn) -> Option<bool> {
    let reply: Vec<redis::Value> = redis::cmd("ACL").arg("GETUSER").arg("default").query_async(conn).await.ok()?;
    let text = |value: &redis::Value| redis::from_redis_value_ref::<String>(value).ok();
    let (mut on, mut all) = (false, false);
    for pair in reply.chunks(2) {
        let [name, value] = pair else { continue };
        match text(name).as_deref() {
            Some("flags") => {
                let flags: Vec<String> = redis::from_redis_value_ref(value).ok()?;
                on = flags.iter().any(|f| f == "on");
            }
            Some("commands") => all = text(value)?.trim() == "+@all",
            _ => {}
        }
    }
    Some(!(on && all))
}

impl Persistence {
    /// Reads the settings; a refusal (`CONFIG` renamed, forbidden by an ACL
    /// or the provider) is [`Persistence::Unknown`].
    pub(crate) async fn read(conn: &mut RedisConn) -> Self {
        let read = async {
            Ok::<_, redis::RedisError>(Self::Known {
                appendonly: config_get(conn, "appendonly").await? == "yes",
                appendfsync: config_get(conn, "appendfsync").await?,
                save: config_get(conn, "save").await?,
                default_user_limited: default_user_limited(conn).await,
            })
        };
        read.await.unwrap_or_else(|e| Self::Unknown(e.to_string()))
    }

    /// Whether a fencing counter survives a Redis restart: `Some(false)`
    /// with neither the append-only file nor RDB snapshots; `None` if
    /// unknown.
    pub(crate) fn survives_restart(&self) -> Option<bool> {
        match self {
            Self::Known { appendonly: true, default_user_limited: Some(true), .. } => Some(false),
            Self::Known { appendonly, save, .. } => Some(*appendonly || !save.trim().is_empty()),
            Self::Unknown(_) => None,
        }
    }

    /// Whether a Redis crash can lose an acknowledged write (`None` if
    /// unknown).
    pub(crate) fn loses_on_crash(&self) -> Option<bool> {
        match self {
            Self::Known { appendonly: true, appendfsync, .. } => Some(appendfsync != "always"),
            Self::Known { .. } => Some(true),
            Self::Unknown(_) => None,
        }
    }

    /// One line: the settings and what they guarantee.
    pub(crate) fn describe(&self) -> String {
        let what = "acknowledged events, checkpoints, run log lines and fence increments";
        match self {
            Self::Known { appendonly: true, appendfsync, default_user_limited: Some(true), .. } => format!(
                "Redis persistence: AOF appendfsync={appendfsync}, but the `default` user is off or may not run every \
                 command: Redis replays the append-only file as that user and, until the fix of redis/redis#14541, \
                 drops every MULTI/EXEC block it may not run, so a restart loses lease grants, fence increments and \
                 run log appends; keep `default` on with +@all and no password to log in with (user default on \
                 resetpass ~* &* +@all)"
            ),
            Self::Known { appendonly: true, appendfsync, .. } if appendfsync == "always" => format!(
                "Redis persistence: AOF appendfsync=always: every write is on disk before Redis answers; a crash of \
                 Redis or its machine loses no {what}"
            ),
            Self::Known { appendonly: true, appendfsync, .. } if appendfsync == "everysec" => format!(
                "Redis persistence: AOF appendfsync=everysec: a crash of the Redis process normally loses nothing, a \
                 crash of its machine (power, kernel) can lose up to about 1 s (at worst 2 s) of {what}"
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
