//! The Redis persistence check at a node's start: `tailrace node` reads
//! `appendonly`, `appendfsync` and `save`, says in one line what they
//! guarantee, and refuses a Redis that keeps nothing across a restart
//! (fence counters would start again at 1) unless `[lease]
//! allow_volatile_redis`, and an append-only file replayed as a `default`
//! user that is off (Redis drops its transactions at reload). A Redis that
//! forbids `CONFIG` is said to be unchecked, and the node starts.

use tailrace_testkit as common;

use common::cluster::{Proc, QUEUES, config, free_port, redis, settle};
use common::redis_server::RedisServer;

const VOLATILE: &[&str] = &["--appendonly", "no", "--save", ""];

/// Starts `tailrace node` on `server` with `edit` applied to its config and
/// `RUST_LOG=log`.
fn spawn(server: &RedisServer, log: &str, edit: impl Fn(String) -> String) -> Proc {
    let port = free_port();
    let text = edit(config(server, "n1", port));
    Proc::spawn_with_env("n1", port, &text, &["node"], &[], &[("RUST_LOG", log)])
}

fn opt_out(text: String) -> String {
    assert!(text.contains("[lease]\n"));
    text.replacen("[lease]\n", "[lease]\nallow_volatile_redis = true\n", 1)
}

#[tokio::test]
async fn a_node_refuses_a_redis_that_keeps_nothing_and_takes_no_lease() {
    let server = RedisServer::start_with(VOLATILE);
    let mut node = spawn(&server, "warn", |text| text);
    let status = node.wait_exit();
    let log = node.log_text();
    assert!(!status.success(), "a node on a volatile Redis must not start:\n{log}");
    assert!(log.contains("Redis persistence: none (appendonly no, save \"\")"), "{log}");
    assert!(log.contains("fence counters start again at 1"), "{log}");
    assert!(log.contains("`tailrace node` refuses such a Redis"), "{log}");
    assert!(log.contains("[lease] allow_volatile_redis = true"), "the message names the opt-out:\n{log}");
    let keys: i64 = redis::cmd("DBSIZE").query_async(&mut redis(&server).await).await.unwrap();
    assert_eq!(keys, 0, "a refused node writes nothing: no lease, no member key");
}

#[tokio::test]
async fn with_the_opt_out_a_node_runs_on_a_volatile_redis_and_says_what_it_loses() {
    let server = RedisServer::start_with(VOLATILE);
    let mut node = spawn(&server, "warn", opt_out);
    node.wait_serving();
    settle(&node, &[("n1", QUEUES as usize)]).await;
    let log = node.log_text();
    assert!(log.contains("Redis persistence: none") && log.contains("fence counters start again at 1"), "{log}");
}

#[tokio::test]
async fn a_node_on_aof_always_states_that_nothing_acknowledged_is_lost() {
    let server = RedisServer::start();
    let mut node = spawn(&server, "info", |text| text);
    node.wait_serving();
    let log = node.log_text();
    assert!(log.contains("Redis persistence: AOF appendfsync=always"), "{log}");
    assert!(log.contains("loses no acknowledged events"), "{log}");
}

#[tokio::test]
async fn a_node_on_aof_everysec_states_what_a_machine_crash_loses() {
    let server = RedisServer::start_with(&["--appendfsync", "everysec"]);
    let mut node = spawn(&server, "warn", |text| text);
    node.wait_serving();
    let log = node.log_text();
    assert!(log.contains("Redis persistence: AOF appendfsync=everysec"), "{log}");
    assert!(log.contains("can lose up to about 1 s"), "{log}");
}

#[tokio::test]
async fn rdb_snapshots_alone_let_a_node_start_and_say_a_crash_loses_writes() {
    let server = RedisServer::start_with(&["--appendonly", "no", "--save", "60 1"]);
    let mut node = spawn(&server, "warn", |text| text);
    node.wait_serving();
    let log = node.log_text();
    assert!(log.contains("Redis persistence: RDB snapshots only (save \"60 1\")"), "{log}");
    assert!(log.contains("a crash loses every write since the last snapshot"), "{log}");
}

#[tokio::test]
async fn a_redis_that_forbids_config_is_said_to_be_unchecked_and_the_node_starts() {
    let server = RedisServer::start_with(&["--appendonly", "no", "--save", "", "--rename-command", "CONFIG", ""]);
    let mut node = spawn(&server, "warn", |text| text);
    node.wait_serving();
    let log = node.log_text();
    assert!(log.contains("Redis persistence could not be checked"), "{log}");
    assert!(log.contains("appendonly yes"), "{log}");
}

#[tokio::test]
async fn serve_on_a_volatile_redis_starts_and_says_what_it_loses() {
    let server = RedisServer::start_with(VOLATILE);
    let port = free_port();
    let data = tempfile::tempdir().unwrap();
    let extra = ["--data-dir".to_string(), data.path().display().to_string()];
    let mut serve = Proc::spawn("lone", port, &config(&server, "lone", port), &["serve"], &extra);
    serve.wait_serving();
    assert!(serve.log_text().contains("Redis persistence: none"), "{}", serve.log_text());
}

/// Redis replays the append-only file as the `default` user: with it off,
/// a restart drops every MULTI/EXEC block (redis/redis#14541), and lease
/// grants are written as such blocks.
#[tokio::test]
async fn a_node_refuses_an_aof_replayed_as_a_default_user_that_is_off() {
    use common::redis_server::{PASSWORD, USER};
    let server = RedisServer::start_secure_with("no", &["off"]);
    let keys = format!(
        "username = \"{USER}\"\npassword = \"{PASSWORD}\"\ntls_ca_file = \"{}\"\n",
        server.secure().file("ca.pem").display()
    );
    let url_line = format!("url = \"{}\"\n", server.url());
    let with_keys = |text: String| text.replacen(&url_line, &format!("{url_line}{keys}"), 1);
    let mut node = spawn(&server, "warn", with_keys);
    let status = node.wait_exit();
    let log = node.log_text();
    assert!(!status.success(), "{log}");
    assert!(log.contains("the `default` user is off or may not run every command"), "{log}");
    assert!(log.contains("redis/redis#14541") && log.contains("allow_volatile_redis"), "{log}");
    let mut node = spawn(&server, "warn", |text| opt_out(with_keys(text)));
    node.wait_serving();
}
