//! `RedisMembership` against a private redis-server: a name held by a live
//! process is refused; members follow heartbeats, leaves and expiry; a node
//! whose agents are stopped leaves the active set.

use tailrace_testkit as common;

use std::collections::BTreeSet;
use std::time::Duration;

use common::redis_server::{RedisServer, command_calls};
use tailrace::NodeId;
use tailrace::cluster::{Membership, MembershipError, MembershipOptions, RedisMembership};
use tailrace::redis_conn::RedisConn;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

const WAIT: Duration = Duration::from_secs(20);

fn options() -> MembershipOptions {
    MembershipOptions { heartbeat: Duration::from_millis(50), ttl: Duration::from_millis(300), max_members: 8 }
}

async fn conn(server: &RedisServer) -> redis::aio::ConnectionManager {
    redis::Client::open(server.url()).unwrap().get_connection_manager().await.unwrap()
}

async fn join(server: &RedisServer, name: &str) -> Result<(RedisMembership, Membership), MembershipError> {
    join_on(conn(server).await.into(), name).await
}

async fn join_on(conn: RedisConn, name: &str) -> Result<(RedisMembership, Membership), MembershipError> {
    let view = Membership::new();
    let member = RedisMembership::join(
        conn,
        "tailrace",
        NodeId::new(name),
        &format!("{name}.example:8586"),
        options(),
        view.clone(),
    )
    .await?;
    Ok((member, view))
}

fn run(member: &RedisMembership) -> (CancellationToken, JoinHandle<Result<(), MembershipError>>) {
    let stop = CancellationToken::new();
    (stop.clone(), tokio::spawn(member.clone().run(stop)))
}

async fn wait_view(view: &Membership, want: &[&str]) {
    let want: BTreeSet<NodeId> = want.iter().map(|n| NodeId::new(*n)).collect();
    let mut rx = view.subscribe();
    let outcome = tokio::time::timeout(WAIT, rx.wait_for(|live| *live == want)).await;
    assert!(outcome.is_ok(), "view {:?}, wanted {want:?}", view.live());
}

