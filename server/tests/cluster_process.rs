//! A cluster of real `tailrace node` processes on one private Redis, with
//! short leases and six queues, seen from outside: through each node's
//! `GET /api/v1/admin/cluster` and the Redis lease, fence and member keys.
//! Four nodes split the queues; one leaves with SIGTERM and the others
//! take its queues; another is killed with SIGKILL and the other two take
//! its queues once its leases lapse; a newcomer gets its share, while a
//! watcher sees no grant with two holders and no token going back. A second
//! process under a live node's name, and a `serve` next to the cluster, are
//! refused and take nothing; a node stopped while Redis is frozen leaves
//! no lease; agents are stopped and started through another node's edge.

use tailrace_testkit as common;

use std::process::Command;

use common::cluster::*;
use common::redis_server::RedisServer;
use serde_json::Value;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_processes_split_hand_over_survive_a_kill_and_take_a_newcomer() {
    let server = RedisServer::start();
    let mut conn = redis(&server).await;
    let n1 = Proc::node(&server, "n1");
    let n2 = Proc::node(&server, "n2");
    let mut n3 = Proc::node(&server, "n3");
    let mut n4 = Proc::node(&server, "n4");
    let watch = LeaseWatch::start(&server);

    // Orleans' scenario 28 with six queues. (a) Four nodes own one or two
    // each, one holder per queue, as in Redis.
    let held = settle_shape(&n1, &["n1", "n2", "n3", "n4"], &[2, 2, 1, 1]).await;
    leases_in_redis_match(&mut conn, &held).await;
    let members = n2.cluster().await.unwrap()["members"].as_array().unwrap().len();
    assert_eq!(members, 4);

    // (b) SIGTERM: a clean exit, its queues handed over, its member key
    // gone: three nodes with two each.
    n4.signal("TERM");
    let status = n4.wait_exit();
    assert!(status.success(), "n4 exited with {status}:\n{}", n4.log_text());
    assert!(!member_exists(&mut conn, "n4").await, "a graceful leave deletes the member key");
    let held = settle(&n1, &[("n1", 2), ("n2", 2), ("n3", 2)]).await;
    leases_in_redis_match(&mut conn, &held).await;

    // (c) kill -9: its links close, nothing listens at its address any
    // more, so the survivors evict it (not waiting for its leases to
    // lapse): two nodes with three each, under higher tokens.
    n3.signal("KILL");
    n3.wait_exit();
    let killed = std::time::Instant::now();
    let after = settle(&n1, &[("n1", 3), ("n2", 3)]).await;
    eprintln!("n3's queues re-owned {:?} after its kill (lease ttl 6 s, acquire 1 s)", killed.elapsed());
    let mut evictions = 0.0;
    for survivor in [&n1, &n2] {
        evictions += survivor.metric_sum("tailrace_nodes_evicted_total", Some("peer=\"n3\"")).await.unwrap_or(0.0);
    }
    assert!(evictions >= 1.0, "a survivor's failure detector evicted n3:\n{}", n1.log_text());
    leases_in_redis_match(&mut conn, &after).await;
    for (queue, (holder, token)) in &held {
        if holder == "n3" {
            assert!(after[queue].1 > *token, "queue {queue}: {:?} after n3's token {token}", after[queue]);
        }
    }

    // (d) A newcomer gets its share: three nodes with two each again.
    let n5 = Proc::node(&server, "n5");
    let held = settle(&n5, &[("n1", 2), ("n2", 2), ("n5", 2)]).await;
    leases_in_redis_match(&mut conn, &held).await;
    watch.check().await;
    let (mut n2, mut n5) = (n2, n5);
    for node in [&mut n2, &mut n5] {
        node.signal("TERM");
        assert!(node.wait_exit().success(), "{}", node.log_text());
    }
    settle(&n1, &[("n1", 6)]).await;

    // (d) A second process under a live node's name is refused and takes
    // no lease: no grant happened (a grant raises its queue's fence).
    let before = fences(&mut conn).await;
    let port = free_port();
    let mut twin = Proc::spawn("n1-twin", port, &config(&server, "n1", port), &["node"], &[]);
    let status = twin.wait_exit();
    let log = twin.log_text();
    assert!(!status.success(), "a second n1 must be refused:\n{log}");
    assert!(log.contains("`n1` is held by a live process"), "{log}");
    assert_eq!(fences(&mut conn).await, before, "the refused process took a lease");
    assert!(member_exists(&mut conn, "n1").await, "the refusal must not touch the live node's key");

    // A `serve` on the same Redis is refused too, naming the live node.
    let port = free_port();
    let data = tempfile::tempdir().unwrap();
    let extra = ["--data-dir".to_string(), data.path().display().to_string()];
    let mut serve = Proc::spawn("lone", port, &config(&server, "lone", port), &["serve"], &extra);
    let status = serve.wait_exit();
    let log = serve.log_text();
    assert!(!status.success(), "serve next to a live node must be refused:\n{log}");
    assert!(log.contains("`n1`") && log.contains("tailrace node"), "{log}");
    assert_eq!(fences(&mut conn).await, before, "the refused serve took a lease");
    assert!(!member_exists(&mut conn, "lone").await, "the refused serve left its member key behind");
    let held = settle(&n1, &[("n1", 6)]).await;
    leases_in_redis_match(&mut conn, &held).await;
}

