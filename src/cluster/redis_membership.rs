//! Membership in Redis, for nodes in separate processes: it feeds the same
//! [`Membership`] watch the in-process cluster uses.
//!
//! Each node keeps `{prefix}:member:{name}` alive: a hash `incarnation` (a
//! random number drawn at start), `advertise` (the address other nodes
//! dial) and `agents` (`started` or `stopped`), with a PX TTL of
//! `membership.ttl`, refreshed every `membership.heartbeat`. A name held by
//! another incarnation whose key is still alive is refused: two processes
//! never run as one node. The names are listed in the set
//! `{prefix}:members`; names whose key expired are removed from it.
//!
//! Every heartbeat also reads every member and replaces the watch's view
//! with the live ones whose agents are started: a node whose agents are
//! stopped leaves the balancer's active set. If Redis cannot be read, the
//! last view is kept (queue leases, not membership, keep a queue to one
//! node). A node that finds its own name taken by another incarnation (it
//! paused past its TTL and was replaced) leaves the view and stops.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use redis::aio::ConnectionManager;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::{Membership, MembershipOptions};
use crate::stream::NodeId;

/// Membership in Redis failed.
#[derive(Debug, thiserror::Error)]
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

/// Claims or refreshes KEYS[1] for incarnation ARGV[1] (advertise ARGV[2],
/// agents ARGV[3], TTL ARGV[4] ms) unless another incarnation holds it;
/// adds ARGV[5] to the set KEYS[2]. `{'1'}` or `{'0', incarnation}`.
const CLAIM: &str = r"
local held = redis.call('HGET', KEYS[1], 'incarnation')
if held and held ~= ARGV[1] then
  return {'0', held}
end
redis.call('HSET', KEYS[1], 'incarnation', ARGV[1], 'advertise', ARGV[2], 'agents', ARGV[3])
redis.call('PEXPIRE', KEYS[1], ARGV[4])
redis.call('SADD', KEYS[2], ARGV[5])
return {'1'}";

/// Deletes KEYS[1] if incarnation ARGV[1] holds it, and removes ARGV[2]
/// from the set KEYS[2].
const LEAVE: &str = r"
if redis.call('HGET', KEYS[1], 'incarnation') == ARGV[1] then
  redis.call('DEL', KEYS[1])
  redis.call('SREM', KEYS[2], ARGV[2])
  return 1
end
return 0";

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
    conn: ConnectionManager,
    prefix: String,
    me: NodeId,
    incarnation: String,
    advertise: String,
    options: MembershipOptions,
    agents_started: AtomicBool,
    view: Membership,
    /// Every live member (agents started or not), with its address.
    everyone: watch::Sender<Vec<Member>>,
    claim: redis::Script,
    leave: redis::Script,
}

