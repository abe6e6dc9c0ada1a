//! Membership in Redis, for nodes in separate processes: it feeds the same
//! [`Membership`] watch the in-process cluster uses.
//!
//! All members live in three keys under one hash tag (one slot on a Redis
//! Cluster), `{prefix:membership}`:
//!
//! - `…:records`, a hash: each member's name to `incarnation|agents|advertise`
//!   (the incarnation is a random number drawn at start; `agents` is
//!   `started` or `stopped`; `advertise` is the address other nodes dial);
//! - `…:deadlines`, a sorted set: each member's name to the Redis server
//!   time (ms) at which it lapses unless refreshed (`membership.ttl` after
//!   its last heartbeat);
//! - `…:version`, the time of the last change to the records.
//!
//! A heartbeat is one script call per `membership.heartbeat`: it drops the
//! members past their deadline, refreshes this node's record and deadline,
//! and answers the records only if they changed since the version this
//! node last saw. An idle cluster of N nodes costs Redis N commands per
//! heartbeat, not N². A name held by another incarnation whose record is
//! still alive is refused: two processes never run as one node.
//!
//! Every heartbeat that brings new records replaces the watch's view with
//! the live members whose agents are started: a node whose agents are
//! stopped leaves the balancer's active set. If Redis cannot be read, the
//! last view is kept (queue leases, not membership, keep a queue to one
//! node). A node that finds its own name taken by another incarnation (it
//! paused past its TTL and was replaced) leaves the view and stops.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use crate::redis_conn::RedisConn;
use parking_lot::Mutex;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::{Membership, MembershipOptions};
use crate::stream::NodeId;

/// Membership in Redis failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum MembershipError {
    /// Another live process runs as this node.
    #[error(
        "node name `{name}` is held by a live process (incarnation {incarnation}); stop it or pick another node.name"
    )]
    NameTaken {
        /// The node name.
        name: String,
        /// The other process's incarnation.
        incarnation: String,
    },
    /// Redis could not be reached or refused.
    #[error("membership store: {doing} `{key}`: {message}")]
    Backend {
        /// What was being done.
        doing: &'static str,
        /// The key.
        key: String,
        /// What Redis said.
        message: String,
    },
}

/// What both scripts start with: effects replication, Redis' clock in ms
/// (`now`), and `bump()`, which sets a new version of the records (later
/// than every earlier one, even after Redis restarts) and answers it.
macro_rules! membership_prelude {
    () => {
        r"
pcall(redis.replicate_commands)
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local function bump()
  local version = tostring(math.max(now, tonumber(redis.call('GET', KEYS[3]) or '0') + 1))
  redis.call('SET', KEYS[3], version)
  return version
end
"
    };
}

/// The heartbeat, on KEYS = records, deadlines, version. ARGV: name
/// (empty: only read), incarnation, agents, advertise, TTL ms, the version
/// the caller saw. Answers `{'taken', incarnation}`, `{'same', version}` or
/// `{'view', version, {name, record, …}}`, each with a fourth element: 1
/// if the caller's record was not there (it joined, or came back after it
/// lapsed or was evicted), else 0. A record whose deadline is missing
/// counts as lapsed.
const HEARTBEAT: &str = concat!(
    membership_prelude!(),
    r"
local changed = false
for _, name in ipairs(redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now)) do
  redis.call('ZREM', KEYS[2], name)
  redis.call('HDEL', KEYS[1], name)
  changed = true
end
-- A record whose deadline went (evicted, deleted by hand) is nobody's:
-- drop it rather than keep a member that never lapses.
if redis.call('ZCARD', KEYS[2]) ~= redis.call('HLEN', KEYS[1]) then
  for _, name in ipairs(redis.call('HKEYS', KEYS[1])) do
    if not redis.call('ZSCORE', KEYS[2], name) then
      redis.call('HDEL', KEYS[1], name)
      changed = true
    end
  end
end
local absent = 0
if ARGV[1] ~= '' then
  local held = redis.call('HGET', KEYS[1], ARGV[1])
  if held then
    local incarnation = string.match(held, '^([^|]*)')
    if incarnation ~= ARGV[2] then
      return {'taken', incarnation, {}, 0}
    end
  else
    absent = 1
  end
  local record = ARGV[2] .. '|' .. ARGV[3] .. '|' .. ARGV[4]
  if held ~= record then
    redis.call('HSET', KEYS[1], ARGV[1], record)
    changed = true
  end
  redis.call('ZADD', KEYS[2], now + tonumber(ARGV[5]), ARGV[1])
