//! The fenced data path of one process on one Redis server: a task that
//! carries the reads and acks of many queues in one optimistic
//! transaction, so the fence is checked once per round trip for all of
//! them, and no entry passes through a Lua script.
//!
//! A fenced read through a script costs Redis about four times the plain
//! `XREADGROUP` (every entry is copied into Lua and back: ~7.5 µs for a
//! 1.3 KB entry, against ~2 µs). Here each cycle takes every request
//! waiting (at most [`MAX_QUEUES`]) and makes two round trips on a
//! connection of its own:
//!
//! 1. `WATCH` the fences of those queues, and `MGET` them. A request whose
//!    token a newer grant superseded is refused at once ([`Answer::Fenced`]).
//! 2. `MULTI`, each remaining request's `XACK` and `XREADGROUP` (and, when
//!    asked, `XREVRANGE … COUNT 1` for the stream's last id), `EXEC`.
//!
//! A grant between the two (it increments a watched fence) makes Redis
//! abort the `EXEC`: nothing of it ran, and the cycle starts again at 1,
//! where the superseded request is refused. So a paused old owner's read
//! or ack changes nothing in Redis, as with the scripts. The connection is
//! not a reconnecting one: a `WATCH` does not survive a reconnect, so after
//! any error the connection is dropped and the next cycle dials anew (and
//! watches again). It closes after [`IDLE_CLOSE`] without requests, so an
//! idle node keeps no extra connection.
//!
//! A Redis Cluster keeps the per-queue scripts (a transaction may not span
//! slots, and each queue has a slot of its own).

use std::collections::BTreeMap;
use std::time::Duration;

use redis::Value;
use redis::aio::MultiplexedConnection;
use redis::streams::{StreamId, StreamRangeReply, StreamReadReply};
use tokio::sync::{mpsc, oneshot};

use crate::redis_conn::RedisEndpoint;

/// Most queues one cycle carries.
pub(crate) const MAX_QUEUES: usize = 128;
/// Requests waiting for a cycle, at most.
pub(crate) const WAITING: usize = 1024;
/// The connection closes after this long without a request.
pub(crate) const IDLE_CLOSE: Duration = Duration::from_secs(10);
/// Cycles aborted in a row (fences moving under it) before the requests
/// fail with a transient error.
const MAX_ABORTS: u32 = 8;

/// One queue's work for a cycle.
pub(crate) struct Work {
    pub(crate) stream: String,
    pub(crate) fence_key: String,
    pub(crate) token: u64,
    pub(crate) group: String,
    pub(crate) consumer: String,
    /// Ids to ack first.
    pub(crate) acks: Vec<String>,
    /// Most entries to read (`0`: ack only).
    pub(crate) count: usize,
    /// Also the stream's last entry id, if nothing new was read.
    pub(crate) last_id: bool,
}

/// Work and where its answer goes.
struct Request {
    work: Work,
    reply: oneshot::Sender<Result<Answer, redis::RedisError>>,
}

/// What a cycle did for one request.
pub(crate) enum Answer {
    /// A newer lease was granted: the fence's value. Nothing was done.
    Fenced(String),
    /// Acked and read.
    Done {
        /// The ack's error, if it failed (the read still ran).
        ack_error: Option<redis::RedisError>,
        /// New entries, now in the consumer's pending list.
        entries: Vec<StreamId>,
        /// The stream's last entry id (`0-0` if empty), when asked and
        /// nothing new was read.
        last_id: Option<String>,
    },
}

/// The handle receivers send their requests to.
#[derive(Clone)]
pub(crate) struct Batcher(mpsc::Sender<Request>);

impl Batcher {
    /// Starts the task, which dials `endpoint` at its first request.
    pub(crate) fn start(endpoint: RedisEndpoint, response_timeout: Duration) -> Self {
        let (tx, rx) = mpsc::channel(WAITING);
        tokio::spawn(run(rx, endpoint, response_timeout));
        Self(tx)
    }

    /// Runs `work` in the next cycle.
    pub(crate) async fn call(&self, work: Work) -> Result<Answer, redis::RedisError> {
        let (reply, answer) = oneshot::channel();
        let gone = || redis::RedisError::from((redis::ErrorKind::Io, "the fenced read task ended"));
        self.0.send(Request { work, reply }).await.map_err(|_| gone())?;
        answer.await.map_err(|_| gone())?
    }
}

async fn run(mut rx: mpsc::Receiver<Request>, endpoint: RedisEndpoint, response_timeout: Duration) {
    let mut conn: Option<MultiplexedConnection> = None;
    loop {
        let first = match tokio::time::timeout(IDLE_CLOSE, rx.recv()).await {
            Ok(Some(first)) => first,
            Ok(None) => return,
            Err(_) => {
                conn = None;
                continue;
            }
        };
        let mut batch = vec![first];
        while batch.len() < MAX_QUEUES {
            match rx.try_recv() {
                Ok(request) => batch.push(request),
                Err(_) => break,
            }
        }
        let connection = match &mut conn {
            Some(connection) => connection,
            None => match dial(&endpoint, response_timeout).await {
                Ok(dialled) => conn.insert(dialled),
                Err(error) => {
                    fail(batch, &error);
                    continue;
                }
            },
        };
        if let Err(error) = cycle(connection, batch).await {
            tracing::warn!(%error, "fenced read cycle failed; dialling again at the next");
            conn = None;
        }
    }
}