impl RedisMembership {
    /// Claims `me`'s member key (refused if another live process holds the
    /// name), then reads the members into `view`. Call
    /// [`RedisMembership::run`] next to keep the key alive.
    pub async fn join(
        conn: ConnectionManager,
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
        conn: ConnectionManager,
        prefix: &str,
        me: NodeId,
        advertise: &str,
        options: MembershipOptions,
        view: Membership,
        agents_started: bool,
    ) -> Result<Self, MembershipError> {
        let membership = Self {
            inner: Arc::new(Inner {
                conn,
                prefix: prefix.to_string(),
                me,
                incarnation: rand::random::<u64>().to_string(),
                advertise: advertise.to_string(),
                options,
                agents_started: AtomicBool::new(agents_started),
                view,
                everyone: watch::Sender::new(Vec::new()),
                claim: redis::Script::new(CLAIM),
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

    /// This process's incarnation.
    pub fn incarnation(&self) -> &str {
        &self.inner.incarnation
    }

    /// The member key of `name`.
    pub fn member_key(&self, name: &NodeId) -> String {
        format!("{}:member:{name}", self.inner.prefix)
    }

    fn set_key(&self) -> String {
        format!("{}:members", self.inner.prefix)
    }

    /// Publishes whether this node's agents run (stopped: it leaves the
    /// balancer's active set at the next heartbeat of every node).
    pub fn set_agents_started(&self, started: bool) {
        self.inner.agents_started.store(started, Ordering::SeqCst);
    }

    /// Refreshes this node's key every heartbeat and follows the others,
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

    /// Deletes this node's key (if still this incarnation's) and leaves the
    /// view.
    pub async fn leave(&self) -> Result<(), MembershipError> {
        self.inner.view.leave(&self.inner.me);
        let key = self.member_key(&self.inner.me);
        let _: i64 = self
            .inner
            .leave
            .key(&key)
            .key(self.set_key())
            .arg(&self.inner.incarnation)
            .arg(self.inner.me.as_str())
            .invoke_async(&mut self.inner.conn.clone())
            .await
            .map_err(backend("leaving", &key))?;
        tracing::info!(node = %self.inner.me, "left the cluster membership");
        Ok(())
    }

    /// Removes `member` (this incarnation of it only) from the cluster: it
    /// is known dead. The view is refreshed at once, so the balancer
    /// re-plans without waiting for the next heartbeat. Whether its key
    /// was still there.
    pub async fn evict(&self, member: &Member) -> Result<bool, MembershipError> {
        let key = self.member_key(&member.name);
        let removed: i64 = self
            .inner
            .leave
            .key(&key)
            .key(self.set_key())
            .arg(&member.incarnation)
            .arg(member.name.as_str())
            .invoke_async(&mut self.inner.conn.clone())
            .await
            .map_err(backend("evicting", &key))?;
        self.heartbeat().await?;
        Ok(removed == 1)
    }

    /// Refreshes this node's key, then replaces the view with the live
    /// members whose agents are started.
    async fn heartbeat(&self) -> Result<(), MembershipError> {
        let key = self.member_key(&self.inner.me);
        let agents = if self.inner.agents_started.load(Ordering::SeqCst) { "started" } else { "stopped" };
        let ttl = u64::try_from(self.inner.options.ttl.as_millis()).unwrap_or(u64::MAX);
        let answer: Vec<String> = self
            .inner
            .claim
            .key(&key)
            .key(self.set_key())
            .arg(&self.inner.incarnation)
            .arg(&self.inner.advertise)
            .arg(agents)
            .arg(ttl)
            .arg(self.inner.me.as_str())
            .invoke_async(&mut self.inner.conn.clone())
            .await
            .map_err(backend("refreshing", &key))?;
        if let [_, incarnation] = answer.as_slice() {
            return Err(MembershipError::NameTaken {
                name: self.inner.me.to_string(),
                incarnation: incarnation.clone(),
            });
        }
        let members = self.members().await?;
        let active: BTreeSet<NodeId> = members.iter().filter(|m| m.agents_started).map(|m| m.name.clone()).collect();
        self.inner.view.replace(active);
        self.inner.everyone.send_if_modified(|everyone| {
            let changed = *everyone != members;
            *everyone = members;
            changed
        });
        Ok(())
    }

    /// The live members (at most `membership.max_members`, by name);
    /// forgets names whose key expired.
    pub async fn members(&self) -> Result<Vec<Member>, MembershipError> {
        let mut conn = self.inner.conn.clone();
        let set = self.set_key();
        let mut names: Vec<String> =
            redis::cmd("SMEMBERS").arg(&set).query_async(&mut conn).await.map_err(backend("listing", &set))?;
        names.sort();
        if names.len() > self.inner.options.max_members {
            tracing::warn!(
                members = names.len(),
                max = self.inner.options.max_members,
                "more members than membership.max_members; ignoring the rest"
            );
            names.truncate(self.inner.options.max_members);
        }
        let mut live = Vec::with_capacity(names.len());
        for name in names {
            let node = NodeId::new(&name);
            let key = self.member_key(&node);
            let fields: Vec<Option<String>> = redis::cmd("HMGET")
                .arg(&key)
                .arg("incarnation")
                .arg("advertise")
                .arg("agents")
                .query_async(&mut conn)
                .await
                .map_err(backend("reading", &key))?;
            match fields.as_slice() {
                [Some(incarnation), advertise, agents] => live.push(Member {
                    name: node,
                    incarnation: incarnation.clone(),
                    advertise: advertise.clone().unwrap_or_default(),
                    agents_started: agents.as_deref() != Some("stopped"),
                }),
                // Expired: forget the name (a later claim adds it again).
                _ => {
                    let _: redis::RedisResult<i64> =
                        redis::cmd("SREM").arg(&set).arg(&name).query_async(&mut conn).await;
                }
            }
        }
        Ok(live)
    }
}

fn backend(doing: &'static str, key: &str) -> impl FnOnce(redis::RedisError) -> MembershipError {
    let key = key.to_string();
    move |e| MembershipError::Backend { doing, key, message: e.to_string() }
}