end
local version = redis.call('GET', KEYS[3])
if changed or not version then
  version = bump()
end
if version == ARGV[6] then
  return {'same', version, {}, absent}
end
return {'view', version, redis.call('HGETALL', KEYS[1]), absent}"
);

/// Removes ARGV[1]'s record (KEYS as [`HEARTBEAT`]) if incarnation ARGV[2]
/// holds it. 1 if it did.
const LEAVE: &str = concat!(
    membership_prelude!(),
    r"
local held = redis.call('HGET', KEYS[1], ARGV[1])
if held and string.match(held, '^([^|]*)') == ARGV[2] then
  redis.call('HDEL', KEYS[1], ARGV[1])
  redis.call('ZREM', KEYS[2], ARGV[1])
  bump()
  return 1
end
return 0"
);

/// What a heartbeat answered, and whether this node's record was absent.
struct Answer {
    beat: Beat,
    absent: bool,
}

/// What a heartbeat found of the records.
enum Beat {
    /// Another incarnation holds the name.
    Taken(String),
    /// The records did not change since the version sent.
    Same,
    /// The records changed: the version, and every live member.
    View(String, Vec<Member>),
}

/// One member as read from Redis.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Member {
    /// Its node name.
    pub name: NodeId,
    /// Its process's incarnation.
    pub incarnation: String,
    /// The address other nodes dial.
    pub advertise: String,
    /// Whether its agents are started.
    pub agents_started: bool,
}

/// This node's membership in Redis. Clones share it.
#[derive(Clone)]
pub struct RedisMembership {
    inner: Arc<Inner>,
}

struct Inner {
    conn: RedisConn,
    prefix: String,
    me: NodeId,
    incarnation: String,
    advertise: String,
    options: MembershipOptions,
    agents_started: AtomicBool,
    view: Membership,
    /// Every live member (agents started or not), with its address.
    everyone: watch::Sender<Vec<Member>>,
    /// The version of the records the view was last built from.
    seen: Mutex<String>,
    /// Bumped each time a heartbeat after the first found this node's
    /// record gone (it lapsed while the node was paused, cut off or Redis
    /// was down, or it was evicted): the other nodes may have let go of
    /// this node's subscriptions meanwhile.
    rejoins: watch::Sender<u64>,
    /// The first heartbeat (the join) succeeded.
    joined: AtomicBool,
    /// When a heartbeat last refreshed this node's record.
    refreshed: Mutex<Option<tokio::time::Instant>>,
    heartbeat: redis::Script,
    leave: redis::Script,
}

impl RedisMembership {
    /// Claims `me`'s member record (refused if another live process holds
    /// the name), then reads the members into `view`. Call
    /// [`RedisMembership::run`] next to keep the record alive.
    pub async fn join(
        conn: impl Into<RedisConn>,
        prefix: &str,
        me: NodeId,
        advertise: &str,
        options: MembershipOptions,
        view: Membership,
    ) -> Result<Self, MembershipError> {
        Self::join_as(conn, prefix, me, advertise, options, view, true).await
    }

    /// As [`RedisMembership::join`], with the agents published as
    /// `agents_started` from the first claim on (`false`: a member the
    /// others never balance queues to, such as a process that only holds
    /// its name).
    pub async fn join_as(
        conn: impl Into<RedisConn>,
        prefix: &str,
        me: NodeId,
        advertise: &str,
        options: MembershipOptions,
        view: Membership,
        agents_started: bool,
    ) -> Result<Self, MembershipError> {
        let membership = Self {
            inner: Arc::new(Inner {
                conn: conn.into(),
                prefix: prefix.to_string(),
                me,
                incarnation: rand::random::<u64>().to_string(),
                advertise: advertise.to_string(),
                options,
                agents_started: AtomicBool::new(agents_started),
                view,
                everyone: watch::Sender::new(Vec::new()),
                seen: Mutex::new(String::new()),
                rejoins: watch::Sender::new(0),
                joined: AtomicBool::new(false),
                refreshed: Mutex::new(None),
                heartbeat: redis::Script::new(HEARTBEAT),
                leave: redis::Script::new(LEAVE),
            }),
        };
        membership.heartbeat().await?;
        tracing::info!(node = %membership.inner.me, incarnation = %membership.inner.incarnation, "joined the cluster membership");
        Ok(membership)
    }

