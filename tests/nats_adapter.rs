//! The NATS JetStream adapter of `examples/nats_jetstream` (written against
//! the public API only) passes the whole conformance kit against a real
//! `nats-server`, started here on a free loopback port with its own store.
//! Without `nats-server` the test says so and passes, except under CI,
//! where `.ci/run` installs it and its absence is a failure. Then two whole
//! nodes on it (the example's `--node` mode: the library's server with this
//! adapter) serve a viewer through a `kill -9` of the queue's owner.

#[allow(dead_code)]
#[path = "../examples/nats_jetstream/adapter.rs"]
mod adapter;
#[path = "../examples/nats_jetstream/receiver.rs"]
mod receiver;
#[allow(dead_code)]
#[path = "../examples/nats_jetstream/server.rs"]
mod server;

use tailrace_testkit as common;

use std::sync::Arc;
use std::time::Duration;

use common::cluster::{Proc, config, free_port, settle};
use common::logs::Sse;
use common::redis_server::RedisServer;

use adapter::{JetStreamFactory, JetStreamOptions};
use tailrace::conformance::{self, Claims};
use tailrace::queue::QueueAdapterFactory;

fn server() -> Option<server::NatsServer> {
    if !server::available() {
        assert!(std::env::var_os("CI").is_none(), "nats-server is missing under CI: {}", server::INSTALL_HINT);
        println!("skipped: nats-server is not installed; {}", server::INSTALL_HINT);
        return None;
    }
    Some(server::NatsServer::start().unwrap())
}

#[tokio::test]
async fn passes_the_conformance_kit() {
    let Some(server) = server() else { return };
    let mut options = JetStreamOptions::new(server.url());
    options.max_messages = Some(128);
    options.purge_every = Duration::ZERO;
    options.read_wait = Duration::from_millis(50);
    let claims =
        Claims { durable: true, rewindable: true, exclusive_receivers: true, bounded: Some(128 * 8), trims: true };
    let report = conformance::run(claims, move || {
        let options = options.clone();
        async move { Ok(Arc::new(JetStreamFactory::connect(4, options).await?) as Arc<dyn QueueAdapterFactory>) }
    })
    .await
    .unwrap_or_else(|failures| panic!("{failures}"));
    println!("{report}");
    assert_eq!(report.checks_run(), 17, "{report}");
}

/// The example binary, built by `cargo test` beside this test
/// (`target/<profile>/examples`).
fn example() -> std::path::PathBuf {
    common::tailrace_bin().with_file_name("examples").join("nats_jetstream")
}

/// Node `name` of a cluster whose queues are JetStream streams on `nats`
/// (leases, membership, subscriptions and run logs on `redis`).
fn jetstream_node(redis: &RedisServer, nats: &str, name: &str) -> Proc {
    let port = free_port();
    let text = config(redis, name, port);
    let mut node =
        Proc::spawn_program(&example(), name, port, &text, &["--node"], &["--nats".into(), nats.into()], &[]);
    node.wait_serving();
    node
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_nodes_on_jetstream_serve_a_viewer_through_a_kill_9_of_the_owner() {
    let Some(nats) = server() else { return };
    if !example().exists() {
        assert!(std::env::var_os("CI").is_none(), "{} was not built", example().display());
        println!("skipped: build the example first (cargo test builds it)");
        return;
    }
    let redis = RedisServer::start();
    let client = common::http_client();
    let mut nodes = [jetstream_node(&redis, &nats.url(), "j1"), jetstream_node(&redis, &nats.url(), "j2")];
    let held = settle(&nodes[0], &[("j1", 3), ("j2", 3)]).await;
    // A run whose queue j1 pulls, watched and written through j2.
    let fqn = "svc.jet";
    let run = (0..100)
        .map(|i| format!("run-{i}"))
        .find(|run| {
            let queue = tailrace::queue::QueueMapper::new(common::cluster::QUEUES)
                .queue_for(&tailrace::archive::RunKey::new(fqn, run).unwrap().stream());
            held[&u64::from(queue.0)].0 == "j1"
        })
        .unwrap();
    let lines_url = nodes[1].url(&format!("/api/v1/logs/{fqn}/runs/{run}/lines"));
    let post = |from: usize, lines: usize| {
        let body: String = (from..from + lines)
            .map(|i| format!("{}\n", serde_json::json!({ "line": format!("line {i}"), "id": format!("l-{i}") })))
            .collect();
        let (url, client) = (lines_url.clone(), client.clone());
        async move {
            let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
            loop {
                let sent = client.post(&url).header("content-type", "application/x-ndjson").body(body.clone());
                match sent.send().await {
                    Ok(answer) if answer.status() == 202 => return,
                    other => assert!(tokio::time::Instant::now() < deadline, "a post kept failing: {other:?}"),
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    };
    post(0, 50).await;
    let stream = nodes[1].url(&format!("/api/v1/services/ingestionPipelines/logs/{fqn}/stream/{run}"));
    let mut viewer = Sse::open(&client, &stream).await;
    assert_eq!(viewer.status, 200);
    let mut seen: Vec<String> = Vec::new();
    let mut read_to = async |seen: &mut Vec<String>, total: usize| {
        while seen.len() < total {
            let event = viewer.event_within(Duration::from_secs(60)).await.expect("the stream goes on");
            if event["eventType"] == "complete" {
                return;
            }
            assert_eq!(event["eventType"], "logs", "{event}");
            assert_eq!(event["truncated"], false, "{event}");
            let text = event["logs"].as_str().unwrap();
            seen.extend(text.split('\n').filter(|l| !l.is_empty()).map(str::to_string));
        }
    };
    read_to(&mut seen, 50).await;
    nodes[0].signal("KILL");
    let _ = nodes[0].wait_exit();
    for batch in 1..6 {
        post(batch * 50, 50).await;
    }
    read_to(&mut seen, 300).await;
    settle(&nodes[1], &[("j2", common::cluster::QUEUES as usize)]).await;
    let expected: Vec<String> = (0..300).map(|i| format!("line {i}")).collect();
    assert_eq!(seen, expected, "the viewer saw every line once, in order, through the kill");
    let download = nodes[1].url(&format!("/api/v1/services/ingestionPipelines/logs/{fqn}/last/download?runId={run}"));
    let stored: Vec<String> =
        client.get(download).send().await.unwrap().text().await.unwrap().lines().map(str::to_string).collect();
    assert_eq!(stored, expected, "the store holds every acknowledged line once");
}