#[test]
fn node_refuses_queues_or_an_archive_not_in_redis_and_tls_files_it_cannot_read() {
    let redis = "[queues]\nadapter = \"redis\"\n[archive]\nstore = \"redis\"\n";
    let tls = format!("{redis}[cluster.tls]\ncert = \"a.pem\"\nkey = \"a.key\"\nca = \"ca.pem\"\n");
    for (text, needs) in [
        ("[queues]\nadapter = \"file\"\n", "adapter = \"redis\""),
        ("[queues]\nadapter = \"redis\"\n[archive]\nstore = \"file\"\n", "store = \"redis\""),
        (tls.as_str(), "cluster.tls.cert: cannot read a.pem"),
    ] {
        let mut node = Proc::spawn("misfit", free_port(), text, &["node"], &[]);
        let status = node.wait_exit();
        let log = node.log_text();
        assert!(!status.success(), "{log}");
        assert!(log.contains(needs), "{log}");
    }
}

/// `tailrace agents …` against a node's edge; its exit status and output.
fn agents(node: &Proc, args: &[&str]) -> (bool, String) {
    let url = format!("http://127.0.0.1:{}", node.port);
    let out =
        Command::new(env!("CARGO_BIN_EXE_tailrace")).arg("agents").args(args).args(["--url", &url]).output().unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    (out.status.success(), text)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stopping_a_nodes_agents_hands_its_queues_to_the_others_until_they_start_again() {
    let server = RedisServer::start();
    let mut conn = redis(&server).await;
    let n1 = Proc::node(&server, "n1");
    let n2 = Proc::node(&server, "n2");
    settle(&n1, &[("n1", 3), ("n2", 3)]).await;

    let (ok, out) = agents(&n2, &["stop"]);
    assert!(ok && out.contains("agents_stopped"), "{out}");
    let held = settle(&n1, &[("n1", 6)]).await;
    leases_in_redis_match(&mut conn, &held).await;
    let cluster = n1.cluster().await.unwrap();
    let n2_member = cluster["members"].as_array().unwrap().iter().find(|m| m["name"] == "n2").cloned();
    assert_eq!(n2_member.map(|m| m["agents"].clone()), Some(Value::from("stopped")), "{cluster}");
    let (ok, out) = agents(&n2, &["state"]);
    assert!(ok && out.contains("agents_stopped") && out.contains("0 agent"), "{out}");

    // Another node's agents, through this node's edge and the transport.
    let (ok, out) = agents(&n2, &["state", "--node", "n1"]);
    assert!(ok && out.contains("node n1") && out.contains("6 agent"), "n1 answers through n2: {out}");
    let (ok, out) = agents(&n2, &["state", "--node", "n9"]);
    assert!(!ok && out.contains("n9") && out.contains("not a live member"), "{out}");
    let (ok, out) = agents(&n2, &["start"]);
    assert!(ok && out.contains("agents_started"), "{out}");
    let held = settle(&n2, &[("n1", 3), ("n2", 3)]).await;
    leases_in_redis_match(&mut conn, &held).await;
}

/// Orleans' scenario 27 from outside: a node told to stop while its lease
/// calls are blocked (Redis frozen as it takes its share) still leaves in
/// order once Redis answers: once it exited, no lease names it, and the
/// other node takes every queue without waiting for a lease to lapse. (The
/// grant whose answer the stopping balancer dropped is forced in
/// `lease_balancer::a_lease_granted_to_a_stopping_node_is_released_by_its_shutdown`.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_stopped_while_redis_is_frozen_leaves_no_lease_behind() {
    let server = RedisServer::start();
    let mut conn = redis(&server).await;
    let n1 = Proc::node(&server, "n1");
    settle(&n1, &[("n1", 6)]).await;
    let mut n2 = Proc::node(&server, "n2");
    // n2's balancer now takes the leases n1 frees; freeze Redis under it.
    server.signal("STOP");
    n2.signal("TERM");
    tokio::time::sleep(std::time::Duration::from_millis(1500)).await;
    server.signal("CONT");
    let status = n2.wait_exit();
    assert!(status.success(), "{}", n2.log_text());
    for queue in 0..QUEUES {
        let key = format!("tailrace:{{q{queue}}}:lease");
        let holder: Option<String> = redis::cmd("HGET").arg(&key).arg("holder").query_async(&mut conn).await.unwrap();
        assert_ne!(holder.as_deref(), Some("n2"), "{key} still names the node that left:\n{}", n2.log_text());
    }
    let held = settle(&n1, &[("n1", 6)]).await;
    leases_in_redis_match(&mut conn, &held).await;
}