    /// Every live member as of the last heartbeat, agents started or not
    /// (the cluster transport dials them; their consumers stay reachable).
    pub fn everyone(&self) -> watch::Receiver<Vec<Member>> {
        self.inner.everyone.subscribe()
    }

    /// Changes each time this node comes back as a member after its
    /// record was gone (see `Node::reattach_on_rejoin`).
    pub fn rejoins(&self) -> watch::Receiver<u64> {
        self.inner.rejoins.subscribe()
    }

    /// Why this node's membership is not fresh: no heartbeat refreshed its
    /// record for `membership.ttl` (the other nodes may count it gone).
    /// `None` while it is fresh.
    pub fn stale(&self) -> Option<String> {
        let ttl = self.inner.options.ttl;
        match *self.inner.refreshed.lock() {
            Some(at) if at.elapsed() < ttl => None,
            Some(at) => Some(format!(
                "no membership heartbeat succeeded for {:.1} s (membership.ttl {ttl:?})",
                at.elapsed().as_secs_f64()
            )),
            None => Some("not a member yet".into()),
        }
    }

    /// This process's incarnation.
    pub fn incarnation(&self) -> &str {
        &self.inner.incarnation
    }

    /// The hash of every member's record (name to
    /// `incarnation|agents|advertise`).
    pub fn records_key(&self) -> String {
        self.keys()[0].clone()
    }

    /// Records, deadlines, version: one hash tag, one slot.
    fn keys(&self) -> [String; 3] {
        let tag = format!("{{{}:membership}}", self.inner.prefix);
        [format!("{tag}:records"), format!("{tag}:deadlines"), format!("{tag}:version")]
    }

    /// Publishes whether this node's agents run (stopped: it leaves the
    /// balancer's active set at the next heartbeat of every node).
    pub fn set_agents_started(&self, started: bool) {
        self.inner.agents_started.store(started, Ordering::SeqCst);
    }