async fn dial(
    endpoint: &RedisEndpoint,
    response_timeout: Duration,
) -> Result<MultiplexedConnection, redis::RedisError> {
    let client =
        endpoint.client().map_err(|e| redis::RedisError::from((redis::ErrorKind::Io, "client", e.to_string())))?;
    let config = redis::AsyncConnectionConfig::new()
        .set_connection_timeout(Some(crate::redis_conn::CONNECT_TIMEOUT))
        .set_response_timeout(Some(response_timeout));
    client.get_multiplexed_async_connection_with_config(&config).await
}

fn fail(batch: Vec<Request>, error: &redis::RedisError) {
    for request in batch {
        let _ = request.reply.send(Err(error.clone()));
    }
}

/// Whether `fence` (a counter, if any) is above `token`.
fn fenced(fence: Option<&str>, token: u64) -> bool {
    fence.and_then(|f| f.parse::<u64>().ok()).is_some_and(|f| f > token)
}

/// One cycle; an error means the connection is to be dropped (every
/// request still waiting got it).
async fn cycle(conn: &mut MultiplexedConnection, mut batch: Vec<Request>) -> Result<(), redis::RedisError> {
    for _ in 0..MAX_ABORTS {
        let keys: Vec<String> = {
            let mut keys: Vec<String> = batch.iter().map(|r| r.work.fence_key.clone()).collect();
            keys.sort_unstable();
            keys.dedup();
            keys
        };
        let mut watch = redis::pipe();
        watch.cmd("WATCH").arg(&keys).ignore().cmd("MGET").arg(&keys);
        let fences: (Vec<Option<String>>,) = match watch.query_async(conn).await {
            Ok(fences) => fences,
            Err(error) => {
                fail(batch, &error);
                return Err(error);
            }
        };
        let fences: BTreeMap<String, Option<String>> = keys.into_iter().zip(fences.0).collect();
        let (refused, live): (Vec<Request>, Vec<Request>) =
            batch.into_iter().partition(|r| fenced(fences[r.work.fence_key.as_str()].as_deref(), r.work.token));
        for request in refused {
            let fence = fences[request.work.fence_key.as_str()].clone().unwrap_or_default();
            let _ = request.reply.send(Ok(Answer::Fenced(fence)));
        }
        batch = live;
        if batch.is_empty() {
            let _: Result<(), _> = redis::cmd("UNWATCH").query_async(conn).await;
            return Ok(());
        }
        let mut work = redis::pipe();
        work.atomic().ignore_errors();
        for request in &batch {
            if !request.work.acks.is_empty() {
                work.cmd("XACK").arg(&request.work.stream).arg(&request.work.group).arg(&request.work.acks);
            }
            if request.work.count > 0 {
                work.cmd("XREADGROUP").arg("GROUP").arg(&request.work.group).arg(&request.work.consumer);
                work.arg("COUNT").arg(request.work.count).arg("STREAMS").arg(&request.work.stream).arg(">");
                if request.work.last_id {
                    work.cmd("XREVRANGE").arg(&request.work.stream).arg("+").arg("-").arg("COUNT").arg(1);
                }
            }
        }
        let replies: Option<Vec<Value>> = match work.query_async(conn).await {
            Ok(replies) => replies,
            Err(error) => {
                fail(batch, &error);
                return Err(error);
            }
        };
        // `None`: a watched fence moved; nothing ran. Check them again.
        let Some(replies) = replies else { continue };
        answer(batch, replies);
        return Ok(());
    }
    let error = redis::RedisError::from((redis::ErrorKind::Io, "fences kept moving during the read"));
    fail(batch, &error);
    Ok(())
}

/// Hands each request its share of the `EXEC` reply, in the order the
/// commands were queued.
fn answer(batch: Vec<Request>, replies: Vec<Value>) {
    let mut replies = replies.into_iter();
    for request in batch {
        let mut ack_error = None;
        if !request.work.acks.is_empty()
            && let Some(Value::ServerError(error)) = replies.next()
        {
            ack_error = Some(redis::RedisError::from(error));
        }
        let result = if request.work.count > 0 {
            let read = replies.next().unwrap_or(Value::Nil);
            let last = if request.work.last_id { replies.next() } else { None };
            read_answer(read, last).map(|(entries, last_id)| Answer::Done { ack_error, entries, last_id })
        } else {
            Ok(Answer::Done { ack_error, entries: Vec::new(), last_id: None })
        };
        let _ = request.reply.send(result);
    }
}

type Read = (Vec<StreamId>, Option<String>);

fn read_answer(read: Value, last: Option<Value>) -> Result<Read, redis::RedisError> {
    if let Value::ServerError(error) = read {
        return Err(error.into());
    }
    let reply: Option<StreamReadReply> = redis::from_redis_value(read)?;
    let entries: Vec<StreamId> = reply.map(|r| r.keys.into_iter().flat_map(|k| k.ids).collect()).unwrap_or_default();
    let last_id = match last {
        Some(value) if entries.is_empty() => {
            if let Value::ServerError(error) = value {
                return Err(error.into());
            }
            let range: StreamRangeReply = redis::from_redis_value(value)?;
            Some(range.ids.first().map_or_else(|| "0-0".to_string(), |entry| entry.id.clone()))
        }
        _ => None,
    };
    Ok((entries, last_id))
}