#[tokio::test]
async fn a_name_held_by_a_live_process_is_refused_until_it_expires() {
    let server = RedisServer::start();
    let (first, _) = join(&server, "a").await.unwrap();
    let error = join(&server, "a").await.err().expect("refused");
    let text = error.to_string();
    assert!(text.contains("node name `a` is held by a live process"), "{text}");
    assert!(text.contains(first.incarnation()), "{text}");
    // The first process dies without leaving: once its key expired, the
    // name can be taken again, by a new incarnation.
    drop(first);
    let deadline = tokio::time::Instant::now() + WAIT;
    let second = loop {
        match join(&server, "a").await {
            Ok((member, _)) => break member,
            Err(MembershipError::NameTaken { .. }) => {}
            Err(other) => panic!("{other}"),
        }
        assert!(tokio::time::Instant::now() < deadline, "the dead process's key never expired");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_ne!(second.incarnation(), error_incarnation(&error));
}

fn error_incarnation(error: &MembershipError) -> String {
    match error {
        MembershipError::NameTaken { incarnation, .. } => incarnation.clone(),
        other => panic!("{other}"),
    }
}

#[tokio::test]
async fn members_follow_heartbeats_leaves_and_expiry() {
    let server = RedisServer::start();
    let (a, view_a) = join(&server, "a").await.unwrap();
    let (b, view_b) = join(&server, "b").await.unwrap();
    let (c, _) = join(&server, "c").await.unwrap();
    let (stop_a, task_a) = run(&a);
    let (stop_b, task_b) = run(&b);
    let (_stop_c, task_c) = run(&c);
    wait_view(&view_a, &["a", "b", "c"]).await;
    wait_view(&view_b, &["a", "b", "c"]).await;
    let members = a.members().await.unwrap();
    assert_eq!(members.iter().find(|m| m.name.as_str() == "b").unwrap().advertise, "b.example:8586");

    // c crashes: no leave, its key expires.
    task_c.abort();
    wait_view(&view_a, &["a", "b"]).await;

    // b leaves: its key goes at once.
    stop_b.cancel();
    task_b.await.unwrap().unwrap();
    let exists: i64 =
        redis::cmd("HEXISTS").arg(a.records_key()).arg("b").query_async(&mut conn(&server).await).await.unwrap();
    assert_eq!(exists, 0, "a graceful leave deletes the record");
    assert!(!view_b.live().contains(&NodeId::new("b")));
    wait_view(&view_a, &["a"]).await;
    stop_a.cancel();
    task_a.await.unwrap().unwrap();
}

#[tokio::test]
async fn a_node_whose_agents_are_stopped_leaves_the_active_set() {
    let server = RedisServer::start();
    let (a, view_a) = join(&server, "a").await.unwrap();
    let (b, _) = join(&server, "b").await.unwrap();
    let (_stop_a, _task_a) = run(&a);
    let (_stop_b, _task_b) = run(&b);
    wait_view(&view_a, &["a", "b"]).await;
    b.set_agents_started(false);
    wait_view(&view_a, &["a"]).await;
    let b_seen = a.members().await.unwrap().into_iter().find(|m| m.name.as_str() == "b").expect("still a member");
    assert!(!b_seen.agents_started);
    b.set_agents_started(true);
    wait_view(&view_a, &["a", "b"]).await;
}

#[tokio::test]
async fn a_node_replaced_after_a_pause_leaves_and_stops() {
    let server = RedisServer::start();
    let (a, view_a) = join(&server, "a").await.unwrap();
    // Another process takes the name while a is paused (its key was lost).
    let _: i64 = redis::cmd("HDEL").arg(a.records_key()).arg("a").query_async(&mut conn(&server).await).await.unwrap();
    let (_usurper, _) = join(&server, "a").await.unwrap();
    let (_stop, task) = run(&a);
    let outcome = tokio::time::timeout(WAIT, task).await.expect("stops").unwrap();
    assert!(matches!(outcome, Err(MembershipError::NameTaken { .. })), "{outcome:?}");
    assert!(!view_a.live().contains(&NodeId::new("a")));
}

#[tokio::test]
async fn a_settled_membership_costs_one_command_per_node_and_heartbeat() {
    let server = RedisServer::start();
    let mut nodes = Vec::new();
    for name in ["a", "b", "c"] {
        let (member, view) = join(&server, name).await.unwrap();
        nodes.push((run(&member), view));
    }
    for (_, view) in &nodes {
        wait_view(view, &["a", "b", "c"]).await;
    }
    let mut conn = conn(&server).await;
    let started = tokio::time::Instant::now();
    let before = command_calls(&mut conn).await;
    tokio::time::sleep(Duration::from_millis(1000)).await;
    let after = command_calls(&mut conn).await;
    let beats = (started.elapsed().as_millis() / options().heartbeat.as_millis()) as u64 + 1;
    let spent = |name: &str| after.get(name).copied().unwrap_or(0) - before.get(name).copied().unwrap_or(0);
    // Each node beats at most once per heartbeat (and once more for a
    // partial one), one script call each, and sends nothing else: the
    // other commands are the ones the script runs inside.
    let scripts = spent("evalsha") + spent("eval");
    assert!((3..=3 * beats).contains(&scripts), "{scripts} script calls for 3 nodes × {beats} heartbeats");
    let inside = [
        "time",
        "zrangebyscore",
        "zrem",
        "hdel",
        "hget",
        "hset",
        "zadd",
        "zcard",
        "hlen",
        "zscore",
        "get",
        "set",
        "hgetall",
        "info",
    ];
    let outside: Vec<(&String, u64)> = after
        .keys()
        .filter(|name| !inside.contains(&name.as_str()) && !name.starts_with("eval"))
        .map(|name| (name, spent(name)))
        .filter(|(_, n)| *n > 0)
        .collect();
    assert!(outside.is_empty(), "commands besides the heartbeat: {outside:?}");
    assert_eq!(spent("hgetall"), 0, "a settled membership reads no records");
    for (_, view) in &nodes {
        assert_eq!(view.live().len(), 3);
    }
}

#[tokio::test]
async fn a_record_whose_deadline_was_lost_is_nobodys() {
    let server = RedisServer::start();
    let (ghost, _) = join(&server, "a").await.unwrap();
    let (b, view_b) = join(&server, "b").await.unwrap();
    let (_stop, _task) = run(&b);
    wait_view(&view_b, &["a", "b"]).await;
    // The deadlines go (evicted, or deleted by hand) while the records stay,
    // and a's process is gone: a must not stay a member, nor hold its name.
    let _: i64 =
        redis::cmd("DEL").arg("{tailrace:membership}:deadlines").query_async(&mut conn(&server).await).await.unwrap();
    drop(ghost);
    wait_view(&view_b, &["b"]).await;
    let records: i64 = redis::cmd("HLEN").arg(b.records_key()).query_async(&mut conn(&server).await).await.unwrap();
    assert_eq!(records, 1, "the lost record is dropped");
    let (again, _) = join(&server, "a").await.expect("the name is free again");
    assert!(!again.incarnation().is_empty());
    wait_view(&view_b, &["a", "b"]).await;
}

/// On a Redis Cluster (the members' keys share one hash tag, so one slot):
/// members see each other, and a crashed one's record lapses.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn members_follow_heartbeats_and_expiry_on_a_redis_cluster() {
    let cluster = common::redis_cluster::RedisCluster::start();
    let endpoint = cluster.endpoint();
    let conn = || endpoint.connect_any(tailrace::redis_conn::reconnecting(WAIT), Duration::from_secs(5));
    let (a, view_a) = join_on(conn().await.unwrap(), "a").await.unwrap();
    let (b, view_b) = join_on(conn().await.unwrap(), "b").await.unwrap();
    let (stop_a, task_a) = run(&a);
    let (_stop_b, task_b) = run(&b);
    wait_view(&view_a, &["a", "b"]).await;
    wait_view(&view_b, &["a", "b"]).await;
    task_b.abort();
    wait_view(&view_a, &["a"]).await;
    stop_a.cancel();
    task_a.await.unwrap().unwrap();
}