    /// Refreshes this node's record every heartbeat and follows the others,
    /// until `stop` (then leaves) or until the name is found taken.
    pub async fn run(self, stop: CancellationToken) -> Result<(), MembershipError> {
        let mut tick = tokio::time::interval(self.inner.options.heartbeat);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = stop.cancelled() => break,
                _ = tick.tick() => {}
            }
            match self.heartbeat().await {
                Ok(()) => {}
                Err(error @ MembershipError::NameTaken { .. }) => {
                    tracing::error!(node = %self.inner.me, %error, "this node was replaced; leaving");
                    self.inner.view.leave(&self.inner.me);
                    return Err(error);
                }
                Err(error) => {
                    tracing::warn!(node = %self.inner.me, %error, "membership heartbeat failed; keeping the last view")
                }
            }
        }
        self.leave().await
    }

    /// Deletes this node's record (if still this incarnation's) and leaves
    /// the view.
    pub async fn leave(&self) -> Result<(), MembershipError> {
        self.inner.view.leave(&self.inner.me);
        self.remove(&self.inner.me, &self.inner.incarnation, "leaving").await?;
        tracing::info!(node = %self.inner.me, "left the cluster membership");
        Ok(())
    }

    /// Removes `member` (this incarnation of it only) from the cluster: it
    /// is known dead. The view is refreshed at once, so the balancer
    /// re-plans without waiting for the next heartbeat. Whether its record
    /// was still there.
    pub async fn evict(&self, member: &Member) -> Result<bool, MembershipError> {
        let removed = self.remove(&member.name, &member.incarnation, "evicting").await?;
        self.heartbeat().await?;
        Ok(removed)
    }

    async fn remove(&self, name: &NodeId, incarnation: &str, doing: &'static str) -> Result<bool, MembershipError> {
        let [records, deadlines, version] = self.keys();
        let removed: i64 = self
            .inner
            .leave
            .key(&records)
            .key(deadlines)
            .key(version)
            .arg(name.as_str())
            .arg(incarnation)
            .invoke_async(&mut self.inner.conn.clone())
            .await
            .map_err(backend(doing, &records))?;
        Ok(removed == 1)
    }

    /// Refreshes this node's record; if the records changed since the last
    /// view, replaces the view with the live members whose agents are
    /// started.
    async fn heartbeat(&self) -> Result<(), MembershipError> {
        let agents = if self.inner.agents_started.load(Ordering::SeqCst) { "started" } else { "stopped" };
        let seen = self.inner.seen.lock().clone();
        let answer = self.beat(self.inner.me.as_str(), agents, &seen).await?;
        if !matches!(answer.beat, Beat::Taken(_)) {
            *self.inner.refreshed.lock() = Some(tokio::time::Instant::now());
        }
        let was_member = self.inner.joined.swap(true, Ordering::SeqCst);
        if answer.absent && was_member {
            tracing::warn!(node = %self.inner.me, "this node's member record had lapsed; it is a member again");
            self.inner.rejoins.send_modify(|n| *n += 1);
        }
        let members = match answer.beat {
            Beat::Taken(incarnation) => {
                return Err(MembershipError::NameTaken { name: self.inner.me.to_string(), incarnation });
            }
            Beat::Same => return Ok(()),
            Beat::View(version, members) => {
                *self.inner.seen.lock() = version;
                members
            }
        };
        let active: BTreeSet<NodeId> = members.iter().filter(|m| m.agents_started).map(|m| m.name.clone()).collect();
        self.inner.view.replace(active);
        self.inner.everyone.send_if_modified(|everyone| {
            let changed = *everyone != members;
            *everyone = members;
            changed
        });
        Ok(())
    }

    /// The live members (at most `membership.max_members`, by name), read
    /// now.
    pub async fn members(&self) -> Result<Vec<Member>, MembershipError> {
        match self.beat("", "", "").await?.beat {
            Beat::View(_, members) => Ok(members),
            Beat::Taken(_) | Beat::Same => Ok(self.inner.everyone.borrow().clone()),
        }
    }

    /// One [`HEARTBEAT`] call: `name` empty only reads.
    async fn beat(&self, name: &str, agents: &str, seen: &str) -> Result<Answer, MembershipError> {
        let [records, deadlines, version] = self.keys();
        let ttl = u64::try_from(self.inner.options.ttl.as_millis()).unwrap_or(u64::MAX);
        let (kind, answer, fields, absent): (String, String, Vec<String>, i64) = self
            .inner
            .heartbeat
            .key(&records)
            .key(deadlines)
            .key(version)
            .arg(name)
            .arg(&self.inner.incarnation)
            .arg(agents)
            .arg(&self.inner.advertise)
            .arg(ttl)
            .arg(seen)
            .invoke_async(&mut self.inner.conn.clone())
            .await
            .map_err(backend(if name.is_empty() { "reading" } else { "refreshing" }, &records))?;
        let beat = match kind.as_str() {
            "taken" => Beat::Taken(answer),
            "same" => Beat::Same,
            _ => Beat::View(answer, self.parse(fields)),
        };
        Ok(Answer { beat, absent: absent == 1 })
    }

    /// Members from `HGETALL` of the records, sorted by name, at most
    /// `membership.max_members` of them.
    fn parse(&self, fields: Vec<String>) -> Vec<Member> {
        let mut members: Vec<Member> = fields
            .chunks_exact(2)
            .filter_map(|pair| {
                let mut parts = pair[1].splitn(3, '|');
                let (incarnation, agents, advertise) = (parts.next()?, parts.next()?, parts.next()?);
                Some(Member {
                    name: NodeId::new(pair[0].as_str()),
                    incarnation: incarnation.to_string(),
                    advertise: advertise.to_string(),
                    agents_started: agents != "stopped",
                })
            })
            .collect();
        members.sort_by(|a, b| a.name.cmp(&b.name));
        if members.len() > self.inner.options.max_members {
            tracing::warn!(
                members = members.len(),
                max = self.inner.options.max_members,
                "more members than membership.max_members; ignoring the rest"
            );
            members.truncate(self.inner.options.max_members);
        }
        members
    }
}

fn backend(doing: &'static str, key: &str) -> impl FnOnce(redis::RedisError) -> MembershipError {
    let key = key.to_string();
    move |e| MembershipError::Backend { doing, key, message: e.to_string() }
}
